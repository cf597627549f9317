"""The Mamba-2 peer impls (`gpu_impls/torch/mamba_peers.py`: mamba_ssm's Triton kernels and
causal_conv1d) on CPU: registered for their ops, unavailable here with the reason and the
install command, their contracts admitting only what the libraries compute, and the import
helper that steps around mamba_ssm's failing package __init__. Every contract's violating cases
are also rejected by `tests/test_contracts.py`; the peers run on the GPU in
`tests/test_gpu_mamba_peers.py`."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.torch import mamba_peers

PEERS = {"torch:mamba_chunk_scan_combined": "ssd_chunked",
         "torch:mamba_selective_state_update": "ssm_step",
         "torch:causal_conv1d_fn": "conv1d_causal",
         "torch:causal_conv1d_update": "conv1d_causal_step"}
SSD = {"heads": 4, "dim_p": 8, "groups": 2, "dim_n": 16}
CONV = {"batch": 2, "channels": 40, "width": 4}


def _impl(impl_id: str):
    return gpu_impls.impls()[impl_id]


@pytest.fixture
def cuda_seen(monkeypatch):
    """torch reports a CUDA device: the checks past "CUDA only" run."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("impl_id", sorted(PEERS))
def test_each_peer_is_registered_for_its_op_and_says_cuda_only(impl_id, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    impl = _impl(impl_id)
    assert impl.op == PEERS[impl_id]
    ok, why = impl.available(gpu_impls.backend("torch"))
    assert not ok and "runs on CUDA only" in why, why


@pytest.mark.parametrize("impl_id", ["torch:mamba_chunk_scan_combined",
                                     "torch:mamba_selective_state_update"])
def test_mamba_peers_name_the_missing_module_and_the_install(impl_id, cuda_seen, monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # find_spec: not installed
    ok, why = _impl(impl_id).requires()
    assert not ok and "not installed" in why and "MAMBA_SKIP_CUDA_BUILD=TRUE" in why, why


def test_a_missing_module_is_named_with_its_install_command(cuda_seen):
    check = mamba_peers.needs("a kernel", ("kparity_no_such_module",), "pip install it")
    assert check() == (False, "kparity_no_such_module not installed: pip install it")


def test_causal_conv1d_without_its_extension_says_not_built(cuda_seen, tmp_path, monkeypatch):
    """The python package installed (a stand-in here), its CUDA extension absent: the check
    imports the extension, not only the package."""
    (tmp_path / "causal_conv1d").mkdir()
    (tmp_path / "causal_conv1d" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "causal_conv1d_cuda", None)  # import raises ImportError
    for impl_id in ("torch:causal_conv1d_fn", "torch:causal_conv1d_update"):
        ok, why = _impl(impl_id).requires()
        assert not ok and why.startswith(
            "causal_conv1d's CUDA extension not built (CAUSAL_CONV1D_FORCE_BUILD=TRUE pip "
            "install --no-build-isolation causal-conv1d)"), why


def test_causal_conv1d_not_installed_says_so(cuda_seen, monkeypatch):
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)
    ok, why = _impl("torch:causal_conv1d_fn").requires()
    assert not ok and why.startswith("causal_conv1d not installed: CAUSAL_CONV1D_FORCE_BUILD"), why


# --- contracts ---------------------------------------------------------------------------------

def _rejects(impl_id: str, case: Case, named: str):
    with pytest.raises(ContractError) as e:
        _impl(impl_id).contract.check(impl_id, case)
    assert named in str(e.value), str(e.value)


def _chunked(dtype: str, **params) -> Case:
    return Case.make("ssd_chunked", {**SSD, "batch": 1, "tokens": 65}, dtype,
                     params={"dots": "T", **params})


def test_chunk_scan_takes_the_triton_roundings_in_f16_and_bf16_only():
    """dots="T" (its kernels round the tile, B·decay·dt and the passed states to T), not f32
    (Triton's tl.dot on f32 is TF32), any chunk and the dt clamp."""
    impl_id = "torch:mamba_chunk_scan_combined"
    contract = _impl(impl_id).contract
    for dtype in ("f16", "bf16"):
        for params in ({}, {"chunk": 128}, {"chunk": 256}, {"dt_min": 0.01, "dt_max": 0.1},
                       {"gate": True}):
            assert contract.admits(_chunked(dtype, **params)), (dtype, params)
    _rejects(impl_id, _chunked("bf16", dots="f32"), "dots == 'T'")
    _rejects(impl_id, _chunked("f32"), "dtype in ('f16', 'bf16')")


def _step(dtype: str, **params) -> Case:
    return Case.make("ssm_step", {**SSD, "batch": 3}, dtype, params=params)


def test_state_update_takes_the_hpn_layout_without_a_dt_clamp():
    impl_id = "torch:mamba_selective_state_update"
    contract = _impl(impl_id).contract
    for dtype in ("f32", "f16", "bf16"):
        assert contract.admits(_step(dtype, gate=True))
    _rejects(impl_id, _step("f32", layout="hnp"), "layout == 'hpn'")
    _rejects(impl_id, _step("f32", dt_min=0.01, dt_max=0.1), "no dt clamp")
    _rejects(impl_id, _step("f32", dt_max=0.5), "no dt clamp")


def test_causal_conv1d_contracts_widths_and_channels():
    """Widths 2 to 4 for both; the prefill's channel-last kernel needs channels % 8 == 0, the
    step takes any channel count."""
    prefill, step = "torch:causal_conv1d_fn", "torch:causal_conv1d_update"
    for width in (2, 3, 4):
        for dtype in ("f32", "f16", "bf16"):
            assert _impl(prefill).contract.admits(Case.make(
                "conv1d_causal", {**CONV, "width": width, "tokens": 5}, dtype))
            assert _impl(step).contract.admits(Case.make(
                "conv1d_causal_step", {**CONV, "width": width, "channels": 37}, dtype))
    _rejects(prefill, Case.make("conv1d_causal", {**CONV, "tokens": 5, "channels": 37}, "f32"),
             "channels % 8 == 0")
    _rejects(prefill, Case.make("conv1d_causal", {**CONV, "tokens": 5, "width": 5}, "f32"),
             "width <= 4")
    _rejects(step, Case.make("conv1d_causal_step", {**CONV, "width": 5}, "f32"), "width <= 4")


def test_causal_conv1d_declares_fast_math_exp():
    """--use_fast_math's __expf: 2 + floor(1.173 |x|) ULPs, charged at |x| <= 16."""
    assert mamba_peers.FAST_EXPF_ULPS == 20.0
    for impl_id in ("torch:causal_conv1d_fn", "torch:causal_conv1d_update"):
        assert _impl(impl_id).numerics.ulps["exp"] == 20.0


# --- importing mamba_ssm's Triton modules --------------------------------------------------------

def _drop_mamba_modules() -> dict:
    return {k: sys.modules.pop(k) for k in list(sys.modules)
            if k == "mamba_ssm" or k.startswith("mamba_ssm.")}


@pytest.fixture
def fake_mamba(tmp_path, monkeypatch):
    """A mamba_ssm on sys.path whose package __init__ raises ImportError, as the real one does
    without its selective_scan_cuda extension; its ops.triton holds a module `kernel`."""
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise ImportError(\"No module named 'selective_scan_cuda'\")\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "kernel.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = _drop_mamba_modules()
    yield pkg
    _drop_mamba_modules()
    sys.modules.update(saved)


def test_mamba_triton_imports_a_kernel_module_without_the_package_init(fake_mamba):
    """The plain import runs the package __init__ and fails; the helper imports the module
    (and a second call finds it imported)."""
    with pytest.raises(ImportError, match="selective_scan_cuda"):
        import mamba_ssm.ops.triton.kernel  # noqa: F401
    module = mamba_peers._mamba_triton("kernel")
    assert module.VALUE == 42
    assert module.__file__ == str(fake_mamba / "ops" / "triton" / "kernel.py")
    assert mamba_peers._mamba_triton("kernel") is module


def test_mamba_triton_without_mamba_ssm_names_the_install():
    saved = _drop_mamba_modules()
    try:
        if importlib.util.find_spec("mamba_ssm") is not None:
            pytest.skip("mamba_ssm is installed here")
        with pytest.raises(ImportError, match="MAMBA_SKIP_CUDA_BUILD=TRUE"):
            mamba_peers._mamba_triton("ssd_combined")
    finally:
        _drop_mamba_modules()
        sys.modules.update(saved)

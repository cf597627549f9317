"""Liger-Kernel's RMSNorm and SwiGLU as baselines (issue 35, `gpu_impls/torch/liger.py`) without a
GPU: registered for rms_norm in both casting modes and for silu_mul, each admitting exactly its
rounding convention
(so `bench` times each on every bench shape under its own), unavailable here with the reason
and the install command. They run on the GPU through the gate (`tests/test_gpu.py`, every
available impl's gate cases) once the extra is installed."""

from __future__ import annotations

import importlib.util

import pytest

import gpu_impls
from cases.generate import bench_cases, bench_plan, convention

MODES = {"torch:liger_rms_norm_llama": ("rms_norm", "rounding=normed"),
         "torch:liger_rms_norm_gemma": ("rms_norm", "rounding=once"),
         "torch:liger_silu_mul": ("silu_mul", "rounding=act"),
         "torch:liger_rope": ("rope", "")}


@pytest.mark.parametrize("impl_id", sorted(MODES))
def test_registered_for_its_op_and_unavailable_here_with_the_reason(impl_id, monkeypatch):
    import torch

    impl = gpu_impls.impls()[impl_id]
    assert impl.op == MODES[impl_id][0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = impl.available(gpu_impls.backend("torch"))
    assert not ok and "CUDA only" in why, why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    ok, why = impl.requires()  # past "CUDA only": the missing package
    assert not ok and "pip install 'kparity[liger]'" in why, why


@pytest.mark.parametrize("impl_id", sorted(MODES))
def test_each_mode_is_benched_on_every_shape_under_its_own_convention(impl_id):
    impl = gpu_impls.impls()[impl_id]
    op, own = MODES[impl_id]
    work = bench_plan([impl])
    admitted = [c for c in bench_cases(op) if own or impl.contract.admits(c)]
    assert work and len(work) == len(admitted)
    assert {convention(w.case) for w in work} == {own}


def test_liger_rope_admits_hfs_t_arithmetic_and_rotate_half_only():
    from cases.model import Case
    from gpu_impls.contract import ContractError

    impl = gpu_impls.impls()["torch:liger_rope"]
    dims = {"tokens": 3, "heads_q": 4, "heads_kv": 2, "head_dim": 64}
    base = Case.make("rope", dims, "bf16", params={"compute": "T"})
    assert impl.contract.admits(base)
    for params, rule in (({"compute": "f32"}, "compute"), ({"pairing": "gptj"}, "pairing"),
                         ({"scaling": "yarn"}, "scaling")):
        with pytest.raises(ContractError, match=rule):
            impl.contract.check(impl.id, base.replace(**params))

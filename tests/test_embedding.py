"""quant_embedding (`oracle/embedding.py`): the oracle against codes written directly, the torch
and MLX impls green on every gate case, a planted wrong gather red."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from gpu_impls.impl import Impl
from oracle.dtypes import round_to, storage_dtype
from oracle.quant import pack
from oracle.spec import get_op
from runners.correctness import check


def test_oracle_is_codes_times_scale_plus_bias_of_the_ids_rows():
    """Independent of `unpack`: codes drawn as integers, packed, and the rows written as
    q * s + b from the integers themselves."""
    rng = np.random.default_rng(0)
    vocab, hidden, group = 10, 64, 32
    q = rng.integers(0, 16, (vocab, hidden))
    s = round_to(rng.uniform(0.01, 0.02, (vocab, hidden // group)), "f16")
    b = round_to(rng.normal(0, 0.1, (vocab, hidden // group)), "f16")
    ids = np.array([9, 0, 3, 3], dtype=np.int32)
    case = Case.make("quant_embedding", {"tokens": 4, "vocab": vocab, "hidden": hidden,
                                         "bits": 4, "group_size": group}, "f16")
    inputs = {"w": pack(q, 4), "scales": s.astype(storage_dtype("f16")),
              "biases": b.astype(storage_dtype("f16")), "ids": ids}
    want = np.stack([q[i] * np.repeat(s[i], group) + np.repeat(b[i], group) for i in ids])
    assert np.array_equal(get_op("quant_embedding").oracle(inputs, case)["out"], want)


def test_oracle_refuses_an_id_outside_the_table():
    case = Case.make("quant_embedding", {"tokens": 1, "vocab": 4, "hidden": 64, "bits": 4,
                                         "group_size": 64}, "bf16")
    inputs = {**make_inputs(case), "ids": np.array([4], dtype=np.int32)}
    with pytest.raises(ValueError, match=r"ids \[4\] outside \[0, vocab=4\)"):
        get_op("quant_embedding").oracle(inputs, case)


@pytest.mark.parametrize("impl_id", ["torch:quant_embedding", "mlx:quant_embedding"])
def test_impls_pass_every_gate_case(impl_id):
    impl = gpu_impls.impls()[impl_id]
    ok, why = impl.available(gpu_impls.backend(impl.backend))
    if not ok:
        pytest.skip(why)
    backend = gpu_impls.backend(impl.backend)
    failed = [(c.short(), row["message"]) for c in gate_cases("quant_embedding")
              if (row := check(Work(impl, c, "valid"), backend))["status"] != "pass"]
    assert not failed, failed[:3]


def _group_off_by_one(launch, inputs, outputs, case):
    """The last code of each group takes the next group's scale and bias (the GEMV mutant's
    bug, in a gather)."""
    import torch

    from gpu_impls.torch.gemv import unpack_codes

    ids, group = inputs["ids"].long(), case.dims["group_size"]
    q = unpack_codes(inputs["w"].index_select(0, ids), case.dims["bits"],
                     case.dims["hidden"]).float()
    s = inputs["scales"].index_select(0, ids).float().repeat_interleave(group, dim=-1)
    b = inputs["biases"].index_select(0, ids).float().repeat_interleave(group, dim=-1)
    last = torch.arange(group - 1, s.shape[-1] - 1, group)
    s[:, last], b[:, last] = s[:, last + 1], b[:, last + 1]
    return {"out": (q * s + b).to(inputs["scales"].dtype)}


def test_a_wrong_gather_fails():
    impl = Impl("quant_embedding", "torch", "test_group_off_by_one", _group_off_by_one)
    torch = gpu_impls.backend("torch")
    case = next(c for c in gate_cases("quant_embedding") if c.dims["tokens"] == 7)
    assert check(Work(impl, case, "valid"), torch)["status"] == "fail"

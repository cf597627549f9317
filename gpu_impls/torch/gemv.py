"""torch baseline for the quantized GEMV: unpack the codes, dequantize in f32, `F.linear` in f32,
one rounding to T. What a user without a quantized kernel would run.

`kparity check` and `bench` run the whole op at every call. The model's decode loop, whose
weights do not change over a run, makes the f32 W_hat once per weight (`Impl.prepare`) as a
user's engine would at load; each step then runs the same `F.linear` on the same tensor (the
same bits: tests/test_model_prepare.py): without it, a SmolLM2 step re-dequantized all 135 M
weights (0.9 tok/s on a 2-core CPU)."""

from __future__ import annotations

import weakref

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import ExactPeer, Impl
from gpu_impls.quant_layout import EXPERT_IN_RANGE, LAYOUT, expert_slabs


def unpack_codes(words, bits: int, n: int):
    """uint32 [out, n*bits/32] -> int64 codes [out, n], LSB-first (as `oracle.quant.unpack`)."""
    import torch

    w = words.to(torch.int64)
    if 32 % bits == 0:  # power-of-2 widths: 32/bits whole codes per word
        shifts = torch.arange(0, 32, bits, device=w.device)
        return ((w[..., None] >> shifts) & ((1 << bits) - 1)).reshape(w.shape[0], n)
    stream = (w[..., None] >> torch.arange(32, device=w.device)) & 1  # the row's bit stream
    stream = stream.reshape(w.shape[0], n, bits)
    return (stream << torch.arange(bits, device=w.device)).sum(-1)


def dequantize_f32(w, scales, biases, case):
    """W_hat = q * s + b in f32, [..., out, in] (exact: s, b are T values, q small integers)."""
    bits, group, n = case.dims["bits"], case.dims["group_size"], case.dims["in"]
    q = unpack_codes(w, bits, n).float()
    s = scales.float().repeat_interleave(group, dim=-1)
    b = biases.float().repeat_interleave(group, dim=-1)
    return q * s + b


def prepare_w_hat(inputs, case):
    """{"w_hat": W_hat in f32}: `dequant_linear_run`'s first step, which the model's decode loop
    makes once per weight (`Impl.prepare`): W_hat is a function of the weights and the case's
    bits, group size and width alone, the same tensor at every call."""
    return {"w_hat": dequantize_f32(inputs["w"], inputs["scales"], inputs["biases"], case)}


def dequant_linear_run(launch, inputs, outputs, case):
    """Dequantize (unless `inputs` carries the prepared "w_hat", `prepare_w_hat`: the same f32
    tensor, made once), then `F.linear` in f32, rounded to T."""
    import torch.nn.functional as F

    x = inputs["x"]
    w_hat = inputs.get("w_hat")
    if w_hat is None:
        w_hat = prepare_w_hat(inputs, case)["w_hat"]
    return {"out": F.linear(x.float(), w_hat).to(x.dtype)}


def _dequant_linear_expert(launch, inputs, outputs, case):
    """The selected slab by index_select on the device index (no host read: graph-capturable),
    then exactly `dequant_linear_run`."""
    e = inputs["expert_index"].long()
    slab = {k: inputs[k].index_select(0, e)[0] for k in ("w", "scales", "biases")}
    return dequant_linear_run(launch, {**slab, "x": inputs["x"]}, outputs, case)


register(Impl("dequant_gemv", "torch", "dequant_linear", dequant_linear_run,
              Contract(invariants=LAYOUT),
              doc="unpack + dequantize in f32, then F.linear in f32, rounded to T",
              prepare=prepare_w_hat),
         Impl("dequant_gemv_expert_indexed", "torch", "dequant_linear_expert",
              _dequant_linear_expert,
              Contract(invariants=(*LAYOUT, EXPERT_IN_RANGE)),
              doc="index_select the expert's slab, then torch:dequant_linear's computation",
              exact_peer=ExactPeer("torch:dequant_linear", expert_slabs)))


# The dense weights of each input set, made once (outside any timing or graph capture: the
# timing layer runs every call once first) and dropped with the set's packed weights.
_DENSE: dict[int, object] = {}  # id(packed w) -> dense W; a finalizer drops the entry


def _linear_dense(launch, inputs, outputs, case):
    import torch.nn.functional as F

    x, w = inputs["x"], inputs["w"]
    dense = _DENSE.get(id(w))
    if dense is None:
        dense = _DENSE[id(w)] = dequantize_f32(w, inputs["scales"], inputs["biases"],
                                               case).to(x.dtype)
        weakref.finalize(w, _DENSE.pop, id(w), None)
    return {"out": F.linear(x, dense)}


register(Impl("dequant_gemv", "torch", "linear_dense", _linear_dense,
              Contract(invariants=LAYOUT),
              doc="F.linear(x, W) with W dense in T (dequantized once per input set): what a "
                  "user would run without a quantized kernel; cuBLAS GEMV reads 2 bytes/weight",
              report_only="W is rounded to T once dequantized: another function than x @ "
                          "dequant(Wq) in f32, a speed baseline only"))

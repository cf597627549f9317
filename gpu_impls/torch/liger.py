"""Liger-Kernel's Triton kernels as baselines (issue 35; optional extra `kparity[liger]`, CUDA
only; read against liger-kernel 0.8.5). Liger's RMSNorm (`LigerRMSNormFunction`, forward
only) in two of its casting modes, each a rounding convention of `rms_norm`:

* `torch:liger_rms_norm_llama` (casting_mode "llama", Liger's default, HF LlamaRMSNorm): the
  inverse RMS and x · inv in f32, rounded to T, then · (offset + w) and the store:
  rounding="normed";
* `torch:liger_rms_norm_gemma` ("gemma", HF Gemma's): everything in f32, one rounding at the
  store: rounding="once".

Both take the weight offset (Gemma's 1 + w) as Liger's `offset`; x is viewed as rows of n.
`in_place` (which only concerns the backward's reuse of dY) is False.

`torch:liger_silu_mul`: `LigerSiLUMulFunction` (silu(gate) in f32, cast to T, times up in T:
`silu_mul`'s rounding="act", HF's convention).

`torch:liger_rope`: `LigerRopeFunction` as Liger's HF patch calls it: the cos and sin tables
made as `torch:rope_hf` makes them (HF's f32 inv_freq, cos and sin of the positions times the
attention factor, cast to T: [1, tokens, R]), q and k passed as [1, heads, tokens, D] views of
the op's [tokens, heads, D]; the kernel rotates the first R of D in T (compute="T"), rotate-half
pairing only (pairing="neox"), and writes q and k in place, as it does on HF's projection
outputs (the op's outputs are those views; the inputs are clobbered). A timed input set is so
rotated again by every call, which keeps its magnitude only without YaRN's attention factor:
the contract refuses scaling="yarn". liger_kernel is imported only where the impls run.
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, param_is
from gpu_impls.impl import Impl
from gpu_impls.torch.extras import needs
from gpu_impls.torch.norms import eps_f32
from gpu_impls.torch.rope import device_hf_inv_freq, rope_contract
from oracle.rope import attention_factor, rotary_dim


liger_available = needs("Liger-Kernel's Triton kernels", ("triton", "liger_kernel"),
                        "pip install 'kparity[liger]'")


def _liger(op: str, name: str, run, rule, doc: str) -> Impl:
    """A Liger impl: `rule` its only contract invariant, CUDA only, the extra required."""
    return Impl(op, "torch", name, run, Contract(invariants=(rule,)), requires=liger_available,
                doc=f"Liger-Kernel {doc}; Triton, CUDA only; optional extra kparity[liger]")


def _rms_norm(mode: str):
    def run(launch, inputs, outputs, case):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        x = inputs["x"]
        rows = x.reshape(-1, x.shape[-1])
        y = LigerRMSNormFunction.apply(rows, inputs["w"], eps_f32(case),
                                       float(case.params["weight_offset"]), mode, False)
        return {"out": y.reshape(x.shape)}
    return run


def _rope(launch, inputs, outputs, case):
    import torch
    from liger_kernel.ops.rope import LigerRopeFunction

    q, k = inputs["q"], inputs["k"]
    r = rotary_dim(case)
    freqs = inputs["positions"].float()[:, None] * device_hf_inv_freq(case, q.device, torch)
    emb = torch.cat((freqs, freqs), dim=-1)
    m = attention_factor(case)
    cos, sin = (emb.cos() * m).to(q.dtype)[None], (emb.sin() * m).to(q.dtype)[None]
    q_out, k_out = LigerRopeFunction.apply(q.unsqueeze(0).transpose(1, 2),
                                           k.unsqueeze(0).transpose(1, 2), cos, sin, None, 1, r)
    return {"q_out": q_out.transpose(1, 2)[0], "k_out": k_out.transpose(1, 2)[0]}


# Liger rotates q and k in place: the bench's repeated calls on one input set rotate it again
# each time, which keeps its magnitude only where the attention factor m is 1 (not YaRN)
NOT_YARN = Invariant(
    name="scaling != 'yarn'", holds=lambda ns: ns["scaling"] != "yarn",
    why="LigerRopeFunction writes q and k in place: timed calls on one input set would scale "
        "it by YaRN's attention factor every call",
    fix=lambda ns: "torch:rope_hf", violation={"scaling": "yarn"}, shows=("scaling",))
ROPE_CONTRACT = Contract(invariants=(
    *rope_contract("T", "torch:rope_polar (f32 throughout)").invariants,
    param_is("pairing", "neox", "torch:rope_hf for pairing='gptj'", other="gptj"), NOT_YARN))


def _silu_mul(launch, inputs, outputs, case):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return {"out": LigerSiLUMulFunction.apply(inputs["gate"], inputs["up"])}


register(
    Impl("rope", "torch", "liger_rope", _rope, ROPE_CONTRACT, requires=liger_available,
         doc="Liger-Kernel LigerRopeFunction on HF's cos / sin tables in T (rotate-half, in "
             "place); Triton, CUDA only; optional extra kparity[liger]"),
    _liger("silu_mul", "liger_silu_mul", _silu_mul,
           param_is("rounding", "act", "torch:silu_mul for rounding='once'", other="once"),
           "LigerSiLUMulFunction: silu(gate) in f32 rounded to T, times up in T (rounding "
           "'act')"),
    _liger("rms_norm", "liger_rms_norm_llama", _rms_norm("llama"),
           param_is("rounding", "normed", "torch:liger_rms_norm_gemma for rounding='once'",
                    other="once"),
           "LigerRMSNormFunction, casting_mode 'llama' (x·inv rounded to T, then ·(offset + w))"),
    _liger("rms_norm", "liger_rms_norm_gemma", _rms_norm("gemma"),
           param_is("rounding", "once", "torch:liger_rms_norm_llama for rounding='normed'",
                    other="normed"),
           "LigerRMSNormFunction, casting_mode 'gemma' (all f32, one store)"),
)

"""PyTorch RoPE as users write it (`oracle/rope.py`).

`torch:rope_hf` is HF transformers' Llama path: the rope init functions' inv_freq in f32
(`_compute_default/llama3/yarn_parameters`), `LlamaRotaryEmbedding.forward`'s cos and sin for
the tokens' positions (times the attention factor) cast to T, then `apply_rotary_pos_emb`'s
q·cos + rotate_half(q)·sin in T (GPT-J's `rotate_every_two` for the interleaved pairing; a
partial rotary's tail concatenated back). Its cos, sin and products are held in T: contract
compute="T". Its table (3.5 ULPs off in llama3's f32 blend, at entries of |ln inv| ~ 7) is within
the default 2 (1 + |ln inv|) ULPs (tests/test_rope.py). Its table is made once per case's table
params and device (HF keeps inv_freq as a buffer on the device), not copied in every call.

`torch:rope_hf_compiled` is torch.compile of that forward (`rope_hf_fn`, static shapes: one
compile per case shape, Inductor fuses it into Triton kernels): the speed baseline a user gets
from compiling HF's model. CUDA only (`norms.compiled_twin`: it needs a GPU and Triton; on a CPU
it would need a C++ toolchain and seconds per shape). Inductor computes the T products in f32
and rounds at the store, which the "T" contract admits (each rounding is optional).

`torch:rope_polar` is Meta's reference form: `torch.polar(1, p·inv)` as complex64, q viewed as
complex pairs in f32, one complex multiply, cast back to T (compute="f32"); the table is
computed in float64 and rounded to f32 once (Meta's `apply_scaling` runs in Python floats):
it declares inv_freq 0.5 ULP.
"""

from __future__ import annotations

import math

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, param_is
from gpu_impls.impl import Impl
from gpu_impls.torch.norms import compiled_twin
from oracle.numerics import FUNCTION_ULPS, Numerics
from oracle.rope import POSITION_LIMIT, attention_factor, rotary_dim, yarn_range

POSITIONS_F32 = Invariant(
    name="positions < 2^24", holds=lambda ns: max(ns["positions"], default=0) < POSITION_LIMIT,
    why="positions are converted to f32, which holds integers exactly only below 2^24",
    fix=lambda ns: f"positions below {POSITION_LIMIT}",
    violation={"positions": (POSITION_LIMIT,)}, shows=("positions",))


def rope_contract(compute: str, alternative: str) -> Contract:
    """A RoPE impl's contract (torch and MLX alike): its arithmetic, `compute` "T" (in the
    input dtype, as HF writes it) or "f32" (one rounding at the store), with `alternative` the
    impl to use for the other; and positions held exactly in f32."""
    other = "f32" if compute == "T" else "T"
    return Contract(invariants=(param_is("compute", compute, alternative, other=other),
                                POSITIONS_F32))


def hf_inv_freq(case, torch):
    """HF transformers' inv_freq for the case, in f32 as `modeling_rope_utils` computes it."""
    p, dim = case.params, rotary_dim(case)
    inv = 1.0 / (p["theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    factor = p["factor"]
    if p["scaling"] == "llama3":
        low, high, orig = p["low_freq_factor"], p["high_freq_factor"], p["original_max_position"]
        wavelen = 2 * math.pi / inv
        llama = torch.where(wavelen > orig / low, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < orig / high) * ~(wavelen > orig / low)
        return torch.where(medium, smoothed, llama)
    if p["scaling"] == "yarn":
        low, high = yarn_range(case)
        pos_freqs = p["theta"] ** (torch.arange(0, dim, 2).float() / dim)
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low)
                           / ((high + 0.001 if high == low else high) - low), 0, 1)
        extrapolation = 1 - ramp
        return ((1.0 / (factor * pos_freqs)) * (1 - extrapolation)
                + (1.0 / pos_freqs) * extrapolation)
    return inv


def _rotate_half(x, torch):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x, torch):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def rope_hf_fn(q, k, positions, inv, m: float, r: int, gptj: bool):
    """HF's forward on the tensors (what `torch:rope_hf_compiled` compiles): cos and sin of the
    positions times inv_freq in f32, times m, cast to T; x*cos + rotate_half(x)*sin in T."""
    import torch

    # LlamaRotaryEmbedding.forward: inv_freq outer positions in f32, cos/sin, scaled, cast to T
    freqs = positions.float()[:, None] * inv[None, :]
    emb = freqs.repeat_interleave(2, dim=-1) if gptj else torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * m).to(q.dtype)[:, None, :]
    sin = (emb.sin() * m).to(q.dtype)[:, None, :]

    def apply(x):
        rot, rest = x[..., :r], x[..., r:]
        turned = _rotate_every_two(rot, torch) if gptj else _rotate_half(rot, torch)
        return torch.cat(((rot * cos) + (turned * sin), rest), dim=-1)

    return apply(q), apply(k)


# inv_freq per (table params, device), made once as HF's rotary embedding keeps it: a buffer
# on the device, not a host-to-device copy in every call
TABLE_PARAMS = ("rotary_dim", "theta", "scaling", "factor", "low_freq_factor",
                "high_freq_factor", "original_max_position", "beta_fast", "beta_slow", "truncate")
_DEVICE_TABLES: dict = {}


def device_hf_inv_freq(case, device, torch):
    """`hf_inv_freq(case)` on `device`, computed and copied there once."""
    key = (case.dims["head_dim"], *(case.params[n] for n in TABLE_PARAMS), str(device))
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = hf_inv_freq(case, torch).to(device)
    return _DEVICE_TABLES[key]


def _rope_hf(launch, inputs, outputs, case, fn=rope_hf_fn):
    import torch

    q = inputs["q"]
    q_out, k_out = fn(q, inputs["k"], inputs["positions"],
                      device_hf_inv_freq(case, q.device, torch), attention_factor(case),
                      rotary_dim(case), case.params["pairing"] == "gptj")
    return {"q_out": q_out, "k_out": k_out}


def _table_f32(case, torch):
    """inv_freq computed in float64 (the formulas of Meta's `apply_scaling` and HF's YaRN),
    rounded to f32 once."""
    p, dim = case.params, rotary_dim(case)
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    inv = 1.0 / p["theta"] ** (i / dim)
    if p["scaling"] == "llama3":
        low, high, orig = p["low_freq_factor"], p["high_freq_factor"], p["original_max_position"]
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - low) / (high - low)
        inv = torch.where(wavelen < orig / high, inv,
                          torch.where(wavelen > orig / low, inv / p["factor"],
                                      (1 - smooth) * inv / p["factor"] + smooth * inv))
    elif p["scaling"] == "yarn":
        low, high = yarn_range(case)
        ramp = ((i / 2 - low) / ((high + 0.001 if high == low else high) - low)).clamp(0, 1)
        inv = inv / p["factor"] * ramp + inv * (1 - ramp)
    return inv.float()


def _rope_polar(launch, inputs, outputs, case, table=_table_f32):
    import torch

    q, k = inputs["q"], inputs["k"]
    freqs = torch.outer(inputs["positions"].float(), table(case, torch).to(q.device))
    cis = torch.polar(torch.ones_like(freqs), freqs)[:, None, :]  # complex64 [tokens, 1, R/2]
    m = attention_factor(case)
    if m != 1.0:
        cis = cis * m
    r, gptj = rotary_dim(case), case.params["pairing"] == "gptj"

    def apply(x):
        rot = x[..., :r].float()
        if gptj:  # Meta's layout: consecutive elements are one complex number
            z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], -1, 2).contiguous())
            out = torch.view_as_real(z * cis).flatten(-2)
        else:
            z = torch.complex(rot[..., :r // 2], rot[..., r // 2:]) * cis
            out = torch.cat((z.real, z.imag), dim=-1)
        return torch.cat((out.to(x.dtype), x[..., r:]), dim=-1)

    return {"q_out": apply(q), "k_out": apply(k)}


# the table rounded once from float64: half an ULP
POLAR_NUMERICS = Numerics(ulps={**FUNCTION_ULPS, "inv_freq": 0.5})

ROPE_HF = Impl("rope", "torch", "rope_hf", _rope_hf,
               rope_contract("T", "torch:rope_polar (f32 throughout)"),
               doc="HF transformers: f32 inv_freq and cos/sin cast to T, "
                   "q*cos + rotate_half(q)*sin")
register(
    ROPE_HF, compiled_twin(ROPE_HF, rope_hf_fn),
    Impl("rope", "torch", "rope_polar", _rope_polar,
         rope_contract("f32", "torch:rope_hf (HF's T arithmetic); an f32 impl's T cases add "
                              "only a looser bound"),
         numerics=POLAR_NUMERICS, doc="Meta's torch.polar complex form in f32, rounded to T once"),
)

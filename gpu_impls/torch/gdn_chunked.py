"""PyTorch impls of the chunked GDN pipeline (`oracle/gdn_chunked.py`).

`torch:gdn_chunked` is the chunked form as users write it: HF transformers' Qwen3-Next
`torch_chunk_gated_delta_rule` (FLA's `naive_chunk_gated_delta_rule`): everything in f32, T padded
to a multiple of the chunk with zeros, the decay mask exp(g_i − g_j), (I + A)^-1 by row-by-row
forward substitution, u = X (v β), w = X (k β e^g), then per chunk v_new = u − w S, o = (q e^g) S
+ (q kᵀ ∘ decay, causal) v_new and S = e^{g_last} S + (k e^{g_last − g})ᵀ v_new; the output cast to
T once. q̂, k̂ are normalised in f32 and stored to T (FLA's `l2norm_fwd`; HF normalises in T's
arithmetic, a few more roundings than the contract admits). No intermediate is rounded to T: an
admissible impl of `gdn_chunked`, whose bound covers both.

`torch:fla_chunk_gated_delta_rule` is flash-linear-attention's `chunk_gated_delta_rule` (the
optional extra `kparity[fla]`: fla-core, Triton kernels, CUDA only; imported when it runs), a
peer impl: chunks of 64, bf16/f16 (its kernels refuse f32), the state V-first as ours. Upstream
it holds A in T and uses tf32 in the solve's merge dots where supported, which the solve's f32
bound does not admit: the end-to-end bound decides (issue 29: 0.6.0 died with an illegal address
at B=1, T=4096, H=16, K=V=128 bf16 on an H200; the sweep's isolation keeps such a case a row).

The stage impls (`torch:gdn_chunk_cumsum` ... `torch:gdn_chunk_o`) compute each stage in f32 on
the stored inputs, with the stage's own rounding points (w's and u's operands, T(S) in chunk_h's
dot, vdec, chunk_o's A tile): straightforward torch, the CPU reference a CUDA stage is compared
with. of the stage impls is the property test's (`tests/test_gdn_chunked.py`).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl
from gpu_impls.torch.extras import needs
from oracle.gdn import EPS, scale_of


def _torch():
    import torch

    return torch


def per_value_head(x, heads_v: int):
    """[B, T, Hk, K] -> [B, T, Hv, K]: value head h reads q/k head h // (Hv / Hk)."""
    return x.repeat_interleave(heads_v // x.shape[2], dim=2)


def chunks(x, c: int, edge: bool = False):
    """[B, T, ...] -> [B, NT, C, ...], padded past T with zeros (or the last value: a cumsum)."""
    torch = _torch()
    b, t = x.shape[:2]
    pad = -t % c
    if pad:
        fill = (x[:, -1:].expand(b, pad, *x.shape[2:]) if edge
                else x.new_zeros((b, pad) + tuple(x.shape[2:])))
        x = torch.cat([x, fill], dim=1)
    return x.reshape(b, -1, c, *x.shape[2:])


def unchunk(x, t: int):
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :t]


def decay_tile(gc, strict: bool):
    """exp(gc_i − gc_j) [B, NT, C(i), Hv, C(j)] masked to j < i (strict) or j <= i, f32."""
    torch = _torch()
    c = gc.shape[2]
    diff = gc[:, :, :, :, None] - gc.transpose(2, 3)[:, :, None, :, :]
    mask = torch.ones(c, c, dtype=torch.bool, device=gc.device).tril(-1 if strict else 0)
    mask = mask[None, None, :, None, :]
    return torch.where(mask, diff, torch.zeros_like(diff)).exp() * mask


# --- the stages ----------------------------------------------------------------------------------

def cumsum_stage(g, c: int):
    return unchunk(chunks(g.float(), c).cumsum(dim=2), g.shape[1])


def kkt_stage(k, beta, gc, c: int):
    hv = beta.shape[2]
    kc = chunks(per_value_head(k, hv).float(), c)  # [B, NT, C, Hv, K]
    dot = (kc.transpose(2, 3) @ kc.permute(0, 1, 3, 4, 2)).transpose(2, 3)  # [B,NT,C,Hv,C]
    a = chunks(beta.float(), c)[..., None] * dot * decay_tile(chunks(gc, c, edge=True), True)
    return unchunk(a, beta.shape[1])


def forward_substitution(a):
    """(I + L)^-1, L the strictly lower part of a [..., C, C], row by row in f32 (HF's loop:
    row i of −L accumulates the rows above it)."""
    torch = _torch()
    c = a.shape[-1]
    x = -a.tril(-1)
    for i in range(1, c):
        row = x[..., i, :i].clone()
        x[..., i, :i] = row + (row.unsqueeze(-1) * x[..., :i, :i]).sum(-2)
    return x + torch.eye(c, dtype=a.dtype, device=a.device)


def solve_stage(a, c: int):
    tiles = chunks(a.float(), c).transpose(2, 3)  # [B, NT, Hv, C, C]
    return unchunk(forward_substitution(tiles).transpose(2, 3), a.shape[1])


def wy_stage(k, v, beta, gc, ai, c: int, dtype):
    hv = beta.shape[2]
    beta, gc = beta.float(), gc.float()
    kb = (per_value_head(k, hv).float() * (beta * gc.exp())[..., None]).to(dtype).float()
    vb = (v.float() * beta[..., None]).to(dtype).float()
    x = chunks(ai.float(), c).transpose(2, 3)  # [B, NT, Hv, C(i), C(j)]
    w = x @ chunks(kb, c).transpose(2, 3)  # [B, NT, Hv, C, K]
    u = x @ chunks(vb, c).transpose(2, 3)
    return unchunk(w.transpose(2, 3), beta.shape[1]), unchunk(u.transpose(2, 3), beta.shape[1])


def chunk_h_stage(k, w, u, gc, h0, c: int, dtype):
    """(h [B, NT, Hv, V, K] f32 before its store, v_new [B, T, Hv, V] f32, the final state)."""
    torch = _torch()
    t, hv = gc.shape[1], gc.shape[2]
    kc = chunks(per_value_head(k, hv).float(), c)
    wc, uc, gcc = chunks(w.float(), c), chunks(u.float(), c), chunks(gc.float(), c, edge=True)
    nt = kc.shape[1]
    last = [min(c, t - n * c) - 1 for n in range(nt)]
    valid = (torch.arange(nt * c, device=gc.device) < t).reshape(nt, c)
    s = h0.float().clone()
    hs, v_new = [], []
    for n in range(nt):
        hs.append(s)
        hn = s.to(dtype).float()
        vn = uc[:, n] - torch.einsum("bihk,bhvk->bihv", wc[:, n], hn)
        v_new.append(vn)
        g_last = gcc[:, n, last[n]]  # [B, Hv]
        d = (g_last[:, None] - gcc[:, n]).exp() * valid[n][None, :, None]
        vdec = (vn * d[..., None]).to(dtype).float()
        s = s * g_last.exp()[:, :, None, None] + torch.einsum("bihv,bihk->bhvk", vdec, kc[:, n])
    return torch.stack(hs, dim=1), unchunk(torch.stack(v_new, dim=1), t), s


def chunk_o_stage(q, k, v_new, h, gc, c: int, scale: float, dtype):
    hv = gc.shape[2]
    qc = chunks(per_value_head(q, hv).float(), c)  # [B, NT, C, Hv, K]
    kc = chunks(per_value_head(k, hv).float(), c)
    gcc = chunks(gc.float(), c, edge=True)
    inter = (qc.transpose(2, 3) @ h.float().transpose(-1, -2)).transpose(2, 3)  # [B,NT,C,Hv,V]
    inter = inter * gcc.exp()[..., None]
    qk = (qc.transpose(2, 3) @ kc.permute(0, 1, 3, 4, 2)).transpose(2, 3)  # [B,NT,C,Hv,C]
    tile = (qk * decay_tile(gcc, False)).to(dtype).float()
    intra = (tile.transpose(2, 3) @ chunks(v_new.float(), c).transpose(2, 3)).transpose(2, 3)
    return unchunk((inter + intra) * scale, gc.shape[1])


# --- the impls -----------------------------------------------------------------------------------

def _chunk(case) -> int:
    return case.params["chunk"]


def _t(case):
    """The case dtype T as torch's."""
    torch = _torch()
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[case.dtype]


def _cumsum(launch, inputs, outputs, case):
    return {"gc": cumsum_stage(inputs["g"], _chunk(case))}


def _kkt(launch, inputs, outputs, case):
    return {"A": kkt_stage(inputs["k"], inputs["beta"], inputs["gc"].float(), _chunk(case))}


def _solve(launch, inputs, outputs, case):
    return {"Ai": solve_stage(inputs["A"], _chunk(case)).to(_t(case))}


def _wy(launch, inputs, outputs, case):
    w, u = wy_stage(inputs["k"], inputs["v"], inputs["beta"], inputs["gc"], inputs["Ai"],
                    _chunk(case), _t(case))
    return {"w": w.to(_t(case)), "u": u.to(_t(case))}


def _chunk_h(launch, inputs, outputs, case):
    h, v_new, state = chunk_h_stage(inputs["k"], inputs["w"], inputs["u"], inputs["gc"],
                                    inputs["h0"], _chunk(case), _t(case))
    return {"h": h.to(_t(case)), "v_new": v_new.to(_t(case)), "state": state}


def _chunk_o(launch, inputs, outputs, case):
    o = chunk_o_stage(inputs["q"], inputs["k"], inputs["v_new"], inputs["h"], inputs["gc"],
                      _chunk(case), scale_of(case), _t(case))
    return {"o": o.to(_t(case))}


def l2norm(x):
    """x · rsqrt(Σx² + eps) in f32, stored to x's dtype (FLA's `l2norm_fwd`)."""
    torch = _torch()
    x32 = x.float()
    return (x32 * torch.rsqrt((x32 * x32).sum(-1, keepdim=True) + EPS)).to(x.dtype)


def chunk_gated_delta_rule(q, k, v, g, beta, h0, c: int, scale: float, use_l2norm: bool):
    """HF's `torch_chunk_gated_delta_rule` in this layout (q, k [B, T, Hk, K], v [B, T, Hv, V],
    g, beta [B, T, Hv], h0 [B, Hv, V, K]): (o f32 [B, T, Hv, V], final state f32)."""
    torch = _torch()
    t, hv = g.shape[1], g.shape[2]
    if use_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = per_value_head(q, hv).float() * scale
    k = per_value_head(k, hv).float()
    v, beta, g = v.float(), beta.float(), g.float()
    # [B, Hv, NT, C, ...] as HF lays them out
    qc, kc, vc = (chunks(x, c).permute(0, 3, 1, 2, 4) for x in (q, k, v))
    bc, gc = (chunks(x, c).permute(0, 3, 1, 2) for x in (beta, g))
    gc = gc.cumsum(dim=-1)
    mask_up = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(0)
    decay = ((gc[..., :, None] - gc[..., None, :]).tril().exp().float()).tril()
    kb, vb = kc * bc[..., None], vc * bc[..., None]
    attn = -((kb @ kc.transpose(-1, -2)) * decay).masked_fill(mask_up, 0)
    for i in range(1, c):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(c, dtype=attn.dtype, device=attn.device)
    u = attn @ vb
    w = attn @ (kb * gc.exp()[..., None])
    state = h0.float().transpose(-1, -2).clone()  # HF's [K, V] state
    out = torch.zeros_like(u)
    strict_up = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    for n in range(qc.shape[2]):
        q_i, k_i = qc[:, :, n], kc[:, :, n]
        attn_i = (q_i @ k_i.transpose(-1, -2) * decay[:, :, n]).masked_fill_(strict_up, 0)
        v_new = u[:, :, n] - w[:, :, n] @ state
        inter = (q_i * gc[:, :, n, :, None].exp()) @ state
        out[:, :, n] = inter + attn_i @ v_new
        g_last = gc[:, :, n, -1]
        state = (state * g_last[..., None, None].exp()
                 + (k_i * (g_last[..., None] - gc[:, :, n]).exp()[..., None]).transpose(-1, -2)
                 @ v_new)
    o = out.permute(0, 2, 3, 1, 4).reshape(out.shape[0], -1, hv, out.shape[-1])[:, :t]
    return o, state.transpose(-1, -2)


def _chunked(launch, inputs, outputs, case):
    o, state = chunk_gated_delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                      inputs["beta"], inputs["h0"], _chunk(case),
                                      scale_of(case), case.params["l2norm"])
    return {"o": o.to(_t(case)), "state": state.contiguous()}


# fla's kernels are Triton; fla is imported only when the impl runs
_fla_available = needs("fla's chunk_gated_delta_rule (Triton kernels)", ("triton", "fla"),
                       "pip install 'kparity[fla]'")


def _fla(launch, inputs, outputs, case):
    """flash-linear-attention's `chunk_gated_delta_rule` (fla-core 0.6.0): chunks of 64, the
    state V-first as ours ([B, Hv, V, K], `state_v_first=True`), GVA native, l2norm in kernel."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    o, state = fla_chunk(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                         scale=scale_of(case), initial_state=inputs["h0"].float(),
                         output_final_state=True,
                         use_qk_l2norm_in_kernel=bool(case.params["l2norm"]),
                         state_v_first=True)
    return {"o": o.to(_t(case)), "state": state.float().contiguous()}


FLA_CONTRACT = Contract(
    invariants=(param_is("chunk", 64, "torch:chunk_gated_delta_rule", other=16),),
    dtypes=("f16", "bf16"))  # fla's chunk kernels assert q.dtype != fp32

STAGE_DOC = "f32 on the stored inputs, the stage's own rounding points (module docstring)"

register(
    Impl("gdn_chunk_cumsum", "torch", "gdn_chunk_cumsum", _cumsum,
         doc="cumsum over each zero-padded chunk, f32"),
    Impl("gdn_kkt", "torch", "gdn_kkt", _kkt, doc="β (k kᵀ) ∘ exp(gc_i − gc_j), strictly lower; "
         + STAGE_DOC),
    Impl("gdn_solve_tril", "torch", "gdn_solve_tril", _solve,
         doc="(I + A)^-1 by HF's row-by-row forward substitution in f32, stored to T"),
    Impl("gdn_wy", "torch", "gdn_wy", _wy, doc="Ai @ T(k β e^gc), Ai @ T(v β); " + STAGE_DOC),
    Impl("gdn_chunk_h", "torch", "gdn_chunk_h", _chunk_h,
         doc="the state loop over chunks, T(S) in the dot, T(vdec); " + STAGE_DOC),
    Impl("gdn_chunk_o", "torch", "gdn_chunk_o", _chunk_o,
         doc="the seed kernel's formula: inclusive causal tile rounded to T, scale after"),
    Impl("gdn_chunked", "torch", "chunk_gated_delta_rule", _chunked,
         doc="HF Qwen3-Next torch_chunk_gated_delta_rule: f32, row-by-row forward substitution"),
    Impl("gdn_chunked", "torch", "fla_chunk_gated_delta_rule", _fla, FLA_CONTRACT,
         requires=_fla_available,
         doc="flash-linear-attention (fla-core 0.6.0) chunk_gated_delta_rule, Triton, CUDA "
             "only; optional extra kparity[fla]"),
)

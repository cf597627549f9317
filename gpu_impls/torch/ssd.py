"""PyTorch Mamba-2 scans (`oracle/ssd.py`, `oracle/ssd_chunked.py`), as users write them, in f32.

`torch:ssd_scan` is the sequential loop over `step` (mamba_ssm's `selective_state_update_ref`
per token, HF Mamba2's decode branch): dt = softplus(dt_raw + dt_bias) (clamped where the case
says), dA = exp(dt A), S = S dA + (dt x) ⊗ B, y = Σ_n S C + D x, y *= silu(z). `torch:ssm_step`
is one call of that same `step` on the same per-token shapes (so T calls of it reproduce the loop
bit for bit, in either state layout: `tests/test_ssd.py`); `torch:ssd_scan_varlen` runs the
loop per packed sequence, reading the offsets from cu_seqlens and resetting the state to h0[s] at
each start. Every intermediate is f32, y is rounded to T once.

`torch:ssd_chunked` is the chunked listing: mamba_ssm's `ssd_minimal_discrete` (the stable
`segsum`; torch.einsum, contracting left to right) as HF Mamba2's `torch_forward` feeds it: f32
throughout, X = x·dt, A·dt, B and C repeated per head, T zero-padded to a multiple of the chunk,
then y = Y + D x and the gate. CUDA where torch sees a GPU, else CPU.

None declares batch invariance: on a CPU, F.softplus and F.silu round a vector body and a scalar
tail differently and a row's place in the batch picks which (measured: torch:ssm_step at batch
8 differs from each row alone); the chunked listing's einsums reorder their sums by shape.
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl
from oracle.ssd import dt_limits


def _torch():
    import torch

    return torch


def time_step(dt_raw, dt_bias, case):
    """softplus(dt_raw + dt_bias) in f32, clamped to [dt_min, dt_max] where the case says."""
    import torch.nn.functional as F

    dt = F.softplus(dt_raw.float() + dt_bias)
    lo, hi = dt_limits(case)
    if lo > 0 or hi is not None:
        dt = dt.clamp(min=lo if lo > 0 else None, max=hi)
    return dt


def per_head(bc, heads: int):
    """B or C [..., G, N] -> [..., H, N] in f32: head h reads group h // (H / G)."""
    return bc.float().repeat_interleave(heads // bc.shape[-2], dim=-2)


def step(state, x, dt_raw, dt_bias, A, b, c, D, z, case):
    """One token, f32: state [B, H, P, N]; x [B, H, P] (T); dt_raw [B, H] (T); dt_bias, A, D
    [H]; b, c [B, G, N] (T); z [B, H, P] or None. Returns (y [B, H, P] f32, the new state)."""
    import torch.nn.functional as F

    torch = _torch()
    heads = x.shape[1]
    x = x.float()
    dt = time_step(dt_raw, dt_bias, case)
    decay = torch.exp(dt * A)
    b, c = per_head(b, heads), per_head(c, heads)
    state = state * decay[..., None, None] + (dt[..., None] * x)[..., None] * b[..., None, :]
    y = (state * c[..., None, :]).sum(-1) + D[:, None] * x
    if z is not None:
        y = y * F.silu(z.float())
    return y, state


def scan(inputs: dict, case, h0, step=step):
    """The token loop over [B, T, ...] inputs from state h0: (y f32 [B, T, H, P], the final
    state). Each token's slices are made contiguous, so `step` sees what `torch:ssm_step` sees."""
    torch = _torch()
    A = -torch.exp(inputs["A_log"])
    gate = case.params["gate"]
    state, ys = h0, []
    for t in range(inputs["x"].shape[1]):
        at = lambda name: inputs[name][:, t].contiguous()  # noqa: E731
        y, state = step(state, at("x"), at("dt_raw"), inputs["dt_bias"], A, at("Bm"), at("Cm"),
                        inputs["D"], at("z") if gate else None, case)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def _scan(launch, inputs, outputs, case, step=step):
    y, state = scan(inputs, case, inputs["h0"], step)
    return {"y": y.to(inputs["x"].dtype), "state": state}


def _varlen(launch, inputs, outputs, case, step=step, reset=True):
    """Per packed sequence from cu_seqlens: the loop from h0[s] (`reset`; a mutant's False
    carries the previous sequence's state instead)."""
    torch = _torch()
    cu = [int(v) for v in inputs["cu_seqlens"].tolist()]
    ys, states, state = [], [], inputs["h0"][0:1]
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        seq = {k: (v[:, lo:hi] if k in ("x", "dt_raw", "Bm", "Cm") else v)
               for k, v in inputs.items()}
        if case.params["gate"]:
            seq["z"] = inputs["z"][:, lo:hi]
        y, state = scan(seq, case, inputs["h0"][s:s + 1] if reset or s == 0 else state, step)
        ys.append(y)
        states.append(state)
    return {"y": torch.cat(ys, dim=1).to(inputs["x"].dtype), "states": torch.cat(states, 0)}


def _ssm_step(launch, inputs, outputs, case, step=step):
    """One `step`; the hnp layout [B, H, N, P] transposed in and out (contiguous: the same
    arithmetic as hpn)."""
    torch = _torch()
    hnp = case.params["layout"] == "hnp"
    state = inputs["state_in"]
    if hnp:
        state = state.transpose(-1, -2).contiguous()
    y, state = step(state, inputs["x"], inputs["dt_raw"], inputs["dt_bias"],
                    -torch.exp(inputs["A_log"]), inputs["Bm"], inputs["Cm"], inputs["D"],
                    inputs["z"] if case.params["gate"] else None, case)
    if hnp:
        state = state.transpose(-1, -2).contiguous()
    return {"y": y.to(inputs["x"].dtype), "state_out": state}


# --- the chunked listing -------------------------------------------------------------------------

def segsum(x):
    """`ssd_minimal`'s stable segsum: [..., T] -> [..., T, T], Σ_{j<m<=i} x_m below the
    diagonal, 0 on it, −inf above."""
    torch = _torch()
    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)  # "... d -> ... d e"
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    x_segsum = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=0)
    return x_segsum.masked_fill(~mask, -torch.inf)


def ssd_minimal_discrete(X, A, B, C, block_len: int, initial_states=None):
    """Listing 1 of the Mamba-2 paper (`mamba_ssm/modules/ssd_minimal.py`): X [b, T, h, p],
    A [b, T, h], B, C [b, T, h, n], T a multiple of block_len. Returns (Y [b, T, h, p], the
    final state [b, h, p, n])."""
    import torch.nn.functional as F

    torch = _torch()
    chunk = lambda v: v.reshape(v.shape[0], -1, block_len, *v.shape[2:])  # noqa: E731
    X, A, B, C = (chunk(v) for v in (X, A, B, C))
    A = A.permute(0, 3, 1, 2)  # "b c l h -> b h c l"
    A_cumsum = torch.cumsum(A, dim=-1)
    # 1. the diagonal blocks (intra-chunk)
    L = torch.exp(segsum(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    # 2. each chunk's own state
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    # 3. the inter-chunk recurrence
    if initial_states is None:
        initial_states = torch.zeros_like(states[:, :1])
    states = torch.cat([initial_states, states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    # 4. state -> output
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, state_decay_out)
    Y = Y_diag + Y_off
    return Y.reshape(Y.shape[0], -1, *Y.shape[3:]), final_state


def chunked(inputs: dict, case, h0):
    """HF Mamba2's `torch_forward` around `ssd_minimal_discrete`: (y f32 [B, T, H, P], the final
    state)."""
    import torch.nn.functional as F

    torch = _torch()
    x = inputs["x"].float()
    b, t, heads, _ = x.shape
    dt = time_step(inputs["dt_raw"], inputs["dt_bias"], case)  # [B, T, H]
    A = -torch.exp(inputs["A_log"])
    pad = -t % case.params["chunk"]
    padded = lambda v: F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad))  # noqa: E731  T at dim 1
    X = padded(x * dt[..., None])
    Y, state = ssd_minimal_discrete(X, padded(A * dt), padded(per_head(inputs["Bm"], heads)),
                                    padded(per_head(inputs["Cm"], heads)), case.params["chunk"],
                                    h0[:, None])
    y = Y[:, :t] + inputs["D"][:, None] * x
    if case.params["gate"]:
        y = y * F.silu(inputs["z"].float())
    return y, state


def _chunked(launch, inputs, outputs, case):
    y, state = chunked(inputs, case, inputs["h0"])
    return {"y": y.to(inputs["x"].dtype), "state": state.contiguous()}


register(
    Impl("ssd_scan", "torch", "ssd_scan", _scan,
         doc="the sequential loop (selective_state_update_ref per token) in f32, y rounded once"),
    Impl("ssm_step", "torch", "ssm_step", _ssm_step,
         doc="one token of torch:ssd_scan's loop (bit-identical to it), hpn or hnp state"),
    Impl("ssd_scan_varlen", "torch", "ssd_scan_varlen", _varlen,
         doc="torch:ssd_scan's loop per cu_seqlens sequence, the state reset to h0[s] at each"),
    Impl("ssd_chunked", "torch", "ssd_chunked", _chunked,
         doc="ssd_minimal_discrete (stable segsum, einsum) as HF Mamba2 feeds it, f32, padded"),
)

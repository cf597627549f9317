"""Rotary position embedding, `rope` (seeds: metaltile-std `src/ffai/rope_llama*.rs`,
`rope_yarn.rs`, `src/mlx/rope.rs`): q and k of one attention layer rotated in one op, each token
at its own position.

    q [tokens, Hq, D], k [tokens, Hkv, D] in T; positions [tokens] i32 (param `positions`: a
    decode batch at arbitrary positions, or packed prefill rows with their own positions)

Per token t and pair i < R/2 (R = `rotary_dim`, 0: all of D; the D - R elements past it are
copied; partial rotary, Qwen3-Next's R = D/4):

    inv_i = theta^(-2i/R)                         plain ("none")
    angle = p_t · inv_i
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) · m
    pairing "neox" (rotate-half, HF's default): (x_i, x_{i+R/2});  "gptj" (interleaved,
    Meta's complex form, mx.fast.rope's traditional=True): (x_{2i}, x_{2i+1})

Frequency scaling (`scaling`), HF `modeling_rope_utils` with the model configs' names:

    llama3  wavelen = 2 pi / inv; inv / factor where wavelen > orig / low_freq_factor, inv
            where wavelen < orig / high_freq_factor, else (1 - s) inv / factor + s inv with
            s = (orig / wavelen - low) / (high - low)            (orig: original_max_position)
    yarn    low, high = the correction range of beta_fast and beta_slow rotations over orig
            (floored/ceiled where `truncate`); ramp_i = clip((i - low) / (high - low), 0, 1);
            inv = inv / factor · ramp + inv · (1 - ramp); m = attention_factor, or where 0
            0.1 ln(factor) + 1 (m is 1 without YaRN)

The oracle computes the table, the angles and the rotation in float64; m is read as f32 (like
eps of a norm); the output is rounded to T once, at the store.

Contract and tolerance (`rope_kernel`, run in `oracle/numerics.py`'s arithmetic):

    inv~  = the kernel's f32 table, within k (1 + |ln inv|)     (`inv_freq`, declared per impl:
            ULPs of inv                                         default 2, torch:rope_polar's
                                                                float64 table 0.5; theta^0 = 1
                                                                exact)
    angle = f32(p · inv~)                                       p exact in f32: p < 2^24
    c, s  = cos, sin of that angle                              2 ULPs of 1 each
    out   = x1 c - x2 s ...                                     two products and a sum, f32
            (· m: `prod3`, any association, where m != 1)
    compute "T": HF's apply_rotary_pos_emb in T (cos and sin cast to T, each product, m·cos
            or mlx-lm's m·x with m itself in T, held in T; mx.fast.rope on CPU): each of those
            may be rounded to T (`may_round`); an f32 kernel passes it too
    store T

The angle's error is the dominant term past a few thousand positions:

    |angle~ - p inv| <= p · k (1 + |ln inv|) ulp(inv) + ulp(angle) / 2 =: e

(the table's conditioning: exp or pow of an f32 exponent x = ln inv carries the exponent's
rounding, |x| u relative, into the entry; measured ULPs grow so, tests/test_rope.py)
    |cos(angle~) - cos(p inv)| <= min(e, |sin| e + e^2 / 2) + 2 · 2^-23   (likewise sin)
    |out~ - out| ~<= e (|x1 sin| + |x2 cos|) <= e r                        (r the pair's norm)

At p = 131071 and inv in [1/2, 1) (the first pairs, |ln inv| < 0.7): p · 2 · 1.2 · 2^-24 =
0.019 and half an ULP of an angle near 10^5 is 2^-8, so e = 0.023 rad: the bound there is
~0.02 r in every dtype, ten times bf16's half ULP at 1 (2^-9 relative). With e ~ 3.4 p u
(u = 2^-24) against T's half ULP, the store's rounding dominates below p ~ 2^13 (bf16) or 2^10
(f16); in f32 the angle's error does from the first positions on. A kernel whose table is off
by more than it declares, or whose positions slip by one (an angle off by inv ~ 1 rad), fails
at any position; pairing (i, i+1) where (i, i + R/2) is declared fails everywhere.
tests/test_rope.py measures the bound against torch's actual error at p = 131071: the worst
element of the first pairs uses 0.7-0.85 of it (torch:rope_polar, a table declared 0.5 ULP)
and 0.35 (torch:rope_hf, the default 2 ULPs for a table off by 0.5-1).

NaN and inf inputs propagate as in IEEE through the formula (a NaN in x1 makes both outputs of
its pair NaN; inf · sin(0) at position 0 is NaN, as in every impl that multiplies). An inf
times a cos or sin whose interval in the kernel model holds 0 (the angle's error reaches a zero
of it: at far positions, e ~ 0.02 rad, one pair in ~80) may come out with either sign, or NaN
where the kernel's factor is an exact 0: the oracle marks those outputs (`nonfinite_free`), where
any NaN or ±inf is admitted and a finite value is not.
"""

from __future__ import annotations

import math

import numpy as np

from oracle.builders import kernel_view
from oracle.comparators import NONFINITE_FREE
from oracle.spec import OpSpec, TensorSpec, register

POSITION_LIMIT = 1 << 24  # f32 holds every integer position below it exactly


def tokens(p) -> int:
    return len(p["positions"])


Q = lambda d, p: (tokens(p), d["heads_q"], d["head_dim"])  # noqa: E731
K = lambda d, p: (tokens(p), d["heads_kv"], d["head_dim"])  # noqa: E731
POSITIONS = lambda d, p: (tokens(p),)  # noqa: E731


def rotary_dim(case) -> int:
    """R: the rotated prefix of each head (even, at most head_dim)."""
    d = case.dims["head_dim"]
    r = case.params["rotary_dim"] or d
    if r % 2 or r > d:
        raise ValueError(f"rope: rotary_dim={r} must be even and at most head_dim={d} "
                         f"(0: the whole head)")
    return r


def yarn_range(case) -> tuple[float, float]:
    """HF's `find_correction_range`: the pair indices where beta_fast and beta_slow rotations
    fit in the original context, floored/ceiled where `truncate`, clipped to [0, R - 1]."""
    p, r = case.params, rotary_dim(case)

    def dim(rotations: float) -> float:
        return (r * math.log(p["original_max_position"] / (rotations * 2 * math.pi))
                / (2 * math.log(p["theta"])))

    low, high = dim(p["beta_fast"]), dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, r - 1)


def _unscaled(case) -> tuple[np.ndarray, np.ndarray]:
    """(i, inv0_i = theta^(-2i/R)): the table before any frequency scaling (float64)."""
    r = rotary_dim(case)
    i = np.arange(r // 2, dtype=np.float64)
    return i, case.params["theta"] ** (-2.0 * i / r)


def _llama3_band(case, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama3's bands of the unscaled table: (low, medium) masks (wavelen > orig / low:
    divided by the factor; the medium band blended) and the blend's s."""
    p = case.params
    low, high, orig = p["low_freq_factor"], p["high_freq_factor"], p["original_max_position"]
    wavelen = 2 * math.pi / inv
    s = (orig / wavelen - low) / (high - low)
    low_band = wavelen > orig / low
    return low_band, ~low_band & ~(wavelen < orig / high), s


def inv_freq(case) -> np.ndarray:
    """The exact table inv_i, i < R/2, with the case's frequency scaling (float64)."""
    p = case.params
    i, inv = _unscaled(case)
    factor = p["factor"]
    if p["scaling"] == "llama3":
        low_band, medium, s = _llama3_band(case, inv)
        smooth = (1 - s) * inv / factor + s * inv
        return np.where(low_band, inv / factor, np.where(medium, smooth, inv))
    if p["scaling"] == "yarn":
        low, high = yarn_range(case)
        ramp = np.clip((i - low) / ((high + 0.001 if high == low else high) - low), 0, 1)
        return inv / factor * ramp + inv * (1 - ramp)
    return inv


def table_conditioning(case, table: np.ndarray) -> np.ndarray:
    """Per entry, the factor on the impl's declared table ULPs: 1 + |ln inv| (an exponent's
    rounding carried through exp or pow), and for llama3's medium band, where the entry is the
    blend (1 - s) inv0 / f + s inv0 = inv0 / f · (1 + s (f - 1)) of the unscaled inv0, its
    amplification of inv0's error through s: wavelen = 2 pi / inv0 carries inv0's relative
    error d (plus two roundings), s = (orig / wavelen - low) / (high - low) moves by
    (orig / wavelen) (d + 3u) / (high - low), and the blend by that times
    (f - 1) / (1 + s (f - 1)) relative, A for short. So (1 + |ln inv|)(1 + A) + 3A + 5: the
    three roundings before s times A, five in the blend (one each: 1 - s, / f, two products,
    the sum). HF's f32 table at head_dim 96, theta 5e5, factor 32 is 25.8 ULPs off at an entry
    of s = 0.022 (A = 6.5), past the 2 (1 + |ln inv|) = 22 ULPs of the plain conditioning."""
    cond = 1.0 + np.abs(np.log(table))
    p = case.params
    if p["scaling"] != "llama3":
        return cond
    low, high, f = p["low_freq_factor"], p["high_freq_factor"], p["factor"]
    _, medium, s = _llama3_band(case, _unscaled(case)[1])
    s = np.clip(s, 0.0, 1.0)
    ratio = s * (high - low) + low  # orig / wavelen
    amp = np.where(medium, ratio / (high - low) * (f - 1) / (1 + s * (f - 1)), 0.0)
    return cond * (1 + amp) + np.where(medium, 3 * amp + 5, 0.0)


def attention_factor(case) -> float:
    """m, read as f32: YaRN's attention factor (0.1 ln(factor) + 1 unless given), else 1."""
    p = case.params
    if p["scaling"] != "yarn":
        return 1.0
    m = p["attention_factor"] or (0.1 * math.log(p["factor"]) + 1.0 if p["factor"] > 1 else 1.0)
    return float(np.float32(m))


def _positions(v: dict) -> np.ndarray:
    pos = v["positions"]
    if pos.size and pos.max() >= POSITION_LIMIT:
        raise ValueError(f"rope: position {int(pos.max())} >= 2^24: f32 holds positions exactly "
                         f"only below {POSITION_LIMIT}")
    return pos


def _halves(x: np.ndarray, case):
    """(x1, x2, rest): the pairs' first and second elements and the unrotated tail."""
    r = rotary_dim(case)
    if case.params["pairing"] == "gptj":
        return x[..., 0:r:2], x[..., 1:r:2], x[..., r:]
    return x[..., :r // 2], x[..., r // 2:r], x[..., r:]


def _join(concat, o1, o2, rest, case):
    """The rotated pairs back in the pairing's layout, the tail after them."""
    if case.params["pairing"] == "gptj":
        shape = o1.shape[:-1] + (2 * o1.shape[-1],)
        rotated = concat([o1.reshape(*o1.shape, 1), o2.reshape(*o2.shape, 1)], -1).reshape(*shape)
        return concat([rotated, rest], -1)
    return concat([o1, o2, rest], -1)


def rope(inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    angle = (_positions(v)[:, None] * inv_freq(case))[:, None, :]  # [tokens, 1, R/2]
    m = attention_factor(case)
    c, s = np.cos(angle) * m, np.sin(angle) * m

    def rotate(x):
        x1, x2, rest = _halves(x, case)
        return _join(np.concatenate, x1 * c - x2 * s, x2 * c + x1 * s, rest, case)

    out = {"q_out": rotate(v["q"]), "k_out": rotate(v["k"])}
    for name, x in (("q_out", v["q"]), ("k_out", v["k"])):
        if np.isinf(x).any():
            out[name + NONFINITE_FREE] = nonfinite_free(x, case, v)
    return out


def nonfinite_free(x: np.ndarray, case, v: dict) -> np.ndarray:
    """Where an infinite x1 or x2 meets a cos or sin whose interval in the kernel model (the
    widest declaration: `FUNCTION_ULPS`) holds 0, or a value T may round to 0 (compute "T"):
    the output's sign is the kernel's rounding's (module docstring)."""
    from oracle.dtypes import spacing
    from oracle.numerics import Bounds, model_for

    angle = _angle(Bounds(model_for(case)), v, case)
    # held in T, a factor below half T's least subnormal is 0 (inf · 0: NaN)
    floor = 0.5 * float(spacing(0.0, case.dtype)) if case.params["compute"] == "T" else 0.0
    c_open, s_open = ((np.abs(f.v) <= f.e + floor) for f in (angle.cos(), angle.sin()))
    x1, x2, rest = _halves(np.isinf(x), case)
    return _join(np.concatenate, (x1 & c_open) | (x2 & s_open), (x2 & c_open) | (x1 & s_open),
                 np.zeros_like(rest), case)


def _angle(A, v: dict, case):
    """The kernel's angles [tokens, 1, R/2]: each position times its table entry (the table
    within the impl's declared ULPs, `table_conditioning`)."""
    pos, table = _positions(v), inv_freq(case)
    inv = A.table("inv_freq", table, table_conditioning(case, table))
    return (A.load(pos.reshape(-1, 1)) * inv.reshape(1, -1)).reshape(len(pos), 1, -1)


def rope_kernel(A, inputs: dict, case) -> dict:
    """The admissible kernel (module docstring): table, angle, cos/sin, rotation."""
    v = kernel_view(inputs, case)
    angle = _angle(A, v, case)
    c, s = angle.cos(), angle.sin()
    m = attention_factor(case)
    T, in_t = case.dtype, case.params["compute"] == "T"

    def rotate(x):
        x1, x2, rest = (A.load(h) for h in _halves(x, case))
        if m == 1.0:
            forms = [_plain(x1, x2, c, s, T if in_t else None)]
        elif not in_t:
            M = A.load(m)
            forms = [(A.prod3(x1, c, M) - A.prod3(x2, s, M),
                      A.prod3(x2, c, M) + A.prod3(x1, s, M))]
        else:  # HF: m times cos and sin; mlx-lm: m (as T) times x; either held in T
            M = A.load(m)
            Mt = M.may_round(T)
            forms = [_plain(x1, x2, (c * M).may_round(T), (s * M).may_round(T), T),
                     _plain((x1 * Mt).may_round(T), (x2 * Mt).may_round(T), c, s, T)]
        o1 = forms[0][0] if len(forms) == 1 else A.either(forms[0][0], forms[1][0])
        o2 = forms[0][1] if len(forms) == 1 else A.either(forms[0][1], forms[1][1])
        return _join(A.concat, o1, o2, rest, case)

    return {"q_out": rotate(v["q"]), "k_out": rotate(v["k"])}


def _plain(x1, x2, c, s, T):
    """x1 c - x2 s and x2 c + x1 s in f32; with T, cos, sin and each product may be in T."""
    if T is None:
        return x1 * c - x2 * s, x2 * c + x1 * s
    c, s = c.may_round(T), s.may_round(T)
    return ((x1 * c).may_round(T) - (x2 * s).may_round(T),
            (x2 * c).may_round(T) + (x1 * s).may_round(T))


def _flops(case) -> int:
    d = case.dims
    return 6 * tokens(case.params) * (d["heads_q"] + d["heads_kv"]) * (rotary_dim(case) // 2)


PARAMS = {
    "positions": (0, 17, 4095, 32767, 131071),  # a decode batch up to 128k context
    "pairing": "neox", "rotary_dim": 0, "theta": 10000.0, "scaling": "none", "factor": 1.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8192,
    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": 1, "attention_factor": 0.0,
    "compute": "f32", "ftz": 0,
}

register(OpSpec(
    name="rope", family="rope", dims=("heads_q", "heads_kv", "head_dim"), domain=rotary_dim,
    inputs=(TensorSpec("q", Q), TensorSpec("k", K),
            TensorSpec("positions", POSITIONS, role="i32", init="positions", adversarial=False)),
    outputs=(TensorSpec("q_out", Q), TensorSpec("k_out", K)),
    oracle=rope, tolerance=None, kernel=rope_kernel,
    bytes=lambda case: case.spec.io_bytes(case), flops=_flops, params=PARAMS,
    param_values={"pairing": ("neox", "gptj"), "scaling": ("none", "llama3", "yarn"),
                  "compute": ("f32", "T"), "truncate": (1, 0)},
    doc=__doc__, chain_input="q"))

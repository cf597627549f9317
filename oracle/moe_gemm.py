"""MoE grouped GEMM and the expert MLP over rows sorted by expert (the counting-sort layout of
`oracle/moe_route.py`'s `moe_dispatch`; seeds: metaltile-std `src/ffai/moe.rs`,
`moe_down_swiglu_accum.rs`).

Rows arrive sorted by expert (`moe_dispatch`'s layout): `offsets` [E+1] i32, the rows of expert e
are x[offsets[e]:offsets[e+1]]; an expert may own no row, or more rows than one 64-row tile.
Here the offsets come from the case's param `routing` (`expert_counts`): a fixed layout per case,
built in NumPy, so this family never depends on the router's ops.

`moe_grouped_gemm`: x [M, K] (T), the experts' weights [E, N, K], offsets -> y [M, N] (T):

    y[i, n] = sum_k x[i, k] W[e(i), n, k]          e(i): the expert whose segment holds row i

param `weights`: "dense" (w [E, N, K] in T) or "affine4" (MLX affine int4, group 64: w_q, scales,
biases [E, ...] as `dequant_gemv_expert_indexed` takes them, `oracle/quant.py`); the other
form's inputs are empty. float64 from the stored values, f32 accumulation, one rounding to T.

Tolerance (derived): each y[i, n] is one K-term dot of one row against one expert's row of W,
exactly a GEMV row: the kernel model is the GEMV's (`oracle.gemv.gemv_kernel_on`, both admissible
forms for affine4; the f32 products and any-order sum for dense) run per expert segment, so the
bound is the GEMV's. Neither M nor E enters: rows never meet in a sum.

`moe_experts`: the expert MLP over the sorted rows, x [M, H] (T), w_up [E, U, H], w_down
[E, H, I] (T, dense), offsets -> y [M, H] (T):

    h = x W_up[e]^T (f32),  a = act(h) (f32),  a_T = RNE_T(a)  (declared rounding point),
    y = a_T W_down[e]^T (f32), rounded to T once at the store.

param `act`: "relu2" (Nemotron-H: a = relu(h)^2, U = I) or "silu_mul" (Qwen3-MoE: gate|up fused,
U = 2I, rows [0, I) of W_up the gate and [I, 2I) the up: a = silu(h_gate) h_up). Tolerance
(derived): the two GEMMs as above, relu exact (1-Lipschitz: the interval passes through) and its
square one rounding, silu_mul as the `silu_mul` op's kernel model, the declared rounding point
as an interval (`Val.round_to`: the kernel may round a neighbour of the exact value to the other
side), then the second GEMM over the rounded interval. Against the seeds (the GEMV's
[5e-3, 5e-2, 2e-1], `docs/seed_kernels.md`): the bound relative to the output RMS stays below
bf16's loosest, tests/test_moe_gemm.py.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view, silu
from oracle.dtypes import round_to
from oracle.gemv import gemv_kernel_on
from oracle.quant import dequantize, unpack
from oracle.spec import OpSpec, TensorSpec, register

BITS, GROUP = 4, 64  # the affine4 layout: MLX int4, group 64
ROUTINGS = ("balanced", "hot", "sparse", "random")


def expert_counts(rows: int, experts: int, routing: str) -> np.ndarray:
    """Rows per expert [E] for a routing layout (deterministic from rows and experts):
    * balanced: rows spread evenly, the first rows % E experts one more;
    * hot: expert E // 2 takes all but ~1/4 of the rows, which go one each to the odd experts
      (the even ones empty): one expert over several 64-row tiles;
    * sparse: the even experts empty, the rows balanced over the odd ones;
    * random: a uniform multinomial draw (empty experts where the draw leaves them)."""
    e = np.arange(experts)
    if routing == "balanced":
        return rows // experts + (e < rows % experts).astype(np.int64)
    if routing == "sparse":
        odd = e[1::2] if experts > 1 else e
        counts = np.zeros(experts, np.int64)
        counts[odd] = expert_counts(rows, len(odd), "balanced")
        return counts
    if routing == "hot":
        hot = experts // 2
        counts = np.zeros(experts, np.int64)
        others = [i for i in e[1::2] if i != hot][:rows // 4]
        counts[others] = 1
        counts[hot] = rows - len(others)
        return counts
    if routing == "random":
        rng = np.random.default_rng([rows, experts, 31])
        return rng.multinomial(rows, np.full(experts, 1.0 / experts)).astype(np.int64)
    raise ValueError(f"routing {routing!r}: one of {ROUTINGS}")


def offsets_of(case) -> np.ndarray:
    """offsets [E+1]: the CSR row offsets of the case's routing layout."""
    counts = expert_counts(case.dims["rows"], case.dims["experts"], case.params["routing"])
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _offsets_init(shape, dtype, rng, case, drawn):
    return offsets_of(case)


def segments(inputs: dict):
    """(e, lo, hi) for every expert that owns rows, from the offsets input."""
    off = np.asarray(inputs["offsets"]).astype(np.int64)
    return [(e, int(off[e]), int(off[e + 1])) for e in range(len(off) - 1)
            if off[e + 1] > off[e]]


def _domain(case) -> None:
    d, p = case.dims, case.params
    if d["rows"] < 1 or d["experts"] < 1:
        raise ValueError(f"{case.op}: rows {d['rows']}, experts {d['experts']}: at least one each")
    if p.get("weights") == "affine4" and d["in"] % GROUP:
        raise ValueError(f"moe_grouped_gemm: in {d['in']} is no multiple of the affine4 group "
                         f"{GROUP}: use in = {d['in'] // GROUP * GROUP or GROUP}")


# --- moe_grouped_gemm -------------------------------------------------------------------------

def expert_weights(inputs: dict, e: int, case) -> np.ndarray:
    """W[e] [N, K] in float64 as the op defines it (dense, or q s + b for affine4)."""
    if case.params["weights"] == "dense":
        return np.asarray(inputs["w"][e]).astype(np.float64)
    return dequantize(inputs["w_q"][e], inputs["scales"][e], inputs["biases"][e], BITS, GROUP)


def moe_grouped_gemm(inputs: dict, case) -> dict:
    """y[lo:hi] = x[lo:hi] W[e]^T per expert segment, float64."""
    x = kernel_view({"x": inputs["x"]}, case)["x"]
    y = np.zeros((case.dims["rows"], case.dims["out"]))
    for e, lo, hi in segments(inputs):
        y[lo:hi] = x[lo:hi] @ expert_weights(inputs, e, case).T
    return {"y": y}


def _gemm_rows(A, inputs: dict, e: int, x, case):
    """The admissible kernel of x [m, K] (a loaded Val/Adverse) against expert e's weights."""
    if case.params.get("weights", "dense") == "dense":
        w = A.load(np.asarray(inputs["w"][e]).astype(np.float64))
        return A.sum(w * x.reshape(x.shape[0], 1, x.shape[-1]))
    q = A.load(unpack(inputs["w_q"][e], BITS, case.dims["in"]).astype(np.float64))
    s = A.load(np.repeat(np.asarray(inputs["scales"][e]).astype(np.float64), GROUP, axis=-1))
    b = A.load(np.repeat(np.asarray(inputs["biases"][e]).astype(np.float64), GROUP, axis=-1))
    return gemv_kernel_on(A, q, s, b, x, GROUP)


def _concat(A, parts):
    return parts[0] if len(parts) == 1 else A.concat(parts, axis=0)


def grouped_gemm_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view({"x": inputs["x"]}, case)["x"]
    parts = [_gemm_rows(A, inputs, e, A.load(x[lo:hi]), case) for e, lo, hi in segments(inputs)]
    return {"y": _concat(A, parts)}


def _dense(shape):
    return lambda d, p: shape(d) if p["weights"] == "dense" else (0,)


def _affine(shape):
    return lambda d, p: shape(d) if p["weights"] == "affine4" else (0,)


def _used(case) -> int:
    """Experts that own rows: a kernel reads only their weights."""
    return int(np.count_nonzero(expert_counts(case.dims["rows"], case.dims["experts"],
                                              case.params["routing"])))


def _used_bytes(weights: tuple[str, ...]):
    """bytes(case): every input and output once, but of the stacked expert weights `weights`
    only the experts that own rows (a decode step reads k of E experts)."""
    def bytes_of(case) -> int:
        from oracle.dtypes import storage_dtype

        d, spec = case.dims, case.spec
        unused = 0
        for t in spec.inputs:
            if t.name in weights:
                size = int(np.prod(t.shape_of(case))) * storage_dtype(t.dtype(case)).itemsize
                unused += size * (d["experts"] - _used(case)) // d["experts"]
        return spec.io_bytes(case) - unused
    return bytes_of


OFFSETS = TensorSpec("offsets", lambda d: (d["experts"] + 1,), role="i32", init=_offsets_init,
                     adversarial=False)

register(OpSpec(
    name="moe_grouped_gemm", family="moe", dims=("rows", "experts", "in", "out"),
    inputs=(TensorSpec("x", lambda d: (d["rows"], d["in"]), init="activation"),
            TensorSpec("w", _dense(lambda d: (d["experts"], d["out"], d["in"])), init="data",
                       adversarial=False),
            TensorSpec("w_q", _affine(lambda d: (d["experts"], d["out"], d["in"] * BITS // 32)),
                       role="u32", init="codes"),
            TensorSpec("scales", _affine(lambda d: (d["experts"], d["out"], d["in"] // GROUP)),
                       init="qscale"),
            TensorSpec("biases", _affine(lambda d: (d["experts"], d["out"], d["in"] // GROUP)),
                       init="qbias"),
            OFFSETS),
    outputs=(TensorSpec("y", lambda d: (d["rows"], d["out"])),),
    oracle=moe_grouped_gemm, tolerance=None, kernel=grouped_gemm_kernel, domain=_domain,
    bytes=_used_bytes(("w", "w_q", "scales", "biases")),
    flops=lambda case: 2 * case.dims["rows"] * case.dims["out"] * case.dims["in"],
    params={"weights": "dense", "routing": "balanced", "ftz": 0},
    param_values={"weights": ("dense", "affine4"), "routing": ROUTINGS},
    doc=__doc__, inf_may_be_nan=True, chain_input="x"))


# --- moe_experts ------------------------------------------------------------------------------

def _up_rows(d, p) -> int:
    return d["inter"] * (2 if p["act"] == "silu_mul" else 1)


def activation(h: np.ndarray, case) -> np.ndarray:
    """act(h) in float64 over h [m, U]."""
    inter = case.dims["inter"]
    if case.params["act"] == "relu2":
        return np.maximum(h, 0.0) ** 2
    return silu(h[:, :inter]) * h[:, inter:]


def moe_experts(inputs: dict, case) -> dict:
    """y[lo:hi] = RNE_T(act(x W_up[e]^T)) W_down[e]^T per expert segment, float64."""
    v = kernel_view({k: inputs[k] for k in ("x", "w_up", "w_down")}, case)
    y = np.zeros((case.dims["rows"], case.dims["hidden"]))
    for e, lo, hi in segments(inputs):
        a = round_to(activation(v["x"][lo:hi] @ v["w_up"][e].T, case), case.dtype)
        y[lo:hi] = a.astype(np.float64) @ v["w_down"][e].T
    return {"y": y}


def _relu(h):
    """relu of an interval or one emulated kernel: exact, 1-Lipschitz (the error passes)."""
    from oracle.numerics import Adverse, Val

    if isinstance(h, Val):
        return Val(np.maximum(h.v, 0.0), h.e, h.m)
    assert isinstance(h, Adverse)
    return Adverse(np.maximum(h.x, 0.0), h.m, h.ch)


def _act_kernel(A, h, case):
    inter = case.dims["inter"]
    if case.params["act"] == "relu2":
        r = _relu(h)
        return r * r
    gate, up = h.at((slice(None), slice(0, inter))), h.at((slice(None), slice(inter, None)))
    one = A.load(1.0)
    return A.prod3(gate, one / (one + gate.neg().exp()), up)


def experts_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view({k: inputs[k] for k in ("x", "w_up", "w_down")}, case)
    parts = []
    for e, lo, hi in segments(inputs):
        x = A.load(v["x"][lo:hi])
        h = A.sum(A.load(v["w_up"][e]) * x.reshape(hi - lo, 1, x.shape[-1]))
        a = _act_kernel(A, h, case).round_to(case.dtype)
        parts.append(A.sum(A.load(v["w_down"][e]) * a.reshape(hi - lo, 1, a.shape[-1])))
    return {"y": _concat(A, parts)}


def _experts_flops(case) -> int:
    d = case.dims
    return 2 * d["rows"] * d["hidden"] * (_up_rows(d, case.params) + d["inter"])


register(OpSpec(
    name="moe_experts", family="moe", dims=("rows", "experts", "hidden", "inter"),
    inputs=(TensorSpec("x", lambda d: (d["rows"], d["hidden"]), init="activation"),
            TensorSpec("w_up", lambda d, p: (d["experts"], _up_rows(d, p), d["hidden"]),
                       init="data", adversarial=False),
            TensorSpec("w_down", lambda d: (d["experts"], d["hidden"], d["inter"]),
                       init="activation", adversarial=False),
            OFFSETS),
    outputs=(TensorSpec("y", lambda d: (d["rows"], d["hidden"])),),
    oracle=moe_experts, tolerance=None, kernel=experts_kernel, domain=_domain,
    bytes=_used_bytes(("w_up", "w_down")), flops=_experts_flops,
    params={"act": "relu2", "routing": "balanced", "ftz": 0},
    param_values={"act": ("relu2", "silu_mul"), "routing": ROUTINGS},
    doc=__doc__, inf_may_be_nan=True, chain_input="x"))

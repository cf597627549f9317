"""A Llama decode loop made of kparity's registered ops (issue 28's model-level gate).

One decode step at position p, token t, over L layers (`models/plan.py` names each op's role;
every arrow is one registered op, every value it produces stored in T, the case dtype, as a
kernel stores it and the next one loads it, `oracle/pipeline.py`):

    h      = quant_embedding(E, t)                     [1, hidden]     embed
    x_0    = rms_norm(h, w_attn[0])                                    attn_norm
    for layer l (r_0 = h; y_{-1} the previous layer's MLP output):
      r, x = add_rms_norm(r, y, w_attn[l])             (l >= 1)        attn_add_norm
      q, k, v = W_q x, W_k x, W_v x                    dequant_gemv    q/k/v_proj
      q, k = rope(q, k, p)                             θ, pairing      rope
      K_l[p], V_l[p] = k, v                            in place        kv_update
      a = softmax(q Kᵀ / √D) V over keys 0..p          GQA             attention
      o = W_o a                                                        o_proj
      r, x = add_rms_norm(r, o, w_ffn[l])                              ffn_add_norm
      y = W_down (silu(W_gate x) · W_up x)             silu_mul        gate/up/down_proj
    _, x = add_rms_norm(r, y, w_final)                                 final_add_norm
    logits = W_lm x                                    [vocab]         lm_head

The residual stream r is add_rms_norm's `residual_out`, T(r + y): a bf16 (or f16) residual
stream, as every half-precision inference engine keeps it. Weights are quantized (MLX affine,
`models/weights.py`); their scales and biases are stored in T, and a T that would round them is
refused (`check_dtype`: a Q4_1 GGUF's f16 scales need T = f16 or f32); norm weights are rounded
to T (the ops' `w` is a T tensor), identically in every plan.

Plans (`models/plan.py`): the reference plan runs every op's float64 oracle on the previous
op's stored outputs, NumPy in storage dtypes: the exact composition, T(o_k(T(o_{k-1}(...)))).
An impl plan runs each role's impl on its backend's device arrays: each role's `Case` and its
contract's launch are built once per shape (and per position for rope and kv_update, whose
params carry it), outputs allocated once per role and layer, `impl.run` called directly; a
value crosses to another backend only where consecutive roles run on different ones (DLPack
between torch and CuPy on one GPU, else through the host). The KV cache is kv_cache_update's
aliased output, updated in place (MLX, functional, returns the updated cache).

Teacher-forced: `logits(tokens, prefill=n)` returns the logits after each given token,
whatever the model would predict. The first n tokens (a prompt, from position 0) go through
one prefill pass: the same roles on n rows (norms rows=n, rope at positions 0..n-1, the n
k and v rows appended to the cache by one kv_cache_update), except that each projection is a
`qmm` over the n rows and attention is `sdpa_prefill_varlen`, causal over the prompt's own k
and v (the cache is empty before it); its lm_head gives all n rows' logits. The rest are
decode steps. prefill=0 (the default) decodes every token as a step; the reference plan's
logits are the same either way (qmm's oracle is dequant_gemv's per row, the prefill
attention's the decode's per query: the same float64 math).

Beside the loop: each role's case and impl (`models/role_cases.py`), where values live and how
they cross backends (`models/backends.py`), and its timing (`models/decode_speed.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpu_impls.backend import Backend
from models.backends import NUMPY, backend_named, cupy_on, dlpack, home
from models.plan import ADAPTABLE, REFERENCE_IMPL, ROLES, ModelError, Plan
from models.plan import plan as builtin_plan
from models.role_cases import GEMV_ROLES, check_dtype, resolve_role, role_case, role_layers
from models.weights import QuantMatrix, Weights
from oracle.dtypes import round_to, storage_dtype
from oracle.quant import dequantize

POSITION_ROLES = ("rope", "kv_update")
STEP_ROWS = ("positions", "lengths", "slots", "ids")  # a decode step's index rows (`_table`)  # their cases carry the position in a param
# Prepared weights (`Decoder._prepare`) a decoder keeps at most: SmolLM2-135M's f32 W_hat
# take 0.54 GB; Llama-3-8B's would take 32 GB beside its 4.5 GB of codes.
PREPARE_BYTES = 4 * 2**30


# --- one role at one layer ---------------------------------------------------------------------

@dataclass
class RoleOp:
    """What runs role `role` at one layer: the impl (None: the oracle), its backend, its case
    and launch per position (`launches`, shared by the layers whose impl and case agree; one
    entry for the roles whose case does not carry the position), its inputs that never change
    (`static`: weights, norm weights, on its backend), the outputs allocated once (in-place
    backends), and `cross`: the inputs that arrive from another backend (found at the first
    call; None before it)."""

    role: str
    impl: object
    backend: Backend
    base: object
    launches: dict = field(default_factory=dict)
    static: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    cross: tuple | None = None
    moves: bool = False  # the case carries the step's position (decode's rope and kv_update)
    inputs: tuple = ()   # (name, dtype) of the op's inputs
    aliased: tuple = ()  # (output, the input it updates in place)

    def __post_init__(self):
        spec, case = self.base.spec, self.base
        self.inputs = tuple((t.name, t.dtype(case)) for t in spec.inputs)
        self.aliased = tuple((t.name, t.aliases) for t in spec.outputs if t.aliases)

    @property
    def impl_id(self) -> str:
        return REFERENCE_IMPL if self.impl is None else self.impl.id

    def at(self, position: int):
        """(case, launch) at `position`, built and contract-checked once."""
        key = position if self.moves else 0
        got = self.launches.get(key)
        if got is None:
            case = self.base
            if self.role == "rope":
                case = case.replace(positions=(position,) * len(case.params["positions"]))
            elif self.role == "kv_update":
                case = case.replace(cache_lens=(position,) * len(case.params["cache_lens"]))
            launch = None if self.impl is None else self.impl.contract.check(self.impl.id, case)
            got = self.launches[key] = (case, launch)
        return got


def run_oracle(case, inputs: dict, dequantized: dict | None = None) -> dict:
    """The op's float64 oracle, each output rounded to its dtype in its storage dtype (a
    pipeline stage's stored output, `Pipeline.run_oracles`). `dequantized`: a memo of the
    dequant_gemv and qmm oracles' w_hat per weight (by the codes array's identity; the
    reference plan applies each matrix at every step: 1.2 -> ~0.1 s a SmolLM2 step on this
    machine, and a prefill pass's qmm reads the same w_hat)."""
    spec = case.spec
    with np.errstate(invalid="ignore", over="ignore"):
        if dequantized is not None and spec.name in ("dequant_gemv", "qmm"):
            key = id(inputs["w"])
            if key not in dequantized:
                dequantized[key] = (inputs["w"], dequantize(
                    inputs["w"], inputs["scales"], inputs["biases"], case.dims["bits"],
                    case.dims["group_size"]))
            exact = spec.oracle(inputs, case, w_hat=dequantized[key][1])
        else:
            exact = spec.oracle(inputs, case)
    return {t.name: round_to(np.asarray(exact[t.name], dtype=np.float64), t.dtype(case))
            for t in spec.outputs}


class Decoder:
    """The decode loop of `weights` under `plan` at case dtype `dtype`, with a KV cache of
    `max_len` positions (module docstring). `impls`: role -> the impl ids that run it (one per
    role unless layers differ); `adapted`: role -> the `ADAPTABLE` params its impl runs with,
    where they differ from the reference's; `notes`: how values cross backends, where that
    is not the direct way. `on_tokens`: called with the number of tokens each decode step
    or prefill pass of `logits` and the timings completes, outside any timed region (the
    CLI's progress bars); None: nothing."""

    on_tokens = None

    def __init__(self, weights: Weights, plan: Plan | str = "reference", dtype: str = "bf16",
                 max_len: int = 256, graph: bool = False, batch: int = 1):
        self.plan = builtin_plan(plan) if isinstance(plan, str) else plan
        self.weights, self.config, self.dtype, self.max_len = weights, weights.config, dtype, \
            int(max_len)
        check_dtype(weights, dtype)
        if not isinstance(batch, int) or batch < 1:
            raise ModelError(f"batch={batch!r}: the number of sequences a step decodes, >= 1")
        self.batch = batch
        self.notes: list[str] = []
        self.backends: dict[str, Backend] = {}
        self._device: dict = {}
        self._shared: dict = {}  # (impl, case id) -> launches: one per position, every layer
        self._dequantized: dict = {}  # the reference's w_hat per weight (`run_oracle`)
        self._prepared: dict = {}  # an impl's prepared weights (`_prepare`)
        self._prepared_bytes = 0
        self._prefill: dict[int, dict] = {}  # prompt length -> the prefill pass's ops
        self._direct = False
        self.ops = self._build(0)
        self.graph = self.graph_failed = False
        self._graph = self._graph_out = self._step = self._captured_at = None
        if graph:
            self.use_graph()
        self.reset()

    def _build(self, prefill: int) -> dict:
        """The ops of a decode step (`prefill` 0) or of the prefill pass over `prefill`
        tokens: resolved (`resolve_role`), their static inputs and outputs allocated."""
        ops = {}
        for role in ROLES:
            for layer in role_layers(role, self.config.layers):
                impl, case = resolve_role(self.plan, role, self.weights, layer, self.dtype,
                                          self.max_len, prefill=prefill,
                                          batch=1 if prefill else self.batch)
                key = (None if impl is None else impl.id, case.id)
                op = RoleOp(role, impl, NUMPY if impl is None else backend_named(impl.backend),
                            case, self._shared.setdefault(key, {}),
                            moves=role in POSITION_ROLES and not prefill)
                op.at(0)  # position 0's case is checked too
                ops[(role, layer)] = op
        for op in ops.values():
            self.backends.setdefault(op.backend.name, op.backend)
        self._direct = self._pick_transfer()
        self._allocate(ops)
        return ops

    def prefill_ops(self, n: int) -> dict:
        """The prefill pass's ops for an n-token prompt (built once per n)."""
        if n not in self._prefill:
            self._prefill[n] = self._build(n)
        return self._prefill[n]

    # --- setup ------------------------------------------------------------------------------

    @property
    def impls(self) -> dict[str, list[str]]:
        """role -> the impl ids of its decode-step ops (`prefill_impls` for a prefill)."""
        return _impl_ids(self.ops)

    def prefill_impls(self, n: int) -> dict[str, list[str]]:
        """role -> the impl ids of the prefill pass over n tokens."""
        return _impl_ids(self.prefill_ops(n))

    @property
    def adapted(self) -> dict[str, dict]:
        out = {}
        for (role, layer), op in self.ops.items():
            ref = role_case(role, self.weights, layer, self.dtype, self.max_len).params
            diff = {n: op.base.params[n] for n in ADAPTABLE
                    if n in ref and op.base.params[n] != ref[n]}
            if diff:
                out[role] = diff
        return out

    def _allocate(self, ops: dict) -> None:
        """Each op's static inputs on its backend (uploaded once per backend, shared by the
        ops that read them), and its outputs once per role and layer on the backends that
        write in place (the aliased caches excepted: the loop passes the cache itself)."""
        w = self.weights
        for (role, layer), op in ops.items():
            b = op.backend
            if role == "embed":
                op.static = self._weight(b, "embedding", w.embedding)
            elif role in GEMV_ROLES or role == "lm_head":
                key, m = ("lm_head", w.lm_head) if role == "lm_head" else \
                    (f"L{layer}.{GEMV_ROLES[role]}", getattr(w.layers[layer], GEMV_ROLES[role]))
                key = "embedding" if m is w.embedding else key
                op.static = self._weight(b, key, m)
                if op.impl is not None and op.impl.prepare is not None:
                    op.static = self._prepare(op, key)
            elif role in ("attn_norm", "attn_add_norm"):
                op.static = {"w": self._norm(b, f"L{layer}.attn_norm", w.layers[layer].attn_norm)}
            elif role == "ffn_add_norm":
                op.static = {"w": self._norm(b, f"L{layer}.ffn_norm", w.layers[layer].ffn_norm)}
            elif role == "final_add_norm":
                op.static = {"w": self._norm(b, "final_norm", w.final_norm)}
            elif role == "attention" and op.base.op == "sdpa_decode":
                op.static = {"sinks": self.dev(b, "no_sinks", lambda: np.zeros(0, np.float32))}
            elif role == "attention":  # prefill: one sequence of n rows
                n = op.base.params["q_lens"][0]
                cu = self.dev(b, f"cu_seqlens{n}", lambda: np.array([0, n], np.int32))
                op.static = {"cu_seqlens_q": cu, "cu_seqlens_k": cu}
            if b.writes_in_place:
                case = op.base
                op.buffers = {t.name: b.to_device(np.zeros(t.shape_of(case),
                                                           storage_dtype(t.dtype(case))))
                              for t in case.spec.outputs if not t.aliases}

    def dev(self, backend: Backend, key: str, host):
        """The host array `host()` on `backend`, uploaded once under `key`."""
        k = (backend.name, key)
        if k not in self._device:
            self._device[k] = backend.to_device(host())
        return self._device[k]

    def _weight(self, backend: Backend, key: str, m: QuantMatrix) -> dict:
        t = self.dtype
        return {"w": self.dev(backend, key + ".codes", lambda: m.codes),
                "scales": self.dev(backend, key + ".scales", lambda: round_to(m.scales, t)),
                "biases": self.dev(backend, key + ".biases", lambda: round_to(m.biases, t))}

    def _prepare(self, op: RoleOp, key: str) -> dict:
        """`op.static` (weight `key`) with what its impl's `prepare` makes of it (`Impl.prepare`:
        torch:dequant_linear's f32 W_hat), made once per weight and prepare function (the
        decode step's GEMV and the prefill's qmm share it) and kept as long as the decoder.

        Sound because the weights are static over a run: uploaded once (`dev`), read by the
        ops as inputs only, never an output; the prepared value is a function of them and of
        the case's bits, group size and width, the same at every position, so each call runs
        the impl's `run` on the same tensors it would have made itself (the same bits,
        tests/test_model_prepare.py); `load` checks that no torch weight was written since
        (`_check_prepared`). Past `PREPARE_BYTES` of prepared tensors, the other weights go
        unprepared (the impl makes them at each call, as the op-level check and bench always
        do) and `notes` says so. Freed with the decoder."""
        k = (op.backend.name, key, op.impl.prepare)
        if k not in self._prepared:
            if self._prepared_bytes >= PREPARE_BYTES:
                note = (f"{op.impl.id}: past {PREPARE_BYTES / 2**30:.0f} GiB of prepared "
                        "weights, the others are prepared at each call")
                if note not in self.notes:
                    self.notes.append(note)
                return op.static
            extra = op.impl.prepare(op.static, op.base)
            self._prepared_bytes += sum(getattr(v, "nbytes", 0) for v in extra.values())
            self._prepared[k] = (_versions(op.static), {**op.static, **extra})
        return self._prepared[k][1]

    def _check_prepared(self) -> None:
        """RuntimeError where a prepared weight was written since it was prepared (its torch
        version moved): an impl wrote an input, and the prepared value would be stale."""
        for (_, key, _), (versions, static) in self._prepared.items():
            if _versions(static, versions) != versions:
                raise RuntimeError(f"weight {key} was written during the run (an impl wrote "
                                   "its input): its prepared form is stale")

    def _norm(self, backend: Backend, key: str, w: np.ndarray):
        return self.dev(backend, key, lambda: round_to(w, self.dtype))

    def reset(self) -> None:
        """Empty KV caches (zeros: finite, never attended) on each layer's kv_update backend,
        and the index tables (positions, lengths) on every backend."""
        cfg = self.config
        shape = (self.batch, cfg.kv_heads, self.max_len, cfg.head_dim)
        zeros = np.zeros(shape, storage_dtype(self.dtype))
        self.k_cache, self.v_cache = [], []
        for layer in range(cfg.layers):
            backend = self.ops[("kv_update", layer)].backend
            self.k_cache.append(backend.to_device(zeros.copy()))
            self.v_cache.append(backend.to_device(zeros.copy()))
        self._tokens, self._ids = None, {}
        self._graph = self._graph_out = None  # it holds the old caches' addresses

    # --- moving values between backends --------------------------------------------------------

    def _pick_transfer(self) -> bool:
        """Whether torch <-> CuPy values cross by DLPack (zero copy on one GPU): where both
        run and a round trip of a test vector returns its bits; else through the host."""
        if not {"torch", "cuda"} <= set(self.backends):
            return False
        x = round_to(np.linspace(-3, 3, 7), self.dtype)
        try:
            torch_b, cuda_b = self.backends["torch"], self.backends["cuda"]
            there = dlpack(torch_b.to_device(x), "torch", "cuda", self.dtype)
            back = dlpack(cuda_b.to_device(x), "cuda", "torch", self.dtype)
            ok = (cuda_b.to_host(there, self.dtype).tobytes() == x.tobytes()
                  and torch_b.to_host(back, self.dtype).tobytes() == x.tobytes())
        except Exception as e:  # an old CuPy or torch: the host path is slower, not wrong
            self.notes.append(f"torch <-> cuda through the host (DLPack failed: {e})")
            return False
        if not ok:
            self.notes.append("torch <-> cuda through the host (DLPack changed the bits)")
        return ok

    def _to(self, backend: Backend, value, dtype: str):
        """`value` (a T activation or cache) as an array of `backend`."""
        src = home(value)
        if src == backend.name:
            return value
        if self._direct and {src, backend.name} == {"torch", "cuda"}:
            return dlpack(value, src, backend.name, dtype)
        return backend.to_device(backend_named(src).to_host(value, dtype))

    # --- the step ----------------------------------------------------------------------------

    def _run(self, op: RoleOp, position: int, inputs: dict) -> dict:
        """`op` at `position` on `inputs` (its static inputs added): its outputs, device
        arrays of its backend."""
        case, launch = op.at(position)
        inputs = {**op.static, **inputs}
        if op.cross is None:  # which inputs come from another backend: fixed by the plan
            op.cross = tuple((name, dtype) for name, dtype in op.inputs
                             if home(inputs[name]) != op.backend.name)
        for name, dtype in op.cross:
            inputs[name] = self._to(op.backend, inputs[name], dtype)
        if op.impl is None:
            return run_oracle(case, inputs, self._dequantized)
        outputs = None
        if op.backend.writes_in_place:
            outputs = {**op.buffers, **{out: inputs[src] for out, src in op.aliased}}
        got = op.impl.run(launch, inputs, outputs, case)
        return outputs if got is None else {**(outputs or {}), **got}

    def _table(self, backend: Backend, name: str):
        """Index tables [max_len, batch] on `backend`, row p for the step at position p:
        "positions" (p), "lengths" (p + 1), "slots" (sequence b's cache slot b·max_len + p),
        "ids" (the loaded tokens, transposed)."""
        if name == "ids":
            if backend.name not in self._ids:
                self._ids[backend.name] = backend.to_device(np.ascontiguousarray(self._tokens.T))
            return self._ids[backend.name]
        return self.dev(backend, f"{name}{self.batch}", lambda: self._step_rows(name))

    def _step_rows(self, name: str, position=None) -> np.ndarray:
        """Table `name` (`_table`) on the host: every position's row, or `position`'s."""
        p = np.arange(self.max_len, dtype=np.int32)[:, None] if position is None else \
            np.array([[position]], dtype=np.int32)
        b = np.arange(self.batch, dtype=np.int32)[None, :]
        rows = {"positions": p + 0 * b, "lengths": p + 1 + 0 * b,
                "slots": b * self.max_len + p}[name]
        return np.ascontiguousarray(rows if position is None else rows[0])

    def _pass(self, ops: dict, p: int, n: int):
        """The layers over n tokens at positions p..p+n-1 (module docstring): a decode step
        (`self.ops`, n = 1) or the prefill pass (`prefill_ops(n)`, p = 0). The logits: a device
        array of the lm_head's backend, [vocab] for a step, [n, vocab] for the prefill."""
        cfg = self.config
        hidden, hq, hkv, d, inter = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, \
            cfg.intermediate
        prefill = ops is not self.ops

        def run(role, layer, inputs):
            return self._run(ops[(role, layer)], p, inputs)

        def rows(role, layer, name):
            return self._rows(ops[(role, layer)].backend, name, p, n, prefill)

        def proj(role, layer, x, width):  # qmm takes [rows, in], dequant_gemv [in]
            shape = (n, width) if ops[(role, layer)].base.op == "qmm" else (width,)
            return run(role, layer, {"x": x.reshape(shape)})["out"]

        h = run("embed", 0, {"ids": rows("embed", 0, "ids")})["out"]
        r, y = h, None
        for l in range(cfg.layers):
            if l == 0:
                x = run("attn_norm", 0, {"x": h})["out"]
            else:
                got = run("attn_add_norm", l, {"a": r, "b": y})
                r, x = got["residual_out"], got["normed_out"]
            q = proj("q_proj", l, x, hidden)
            k = proj("k_proj", l, x, hidden)
            v = proj("v_proj", l, x, hidden).reshape((n, hkv, d))
            rot = run("rope", l, {"q": q.reshape((n, hq, d)), "k": k.reshape((n, hkv, d)),
                                  "positions": rows("rope", l, "positions")})
            kv = run("kv_update", l, {"k_cache": self.k_cache[l], "v_cache": self.v_cache[l],
                                      "k": rot["k_out"], "v": v,
                                      "slots": rows("kv_update", l, "slots")})
            self.k_cache[l], self.v_cache[l] = kv["k_cache"], kv["v_cache"]
            if prefill:  # causal over the prompt's own rows
                a = run("attention", l, {"q": rot["q_out"], "k": rot["k_out"], "v": v})["out"]
            else:
                a = run("attention", l, {"lengths": rows("attention", l, "lengths"),
                                         "q": rot["q_out"], "k": self.k_cache[l],
                                         "v": self.v_cache[l]})["out"]
            o = proj("o_proj", l, a, hq * d).reshape((n, hidden))
            got = run("ffn_add_norm", l, {"a": r, "b": o})
            r, x = got["residual_out"], got["normed_out"]
            g = proj("gate_proj", l, x, hidden).reshape((n, inter))
            u = proj("up_proj", l, x, hidden).reshape((n, inter))
            s = run("silu_mul", l, {"gate": g, "up": u})["out"]
            y = proj("down_proj", l, s, inter).reshape((n, hidden))
        final = run("final_add_norm", 0, {"a": r, "b": y})
        return proj("lm_head", 0, final["normed_out"], hidden)

    def _rows(self, backend: Backend, name: str, p: int, n: int, prefill: bool):
        """Rows p..p+n-1 of the index table `name` (`_table`) on `backend`; a decode step in
        graph mode reads the step's own one-row tables instead (`use_graph`). A prefill (one
        sequence): rows p..p+n-1; a decode step: row p, one entry per sequence."""
        if self.graph and not prefill:
            return self._step[backend.name][name]
        table = self._table(backend, name)
        return table[p:p + n, 0] if prefill else table[p]

    def forward(self, position: int):
        """One decode step at `position` for the token loaded there (`load`): the logits, a
        device array [vocab] of the lm_head's backend. In graph mode (`use_graph`) the step
        is a CUDA graph, recorded at the first step after each `load` and replayed."""
        if not self.graph:
            return self._pass(self.ops, position, self.batch)
        self._set_step(position)
        if self._graph is None:
            out = self._pass(self.ops, position, self.batch)  # compiles, allocates uncaptured
            try:
                self._graph, self._graph_out = self._capture(position)
            except Exception as e:  # an op that cannot be captured (a host sync, an allocation)
                return self._graph_refused(f"graph capture failed ({type(e).__name__}: {e})",
                                           out)
            self._captured_at = position
            return out
        if self._captured_at is not None and position != self._captured_at:
            return self._verify_replay(position)
        self._graph.replay()
        return self._graph_out

    def _graph_refused(self, why: str, out):
        self.notes.append(f"{why}: eager steps")
        self.use_graph(False)
        self.graph_failed = True
        return out

    def _verify_replay(self, position: int):
        """The first replay at another position than the capture's, checked against the eager
        step bit for bit: an impl that took the position from its case's params (a Python
        number, baked into the graph) instead of the step buffer would replay the captured
        position. On a mismatch the steps up to `position` are rerun eagerly (the graph may
        have written the captured position's cache slot) and the decoder stays eager."""
        lm = self.ops[("lm_head", 0)].backend
        eager = lm.to_host(self._pass(self.ops, position, self.batch), self.dtype).copy()
        self._graph.replay()
        if lm.to_host(self._graph_out, self.dtype).tobytes() == eager.tobytes():
            self._captured_at = None  # verified
            return self._graph_out
        captured = self._captured_at
        self.use_graph(False)
        self._pass(self.ops, captured, self.batch)
        out = self._pass(self.ops, position, self.batch)
        return self._graph_refused(f"the graph replayed at position {position} differs from the "
                                   f"eager step (an impl reads the position captured at "
                                   f"{captured}, not the step buffer)", out)

    # --- the decode step as a CUDA graph -------------------------------------------------------

    def graph_refusal(self) -> str | None:
        """Why this plan's decode step cannot be a CUDA graph (None: it can): every op must run
        on the GPU, through CuPy (kparity's kernels) or torch."""
        off = sorted(f"{b.name} on {b.device()}" for b in self.backends.values()
                     if b.name not in ("cuda", "torch") or not b.device().startswith("cuda"))
        if off:
            return (f"plan {self.plan.name}: a CUDA graph needs every op on the GPU through "
                    f"CuPy or torch; this plan runs on {', '.join(off)}")
        try:
            import torch
        except ImportError:
            return "a CUDA graph is recorded with torch.cuda.graph: torch is not installed"
        if not torch.cuda.is_available():
            return "a CUDA graph is recorded with torch.cuda.graph: torch sees no GPU"
        return None

    def use_graph(self, on: bool = True) -> None:
        """Run each decode step as a CUDA graph (the issue's "CUDA plans capture the decode
        step"): the step's launches recorded once per `load` by `torch.cuda.graph` (kparity's
        CuPy kernels on the same capturing stream, their programmatic dependent launches kept
        as programmatic edges) and replayed, one launch for ~15 kernels per layer instead of
        one Python call each.

        A graph bakes in every address it reads, so a step's position, length, slot and token
        cannot be rows of the index tables (another address per position): they live in one
        int32 device buffer (`STEP_ROWS` x batch, `_step_rows`) that every step reads, written
        from pinned host memory before each replay (`_set_step`; torch and CuPy see it through
        DLPack). The caches, weights, outputs and workspaces are allocated before the capture
        and stay; `reset` (a new `load`) drops the graph, since it allocates new caches.
        ModelError where the plan cannot (`graph_refusal`); where the capture itself fails
        (an impl that synchronizes with the host, say), the steps run eagerly from then on,
        `graph_failed` set and the error in `notes`. `on=False`: eager steps again."""
        self._graph = self._graph_out = None
        self.graph = False
        if on and self.graph_failed:
            return
        if not on or self._step is not None:
            self.graph = on
            return
        why = self.graph_refusal()
        if why:
            raise ModelError(why)
        import torch

        self._step_host = torch.zeros((len(STEP_ROWS), self.batch), dtype=torch.int32
                                      ).pin_memory()
        step = torch.zeros((len(STEP_ROWS), self.batch), dtype=torch.int32, device="cuda")
        self._step_dev, self._step_event = step, torch.cuda.Event()
        views = {name: step[i] for i, name in enumerate(STEP_ROWS)}
        self._step = {"torch": views}
        if "cuda" in self.backends:
            import cupy

            self._step["cuda"] = {k: cupy.from_dlpack(v) for k, v in views.items()}
        self.graph = True

    def _set_step(self, position: int) -> None:
        """The step buffer [position, position + 1, token], copied from pinned memory on the
        stream the graph replays on (the copy before it in stream order). The pinned buffer is
        rewritten only once the previous copy has read it."""
        import torch

        rows = [self._tokens[:, position] if name == "ids" else self._step_rows(name, position)
                for name in STEP_ROWS]
        self._step_event.synchronize()
        self._step_host.copy_(torch.from_numpy(np.stack(rows).astype(np.int32)))
        self._step_dev.copy_(self._step_host, non_blocking=True)
        self._step_event.record()

    def _capture(self, position: int):
        """Record the decode step at `position` (its inputs already in the step buffer): the
        graph and its logits (the lm_head's output, at a fixed address)."""
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            with cupy_on(stream):
                out = self._pass(self.ops, position, self.batch)
        return graph, out

    def prefill(self, n: int):
        """The prefill pass over the first n loaded tokens (positions 0..n-1, after `load`):
        their logits, a device array [n, vocab] of the prefill lm_head's backend. The caches
        end on the decode step's kv_update backend (the prefill's may differ)."""
        logits = self._pass(self.prefill_ops(n), 0, n)
        for layer in range(self.config.layers):
            home_ = self.ops[("kv_update", layer)].backend
            self.k_cache[layer] = self._to(home_, self.k_cache[layer], self.dtype)
            self.v_cache[layer] = self._to(home_, self.v_cache[layer], self.dtype)
        return logits

    def load(self, tokens, prefill: int = 0) -> None:
        """Empty the caches, hold the token ids (teacher forcing: token i is fed at position
        i; [T] for one sequence, [batch, T] for a batch) and build the cases of every position
        the loop will run (so a timed step builds none) and the prefill pass's ops for its
        first `prefill` tokens (one sequence only)."""
        ids = np.asarray(tokens)
        ids = ids[None] if ids.ndim == 1 and self.batch == 1 else ids
        vocab = self.weights.embedding.shape[0]
        want = "a non-empty 1-D sequence" if self.batch == 1 else f"[batch={self.batch}, T]"
        if (ids.ndim != 2 or ids.shape[0] != self.batch or not ids.size
                or not np.issubdtype(ids.dtype, np.integer)):
            raise ModelError(f"tokens: {want} of integer ids, got shape "
                             f"{np.asarray(tokens).shape} of {ids.dtype}")
        if ids.min() < 0 or ids.max() >= vocab:
            raise ModelError(f"tokens: ids must lie in [0, vocab={vocab}); got min "
                             f"{int(ids.min())}, max {int(ids.max())}")
        steps = ids.shape[1]
        if steps > self.max_len:
            raise ModelError(f"tokens: {steps} tokens do not fit the KV cache of max_len="
                             f"{self.max_len}: raise max_len")
        if not 0 <= prefill <= steps or (prefill and self.batch > 1):
            raise ModelError(f"prefill={prefill}: the prompt is a prefix of the {steps} tokens "
                             "of one sequence (0: decode every token as a step)")
        self.reset()
        self._check_prepared()
        self._tokens = ids.astype(np.int32)  # on each backend at its first use (`_table`)
        if prefill:
            self.prefill_ops(prefill)
        for (role, _), op in self.ops.items():
            if op.moves:
                for p in range(prefill, steps):
                    op.at(p)

    @property
    def steps(self) -> int:
        """Positions of the loaded tokens."""
        return self._tokens.shape[1]

    def logits(self, tokens, prefill: int = 0) -> np.ndarray:
        """Teacher-forced logits after each token: float64 [T, vocab] ([batch, T, vocab] for a
        batch); the first `prefill` tokens in one prefill pass, the rest as decode steps
        (module docstring)."""
        self.load(tokens, prefill)
        rows = []
        if prefill:
            lm = self.prefill_ops(prefill)[("lm_head", 0)].backend
            rows.append(lm.to_host(self.prefill(prefill), self.dtype).astype(np.float64)[None])
            self.tokens_done(prefill)
        lm = self.ops[("lm_head", 0)].backend
        vocab = self.weights.lm_head.shape[0]
        for p in range(prefill, self.steps):
            rows.append(lm.to_host(self.forward(p), self.dtype).astype(np.float64)
                        .reshape(self.batch, 1, vocab))
            self.tokens_done(self.batch)
        out = np.concatenate(rows, axis=1)
        return out[0] if self.batch == 1 else out

    def tokens_done(self, n: int) -> None:
        """Tell `on_tokens` that n more tokens went through."""
        if self.on_tokens is not None:
            self.on_tokens(n)

    def synchronize(self, value=None) -> None:
        """Wait for the work queued on every backend (MLX: evaluate `value` first)."""
        if value is not None and home(value) == "mlx":
            import mlx.core as mx

            mx.eval(value)
        for b in self.backends.values():
            b.synchronize()


def _versions(static: dict, names=None) -> dict:
    """The torch version counter of each input in `static` (of those in `names`), which an
    in-place write moves; other backends' arrays have none (None)."""
    return {k: getattr(v, "_version", None) for k, v in static.items()
            if names is None or k in names}


def _impl_ids(ops: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for (role, _), op in ops.items():
        if op.impl_id not in out.setdefault(role, []):
            out[role].append(op.impl_id)
    return out

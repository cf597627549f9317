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

Prefill: token by token (each prompt token is a decode step at its position); teacher-forced:
`logits(tokens)` returns the logits after each given token, whatever the model would predict.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from gpu_impls.backend import Backend
from models.plan import ADAPTABLE, REFERENCE_IMPL, ROLES, ModelError, Plan, plan as builtin_plan
from models.plan import resolve
from models.weights import QuantMatrix, Weights
from oracle.dtypes import FLOAT_DTYPES, round_to, storage_dtype

POSITION_ROLES = ("rope", "kv_update")  # their cases carry the position in a param
GEMV_ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
              "up_proj": "up", "down_proj": "down"}


# --- the reference's "device": NumPy arrays in storage dtypes ------------------------------------

class NumpyBackend(Backend):
    """Host arrays as they are: the reference plan's oracles read and return them."""

    name = "numpy"
    writes_in_place = False

    def available(self):
        return True, "NumPy float64 oracles"

    def device(self) -> str:
        return "cpu"

    def to_device(self, array: np.ndarray):
        return np.ascontiguousarray(array)

    def to_host(self, array, dtype: str) -> np.ndarray:
        return np.asarray(array).astype(storage_dtype(dtype), copy=False)


NUMPY = NumpyBackend()


def backend_named(name: str) -> Backend:
    import gpu_impls

    return NUMPY if name == "numpy" else gpu_impls.backend(name)


def home(array) -> str:
    """The backend a device array belongs to, from its type."""
    module = type(array).__module__
    for prefix, name in (("torch", "torch"), ("mlx", "mlx"), ("cupy", "cuda")):
        if module.startswith(prefix):
            return name
    return "numpy"


# --- dtype ----------------------------------------------------------------------------------------

def matrices(weights: Weights) -> dict[str, QuantMatrix]:
    """Every quantized matrix by name ("embedding", "L3.q", "lm_head"), each object once."""
    out, seen = {}, set()
    named = [("embedding", weights.embedding), ("lm_head", weights.lm_head)]
    named += [(f"L{i}.{name}", getattr(layer, name)) for i, layer in enumerate(weights.layers)
              for name in GEMV_ROLES.values()]
    for name, m in named:
        if id(m) not in seen:
            seen.add(id(m))
            out[name] = m
    return out


def check_dtype(weights: Weights, dtype: str) -> None:
    """ModelError unless `dtype` is a float dtype that holds every scale and bias exactly
    (the ops take them in T; rounding them would be another model)."""
    if dtype not in FLOAT_DTYPES:
        raise ModelError(f"dtype {dtype!r}: the case dtype T is one of {', '.join(FLOAT_DTYPES)}")
    for name, m in matrices(weights).items():
        if m.scale_dtype == dtype or (dtype == "f32" and m.scale_dtype in ("f16", "bf16")):
            continue
        for part in ("scales", "biases"):
            values = getattr(m, part)
            kept = round_to(values, dtype).astype(np.float64)
            if not np.array_equal(kept, values):
                bad = int(np.flatnonzero(kept.reshape(-1) != values.reshape(-1))[0])
                raise ModelError(
                    f"dtype {dtype}: {name}'s {part} (stored as {m.scale_dtype}) are not all "
                    f"values of {dtype} (e.g. {values.reshape(-1)[bad]!r} -> "
                    f"{kept.reshape(-1)[bad]!r}); the ops take scales in T, so T={dtype} would "
                    f"change the model: use dtype {m.scale_dtype} (or f32)")


# --- the roles' cases --------------------------------------------------------------------------

def _case(op: str, dims: dict, dtype: str, params: dict | None = None):
    from cases.model import Case

    return Case.make(op, dims, dtype, params=params or {}, label="model")


def matrix_layout(role: str, model, layer: int) -> tuple[int, int, int, int]:
    """(out, in, bits, group_size) of the matrix role `role` reads at `layer` ("embed": the
    embedding), from `Weights`, or from a `LlamaConfig` alone (every matrix at its bits and
    group size: a plan resolved without materializing the weights)."""
    if isinstance(model, Weights):
        if role == "embed":
            m = model.embedding
        elif role == "lm_head":
            m = model.lm_head
        else:
            m = getattr(model.layers[layer], GEMV_ROLES[role])
        return (*m.shape, m.bits, m.group_size)
    c = model
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    shapes = {"embed": (c.vocab, c.hidden), "lm_head": (c.vocab, c.hidden),
              "q_proj": (q, c.hidden), "k_proj": (kv, c.hidden), "v_proj": (kv, c.hidden),
              "o_proj": (c.hidden, q), "gate_proj": (c.intermediate, c.hidden),
              "up_proj": (c.intermediate, c.hidden), "down_proj": (c.hidden, c.intermediate)}
    return (*shapes[role], c.bits, c.group_size)


def role_case(role: str, model, layer: int, dtype: str, max_len: int, position: int = 0):
    """The case role `role` runs at `layer` and `position` with the model's params (eps, θ,
    pairing; the ops' defaults for the rounding conventions, `ADAPTABLE`). `model`: the
    `Weights`, or their `LlamaConfig` (`matrix_layout`)."""
    cfg = model.config if isinstance(model, Weights) else model
    norm = {"eps": cfg.rms_eps}
    op = ROLES[role]
    if role == "embed":
        vocab, hidden, bits, group = matrix_layout(role, model, layer)
        return _case(op, {"tokens": 1, "vocab": vocab, "hidden": hidden, "bits": bits,
                          "group_size": group}, dtype)
    if op in ("rms_norm", "add_rms_norm"):
        return _case(op, {"rows": 1, "n": cfg.hidden}, dtype, norm)
    if op == "dequant_gemv":
        out, n, bits, group = matrix_layout(role, model, layer)
        return _case(op, {"out": out, "in": n, "bits": bits, "group_size": group}, dtype)
    if role == "rope":
        return _case(op, {"heads_q": cfg.heads, "heads_kv": cfg.kv_heads,
                          "head_dim": cfg.head_dim}, dtype,
                     {"positions": (position,), "theta": float(cfg.rope_theta),
                      "pairing": rope_pairing(cfg)})
    if role == "kv_update":
        return _case(op, {"heads": cfg.kv_heads, "head_dim": cfg.head_dim, "max_len": max_len},
                     dtype, {"cache_lens": (position,), "new_lens": (1,)})
    if role == "attention":
        return _case(op, {"batch": 1, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
                          "head_dim": cfg.head_dim, "max_len": max_len}, dtype)
    if role == "silu_mul":
        return _case(op, {"rows": 1, "n": cfg.intermediate}, dtype)
    raise KeyError(role)


def rope_pairing(cfg) -> str:
    """"neox" (HF's rotate-half) unless the config says otherwise (a GGUF's Llama q/k rows are
    permuted for llama.cpp's adjacent pairs: "gptj")."""
    return getattr(cfg, "rope_pairing", "neox")


def role_layers(role: str, layers: int) -> range:
    """The layers where role `role` runs (one for the embedding and the head)."""
    if role in ("embed", "attn_norm", "final_add_norm", "lm_head"):
        return range(1)
    if role == "attn_add_norm":
        return range(1, layers)
    return range(layers)


def resolve_role(plan: Plan, role: str, model, layer: int, dtype: str, max_len: int,
                 here: bool = True):
    """(impl or None for the oracle, the case it runs): the plan's first candidate for `role`
    that admits its case (`models.plan.resolve`), checked at the last position the cache
    holds (rope's and kv_update's cases carry the position)."""
    case = role_case(role, model, layer, dtype, max_len, position=max_len - 1)
    impl, case, _ = resolve(plan.candidates(role), case, role, here)
    return impl, case


def plan_impls(plan: Plan | str, model, dtype: str = "bf16", max_len: int = 256,
               here: bool = True) -> dict[str, list[str]]:
    """role -> the impl ids `plan` runs it with for `model` (`Weights` or a `LlamaConfig`),
    without building a decoder: what `Decoder.impls` will be. `here=False` resolves the
    contracts only (a CUDA plan on a machine without a GPU)."""
    plan = builtin_plan(plan) if isinstance(plan, str) else plan
    layers = (model.config if isinstance(model, Weights) else model).layers
    out: dict[str, list[str]] = {}
    for role in ROLES:
        for layer in role_layers(role, layers):
            impl, _ = resolve_role(plan, role, model, layer, dtype, max_len, here)
            impl_id = REFERENCE_IMPL if impl is None else impl.id
            if impl_id not in out.setdefault(role, []):
                out[role].append(impl_id)
    return out


# --- one role at one layer ---------------------------------------------------------------------

@dataclass
class RoleOp:
    """What runs role `role` at one layer: the impl (None: the oracle), its backend, its case
    and launch per position (one entry for the roles whose case does not carry it), and the
    outputs allocated once (in-place backends)."""

    role: str
    impl: object
    backend: Backend
    base: object
    launches: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)

    @property
    def impl_id(self) -> str:
        return REFERENCE_IMPL if self.impl is None else self.impl.id

    def at(self, position: int):
        """(case, launch) at `position`, built and contract-checked once."""
        key = position if self.role in POSITION_ROLES else 0
        got = self.launches.get(key)
        if got is None:
            case = self.base
            if self.role == "rope":
                case = case.replace(positions=(position,))
            elif self.role == "kv_update":
                case = case.replace(cache_lens=(position,))
            launch = None if self.impl is None else self.impl.contract.check(self.impl.id, case)
            got = self.launches[key] = (case, launch)
        return got


def run_oracle(case, inputs: dict) -> dict:
    """The op's float64 oracle, each output rounded to its dtype in its storage dtype (a
    pipeline stage's stored output, `Pipeline.run_oracles`)."""
    spec = case.spec
    with np.errstate(invalid="ignore", over="ignore"):
        exact = spec.oracle(inputs, case)
    return {t.name: round_to(np.asarray(exact[t.name], dtype=np.float64), t.dtype(case))
            for t in spec.outputs}


class Decoder:
    """The decode loop of `weights` under `plan` at case dtype `dtype`, with a KV cache of
    `max_len` positions (module docstring). `impls`: role -> the impl ids that run it (one per
    role unless layers differ); `adapted`: role -> the `ADAPTABLE` params its impl runs with,
    where they differ from the reference's."""

    def __init__(self, weights: Weights, plan: Plan | str = "reference", dtype: str = "bf16",
                 max_len: int = 256):
        self.plan = builtin_plan(plan) if isinstance(plan, str) else plan
        self.weights, self.config, self.dtype, self.max_len = weights, weights.config, dtype, \
            int(max_len)
        check_dtype(weights, dtype)
        self.notes: list[str] = []
        self.ops = {(role, layer): self._resolve(role, layer)
                    for role in ROLES for layer in role_layers(role, self.config.layers)}
        self.backends = {op.backend.name: op.backend for op in self.ops.values()}
        self._direct = self._pick_transfer()
        self._device: dict = {}
        self._allocate()
        self.reset()

    # --- setup ------------------------------------------------------------------------------

    def _resolve(self, role: str, layer: int) -> RoleOp:
        impl, case = resolve_role(self.plan, role, self.weights, layer, self.dtype,
                                  self.max_len)
        backend = NUMPY if impl is None else backend_named(impl.backend)
        op = RoleOp(role, impl, backend, case)
        op.at(0)  # the launch at position 0 is checked too
        return op

    @property
    def impls(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for (role, _), op in self.ops.items():
            if op.impl_id not in out.setdefault(role, []):
                out[role].append(op.impl_id)
        return out

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

    def _allocate(self) -> None:
        """Outputs once per role and layer on the backends that write in place (the aliased
        caches excepted: the loop passes the cache itself)."""
        for op in self.ops.values():
            if not op.backend.writes_in_place:
                continue
            case = op.base
            op.buffers = {t.name: op.backend.to_device(np.zeros(t.shape_of(case),
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

    def _norm(self, backend: Backend, key: str, w: np.ndarray):
        return self.dev(backend, key, lambda: round_to(w, self.dtype))

    def reset(self) -> None:
        """Empty KV caches (zeros: finite, never attended) on each layer's kv_update backend,
        and the index tables (positions, lengths) on every backend."""
        cfg = self.config
        shape = (1, cfg.kv_heads, self.max_len, cfg.head_dim)
        zeros = np.zeros(shape, storage_dtype(self.dtype))
        self.k_cache, self.v_cache = [], []
        for layer in range(cfg.layers):
            backend = self.ops[("kv_update", layer)].backend
            self.k_cache.append(backend.to_device(zeros.copy()))
            self.v_cache.append(backend.to_device(zeros.copy()))
        positions = np.arange(self.max_len, dtype=np.int32)
        for backend in self.backends.values():
            self.dev(backend, "positions", lambda: positions)
            self.dev(backend, "lengths", lambda: positions + 1)
            self.dev(backend, "no_sinks", lambda: np.zeros(0, np.float32))

    # --- moving values between backends --------------------------------------------------------

    def _pick_transfer(self) -> bool:
        """Whether torch <-> CuPy values cross by DLPack (zero copy on one GPU): where both
        run and a round trip of a test vector returns its bits; else through the host."""
        if not {"torch", "cuda"} <= set(self.backends):
            return False
        x = round_to(np.linspace(-3, 3, 7), self.dtype)
        try:
            torch_b, cuda_b = self.backends["torch"], self.backends["cuda"]
            there = _dlpack(torch_b.to_device(x), "torch", "cuda", self.dtype)
            back = _dlpack(cuda_b.to_device(x), "cuda", "torch", self.dtype)
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
            return _dlpack(value, src, backend.name, dtype)
        return backend.to_device(backend_named(src).to_host(value, dtype))

    # --- the step ----------------------------------------------------------------------------

    def _run(self, role: str, layer: int, position: int, inputs: dict) -> dict:
        op = self.ops[(role, layer)]
        case, launch = op.at(position)
        if len(self.backends) > 1:
            inputs = {t.name: self._to(op.backend, inputs[t.name], t.dtype(case))
                      for t in case.spec.inputs}
        if op.impl is None:
            return run_oracle(case, inputs)
        outputs = None
        if op.backend.writes_in_place:
            outputs = {**op.buffers, **{t.name: inputs[t.aliases]
                                        for t in case.spec.outputs if t.aliases}}
        got = op.impl.run(launch, inputs, outputs, case)
        return outputs if got is None else {**(outputs or {}), **got}

    def _gemv(self, role: str, layer: int, x, n: int):
        op = self.ops[(role, layer)]
        if role == "lm_head":
            key, m = "lm_head", self.weights.lm_head
        else:
            name = GEMV_ROLES[role]
            key, m = f"L{layer}.{name}", getattr(self.weights.layers[layer], name)
        if m is self.weights.embedding:
            key = "embedding"
        return self._run(role, layer, 0, {**self._weight(op.backend, key, m),
                                           "x": x.reshape((n,))})["out"]

    def _index(self, role: str, layer: int, name: str, position: int):
        return self.dev(self.ops[(role, layer)].backend, name, None)[position:position + 1]

    def forward(self, position: int):
        """One decode step at `position` for the token loaded there (`load`): the logits, a
        device array [vocab] of the lm_head's backend (module docstring)."""
        cfg, w, p = self.config, self.weights, position
        hidden, hq, hkv, d = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        op = self.ops[("embed", 0)]
        h = self._run("embed", 0, p, {**self._weight(op.backend, "embedding", w.embedding),
                                      "ids": self._ids[op.backend.name][p:p + 1]})["out"]
        r, y = h, None
        for l, lw in enumerate(w.layers):
            if l == 0:
                x = self._run("attn_norm", 0, p, {"x": h, "w": self._norm(
                    self.ops[("attn_norm", 0)].backend, "L0.attn_norm", lw.attn_norm)})["out"]
            else:
                got = self._run("attn_add_norm", l, p, {"a": r, "b": y, "w": self._norm(
                    self.ops[("attn_add_norm", l)].backend, f"L{l}.attn_norm", lw.attn_norm)})
                r, x = got["residual_out"], got["normed_out"]
            q = self._gemv("q_proj", l, x, hidden)
            k = self._gemv("k_proj", l, x, hidden)
            v = self._gemv("v_proj", l, x, hidden)
            rot = self._run("rope", l, p, {"q": q.reshape((1, hq, d)), "k": k.reshape((1, hkv, d)),
                                           "positions": self._index("rope", l, "positions", p)})
            kv = self._run("kv_update", l, p, {
                "k_cache": self.k_cache[l], "v_cache": self.v_cache[l], "k": rot["k_out"],
                "v": v.reshape((1, hkv, d)), "slots": self._index("kv_update", l, "positions", p)})
            self.k_cache[l], self.v_cache[l] = kv["k_cache"], kv["v_cache"]
            attn = self.ops[("attention", l)].backend
            a = self._run("attention", l, p, {
                "lengths": self._index("attention", l, "lengths", p), "q": rot["q_out"],
                "k": self.k_cache[l], "v": self.v_cache[l],
                "sinks": self.dev(attn, "no_sinks", None)})["out"]
            o = self._gemv("o_proj", l, a, hq * d)
            got = self._run("ffn_add_norm", l, p, {"a": r, "b": o.reshape((1, hidden)), "w": self._norm(
                self.ops[("ffn_add_norm", l)].backend, f"L{l}.ffn_norm", lw.ffn_norm)})
            r, x = got["residual_out"], got["normed_out"]
            g = self._gemv("gate_proj", l, x, hidden)
            u = self._gemv("up_proj", l, x, hidden)
            n = cfg.intermediate
            s = self._run("silu_mul", l, p, {"gate": g.reshape((1, n)), "up": u.reshape((1, n))})["out"]
            y = self._gemv("down_proj", l, s, n).reshape((1, hidden))
        final = self._run("final_add_norm", 0, p, {"a": r, "b": y, "w": self._norm(
            self.ops[("final_add_norm", 0)].backend, "final_norm", w.final_norm)})
        return self._gemv("lm_head", 0, final["normed_out"], hidden)

    def load(self, tokens) -> None:
        """Empty the caches and put the token ids on every backend (teacher forcing: token i
        is fed at position i)."""
        ids = np.asarray(tokens)
        vocab = self.weights.embedding.shape[0]
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or not ids.size:
            raise ModelError(f"tokens: a non-empty 1-D sequence of integer ids, got shape "
                             f"{ids.shape} of {ids.dtype}")
        if ids.min() < 0 or ids.max() >= vocab:
            raise ModelError(f"tokens: ids must lie in [0, vocab={vocab}); got min "
                             f"{int(ids.min())}, max {int(ids.max())}")
        if ids.size > self.max_len:
            raise ModelError(f"tokens: {ids.size} tokens do not fit the KV cache of max_len="
                             f"{self.max_len}: raise max_len")
        self.reset()
        self._ids = {name: b.to_device(ids.astype(np.int32)) for name, b in self.backends.items()}

    def logits(self, tokens) -> np.ndarray:
        """Teacher-forced logits after each token: float64 [len(tokens), vocab]."""
        self.load(tokens)
        lm = self.ops[("lm_head", 0)].backend
        return np.stack([lm.to_host(self.forward(p), self.dtype).astype(np.float64)
                         for p in range(len(tokens))])

    def synchronize(self, value=None) -> None:
        """Wait for the work queued on every backend (MLX: evaluate `value` first)."""
        if value is not None and home(value) == "mlx":
            import mlx.core as mx

            mx.eval(value)
        for b in self.backends.values():
            b.synchronize()


def _dlpack(value, src: str, dst: str, dtype: str):
    """A torch tensor as a CuPy array or back, zero copy (CuPy holds f16/bf16 as uint16 bits,
    and exchanges 16-bit floats through DLPack as int16)."""
    import cupy
    import torch

    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(dtype)
    if src == "torch":
        t = value.contiguous()
        if half is not None:
            return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(t)
    if half is not None:
        return torch.from_dlpack(value.view(cupy.int16)).view(half)
    return torch.from_dlpack(value)


# --- speed ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeTiming:
    """Wall time per decode step (batch 1), each step between two synchronizes of every
    backend the plan runs on: the median and 10th/90th percentiles over the steps after the
    warm-up, and every step's time."""

    plan: str
    device: str
    dtype: str
    steps: int
    warmup: int
    ms_per_token: float
    p10_ms: float
    p90_ms: float
    tokens_per_s: float
    samples_ms: tuple[float, ...]


def time_decode(decoder: Decoder, tokens, warmup: int = 3) -> DecodeTiming:
    """Teacher-forced decode over `tokens` (position i gets token i), timing each step after
    the first `warmup`: see `DecodeTiming`."""
    if len(tokens) <= warmup:
        raise ModelError(f"time_decode: {len(tokens)} tokens leave no step after "
                         f"{warmup} warm-up steps")
    decoder.load(tokens)
    samples = []
    for p in range(len(tokens)):
        decoder.synchronize()
        t0 = time.perf_counter()
        decoder.synchronize(decoder.forward(p))
        if p >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    median = statistics.median(samples)
    devices = sorted({b.device() for b in decoder.backends.values()})
    return DecodeTiming(decoder.plan.name, ", ".join(devices), decoder.dtype, len(samples),
                        warmup, median, q[0], q[-1], 1e3 / median, tuple(samples))

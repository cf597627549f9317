"""The case each role of the decode loop runs (`models/plan.py` names the roles): its op, dims and
params from the model's config (or its `Weights`), per layer, position, prefill length and
batch; the impl a plan resolves for it (`plan_impls`: without building a decoder); and the case
dtypes a model's weights admit (`check_dtype`).
"""

from __future__ import annotations

import numpy as np

from models.plan import ALL_ROLES, REFERENCE_IMPL, ROLES, ModelError, Plan
from models.plan import plan as builtin_plan
from models.plan import resolve
from models.weights import QuantMatrix, Weights
from oracle.dtypes import FLOAT_DTYPES, round_to

# The projection roles, each with the matrix of its layer it reads (`Weights.layers[i].<name>`)
GEMV_ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
              "up_proj": "up", "down_proj": "down"}


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


def plan_role(role: str, prefill: bool, batch: int = 1) -> str:
    """The plan role that picks the impl of loop role `role` (`models.plan.PREFILL_ROLES`): a
    projection over several rows (a prefill, or a decode step of `batch` > 1 sequences) is a
    `qmm`."""
    if (prefill or batch > 1) and (role in GEMV_ROLES or role == "lm_head"):
        return "prefill_proj"
    if prefill and role == "attention":
        return "prefill_attention"
    return role


def role_case(role: str, model, layer: int, dtype: str, max_len: int, position: int = 0,
              prefill: int = 0, batch: int = 1):
    """The case role `role` runs at `layer` with the model's params (eps, θ, pairing; the ops'
    defaults for the rounding conventions, `ADAPTABLE`): a decode step's at `position`, or
    with `prefill` = n, the prefill pass's over n tokens from position 0; a decode step of
    `batch` sequences, all at `position`, has a row per sequence. `model`: the `Weights`, or
    their `LlamaConfig` (`matrix_layout`)."""
    cfg = model.config if isinstance(model, Weights) else model
    rows = prefill or batch
    op = ALL_ROLES[plan_role(role, bool(prefill), batch)]
    if role == "embed":
        vocab, hidden, bits, group = matrix_layout(role, model, layer)
        return _case(op, {"tokens": rows, "vocab": vocab, "hidden": hidden, "bits": bits,
                          "group_size": group}, dtype)
    if op in ("rms_norm", "add_rms_norm"):
        return _case(op, {"rows": rows, "n": cfg.hidden}, dtype, {"eps": cfg.rms_eps})
    if op in ("dequant_gemv", "qmm"):
        out, n, bits, group = matrix_layout(role, model, layer)
        m = {"m": rows} if op == "qmm" else {}
        return _case(op, {**m, "out": out, "in": n, "bits": bits, "group_size": group}, dtype)
    if role == "rope":
        positions = tuple(range(prefill)) if prefill else (position,) * batch
        return _case(op, {"heads_q": cfg.heads, "heads_kv": cfg.kv_heads,
                          "head_dim": cfg.head_dim}, dtype,
                     {"positions": positions, "theta": float(cfg.rope_theta),
                      "pairing": rope_pairing(cfg)})
    if role == "kv_update":
        if prefill:
            lens = {"cache_lens": (0,), "new_lens": (prefill,)}
        else:
            lens = {"cache_lens": (position,) * batch, "new_lens": (1,) * batch}
        return _case(op, {"heads": cfg.kv_heads, "head_dim": cfg.head_dim, "max_len": max_len},
                     dtype, lens)
    if op == "sdpa_decode":
        return _case(op, {"batch": batch, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
                          "head_dim": cfg.head_dim, "max_len": max_len}, dtype)
    if op == "sdpa_prefill_varlen":
        return _case(op, {"heads": cfg.heads, "kv_heads": cfg.kv_heads,
                          "head_dim": cfg.head_dim}, dtype,
                     {"q_lens": (prefill,), "k_lens": (prefill,)})
    if role == "silu_mul":
        return _case(op, {"rows": rows, "n": cfg.intermediate}, dtype)
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
                 here: bool = True, prefill: int = 0, batch: int = 1):
    """(impl or None for the oracle, the case it runs): the plan's first candidate for `role`
    (`plan_role`) that admits its case (`models.plan.resolve`); a decode step's checked at the
    last position the cache holds (rope's and kv_update's cases carry the position)."""
    case = role_case(role, model, layer, dtype, max_len, position=max_len - 1, prefill=prefill,
                     batch=batch)
    who = plan_role(role, bool(prefill), batch)
    impl, case, _ = resolve(plan.candidates(who), case, who, here)
    return impl, case


def plan_impls(plan: Plan | str, model, dtype: str = "bf16", max_len: int = 256,
               here: bool = True, prefill: int = 0, batch: int = 1) -> dict[str, list[str]]:
    """role -> the impl ids `plan` runs it with for `model` (`Weights` or a `LlamaConfig`) in
    a decode step (or, `prefill` = n, in the prefill pass over n tokens), without building a
    decoder: what `Decoder.impls` will be. `here=False` resolves the contracts only (a CUDA
    plan on a machine without a GPU)."""
    plan = builtin_plan(plan) if isinstance(plan, str) else plan
    layers = (model.config if isinstance(model, Weights) else model).layers
    out: dict[str, list[str]] = {}
    for role in ROLES:
        for layer in role_layers(role, layers):
            impl, _ = resolve_role(plan, role, model, layer, dtype, max_len, here, prefill,
                                   batch)
            impl_id = REFERENCE_IMPL if impl is None else impl.id
            if impl_id not in out.setdefault(role, []):
                out[role].append(impl_id)
    return out

"""A model plan: which impl runs each op of the decode loop (`models/decode.py`).

A Llama decode step is a fixed sequence of op *roles*, each an instance of a registered op
(`ROLES`: role -> op). A `Plan` maps every role to its candidate impl ids in order of
preference; the loop runs, per role, the first candidate whose contract admits the role's case
(its shapes come from the model: `cuda:kp_qgemv_mma` takes `in % 128 == 0`, SmolLM2's 576 does
not, so the CUDA plan runs `cuda:kp_qgemv` there). `REFERENCE_IMPL` ("numpy:oracle") is the op's
float64 oracle with its outputs rounded to their dtype, as `oracle/pipeline.py` composes stages.

Builtin plans (`plan(name)`; the dtype picks among candidates through their contracts):

    reference  every role the oracle: the exact composition, rounded to T at every op boundary
    torch      the torch impls (CPU here; CUDA where torch sees a GPU)
    mlx        the MLX impls (mlx:quantized_matmul for f32, mlx:quantized_matmul_half for
               f16/bf16 GEMVs: what an MLX user runs, outside the f32-accumulation contract,
               gpu_impls/mlx/gemv.py; likewise qmm's for a prefill)
    cuda       kparity's CUDA kernels where one admits the role (cuda:kp_rms_norm,
               cuda:kp_add_rms_norm, cuda:kp_qgemv_mma / kp_qgemv, cuda:kp_rope,
               cuda:kv_cache_update, cuda:kp_sdpa_decode, cuda:silu_mul), torch for the rest
               (the embedding gather and prefill attention have no CUDA kernel;
               cuda:kp_qmm takes prompts of up to 32 rows)

Prefill (`PREFILL_ROLES`): a prompt in one pass runs the decode roles on its rows, except the
projections (`prefill_proj`: qmm) and attention (`prefill_attention`: sdpa_prefill_varlen).

`plan.swapped({"rms_norm": "cuda:kp_rms_norm"})` pins one impl: a key is a role (`q_proj`) or an
op (`dequant_gemv`: every role of that op); the swapped role has that one candidate, and a
contract that rejects its case is an error rather than a fallback.

A contract may name a rounding convention in a param (`ADAPTABLE`: rms_norm's `rounding`,
rope's `compute`, sdpa's `probs`); an impl that admits only the other convention (torch:sdpa's
probs="T") runs its role with that param (`admitted`): the same function, another rounding
point. The reference keeps the ops' defaults (one rounding per op). Params that change the
function (RoPE pairing, eps, theta, the cache layout) are the model's and are never adapted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Mapping

REFERENCE_IMPL = "numpy:oracle"

# role -> op, in the order a decode step runs them
ROLES: dict[str, str] = {
    "embed": "quant_embedding",          # the token's row of the quantized embedding
    "attn_norm": "rms_norm",             # layer 0: the embedding, normed
    "attn_add_norm": "add_rms_norm",     # layers 1..L-1: residual + the MLP's output, normed
    "q_proj": "dequant_gemv",
    "k_proj": "dequant_gemv",
    "v_proj": "dequant_gemv",
    "rope": "rope",                      # q and k at the token's position
    "kv_update": "kv_cache_update",      # k and v appended to the layer's cache, in place
    "attention": "sdpa_decode",
    "o_proj": "dequant_gemv",
    "ffn_add_norm": "add_rms_norm",      # residual + the attention's output, normed
    "gate_proj": "dequant_gemv",
    "up_proj": "dequant_gemv",
    "silu_mul": "silu_mul",
    "down_proj": "dequant_gemv",
    "final_add_norm": "add_rms_norm",    # residual + the last MLP's output, the final norm
    "lm_head": "dequant_gemv",
}

# The prefill pass (a whole prompt at once) runs the same roles, on rows of tokens, except
# these two: every projection is a `qmm` over the prompt's rows (one role: the plan gives one
# impl list for all of them) and attention is `sdpa_prefill_varlen` (causal over the prompt).
PREFILL_ROLES: dict[str, str] = {
    "prefill_proj": "qmm",
    "prefill_attention": "sdpa_prefill_varlen",
}
ALL_ROLES: dict[str, str] = {**ROLES, **PREFILL_ROLES}

# Params naming a rounding convention of the same function (module docstring).
ADAPTABLE = ("rounding", "compute", "probs")


class ModelError(ValueError):
    """Bad input to the model layer (a plan name, a swap, a dtype, a token id): the message
    names it and the fix. The CLI reports it as a usage error (exit code 2)."""


class NotHere(RuntimeError):
    """A plan's impl whose backend is not on this machine: nothing wrong with the input, it
    cannot run here (the CLI's exit code 3, as for `kparity check` with no backend)."""


def _closest(given: str, valid) -> str:
    from cases.casefile import closest

    return closest(given, valid)


@dataclass(frozen=True)
class Plan:
    """`name` and, per role, the impl ids to try in order (module docstring)."""

    name: str
    impls: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        missing = [r for r in ALL_ROLES if not self.impls.get(r)]
        extra = [r for r in self.impls if r not in ALL_ROLES]
        if missing or extra:
            raise ModelError(f"plan {self.name}: roles without an impl {missing}, unknown "
                             f"roles {extra}; the roles: {', '.join(ALL_ROLES)}")

    def candidates(self, role: str) -> tuple[str, ...]:
        return tuple(self.impls[role])

    def swapped(self, swaps: Mapping[str, str]) -> "Plan":
        """This plan with roles pinned to one impl each: `swaps` maps a role or an op name to
        an impl id of that op (`REFERENCE_IMPL`: the oracle). The new plan's name says what
        changed: "cuda+rms_norm=cuda:kp_rms_norm"."""
        impls = dict(self.impls)
        for key, impl_id in swaps.items():
            roles = swap_roles(key)
            check_impl(impl_id, ALL_ROLES[roles[0]], key)
            for role in roles:
                impls[role] = (impl_id,)
        suffix = "".join(f"+{k}={v}" for k, v in swaps.items())
        return Plan(self.name + suffix, impls)

    def describe(self) -> dict[str, str]:
        """role -> its candidates, " | "-joined (for a table)."""
        return {role: " | ".join(self.impls[role]) for role in ALL_ROLES}


def swap_roles(key: str) -> list[str]:
    """The roles a swap key names: the role itself, or every role of that op."""
    if key in ALL_ROLES:
        return [key]
    roles = [r for r, op in ALL_ROLES.items() if op == key]
    if not roles:
        valid = list(ALL_ROLES) + sorted(set(ALL_ROLES.values()))
        raise ModelError(f"swap {key!r}: not a role or an op of the decode loop; valid "
                         f"(closest first): {_closest(key, valid)}")
    return roles


def check_impl(impl_id: str, op: str, where: str) -> None:
    """`impl_id` exists and implements `op`, else ModelError naming the valid ones."""
    if impl_id == REFERENCE_IMPL:
        return
    import gpu_impls

    impls = gpu_impls.impls()
    valid = [REFERENCE_IMPL] + sorted(i for i, impl in impls.items() if impl.op == op)
    if impl_id not in impls:
        raise ModelError(f"{where}={impl_id}: unknown impl; the impls of {op} (closest "
                         f"first): {_closest(impl_id, valid)}")
    if impls[impl_id].op != op:
        raise ModelError(f"{where}={impl_id}: {impl_id} implements {impls[impl_id].op}, the "
                         f"role runs {op}; its impls: {', '.join(valid)}")


def _plan(name: str, by_op: Mapping[str, tuple[str, ...]]) -> Plan:
    return Plan(name, {role: tuple(by_op[op]) for role, op in ALL_ROLES.items()})


TORCH = {"quant_embedding": ("torch:quant_embedding",), "rms_norm": ("torch:rms_norm",),
         "add_rms_norm": ("torch:add_rms_norm",), "dequant_gemv": ("torch:dequant_linear",),
         "rope": ("torch:rope_polar",), "kv_cache_update": ("torch:kv_cache_update",),
         "sdpa_decode": ("torch:sdpa",), "silu_mul": ("torch:silu_mul",),
         "qmm": ("torch:qmm_dequant_linear",), "sdpa_prefill_varlen": ("torch:sdpa_varlen",)}
MLX = {"quant_embedding": ("mlx:quant_embedding",), "rms_norm": ("mlx:rms_norm_f32",),
       "add_rms_norm": ("mlx:add_rms_norm",),
       "dequant_gemv": ("mlx:quantized_matmul", "mlx:quantized_matmul_half"),
       "rope": ("mlx:fast_rope_f32",), "kv_cache_update": ("mlx:kv_cache_update",),
       "sdpa_decode": ("mlx:fast_sdpa",), "silu_mul": ("mlx:silu_mul",),
       "qmm": ("mlx:qmm_quantized_matmul", "mlx:qmm_quantized_matmul_half"),
       "sdpa_prefill_varlen": ("mlx:fast_sdpa_varlen",)}
CUDA = {"quant_embedding": TORCH["quant_embedding"],
        "rms_norm": ("cuda:kp_rms_norm", *TORCH["rms_norm"]),
        "add_rms_norm": ("cuda:kp_add_rms_norm", *TORCH["add_rms_norm"]),
        "dequant_gemv": ("cuda:kp_qgemv_mma", "cuda:kp_qgemv", *TORCH["dequant_gemv"]),
        "rope": ("cuda:kp_rope", *TORCH["rope"]),
        "kv_cache_update": ("cuda:kv_cache_update", *TORCH["kv_cache_update"]),
        "sdpa_decode": ("cuda:kp_sdpa_decode", *TORCH["sdpa_decode"]),
        "silu_mul": ("cuda:silu_mul", *TORCH["silu_mul"]),
        "qmm": ("cuda:kp_qmm", *TORCH["qmm"]),  # kp_qmm: up to 32 rows
        "sdpa_prefill_varlen": TORCH["sdpa_prefill_varlen"]}

PLANS = {
    "reference": _plan("reference", {op: (REFERENCE_IMPL,) for op in set(ALL_ROLES.values())}),
    "torch": _plan("torch", TORCH),
    "mlx": _plan("mlx", MLX),
    "cuda": _plan("cuda", CUDA),
}


def plan(name: str) -> Plan:
    """The builtin plan `name` (`PLANS`)."""
    if name not in PLANS:
        raise ModelError(f"unknown plan {name!r}; plans (closest first): "
                         f"{_closest(name, PLANS)}")
    return PLANS[name]


# --- which candidate runs a role ---------------------------------------------------------------

def admitted(impl, case):
    """`case`, or the nearest case with other `ADAPTABLE` params, that `impl`'s contract
    admits; None where none does. Returns (case, launch)."""
    from gpu_impls.contract import ContractError

    spec = case.spec
    names = [n for n in ADAPTABLE if n in spec.param_values]
    options = [(case.params[n], *(v for v in spec.param_values[n] if v != case.params[n]))
               for n in names]
    for values in product(*options):
        trial = case.replace(**dict(zip(names, values))) if names else case
        try:
            return trial, impl.contract.check(impl.id, trial)
        except ContractError:
            continue
        except (ArithmeticError, ValueError):  # a geometry that cannot be derived: refused
            continue
    return None


def resolve(candidates: tuple[str, ...], case, role: str, here: bool = True):
    """(impl or None for the oracle, the case it runs, its launch): the first candidate whose
    contract admits `case` (`admitted`). ModelError, with each candidate's refusal, where none
    does, and where the one that admits it cannot run here (its backend is missing: a plan
    never falls back silently to another backend; `here=False`: not asked, for a plan
    resolved on a machine without its backends)."""
    import gpu_impls
    from gpu_impls.contract import ContractError

    refusals = []
    for impl_id in candidates:
        if impl_id == REFERENCE_IMPL:
            return None, case, None
        impl = gpu_impls.impls()[impl_id]
        got = admitted(impl, case)
        if got is None:
            try:
                impl.contract.check(impl.id, case)
            except ContractError as e:
                refusals.append(str(e))
            except (ArithmeticError, ValueError) as e:  # e.g. cuda:kp_qgemv_mma at in < 128
                refusals.append(f"{impl_id}: its launch geometry cannot be derived "
                                f"({type(e).__name__}: {e})")
            continue
        # the impl that would run must run here: no silent fallback to another backend
        ok, why = impl.available(gpu_impls.backend(impl.backend)) if here else (True, "")
        if not ok:
            raise NotHere(f"role {role}: {impl_id} is not available here ({why}); run "
                          "another plan, or swap the role to an impl of this machine")
        return impl, got[0], got[1]
    raise ModelError(f"role {role} ({case.short()}): no candidate runs it: "
                     + "; ".join(refusals)
                     + f". Swap the role to an impl of {case.op} that admits it "
                       f"(plan.swapped({{{role!r}: IMPL}}))")

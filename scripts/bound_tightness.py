"""How tight the derived bounds are: the median bound, in ULPs of the output dtype T at the exact
value, over the elements of normal-data cases (rms_norm at n = 4096, dequant_gemv at in = 4096),
per dtype and per declared reduction (and per impl that declares its own order per launch). Run: `python scripts/bound_tightness.py`."""

from __future__ import annotations

import inspect

import numpy as np

from cases.model import Case, make_inputs
from oracle.dtypes import spacing

CASES = {
    "rms_norm once": ("rms_norm", {"rows": 16, "n": 4096}, {"rounding": "once"}),
    "rms_norm normed": ("rms_norm", {"rows": 16, "n": 4096}, {"rounding": "normed"}),
    "dequant_gemv": ("dequant_gemv", {"out": 256, "in": 4096, "bits": 4, "group_size": 64}, {}),
}


def median_ulps(op, dims, params, dtype, numerics=None) -> float:
    case = Case.make(op, dims, dtype, "normal", params=params)
    if isinstance(numerics, str):  # an impl's own declaration (its plan for this launch)
        import gpu_impls

        from gpu_impls.contract import ContractError

        impl = gpu_impls.impls()[numerics]
        if impl.op != op:
            return float("nan")
        try:
            impl.contract.check(impl.id, case)
        except ContractError:
            return float("nan")
        numerics = impl.numerics_for(case)
    inputs = make_inputs(case)
    exact, _ = case.spec.reference(inputs, case)
    takes_numerics = len(inspect.signature(case.spec.tolerance).parameters) > 3
    args = (numerics,) if takes_numerics and numerics is not None else ()
    bound = case.spec.tolerance(inputs, exact, case, *args)["out"]
    y = exact["out"]
    return float(np.median(bound / spacing(y, dtype)))


def main() -> None:
    try:
        from oracle.numerics import DEFAULT, SEQUENTIAL, Numerics, lanes
        declared = {"any (default)": DEFAULT, "sequential": Numerics(SEQUENTIAL),
                    "lanes(32)": Numerics(lanes(32)),
                    "cuda:kp_rms_norm's plan": "cuda:kp_rms_norm"}
    except ImportError:  # before the error model declared reductions
        declared = {"(one bound)": None}
    print("| case | reduction | f32 | f16 | bf16 |")
    print("|---|---|---|---|---|")
    for label, (op, dims, params) in CASES.items():
        for name, numerics in declared.items():
            cells = [f"{median_ulps(op, dims, params, dt, numerics):.3g}"
                     for dt in ("f32", "f16", "bf16")]
            if "nan" in cells:  # an impl's declaration, for another op or refused there
                continue
            print(f"| {label} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

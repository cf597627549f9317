"""How tight the derived bounds are: the median bound, in ULPs of the output dtype T at the exact
value, over the elements of normal-data cases (rms_norm at n = 4096, dequant_gemv at in = 4096),
per dtype and per declared reduction (and per impl that declares its own order per launch).
Run: `python scripts/bound_tightness.py`."""

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
    if isinstance(numerics, dict):  # an impl's own declaration (its plan for this launch)
        import gpu_impls
        from gpu_impls.contract import ContractError

        impl = gpu_impls.impls()[numerics[op]]
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
                    "kparity's kernel (its declared order)": {"rms_norm": "cuda:kp_rms_norm",
                                                              "dequant_gemv": "cuda:kp_qgemv"}}
    except ImportError:  # before the error model declared reductions
        declared = {"(one bound)": None}
    print("| case | reduction | f32 | f16 | bf16 |")
    print("|---|---|---|---|---|")
    for label, (op, dims, params) in CASES.items():
        for name, numerics in declared.items():
            cells = [f"{median_ulps(op, dims, params, dt, numerics):.3g}"
                     for dt in ("f32", "f16", "bf16")]
            if "nan" in cells:  # the impl refuses the case (kp_rms_norm: rounding="normed")
                continue
            print(f"| {label} | {name} | " + " | ".join(cells) + " |")


def observed_gemv() -> None:
    """cuda:kp_qgemv's own f32 arithmetic, transcribed in NumPy (tests/emulate_kp.py): its
    error on these cases against its declared bound (no GPU: the transcription rounds as the
    source says; a GPU run of the kernel is the check's own business)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpu_impls
    from gpu_impls.cuda.gemv import kp_warps
    from oracle.quant import unpack
    from tests import emulate_kp

    impl = gpu_impls.impls()["cuda:kp_qgemv"]
    print("\n| kp_qgemv f32 (256 rows, g64) | error median / max (ULP) | bound median (ULP) | "
          "max error / bound | code 0 off by one / bound, row 0 |")
    print("|---|---|---|---|---|")
    for n in (4096, 14336):
        for bits in (4, 8):
            case = Case.make("dequant_gemv", {"out": 256, "in": n, "bits": bits,
                                              "group_size": 64}, "f32", "normal")
            inputs = make_inputs(case)
            exact = case.spec.reference(inputs, case)[0]["out"]
            y = emulate_kp.kp_qgemv(unpack(inputs["w"], bits, n), inputs["scales"],
                                    inputs["biases"], inputs["x"], bits, kp_warps(case.dims))
            bound = case.spec.bounds(inputs, {"out": exact}, case,
                                     impl.numerics_for(case))["out"]
            ulp = spacing(exact, "f32")
            err = np.abs(y.astype(np.float64) - exact)
            off = abs(float(inputs["scales"][0, 0]) * float(inputs["x"][0]))
            print(f"| in = {n}, int{bits} | {np.median(err / ulp):.3g} / {np.max(err / ulp):.3g} "
                  f"| {np.median(bound / ulp):.3g} | {np.max(err / bound):.3g} "
                  f"| {off / bound[0]:.3g} |")


if __name__ == "__main__":
    main()
    observed_gemv()

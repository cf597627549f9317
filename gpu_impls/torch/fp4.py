"""torch FP4 quantize / dequantize as users write the references: vLLM's `ref_nvfp4_quant` (f32
ops, `.to(torch.float8_e4m3fn)` after the clamp to 448, `cast_to_fp4`'s RNE thresholds) and the
OCP / TE (ceil) MXFP4 scale rules with torch.frexp. Codes packed two per byte, element 2j low."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, nearest_multiples
from gpu_impls.impl import Impl

BLOCKS = {"nvfp4": 16, "mxfp4": 32}


def whole_blocks(dim: str = "cols") -> Invariant:
    """`dim`: the blocked dimension (fp4_gemv's is "in")."""
    return Invariant(f"{dim} % block == 0",
                     lambda ns: ns[dim] % BLOCKS[ns["format"]] == 0,
                     "every block of 16 (nvfp4) or 32 (mxfp4) elements has one scale: a partial "
                     "block has none",
                     lambda ns: f"{dim} = {nearest_multiples(ns[dim], BLOCKS[ns['format']])}",
                     {dim: 40}, (dim, "format"))


def rules(*allowed: str, other: str = "mlx") -> Invariant:
    """`other`: a rule of the same format that breaks it (the violating case's)."""
    return Invariant(f"scale_rule in {allowed}", lambda ns: ns["scale_rule"] in allowed,
                     "this impl implements these scale rules only (oracle/fp4.py names each)",
                     lambda ns: f"scale_rule = {allowed[0]}",
                     {"scale_rule": other}, ("scale_rule",))


def format_is(fmt: str) -> Invariant:
    other = next(f for f in BLOCKS if f != fmt)
    return Invariant(f"format == {fmt}", lambda ns: ns["format"] == fmt,
                     f"this impl quantizes {fmt} only", lambda ns: f"format = {fmt}",
                     {"format": other}, ("format",))


def cast_to_fp4(v, ties_up: bool = False):
    """vLLM's `cast_to_fp4` (RNE thresholds) -> 4-bit codes, the sign kept (as the hardware cvt).
    `ties_up`: every tie to the larger magnitude (half away from zero: tests/mutants.py's bug)."""
    import torch

    a = v.abs()
    mag = torch.zeros_like(a, dtype=torch.uint8)
    # (lower bound, inclusive?) of magnitude codes 1..7: ties go to the even code
    for code, (edge, inclusive) in enumerate(((0.25, False), (0.75, True), (1.25, False),
                                              (1.75, True), (2.5, False), (3.5, True),
                                              (5.0, False)), start=1):
        up = (a >= edge) if inclusive or ties_up else (a > edge)
        mag = torch.where(up, code, mag).to(torch.uint8)
    return mag | (torch.signbit(v).to(torch.uint8) << 3)


def pack(codes):
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _nvfp4(x, ties_up: bool = False, unscaled_block_max: bool = False):
    """vLLM's ref_nvfp4_quant. The flags are tests/mutants.py's bugs: ties half away from zero;
    the block scale e4m3(vmax / 6) without the tensor scale gs_enc."""
    import torch

    x = x.float()
    r, k = x.shape
    amax = x.abs().max()
    big = torch.tensor(torch.finfo(torch.float32).max, device=x.device)
    gs_enc = torch.where(amax == 0, torch.ones_like(amax),
                         torch.minimum(torch.tensor(2688.0, device=x.device) / amax,
                                       big))  # TE's clamps
    gs_dec = 1.0 / gs_enc
    xb = x.reshape(r, k // 16, 16)
    vmax = xb.abs().amax(-1, keepdim=True)
    s = vmax * torch.tensor(1.0 / 6.0, dtype=torch.float32, device=x.device)
    s = s if unscaled_block_max else gs_enc * s
    sf = s.clamp(max=448.0).to(torch.float8_e4m3fn)
    sf32 = sf.float()
    enc = torch.where(sf32 == 0, torch.zeros_like(sf32), 1.0 / (sf32 * gs_dec))
    q = cast_to_fp4((xb * enc).clamp(-6.0, 6.0), ties_up).reshape(r, k)
    return pack(q), sf.view(torch.uint8).reshape(r, k // 16), gs_dec.reshape(1)


def _mxfp4(x, rule: str):
    import torch

    x = x.float()
    r, k = x.shape
    xb = x.reshape(r, k // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    if rule == "ocp":
        m, e = torch.frexp(amax)
        exp = e - 3
    else:
        m, e = torch.frexp(amax / 6.0)
        exp = torch.where(m == 0.5, e - 1, e)
    exp = torch.where(amax == 0, -127, exp.clamp(-127, 127))
    q = cast_to_fp4(xb.double() * torch.exp2(-exp.double())).reshape(r, k)  # exact: 2^-e
    return (pack(q), (exp + 127).to(torch.uint8).reshape(r, k // 32),
            torch.ones(1, device=x.device))


def _quantize(launch, inputs, outputs, case):
    fmt, rule = case.params["format"], case.params["scale_rule"]
    codes, scales, ts = _nvfp4(inputs["x"]) if fmt == "nvfp4" else _mxfp4(inputs["x"], rule)
    return {"codes": codes, "scales": scales, "tensor_scale": ts}


def dequant_f32(codes, scales, tensor_scale, fmt: str):
    """W [N, K] in f32 as users write the dequantization: E2M1 LUT[codes] x the block scale
    (float8 -> f32, or 2^(e - 127)) x the tensor scale, f32 products."""
    import torch

    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                       device=codes.device)
    q = lut[torch.stack([codes & 15, codes >> 4], -1).reshape(codes.shape[0], -1).long()]
    s = scales.view(torch.float8_e4m3fn).float() if fmt == "nvfp4" else torch.exp2(
        scales.float() - 127)
    return q * s.repeat_interleave(BLOCKS[fmt], -1) * tensor_scale.float()


def _dequantize(launch, inputs, outputs, case):
    """e2m1 LUT[codes] * scale * tensor_scale in f32, then T."""
    x = dequant_f32(inputs["codes"], inputs["scales"], inputs["tensor_scale"],
                    case.params["format"])
    return {"x_hat": x.to(outputs["x_hat"].dtype)}


def _dequantize_dtypes(launch, inputs, outputs, case):
    """The block scales through torch's own dtypes: `.view(torch.float8_e4m3fn)` (NVFP4) or
    `.view(torch.float8_e8m0fnu)` (MXFP4), `.float()`; E2M1 by the LUT, because
    `torch.float4_e2m1fn_x2` is storage only (torch 2.13 CPU: `.float()` raises
    '"copy_kernel" not implemented for 'Float4_e2m1fn_x2''); f32 products, then T."""
    import torch

    codes, fmt = inputs["codes"], case.params["format"]
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                       device=codes.device)
    q = lut[torch.stack([codes & 15, codes >> 4], -1).reshape(codes.shape[0], -1).long()]
    dtype = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    s = inputs["scales"].view(dtype).float().repeat_interleave(BLOCKS[fmt], -1)
    x = q * s * inputs["tensor_scale"].float()
    return {"x_hat": x.to(outputs["x_hat"].dtype)}


def _has_e8m0() -> tuple[bool, str]:
    import torch

    ok = hasattr(torch, "float8_e8m0fnu")
    return ok, "" if ok else f"torch {torch.__version__} has no float8_e8m0fnu (2.7+)"


def _gemv(launch, inputs, outputs, case):
    """Dequantize to f32, then F.linear in f32 (x upcast), rounded to T once."""
    import torch.nn.functional as F

    w = dequant_f32(inputs["codes"], inputs["scales"], inputs["tensor_scale"],
                    case.params["format"])
    return {"y": F.linear(inputs["x"].float(), w).to(outputs["y"].dtype)}


register(Impl("fp4_quantize", "torch", "fp4_quantize_ref", _quantize,
              Contract(invariants=(whole_blocks(), rules("exact", "ocp", "ceil"))),
              doc="vLLM ref_nvfp4_quant / OCP and TE (ceil) MXFP4 rules in torch f32 ops"),
         Impl("fp4_dequantize", "torch", "fp4_dequantize_ref", _dequantize,
              Contract(invariants=(whole_blocks(),)),
              doc="E2M1 LUT x block scale x tensor scale in f32, rounded to T"),
         Impl("fp4_dequantize", "torch", "fp4_dequantize_dtypes", _dequantize_dtypes,
              Contract(invariants=(whole_blocks(),)), requires=_has_e8m0,
              doc="block scales via torch.float8_e4m3fn / float8_e8m0fnu views, E2M1 by LUT "
                  "(float4_e2m1fn_x2 has no conversion), f32 products, then T"),
         Impl("fp4_gemv", "torch", "fp4_dequant_linear", _gemv,
              Contract(invariants=(whole_blocks("in"),)),
              doc="dequantize to f32 (LUT x scale x tensor scale), F.linear in f32, then T"))

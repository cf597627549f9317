"""Issue 29's fla crash case, outside the harness: flash-linear-attention's chunk_gated_delta_rule
at B=1, T=4096, H=16 (q/k and v heads), K=V=128, bf16, with and without the in-kernel l2norm;
prints whether each call finished with a finite state (the issue saw cudaErrorIllegalAddress on
an H200). Needs a CUDA GPU and fla-core (`pip install 'kparity[fla]'`):

    python3 scripts/fla_probe.py
"""
import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as f
torch.manual_seed(0)
B, T, H, K = 1, 4096, 16, 128
q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g = -torch.rand(B, T, H, device="cuda").mul(5)
beta = torch.rand(B, T, H, device="cuda")
h0 = torch.randn(B, H, K, K, device="cuda")
for l2 in (True, False):
    o, s = f(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,
             use_qk_l2norm_in_kernel=l2, state_v_first=True)
    torch.cuda.synchronize()
    print("fla issue case l2norm", l2, "ok", tuple(o.shape), float(o.float().abs().max()),
          bool(torch.isfinite(s).all()))
print(torch.cuda.get_device_name(), torch.__version__)

#!/usr/bin/env bash
# The Mamba-2 peer impls' libraries on the GPU machine (no internet), into /tmp/site
# (gpu_impls/torch/mamba_peers.py: torch:mamba_chunk_scan_combined, ...selective_state_update,
# torch:causal_conv1d_fn, torch:causal_conv1d_update). Run from the repo root, where
# .device/wheels/ holds mamba_ssm-2.3.2.post1.tar.gz, causal_conv1d-1.7.0.tar.gz and
# einops-0.8.2-py3-none-any.whl (carry .device/wheels). Then, in the same call:
#   export PYTHONPATH=/tmp/site:$PWD && python3 -m pytest -m gpu tests/test_gpu_mamba_peers.py
#
# einops: its wheel. mamba_ssm: python files only (MAMBA_SKIP_CUDA_BUILD=TRUE; FORCE_BUILD skips
# the prebuilt-wheel download, which without internet raises an error setup.py does not catch);
# its package __init__ then fails at `import selective_scan_cuda`, which the impls step around.
# If pip cannot build it (its setup.py imports `wheel` and `packaging`), the package's python
# files are copied from the sdist instead: the same files a python-only install puts there.
# causal_conv1d: its CUDA extension built here under `timeout 400`; its setup.py hard-codes
# -gencode for nine architectures (sm_75 ... sm_121, ignoring TORCH_CUDA_ARCH_LIST), patched in
# the extracted sdist to sm_90 only (H100 and H200), a ninth of the compile. A failure prints its
# last lines; the impls then report "CUDA extension not built". Last, what imports and what the
# impls' own requires-checks say. KPARITY_SKIP_CONV_BUILD=1 skips the causal_conv1d build (~330 s
# on an H100 machine's 16 cores): its two impls then say "not built".
set -u
W=.device/wheels
SITE=/tmp/site
SRC=/tmp/mamba_src
mkdir -p "$SITE" "$SRC"
pip_site() { python3 -m pip install --no-index --no-deps --no-build-isolation --target "$SITE" "$@"; }

echo "== einops"
pip_site -q "$W/einops-0.8.2-py3-none-any.whl" && echo "einops: installed"

echo "== mamba_ssm (python files only)"
if MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip_site -q "$W/mamba_ssm-2.3.2.post1.tar.gz" \
    > "$SRC/mamba_pip.log" 2>&1; then
  echo "mamba_ssm: installed by pip"
else
  echo "mamba_ssm: pip failed (last lines below); copying the package's python files instead"
  tail -5 "$SRC/mamba_pip.log"
  tar -xzf "$W/mamba_ssm-2.3.2.post1.tar.gz" -C "$SRC"
  rm -rf "$SITE/mamba_ssm" && cp -r "$SRC/mamba_ssm-2.3.2.post1/mamba_ssm" "$SITE/" \
    && echo "mamba_ssm: copied to $SITE/mamba_ssm"
fi

if [ "${KPARITY_SKIP_CONV_BUILD:-0}" = 1 ]; then
  echo "== causal_conv1d: not built (KPARITY_SKIP_CONV_BUILD=1)"
else
echo "== causal_conv1d (its CUDA extension, sm_90)"
tar -xzf "$W/causal_conv1d-1.7.0.tar.gz" -C "$SRC"
CC1D="$SRC/causal_conv1d-1.7.0"
python3 - "$CC1D/setup.py" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
mark = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert text.count(mark) == 1, f"{path}: the line to patch before is not there once"
patch = '    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]  # kparity: sm_90 only\n'
open(path, "w").write(text.replace(mark, patch + mark))
print("setup.py: -gencode sm_90 only")
EOF
start=$SECONDS
CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 timeout 400 \
  python3 -m pip install --no-index --no-deps --no-build-isolation --target "$SITE" "$CC1D" \
  > "$SRC/conv_pip.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  echo "causal_conv1d: built in $((SECONDS - start)) s"
else
  echo "causal_conv1d: build FAILED after $((SECONDS - start)) s (rc $rc; 124: the 400 s timeout)"
  tail -25 "$SRC/conv_pip.log"
fi

fi

echo "== what imports"
PYTHONPATH="$SITE:$PWD" python3 - <<'EOF'
import importlib

import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())
for name in ("triton", "einops", "packaging", "causal_conv1d_cuda", "causal_conv1d"):
    try:
        module = importlib.import_module(name)
        print(f"ok    {name} {getattr(module, '__version__', '')}")
    except Exception as e:
        print(f"FAIL  {name}: {type(e).__name__}: {e}")
try:
    import mamba_ssm  # noqa: F401
    print("ok    mamba_ssm (the package __init__ too)")
except Exception as e:
    print(f"as expected without selective_scan_cuda: mamba_ssm: {type(e).__name__}: {e}")

import gpu_impls
from gpu_impls.torch.mamba_peers import _mamba_triton

for name in ("ssd_combined", "selective_state_update"):
    try:
        _mamba_triton(name)
        print(f"ok    mamba_ssm.ops.triton.{name}")
    except Exception as e:
        print(f"FAIL  mamba_ssm.ops.triton.{name}: {type(e).__name__}: {e}")
backend = gpu_impls.backend("torch")
for impl_id in ("torch:mamba_chunk_scan_combined", "torch:mamba_selective_state_update",
                "torch:causal_conv1d_fn", "torch:causal_conv1d_update"):
    ok, why = gpu_impls.impls()[impl_id].available(backend)
    print(f"{'runs ' if ok else 'NO   '} {impl_id}: {why}")
EOF

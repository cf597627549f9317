#!/usr/bin/env bash
# MLX on the CUDA machine: the mlx-cuda-13 wheel (~90 MB) is over one call's carry limit, so it
# travels in two parts, in two device calls made back to back. Here, once:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_35_x86_64 -d /tmp/mlxwheels mlx==0.32.4 mlx-cuda-13==0.32.4
#   mkdir -p mlxparts1 mlxparts2 && split -b 44M /tmp/mlxwheels/mlx_cuda_13-*.whl part. &&
#     mv part.aa mlxparts1/ && mv part.ab mlxparts2/ && cp /tmp/mlxwheels/mlx-0.32.4-*.whl mlxparts2/
# Device call 1 (carry mlxparts1):  bash scripts/mlx_cuda_install.sh stash
# Device call 2, at once (carry mlxparts2): bash scripts/mlx_cuda_install.sh install && \
#   export PYTHONPATH=/tmp/site:$PWD && bash scripts/gpu_bench.sh mlx-cuda
# mlx-cuda-13's own needs (cuBLAS 13, cuDNN 9 for CUDA 13, NCCL, ...) are in the CUDA image.
set -eu
case ${1:?stash or install} in
stash)
  mkdir -p /root/mlxparts && cp mlxparts1/part.aa /root/mlxparts/ && ls -la /root/mlxparts ;;
install)
  cat /root/mlxparts/part.aa mlxparts2/part.ab > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl mlxparts2/mlx-0.32.4-*.whl ;;
esac

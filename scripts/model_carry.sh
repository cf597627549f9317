#!/usr/bin/env bash
# The model gate on the CUDA machine (issue 28): the SmolLM2 GGUF (98 MB) is over one call's
# carry limit, so it travels in two parts, in two device calls made back to back; gguf and
# transformers 5.24 (the versions the CPU side runs) travel as wheels. Here, once:
#   mkdir -p .device/gguf1 .device/gguf2 .device/wheels
#   split -b 49200000 ~/.cache/kparity/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/gguf.part.
#   mv /tmp/gguf.part.aa .device/gguf1/ && mv /tmp/gguf.part.ab .device/gguf2/
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_35_x86_64 -d .device/wheels transformers==5.24.0 gguf==0.19.0
# Device call 1 (carry .device/gguf1): bash scripts/model_carry.sh stash
# Device call 2, at once (carry .device/gguf2 .device/wheels):
#   bash scripts/model_carry.sh install && export PYTHONPATH=/tmp/site:$PWD \
#     KPARITY_GGUF=/root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf && bash scripts/gpu_bench.sh model
set -eu
case ${1:?stash or install} in
stash)
  mkdir -p /root/gguf && cp .device/gguf1/gguf.part.aa /root/gguf/ && ls -la /root/gguf ;;
install)
  cat /root/gguf/gguf.part.aa .device/gguf2/gguf.part.ab > /root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum /root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl ;;
esac

#!/usr/bin/env bash
# One device call: GPU gate (pytest -m gpu) + kparity check --backend cuda; logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_gpu.py "$@" 2>&1 | tee $OUT/pytest_gpu.log | tail -25
echo "pytest rc=${PIPESTATUS[0]}"
python3 -m verbs.cli --store /tmp/kpstore check --backend cuda 2>&1 | tee $OUT/check_cuda.log | tail -30
echo "check rc=${PIPESTATUS[0]}"

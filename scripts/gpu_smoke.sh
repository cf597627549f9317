#!/usr/bin/env bash
# First look on the GPU machine: the gate, then a short bench in every mode, then cold vs do_bench.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
K="python3 -m verbs.cli --store $OUT/store"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,ecc.mode.current --format=csv
timeout 300 python3 -m pytest -m gpu -q -x -p no:cacheprovider > "$OUT/gate.log" 2>&1; echo "gate rc=$?"
tail -5 "$OUT/gate.log"
timeout 200 $K bench --impl cuda:kp_rms_norm,torch:rms_norm,torch:rms_norm_compiled,cuda:mt_rms_norm_wide \
  --preset decode-1x4096,prefill,hbm-16384 --dtype bf16 --mode all --timeout 5 > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
tail -40 "$OUT/bench.log"

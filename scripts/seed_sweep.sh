#!/usr/bin/env bash
# Issue 34's fresh-data sweep: `kparity check --seed S` for S in FIRST..LAST over the generated
# cases of rms_norm and dequant_gemv on the CPU backends present (torch, MLX), JOBS seeds at a
# time, each into its own store under OUT; prints one line per seed, then the failing rows.
#   bash scripts/seed_sweep.sh [FIRST=1] [LAST=40] [JOBS=4] [OUT=/tmp/seed-sweep]
set -u
FIRST=${1:-1}; LAST=${2:-40}; JOBS=${3:-4}; OUT=${4:-/tmp/seed-sweep}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one core per seed
seq "$FIRST" "$LAST" | xargs -P "$JOBS" -I{} sh -c \
  'python3 -m verbs.cli --store '"$OUT"'/store-{} check --op rms_norm,dequant_gemv --seed {} \
     --backend torch --backend mlx > '"$OUT"'/seed-{}.log 2>&1; echo "seed {}: $(tail -1 '"$OUT"'/seed-{}.log)"'
python3 scripts/seed_sweep_summary.py "$OUT"

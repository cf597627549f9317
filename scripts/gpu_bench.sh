#!/usr/bin/env bash
# Regenerates the measurements of benchmarks/README.md on a CUDA machine, in stages that each
# fit one device call:
#   bash scripts/gpu_bench.sh aa        A/A for three impls, harness cold vs triton do_bench
#   bash scripts/gpu_bench.sh eager     kp_rms_norm against torch eager (F.rms_norm)
#   bash scripts/gpu_bench.sh compiled  kp_rms_norm against torch.compile(F.rms_norm)
#   bash scripts/gpu_bench.sh family    per-head, residual and add variants against torch
#   bash scripts/gpu_bench.sh perhead   kp gate, per-head and decode against torch.compile again
#   bash scripts/gpu_bench.sh small-compiled  per-head and decode, all dtypes, against torch.compile
#   bash scripts/gpu_bench.sh small-eager     the same against torch eager
#     (the two `small-*` stages: after torch's fresh outputs were made to rotate like the inputs)
#   bash scripts/gpu_bench.sh gemv      quantized GEMV family (issue 4): gate, every CUDA GEMV and
#     the torch baselines at the shapes (bf16), A/B against dense bf16 F.linear
#   bash scripts/gpu_bench.sh history   a small run history of the RMSNorm and GEMV families
#     (issue 5): 3 check runs, 4 bench runs, one A/B, for `kparity compare` and `kparity report`
#   bash scripts/gpu_bench.sh faults    issue 6: one check sweep of every CUDA impl plus the planted
#     faults of tests/faults_cuda.py, each case twice (--repeat 2: the race), isolated per case;
#     then each fault's rows and every real impl's status counts (scripts/fault_summary.py)
#   bash scripts/gpu_bench.sh pdl       kp_ impls as programmatic dependent launches: kp gate, per-head
#     and decode against torch.compile, the same kernels with and without PDL, the GEMV at the
#     issue's shapes with and without PDL against dense bf16 F.linear
#   bash scripts/gpu_bench.sh pdl-family  the rest of the RMSNorm A/Bs after the PDL change: HBM
#     shapes against torch.compile, per-head against eager, residual and add against both
#     (with `eager` and `pdl`: every issue-3 A/B on the shipped launch)
#   bash scripts/gpu_bench.sh mlx-cuda  issue 4: MLX on CUDA (mlx + mlx-cuda-13 importable, see
#     scripts/mlx_cuda_install.sh): the gate of mlx:quantized_matmul (f32) on the GPU, then MLX's
#     quantized_matmul at bf16 beside kp_qgemv_mma and dense F.linear at the shapes
#   bash scripts/gpu_bench.sh targets   issue 4's speed targets on this GPU: the GEMV family's bench
#     (kp_qgemv_mma, its copies only, kp_qgemv, dense bf16 F.linear; kp_qgemv_mma letting the next
#     kernel in late and launched without PDL) and kp_qgemv_mma against dense F.linear in an A/B,
#     at the shapes
#   bash scripts/gpu_bench.sh mma       issue 4 after the kp_qgemv_mma rewrite: read-only access
#     patterns (scripts/access_pattern.py), its stages / K parts / tiles choices, its load-only time, its subtraction path, the GEMV family at the shapes (bf16), A/B of kp_qgemv_mma against dense bf16
#     F.linear and against kp_qgemv (the full GPU gate runs as its own call before it)
#   bash scripts/gpu_bench.sh chain     issue 26: the official tables in the `chain` mode with
#     `graph_rot` beside them: the GEMV family at issue 4's shapes and the RMSNorm decode and HBM
#     shapes (bench in both modes)
#   bash scripts/gpu_bench.sh chain-ab  the A/Bs of those tables in `chain`: kp_qgemv_mma against
#     dense F.linear, kp_rms_norm against F.rms_norm
#   bash scripts/gpu_bench.sh attention  issue 27: decode attention at the shapes (Llama-3.1-8B
#     32/8 x 128, bf16: B=1 L=4096, B=32 L=4096, B=1 L=32768), kparity's split-KV kernel beside
#     the seed ports, torch SDPA and flex_attention; RoPE at decode (B=1, 32) against torch eager
#     and torch.compile; then the A/Bs of kp_sdpa_decode against torch SDPA and of kp_rope against
#     both RoPE baselines, all in `chain`
#   bash scripts/gpu_bench.sh gdn       issue 29: the check of both CUDA GDN impls, then the decode step
#     at Qwen3-Next's heads (B=64, Hv=32, K=V=128, bf16; the f32 state read and written: against
#     the copy ceiling), kp_gdn_step beside torch:gdn_step, and chunk_o (the seed port) at B=1,
#     T=4096 beside torch, in `chain`; then the A/B of kp_gdn_step against torch:gdn_step.
#     chunk_o's bench runs --no-verify: its float64 interval oracle takes ~75 s per 256 tokens
#     at these heads (minutes at 4096); the check before it verifies the kernel on its gate cases
#   bash scripts/gpu_bench.sh gdn-chunked  issue 29: the check of kparity's CUDA chunked pipeline and
#     its stages, then gdn_chunked at B=1, T=4096 / 16384 (Qwen3-Next heads, bf16, `chain`):
#     cuda:kp_gdn_chunked beside torch's chunked form and fla; each stage beside torch's at
#     T=4096; the A/B of kp_gdn_chunked against torch's chunked form (all --no-verify: the
#     float64 oracles take minutes at these T; the check verifies the pipeline on its gate cases)
#   bash scripts/gpu_bench.sh mamba     issue 30: the check of kparity's CUDA Mamba-2 kernels, then
#     at Nemotron-3-Nano's heads (bf16, `chain`): ssm_step (B = 1, 64, both layouts) beside torch
#     and mamba_ssm's selective_state_update, the conv step (B = 1, 64) and prefill (T = 2048)
#     beside torch, ssd_chunked (T = 2048 / 16384, dots f32 and T) beside torch's listing and
#     mamba_ssm's mamba_chunk_scan_combined
#   bash scripts/gpu_bench.sh attention-variants  issue 52: the attention GPU tests, kp_sdpa_decode's
#     variants (built alone, combine unrolled, 16 splits, 8/16 warps) beside torch SDPA, A/Bs
#   bash scripts/gpu_bench.sh conv-variants  issue 53: kp_conv1d_causal's span / load batching /
#     register budget / silu variants at Nemotron-3-Nano's conv, T = 2048, in `chain`
#   bash scripts/gpu_bench.sh compile-start  issue 48: a process's first torch.compile on this machine,
#     its phases cold and warm (scripts/compile_start.py, one profiled), then the three cold
#     commit-tier tests over 20 s alone (-n 0), each from empty caches and again warm
#   bash scripts/gpu_bench.sh collect-profile  issue 48: a `pytest -m gpu --collect-only` under
#     -X importtime and cProfile (a gate worker's 34 s before its first test)
#   bash scripts/gpu_bench.sh mamba-decode  issue 30: ssm_step and the conv step at B = 1, 64 against
#     a copy of each case's own bytes in `chain` (--copy-same-bytes)
#   bash scripts/gpu_bench.sh mamba-ab  issue 30: the A/Bs in `chain`: kp_ssd_chunked against torch's
#     listing and mamba_chunk_scan_combined (T = 2048, --no-verify: minutes of float64 oracle),
#     kp_ssm_step and kp_conv1d_causal_step against torch (B = 1, 64)
#   bash scripts/gpu_bench.sh moe       issue 31: MoE at the models' shapes (bf16, `chain`): route
#     (kp_moe_router) and sort (kp_moe_dispatch) beside torch's (its bincount a host sync) at
#     T = 1 and 2048; the grouped GEMM (the experts' up projection, dense and affine int4)
#     beside torch's per-expert loops and torch._grouped_mm, against a copy of the same bytes
#     (--copy-same-bytes: decode reads k experts' weights)
#   bash scripts/gpu_bench.sh moe-ab    issue 31: the A/Bs in `chain`: route and sort (T = 2048), the
#     up projection against torch._grouped_mm (T = 1, 2048) and the int4 per-expert loop (T = 1)
#   bash scripts/gpu_bench.sh liger     issue 35: Liger-Kernel's impls through the GPU gate, then the
#     A/Bs of cuda:kp_rms_norm against each RMSNorm casting mode on every rms_norm bench shape,
#     bf16 (`liger-more`: f16, and kp_rope and silu_mul against Liger's), in `chain` (needs liger-kernel:
#     carry its wheel and
#     `pip install --no-index --no-deps --target /tmp/site liger_kernel-*.whl`, PYTHONPATH=/tmp/site)
#   [TIER=commit] [N=8] [PASSES="cold warm"] [LIMIT=280] [WARM_LIMIT=LIMIT] [STACKS_AFTER=30] bash scripts/gpu_bench.sh tiers
#     issue 48:
#     `pytest -m gpu --tier TIER -n N` from empty caches (oracle, nvcc, CuPy, Triton, Inductor),
#     then again on the caches it filled; wall time, pytest's 40 longest tests and the JUnit file
#     of each pass (test seconds by file: python3 scripts/same_tests.py --by-file FILE ...); every thread's
#     stack of a test still running after STACKS_AFTER s (default 30) goes to the pass's log
#   [SWEEP=all] [WARM=1] bash scripts/gpu_bench.sh devices   issue 32: `check` plain against
#     `--devices all` (same rows: scripts/same_rows.py; wall times), each from empty caches, or
#     both on the caches a first (untimed) run filled
#   [GATE='pytest args'] bash scripts/gpu_bench.sh devices-gate   issue 32: the gate's part GATE with
#     -n 0 against one xdist worker per GPU (same outcomes: scripts/same_tests.py; wall times)
#   bash scripts/gpu_bench.sh model     issue 28: the model gate's GPU tests, SmolLM2-135M Q4_1 under the
#     CUDA and torch plans (CUDA graphs, the eager step beside) against the transformers bf16
#     baselines (eager, compiled), the Llama-3-8B-shaped synthetic model's roofline, one model A/B
#     (after scripts/model_carry.sh)
# Logs go to $OUT/<stage>.log; the store is packed as $OUT/store-<stage>.tgz.
set -u
STAGE=${1:?stage: aa, eager, compiled or family}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STORE=$OUT/store-$STAGE
K="python3 -m verbs.cli --store $STORE"
T="--min-time 0.25"   # per run; the A/B replicates runs, not samples
LOG=$OUT/$STAGE.log
run() { echo "\$ kparity ${*}" | sed "s|--store [^ ]* ||" >> "$LOG"; $K "$@" >> "$LOG" 2>&1; echo "rc=$? at ${SECONDS} s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,ecc.mode.current --format=csv > "$LOG"
case $STAGE in
aa)
  for impl in cuda:kp_rms_norm torch:rms_norm cuda:mt_rms_norm_wide; do
    run ab $impl $impl --preset hbm-16384x8192,prefill-2048x4096 --dtype bf16 $T
  done
  echo "\$ python3 scripts/cold_vs_do_bench.py" >> "$LOG"
  python3 scripts/cold_vs_do_bench.py --preset hbm-16384x8192 hbm-65536x4096 prefill-2048x4096 >> "$LOG" 2>&1
  ;;
eager)
  run ab torch:rms_norm cuda:kp_rms_norm --preset hbm,decode-1x4096,decode-64x4096 $T
  ;;
compiled)
  run ab torch:rms_norm_compiled cuda:kp_rms_norm --preset hbm,decode-1x4096,decode-64x4096 $T
  ;;
family)
  run ab torch:rms_norm_per_head cuda:kp_rms_norm_per_head $T
  run ab torch:rms_norm_per_head_compiled cuda:kp_rms_norm_per_head $T
  for op in rms_norm_residual add_rms_norm; do
    run ab torch:${op} cuda:kp_${op} --preset hbm-16384x8192,decode-1x4096 --dtype bf16 $T
    run ab torch:${op}_compiled cuda:kp_${op} --preset hbm-16384x8192,decode-1x4096 --dtype bf16 $T
  done
  ;;
perhead)  # after the SMALL_WORK geometry change: gate the kp impls again, then re-measure
  timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider -k "kp_" >> "$LOG" 2>&1; echo "gate rc=$?" >> "$LOG"
  tail -2 "$LOG"
  run ab torch:rms_norm_per_head_compiled cuda:kp_rms_norm_per_head $T
  run ab torch:rms_norm_compiled cuda:kp_rms_norm --preset decode-1x4096,decode-64x4096 --dtype bf16 $T
  ;;
small-compiled)
  run ab torch:rms_norm_per_head_compiled cuda:kp_rms_norm_per_head $T
  run ab torch:rms_norm_compiled cuda:kp_rms_norm --preset decode-1x4096,decode-64x4096 $T
  ;;
small-eager)
  run ab torch:rms_norm_per_head cuda:kp_rms_norm_per_head $T
  run ab torch:rms_norm cuda:kp_rms_norm --preset decode-1x4096,decode-64x4096 $T
  ;;
gemv)
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -k "gemv or expert or qmm or rms_qgemv or invariance" >> "$LOG" 2>&1; echo "gate rc=$?" >> "$LOG"
  run bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --impl cuda:kp_qgemv,cuda:kp_qgemv_mma,cuda:dequant_gemv_int4_fast,torch:linear_dense,torch:dequant_linear --min-time 0.1
  run bench --op rms_norm_qgemv,qmm,dequant_gemv_expert_indexed --dtype bf16 --min-time 0.1
  run ab torch:linear_dense cuda:kp_qgemv --preset llama3-8b,qwen2.5-32b --dtype bf16 --min-time 0.1
  ;;
pdl)
  timeout 240 python3 -m pytest -m gpu -q -x -p no:cacheprovider -k "kp_" >> "$LOG" 2>&1; echo "gate rc=$?" >> "$LOG"
  tail -2 "$LOG"
  V="--plugin scripts/kp_variants.py"
  run ab torch:rms_norm_per_head_compiled cuda:kp_rms_norm_per_head $T
  run ab torch:rms_norm_compiled cuda:kp_rms_norm --preset decode-1x4096,decode-64x4096 $T
  run $V ab cuda:kp_rms_norm_per_head_nopdl cuda:kp_rms_norm_per_head --dtype bf16 $T
  run $V bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b --dtype bf16 --impl cuda:kp_qgemv,cuda:kp_qgemv_nopdl,torch:linear_dense --min-time 0.1
  ;;
mma)
  V="--plugin scripts/kp_variants.py"
  echo "\$ python3 scripts/access_pattern.py" >> "$LOG"
  python3 scripts/access_pattern.py >> "$LOG" 2>&1
  echo "\$ python3 scripts/mma_trace.py" >> "$LOG"
  python3 scripts/mma_trace.py >> "$LOG" 2>&1
  run $V bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b --dtype bf16 --impl cuda:kp_qgemv_mma,cuda:kp_qgemv_mma_s2,cuda:kp_qgemv_mma_s3,cuda:kp_qgemv_mma_p2,cuda:kp_qgemv_mma_p4,cuda:kp_qgemv_mma_p8,cuda:kp_qgemv_mma_t1,cuda:kp_qgemv_mma_t2,cuda:kp_qgemv_mma_t4,cuda:kp_qgemv_mma_late,cuda:kp_qgemv_mma_nopdl,cuda:kp_qgemv_mma_subtract --min-time 0.1
  run $V bench --no-verify --op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --impl cuda:kp_qgemv_mma_diag_load_only --min-time 0.1
  run bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --impl cuda:kp_qgemv,cuda:kp_qgemv_mma,cuda:dequant_gemv_int4_fast,torch:linear_dense,torch:dequant_linear --min-time 0.1
  run ab torch:linear_dense cuda:kp_qgemv_mma --preset llama3-8b,qwen2.5-32b --dtype bf16 --min-time 0.1
  run ab cuda:kp_qgemv cuda:kp_qgemv_mma --preset llama3-8b,qwen2.5-32b --dtype bf16 --min-time 0.1
  ;;
targets)
  run bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --impl cuda:kp_qgemv_mma,cuda:kp_qgemv,torch:linear_dense --min-time 0.2
  run --plugin scripts/kp_variants.py bench --no-verify --op dequant_gemv --preset llama3-8b,qwen2.5-32b --dtype bf16 --impl cuda:kp_qgemv_mma_diag_load_only --min-time 0.2
  run --plugin scripts/kp_variants.py bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b --dtype bf16 --impl cuda:kp_qgemv_mma_late,cuda:kp_qgemv_mma_nopdl --min-time 0.2
  run ab torch:linear_dense cuda:kp_qgemv_mma --preset llama3-8b,qwen2.5-32b --dtype bf16 --min-time 0.1
  ;;
chain)
  G="--op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --min-time 0.2"
  R="--op rms_norm --preset decode-1x4096,decode-64x4096,hbm --dtype bf16 --min-time 0.2"
  for mode in chain graph_rot; do
    run bench $G --impl cuda:kp_qgemv_mma,cuda:kp_qgemv,cuda:dequant_gemv_int4_fast,torch:linear_dense --mode $mode
    run bench $R --impl cuda:kp_rms_norm,cuda:mt_rms_norm,torch:rms_norm,torch:rms_norm_compiled --mode $mode
  done
  ;;
chain-ab)
  run ab torch:linear_dense cuda:kp_qgemv_mma --preset llama3-8b,qwen2.5-32b --dtype bf16 --min-time 0.1
  run ab torch:rms_norm cuda:kp_rms_norm --preset hbm,decode-1x4096,decode-64x4096 $T
  ;;
mlx-cuda)
  python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" >> "$LOG" 2>&1
  run check --op dequant_gemv --impl mlx:quantized_matmul --isolate none
  run bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b,lm_head --dtype bf16 --impl mlx:quantized_matmul_half,cuda:kp_qgemv_mma,torch:linear_dense --min-time 0.2
  run bench --op dequant_gemv --preset llama3-8b,qwen2.5-32b --dtype f32 --impl mlx:quantized_matmul,cuda:kp_qgemv --min-time 0.2
  ;;
pdl-family)
  run ab torch:rms_norm_compiled cuda:kp_rms_norm --preset hbm $T
  run ab torch:rms_norm_per_head cuda:kp_rms_norm_per_head $T
  for op in rms_norm_residual add_rms_norm; do
    run ab torch:${op} cuda:kp_${op} --preset hbm-16384x8192,decode-1x4096 --dtype bf16 $T
    run ab torch:${op}_compiled cuda:kp_${op} --preset hbm-16384x8192,decode-1x4096 --dtype bf16 $T
  done
  ;;
faults)
  start=$(date +%s)
  run --plugin tests/faults_cuda.py check --backend cuda --repeat 2 --show-failures 40
  echo "sweep wall_s=$(( $(date +%s) - start ))" >> "$LOG"
  python3 scripts/fault_summary.py "$STORE" >> "$LOG" 2>&1
  ;;
attention)
  A="--preset llama-3.1-8b-b1-4096,llama-3.1-8b-b32-4096,llama-3.1-8b-b1-32768 --dtype bf16"
  R="--preset llama-3.1-8b-b1,llama-3.1-8b-b32 --dtype bf16"
  run bench --op sdpa_decode $A --impl cuda:kp_sdpa_decode,cuda:ffai_sdpa_decode,cuda:sdpa_decode_2pass,torch:sdpa,torch:flex_attention --min-time 0.2
  run bench --op rope $R --impl cuda:kp_rope,torch:rope_hf,torch:rope_hf_compiled --min-time 0.2
  run ab torch:sdpa cuda:kp_sdpa_decode $A --min-time 0.1
  run ab torch:rope_hf_compiled cuda:kp_rope $R --min-time 0.1
  run ab torch:rope_hf cuda:kp_rope $R --min-time 0.1
  ;;
gdn)
  S="--op gdn_step --preset qwen3-next-b64 --dtype bf16"
  C="--op gdn_chunk_o --preset qwen3-next-b1-t4096 --dtype bf16"
  run check --impl cuda:kp_gdn_step,cuda:gdn_chunk_o --show-failures 5
  run bench $S --impl cuda:kp_gdn_step,torch:gdn_step --mode chain --min-time 0.2
  run bench $C --impl cuda:gdn_chunk_o,torch:gdn_chunk_o --mode chain --min-time 0.2 --no-verify
  run ab torch:gdn_step cuda:kp_gdn_step --preset qwen3-next-b64 --dtype bf16 --min-time 0.1
  ;;
gdn-chunked)
  # needs fla-core 0.6.0 + einops importable (pip install --no-index --no-deps --target
  # /tmp/site .device/wheels/{fla_core,einops}*.whl; PYTHONPATH=/tmp/site) for the fla rows
  P="--preset qwen3-next-b1-t4096,qwen3-next-b1-t16384 --dtype bf16 --mode chain --min-time 0.2"
  run check --impl cuda:kp_gdn_chunked,cuda:kp_gdn_chunk_cumsum,cuda:kp_gdn_kkt,cuda:kp_gdn_solve_tril,cuda:kp_gdn_wy,cuda:kp_gdn_chunk_h --show-failures 5
  run bench --op gdn_chunked $P --impl cuda:kp_gdn_chunked,torch:chunk_gated_delta_rule,torch:fla_chunk_gated_delta_rule --no-verify
  for s in chunk_cumsum kkt solve_tril wy chunk_h; do
    run bench --op gdn_$s --preset qwen3-next-b1-t4096 --dtype bf16 --mode chain --min-time 0.2 --impl cuda:kp_gdn_$s,torch:gdn_$s --no-verify
  done
  run bench --op gdn_chunk_o --preset qwen3-next-b1-t4096 --dtype bf16 --mode chain --min-time 0.2 --impl cuda:gdn_chunk_o,torch:gdn_chunk_o --no-verify
  run ab torch:chunk_gated_delta_rule cuda:kp_gdn_chunked --preset qwen3-next-b1-t4096 --dtype bf16 --min-time 0.2
  ;;
mamba)
  # mamba_ssm's Triton kernels (python-only install; causal_conv1d's build skipped: ~330 s):
  # KPARITY_SKIP_CONV_BUILD=1 bash scripts/mamba_peer_install.sh; export PYTHONPATH=/tmp/site:$PWD
  run check --impl cuda:kp_ssm_step,cuda:kp_conv1d_causal_step,cuda:kp_conv1d_causal,cuda:kp_ssd_chunked --show-failures 5
  B="--dtype bf16 --mode chain --min-time 0.2"
  run bench --op ssm_step --preset nemotron-3-nano $B --impl cuda:kp_ssm_step,torch:ssm_step,torch:mamba_selective_state_update
  run bench --op conv1d_causal_step --preset nemotron-3-nano $B --impl cuda:kp_conv1d_causal_step,torch:conv1d_causal_step
  run bench --op conv1d_causal --preset nemotron-3-nano $B --impl cuda:kp_conv1d_causal,torch:conv1d_causal --no-verify
  run bench --op ssd_chunked --preset nemotron-3-nano $B --impl cuda:kp_ssd_chunked,torch:ssd_chunked,torch:mamba_chunk_scan_combined --no-verify
  ;;
attention-variants)
  # issue 52, next: the attention GPU tests, then kp_sdpa_decode's variants (scripts/kp_attn_variants.py:
  # built alone, the combine unrolled, 16 splits, 8 / 16 warps) beside torch SDPA, and A/Bs in `chain`
  A="--preset llama-3.1-8b-b1-4096,llama-3.1-8b-b32-4096,llama-3.1-8b-b1-32768 --dtype bf16"
  V="--plugin scripts/kp_attn_variants.py"
  timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gpu_attention.py >> "$LOG" 2>&1; echo "gate rc=$?" >> "$LOG"
  run $V check --op sdpa_decode,attn_combine --impl cuda:kp_sdpa_decode_cu8,cuda:kp_attn_combine_u8,cuda:kp_sdpa_decode_w8,cuda:kp_sdpa_decode_e8_w16 --show-failures 3
  run $V bench --op sdpa_decode $A --mode chain --min-time 0.1 --impl cuda:kp_sdpa_decode,cuda:kp_sdpa_decode_solo,cuda:kp_sdpa_decode_cu8,cuda:kp_sdpa_decode_s16,cuda:kp_sdpa_decode_s16_cu8,cuda:kp_sdpa_decode_w8,cuda:kp_sdpa_decode_w8_s16,cuda:kp_sdpa_decode_e8_w8,cuda:kp_sdpa_decode_e8_w16,torch:sdpa
  run $V ab cuda:kp_sdpa_decode cuda:kp_sdpa_decode_cu8 --preset llama-3.1-8b-b1-4096,llama-3.1-8b-b1-32768 --dtype bf16 --min-time 0.1
  run ab torch:sdpa cuda:kp_sdpa_decode $A --min-time 0.1
  ;;
conv-variants)
  # issue 53: kp_conv1d_causal's span and register budget (scripts/kp_conv_variants.py) at
  # Nemotron-3-Nano's conv, T = 2048, against the copy ceiling, in `chain`
  V="--plugin scripts/kp_conv_variants.py"
  run $V check --op conv1d_causal --impl cuda:kp_conv1d_causal,cuda:kp_conv1d_causal_a8m1_sp32 --show-failures 3
  run $V bench --op conv1d_causal --preset nemotron-3-nano --dtype bf16 --mode chain --min-time 0.2 --impl cuda:kp_conv1d_causal,cuda:kp_conv1d_causal_sp4,cuda:kp_conv1d_causal_sp16,cuda:kp_conv1d_causal_sp32,cuda:kp_conv1d_causal_a8,cuda:kp_conv1d_causal_a8m1,cuda:kp_conv1d_causal_a8m1_sp4,cuda:kp_conv1d_causal_a8m1_sp16,cuda:kp_conv1d_causal_a8m1_sp32
  run $V ab cuda:kp_conv1d_causal_a8m1_sp32 cuda:kp_conv1d_causal --preset nemotron-3-nano --dtype bf16 --min-time 0.1
  # is it silu's instructions? The 1-ULP reciprocal is within what the op's bound charges (the
  # divide at 2 ULP, then the product), so its gate must pass; __expf is not declared (bench only)
  run $V check --op conv1d_causal --impl cuda:kp_conv1d_causal_rcp --show-failures 3
  run $V bench --op conv1d_causal --preset nemotron-3-nano --dtype bf16 --mode chain --min-time 0.2 --no-verify --impl cuda:kp_conv1d_causal,cuda:kp_conv1d_causal_rcp,cuda:kp_conv1d_causal_fastexp
  ;;
compile-start)
  # issue 48: ~11 s of a compiled impl's first test in a process, cache warm or cold
  export TORCHINDUCTOR_COMPILE_THREADS=1 OMP_NUM_THREADS=1  # as in a gate worker
  C="TRITON_CACHE_DIR=/tmp/cs/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cs/inductor"
  rm -rf /tmp/cs
  for pass in cold warm; do echo "$pass: $(env $C python3 scripts/compile_start.py 2>&1 | tail -1)" >> "$LOG"; done
  env $C python3 scripts/compile_start.py --profile 40 > $OUT/compile-start-profile.txt 2>&1
  for t in "test_deterministic_impls_are_bit_identical_run_to_run[torch:flex_attention_varlen-7bfcb9147ebd]" \
           "test_deterministic_impls_are_bit_identical_run_to_run[torch:rms_norm_compiled-0a40c1be564c]" \
           "test_gate[torch:rope_hf_compiled-01b807f245ef]"; do
    rm -rf /tmp/ca
    for pass in cold warm; do
      echo "\$ pytest -m gpu tests/test_gpu.py::$t ($pass)" >> "$LOG"
      env KPARITY_CACHE=/tmp/ca/kp CUPY_CACHE_DIR=/tmp/ca/cupy TRITON_CACHE_DIR=/tmp/ca/triton \
        TORCHINDUCTOR_CACHE_DIR=/tmp/ca/inductor KPARITY_PREBUILD=0 python3 -m pytest -m gpu -q \
        -p no:cacheprovider --durations=1 "tests/test_gpu.py::$t" 2>&1 | grep -E "s call|passed|failed" >> "$LOG"
    done
  done
  cat "$LOG"; exit 0
  ;;
collect-profile)
  # issue 48: where a worker's 34 s before its first test go (the same cold or warm): one
  # `pytest -m gpu --collect-only` under -X importtime and one under cProfile (cumulative top 40)
  timeout 90 python3 -X importtime -m pytest -m gpu --collect-only -q -p no:cacheprovider > $OUT/collect0.txt 2> $OUT/importtime.txt
  echo "collect rc=$? $(tail -1 $OUT/collect0.txt)" >> "$LOG"
  sort -t'|' -k2 -n -r $OUT/importtime.txt | head -30 >> "$LOG"
  timeout 90 python3 -m cProfile -o $OUT/collect.prof -m pytest -m gpu --collect-only -q -p no:cacheprovider > /dev/null 2>&1
  python3 -c "import pstats; pstats.Stats('$OUT/collect.prof').sort_stats('cumulative').print_stats(40)" >> "$LOG" 2>&1
  ;;
mamba-decode)
  # the decode step and the conv step against a copy of their own bytes in chain
  # (--copy-same-bytes: %cp-same); mamba_ssm as in `mamba`
  B="--dtype bf16 --mode chain --min-time 0.2 --copy-same-bytes"
  run bench --op ssm_step --preset nemotron-3-nano $B --impl cuda:kp_ssm_step,torch:ssm_step,torch:mamba_selective_state_update
  run bench --op conv1d_causal_step --preset nemotron-3-nano $B --impl cuda:kp_conv1d_causal_step,torch:conv1d_causal_step
  ;;
mamba-ab)
  # the A/Bs of the Mamba-2 table, in chain
  A="--dtype bf16 --mode chain --min-time 0.2"
  # --no-verify: the float64 oracle takes minutes at T = 2048; the check verifies the kernel
  run ab torch:ssd_chunked cuda:kp_ssd_chunked --preset nemotron-3-nano-t2048 $A --no-verify
  run ab torch:mamba_chunk_scan_combined cuda:kp_ssd_chunked --preset nemotron-3-nano-t2048-dotsT $A --no-verify
  run ab torch:ssm_step cuda:kp_ssm_step --preset nemotron-3-nano-b1-hpn,nemotron-3-nano-b64-hpn $A
  run ab torch:conv1d_causal_step cuda:kp_conv1d_causal_step --preset nemotron-3-nano-b1,nemotron-3-nano-b64 $A
  ;;
moe)
  B="--mode chain --min-time 0.2"
  run bench --op moe_router --impl cuda:kp_moe_router,torch:moe_router --dtype bf16 $B
  run bench --op moe_dispatch --impl cuda:kp_moe_dispatch,torch:moe_dispatch $B
  G="--op moe_grouped_gemm --impl cuda:kp_moe_grouped_gemm,torch:grouped_linear,torch:grouped_dequant_linear,torch:grouped_mm --dtype bf16"
  run bench $G --preset nemotron3-nano-up-dense-t1,nemotron3-nano-up-affine4-t1,qwen3-30b-a3b-up-affine4-t1 $B --copy-same-bytes
  # --no-verify: the float64 oracle of 12288 x 2688 x 1856 per case; the gate and
  # tests/test_gpu_moe_gemm.py verify the kernels at T = 2048. The loops take 10-37 ms a call.
  run bench $G --preset nemotron3-nano-up-dense-t2048,nemotron3-nano-up-affine4-t2048 --mode chain --min-time 0.1 --timeout 5 --no-verify
  ;;
moe-ab)
  # the A/Bs of the MoE table, in chain. Route and sort at T = 2048 only: at T = 1 each run
  # builds 65536 rotating sets of a few hundred bytes, and the A/B outlasts a 600 s call
  m=nemotron-3-nano-30b-a3b
  R="--mode chain --min-time 0.1 --runs 5 --timeout 3"
  run ab torch:moe_router cuda:kp_moe_router --preset $m-t2048 --dtype bf16 $R
  run ab torch:moe_dispatch cuda:kp_moe_dispatch --preset $m-t2048 $R
  A="--dtype bf16 --mode chain --min-time 0.2 --no-verify"
  run ab torch:grouped_mm cuda:kp_moe_grouped_gemm --preset nemotron3-nano-up-dense-t1,nemotron3-nano-up-dense-t2048 $A
  run ab torch:grouped_dequant_linear cuda:kp_moe_grouped_gemm --preset nemotron3-nano-up-affine4-t1 $A
  ;;
liger)  # one device call each: `liger`, then `liger-more`
  echo "\$ pytest -m gpu tests/test_gpu.py -k liger" >> "$LOG"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k liger >> "$LOG" 2>&1
  echo "rc=$?" >> "$LOG"
  A="--mode chain --min-time 0.2 --timeout 2"  # a noisy run stops at 2 s, not 15
  for mode in gemma llama; do
    run ab torch:liger_rms_norm_$mode cuda:kp_rms_norm --dtype bf16 $A
  done
  # the SLOWER row was measured in graph_rot: measure it there too
  run ab torch:liger_rms_norm_gemma cuda:kp_rms_norm --preset decode-64x8192 --dtype bf16 --mode graph_rot --min-time 0.2 --timeout 2
  ;;
liger-more)
  A="--mode chain --min-time 0.2 --timeout 2"
  for mode in gemma llama; do
    run ab torch:liger_rms_norm_$mode cuda:kp_rms_norm --dtype f16 $A
  done
  run ab torch:liger_rope cuda:kp_rope --dtype bf16 $A
  run ab torch:liger_silu_mul cuda:silu_mul --dtype bf16 $A
  ;;
tiers)  # issue 48: the gate's tier, cold then warm (header above)
  TIER=${TIER:-commit}; N=${N:-8}; rm -rf /tmp/tiers
  for pass in ${PASSES:-cold warm}; do
    start=$SECONDS
    env KPARITY_CACHE=/tmp/tiers/kp CUPY_CACHE_DIR=/tmp/tiers/cupy TRITON_CACHE_DIR=/tmp/tiers/triton \
        TORCHINDUCTOR_CACHE_DIR=/tmp/tiers/inductor KPARITY_TIMELINE=$OUT/timeline-$pass \
        timeout -s INT -k 30 $([ $pass = warm ] && echo ${WARM_LIMIT:-${LIMIT:-280}} || echo ${LIMIT:-280}) \
        python3 -m pytest -m gpu -q -p no:cacheprovider -p scripts.timeline -n $N --tier $TIER \
        --durations=40 -o faulthandler_timeout=${STACKS_AFTER:-30} \
        --junitxml=$OUT/$TIER-$pass.xml ${GATE:-} > $OUT/$TIER-$pass.log 2>&1
    echo "$TIER $pass -n $N: rc=$? wall $((SECONDS - start)) s; $(tail -1 $OUT/$TIER-$pass.log)" | tee -a "$LOG"
    python3 -m scripts.timeline $OUT/timeline-$pass > $OUT/timeline-$pass.txt 2>&1
    head -1 $OUT/timeline-$pass.txt | tee -a "$LOG"
  done
  # a device call brings back 8 files: per pass its log, JUnit file and timeline summary, this
  # log, and every pass's per-worker timelines in one archive (no store: pytest writes none)
  tar -czf $OUT/timelines.tgz -C $OUT $(cd $OUT && ls -d timeline-* | grep -v '\.txt$') \
    && rm -rf $(ls -d $OUT/timeline-* | grep -v '\.txt$')
  exit 0
  ;;
devices|devices-gate)  # issue 32: a spread sweep against the plain one (devices), the gate under
  # xdist against one process (devices-gate). SWEEP (env): check's filter arguments (default six
  # kp impls; SWEEP=all: the full sweep); GATE (env): pytest's selection arguments. One GPU: the
  # rows and the test outcomes must match; two GPUs: the wall times are the table (targets 1.8x
  # sweep, 1.7x gate). Every timed run starts from its own empty caches (KPARITY_CACHE: oracle
  # results and nvcc builds; CuPy's, Triton's and Inductor's kernel caches), so neither side
  # inherits the other's work; `devices` with WARM=1: both on the caches a first run filled.
  # LIMIT (env, s): each run is stopped past it (SIGINT: its rows are kept; killed 60 s later).
  # pytest -n needs pytest-xdist (in the GPU image).
  GPUS=$(nvidia-smi -L | wc -l)
  cold() { [ -n "${WARM:-}" ] && [ $STAGE = devices ] && set -- warm || rm -rf /tmp/cold-$1
    echo "KPARITY_CACHE=/tmp/cold-$1/kp CUPY_CACHE_DIR=/tmp/cold-$1/cupy TRITON_CACHE_DIR=/tmp/cold-$1/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cold-$1/inductor"; }
  if [ $STAGE = devices ]; then
    SWEEP=${SWEEP:---impl cuda:kp_rms_norm,cuda:kp_rms_norm_per_head,cuda:kp_qgemv_mma,cuda:kp_qgemv,cuda:silu_mul,cuda:kp_rope}
    [ "$SWEEP" = all ] && SWEEP=""
    # WARM=1: one untimed run fills one set of caches, and both timed runs use it (a nightly's
    # steady state: the same seeded cases every night)
    [ -n "${WARM:-}" ] && { rm -rf /tmp/cold-warm; HOWS="warm-up ${HOWS:-plain devices}"; }
    for how in ${HOWS:-plain devices}; do
      flag=""; [ $how != plain ] && flag="--devices all"
      t0=$SECONDS
      echo "\$ kparity check $SWEEP $flag" >> "$LOG"
      env $(cold $how) timeout -k 60 -s INT ${LIMIT:-3600} python3 -m verbs.cli --store $OUT/store-$how check $SWEEP $flag >> "$LOG" 2>&1
      echo "check $how rc=$? wall $((SECONDS - t0)) s ($GPUS GPUs)" >> "$LOG"
    done
    python3 scripts/same_rows.py $OUT/store-plain $OUT/store-devices >> "$LOG" 2>&1; echo "same_rows rc=$?" >> "$LOG"
  else
    [ -n "${GATE:-}" ] || GATE='-k "kp_rms_norm or kp_qgemv"'
    NS=${NS:-0 $([ "$GPUS" = 1 ] && echo auto || echo "$GPUS")}
    for n in $NS; do
      t0=$SECONDS
      echo "\$ pytest -m gpu -n $n $GATE" >> "$LOG"
      eval env $(cold gate-$n) timeout -k 60 -s INT ${LIMIT:-3600} python3 -m pytest -m gpu -q -p no:cacheprovider -n $n \
        --junit-xml $OUT/gate-n$n.xml "$GATE" >> "$LOG" 2>&1
      echo "gate -n $n rc=$? wall $((SECONDS - t0)) s ($GPUS GPUs)" >> "$LOG"
    done
    python3 scripts/same_tests.py $OUT/gate-n${NS%% *}.xml $OUT/gate-n${NS##* }.xml >> "$LOG" 2>&1
    echo "same_tests rc=$?" >> "$LOG"
  fi
  grep -E "wall|same |DIFFERENT|passed|failed|by device_index|checks launched|interrupted" "$LOG" | cut -c1-200 | tail -20
  tar czf "$OUT/stores-$STAGE.tgz" -C "$OUT" $(cd $OUT && ls -d store-* 2>/dev/null) 2>/dev/null; rm -rf $OUT/store-*
  exit 0
  ;;
model)
  # needs the SmolLM2 GGUF at $KPARITY_GGUF and transformers + gguf (scripts/model_carry.sh)
  echo "\$ pytest -m gpu tests/test_gpu_model.py" >> "$LOG"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_model.py >> "$LOG" 2>&1
  echo "rc=$?" >> "$LOG"
  run model --plan cuda,torch,hf-bf16,hf-bf16-compiled --dtype f16 --tokens 64 --speed
  run model --model synthetic:llama3-8b --plan cuda --dtype bf16 --tokens 64 --speed-only
  run model-ab cuda cuda+rms_norm=torch:rms_norm --dtype f16 --tokens 64
  ;;
history)
  CHECK_IMPLS=cuda:kp_rms_norm,cuda:kp_rms_norm_per_head,cuda:mt_rms_norm,cuda:mt_rms_norm_wide,cuda:dequant_gemv,cuda:dequant_gemv_int4_fast,cuda:kp_qgemv,cuda:kp_qgemv_mma,torch:rms_norm,torch:rms_norm_per_head,torch:dequant_linear
  for i in 1 2 3; do run check --impl $CHECK_IMPLS --show-failures 5; done
  for i in 1 2 3 4; do
    run bench --impl cuda:kp_rms_norm,cuda:kp_rms_norm_per_head,cuda:mt_rms_norm_wide,torch:rms_norm,torch:rms_norm_per_head --preset decode-1x4096,per-head-1024x128,hbm-16384x8192 --dtype bf16 --min-time 0.1 --timeout 3
    run bench --impl cuda:kp_qgemv,cuda:kp_qgemv_mma,torch:linear_dense --op dequant_gemv --preset llama3-8b --dtype bf16 --min-time 0.1 --timeout 3
  done
  run ab torch:rms_norm cuda:kp_rms_norm --preset decode-1x4096,hbm-16384x8192 --dtype bf16 --min-time 0.1
  ;;
esac
tar czf "$OUT/store-$STAGE.tgz" -C "$OUT" "store-$STAGE" && rm -rf "$STORE"
grep -E "^\\$|ceilings|verdict|│|rc=|impl  |ratio" "$LOG" | grep -v "━" | cut -c1-150 | tail -80

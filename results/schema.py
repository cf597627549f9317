"""Arrow schemas of the store's tables. Every row carries `schema_version`.

Documented in docs/results-schema.md; change both together and bump SCHEMA_VERSION.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 10  # 2: correctness.flags; 3: the annotations table, toolchain in runs.versions;
#                     4: bench.pred_median_ns (the chain mode's subtracted predecessor);
#                     5: the model table (`kparity model`, issue 28);
#                     6: model.prefill_tokens, decode_mode, eager_tok_s, batch_size,
#                        batch_tok_s;
#                     7: bench.copy_same_ns, pct_copy_same (`--copy-same-bytes`);
#                     8: ab.convention_a, convention_b (each arm's rounding convention);
#                     9: correctness.device_index, bench.device_index (`--devices`);
#                     10: correctness.host, bench.host (`--ray`: the host a row ran on)

RUNS = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),           # sorts by start time: UTC time, microseconds, random
    ("started", pa.timestamp("us", tz="UTC")),
    ("command", pa.string()),          # the command line
    ("verb", pa.string()),             # check, repro, ...
    ("git_sha", pa.string()),
    ("git_dirty", pa.bool_()),
    ("host", pa.string()),
    ("platform", pa.string()),
    ("devices", pa.string()),          # JSON: backend -> device
    ("versions", pa.string()),         # JSON: package -> version (python, numpy, torch, cupy, mlx...)
    ("filters", pa.string()),          # JSON of the CLI filters
])

# Who ran which case: the leading columns of every per-(impl, case) table.
CASE_ROW = [
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("case_id", pa.string()),          # stable content hash of the case
    ("impl", pa.string()),             # backend:name
    ("op", pa.string()),
    ("backend", pa.string()),
    ("device", pa.string()),
    ("device_index", pa.int32()),      # `--devices`: the index of the device it ran on (its
    #                                    position in the list); `--ray`: the GPU Ray gave its
    #                                    task, as Ray numbers its host's GPUs; else null
    ("host", pa.string()),             # `--ray`: the host it ran on; else null (`runs.host`)
    ("dtype", pa.string()),
    ("dist", pa.string()),
    ("dims", pa.string()),             # JSON
    ("params", pa.string()),           # JSON (eps, weight_offset, ...)
    ("label", pa.string()),            # preset:..., edge, violates:<invariant>
    ("case_json", pa.string()),        # the whole case, for `kparity repro`
]

CORRECTNESS = pa.schema([
    *CASE_ROW,
    ("expect", pa.string()),           # valid | rejected
    ("status", pa.string()),           # pass fail rejected error timeout crash unsupported
    ("message", pa.string()),
    ("worst_output", pa.string()),
    ("max_abs", pa.float64()),
    ("max_rel", pa.float64()),
    ("nmse", pa.float64()),
    ("cosine", pa.float64()),
    ("max_ulp", pa.int64()),
    ("frac_within", pa.float64()),
    ("nonfinite_mismatch", pa.int64()),
    ("budget", pa.float64()),          # max |out - exact| / bound over the worst output
    ("outputs_json", pa.string()),     # per-output metrics, by each output's comparator
    ("seconds", pa.float64()),
    ("flags", pa.string()),            # comma-separated, e.g. near_tie:out (a passing argmax flip
                                       # or top-k swap)
])

# One row per (impl, case, mode) measurement; an A/B writes one per run of each arm.
BENCH = pa.schema([
    *CASE_ROW,                         # label: bench:decode-..., bench:hbm-...
    ("mode", pa.string()),             # chain | graph_rot | cold | eager | wall | wall_eval
    ("timer", pa.string()),            # cuda_events | host_wall
    ("status", pa.string()),           # ok | fail (wrong results: not timed) | rejected | error
    ("message", pa.string()),
    ("ab_id", pa.string()),            # set when the row is one run of an A/B arm
    ("arm", pa.string()),              # A | B | "" (plain bench)
    ("rep", pa.int32()),               # run index within the A/B (0 for a plain bench)
    ("correct", pa.string()),          # pass | fail | skipped:<why> (oracle check before timing)
    ("budget", pa.float64()),          # that check's worst error / bound
    ("n_sets", pa.int32()),            # rotating input sets
    ("calls_per_sample", pa.int32()),
    ("n_warmup", pa.int32()),
    ("warmup_s", pa.float64()),
    ("n_samples", pa.int32()),
    ("n_dropped", pa.int32()),         # samples dropped: SM clock under the throttle floor
    ("stop_reason", pa.string()),      # converged | plateau | timeout
    ("samples_ns", pa.list_(pa.float32())),  # raw per-call samples
    ("median_ns", pa.float64()),
    ("mean_ns", pa.float64()),
    ("min_ns", pa.float64()),
    ("q1_ns", pa.float64()),
    ("q3_ns", pa.float64()),
    ("rel_iqr", pa.float64()),
    ("rel_std", pa.float64()),
    ("pred_median_ns", pa.float64()),  # chain: the predecessor's own median per call (the time
                                       # subtracted); null in every other mode and before it
    ("bytes_model", pa.int64()),       # the op's bytes(case): each input read, output written once
    ("flops_model", pa.int64()),
    ("gbps", pa.float64()),            # bytes_model / median
    ("tflops", pa.float64()),
    ("pct_peak_spec", pa.float64()),   # % of 2 * mem clock * bus width / 8
    ("pct_copy_ceiling", pa.float64()),  # % of this run's measured copy
    ("copy_same_ns", pa.float64()),    # `--copy-same-bytes`: a copy of bytes_model, same mode and
                                       # rotation (runners/bench.py); null without the flag
    ("pct_copy_same", pa.float64()),   # 100 x copy_same_ns / median_ns
    ("cache_resident", pa.bool_()),    # above 100 % of peak: the data came from cache
    ("sm_clock_mhz", pa.float64()),    # mean over kept samples (NVML)
    ("mem_clock_mhz", pa.float64()),
    ("seconds", pa.float64()),
])

# One row per A/B (impl pair, case, mode): the verdict from the arms' run medians.
AB = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("ab_id", pa.string()),
    ("case_id", pa.string()),
    ("impl_a", pa.string()),
    ("impl_b", pa.string()),
    ("op", pa.string()),
    ("dtype", pa.string()),
    ("dims", pa.string()),
    ("label", pa.string()),
    ("mode", pa.string()),
    ("convention_a", pa.string()),     # each arm's rounding convention, e.g. rounding=normed
    ("convention_b", pa.string()),     # ("" for an op without one; cases.generate.convention)
    ("status", pa.string()),           # ok | fail (an arm wrong or not timed) | error
    ("message", pa.string()),
    ("correct_a", pa.string()),
    ("correct_b", pa.string()),
    ("ab_max_abs", pa.float64()),      # A against B on the same inputs
    ("ab_max_ulp", pa.int64()),
    ("runs_a_ns", pa.list_(pa.float64())),  # run medians, in run order
    ("runs_b_ns", pa.list_(pa.float64())),
    ("ratio", pa.float64()),           # median(B) / median(A): < 1 means B is faster
    ("ci_lo", pa.float64()),
    ("ci_hi", pa.float64()),
    ("aa_noise", pa.float64()),        # MAD of consecutive A/A log-ratios, both arms pooled
    ("delta", pa.float64()),           # max(2 %, 3 * aa_noise)
    ("verdict", pa.string()),          # FASTER | SLOWER | SAME | AMBIGUOUS (B against A)
])

# One row per timer per run: the device, its clocks and what it can do, measured in the run.
CEILINGS = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("backend", pa.string()),
    ("device", pa.string()),
    ("timer", pa.string()),
    ("copy_bytes", pa.int64()),        # read + write of the copy
    ("copy_gbps", pa.float64()),
    ("gemm", pa.string()),             # e.g. "bf16 8192x8192x8192"
    ("gemm_tflops", pa.float64()),
    ("peak_bw_spec_gbps", pa.float64()),
    ("cache_bytes", pa.int64()),       # L2 (GPU) or last-level cache (CPU)
    ("ecc", pa.bool_()),
    ("driver", pa.string()),
    ("sm_clock_default_mhz", pa.float64()),
    ("context", pa.string()),          # JSON: everything the timer reports
])

# One row per accepted change (`kparity accept`): from `run_id` on, the history of every series
# matching `target` starts afresh (conbench's "distribution change" annotation).
ANNOTATIONS = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),           # the first run of the new baseline
    ("created", pa.timestamp("us", tz="UTC")),
    ("kind", pa.string()),             # accept
    ("target", pa.string()),           # an impl id (backend:name) or a case id
    ("metric", pa.string()),           # median_ns | budget | "" (every metric)
    ("reason", pa.string()),
    ("command", pa.string()),
    ("host", pa.string()),
])

# One row per (model, plan, text) of a `kparity model` run: the plan's logits against the
# reference plan's (models/metrics.py: llama-perplexity's --kl-divergence statistics), the gate's
# verdict, and its speed.
MODEL = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("model", pa.string()),            # e.g. smollm2-135m-instruct-q4_1, or a synthetic config
    ("model_sha256", pa.string()),     # of the model file ("" for synthetic weights)
    ("plan", pa.string()),             # reference | torch | mlx | cuda | a name with swaps
    ("plan_json", pa.string()),        # JSON: op role -> impl id, swaps applied
    ("backend", pa.string()),
    ("device", pa.string()),
    ("dtype", pa.string()),            # the activations' T
    ("text", pa.string()),             # the evaluation text's name
    ("positions", pa.int64()),         # scored positions (teacher-forced next tokens)
    ("mean_kld", pa.float64()),
    ("mean_kld_unc", pa.float64()),
    ("median_kld", pa.float64()),      # the order statistics: null below 100 positions
    ("kld_90", pa.float64()),
    ("kld_95", pa.float64()),
    ("kld_99", pa.float64()),
    ("kld_99_9", pa.float64()),
    ("max_kld", pa.float64()),
    ("same_top_p", pa.float64()),
    ("same_top_p_unc", pa.float64()),
    ("rms_dp", pa.float64()),
    ("rms_dp_unc", pa.float64()),
    ("flips", pa.int64()),             # top-token flips beyond what the op tolerances can move
    ("near_ties", pa.int64()),         # flips within it (excused)
    ("gate", pa.string()),             # pass | fail | report (no gate for this plan)
    ("gate_reasons", pa.string()),
    ("prefill_tok_s", pa.float64()),   # one prefill pass over a prompt of prefill_tokens
    ("prefill_tokens", pa.int64()),
    ("decode_tok_s", pa.float64()),    # batch 1, steady state, median over steps
    ("decode_mode", pa.string()),      # graph (the step replayed as a CUDA graph) | eager
    ("eager_tok_s", pa.float64()),     # the eager step's (= decode_tok_s when eager)
    ("batch_size", pa.int64()),        # sequences decoded at once for batch_tok_s
    ("batch_tok_s", pa.float64()),     # tokens/s summed over them (stepped as decode_mode)
    ("ms_per_token", pa.float64()),
    ("ms_per_token_spread", pa.float64()),  # (q3 - q1) / median of the per-step times
    ("roofline_tok_s", pa.float64()),  # bytes read per step / the run's copy ceiling
    ("summary_json", pa.string()),     # every field of models.metrics.summary
    ("seconds", pa.float64()),
])

TABLES = {"runs": RUNS, "correctness": CORRECTNESS, "bench": BENCH, "ab": AB,
          "ceilings": CEILINGS, "annotations": ANNOTATIONS, "model": MODEL}

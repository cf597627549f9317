"""The `transformers` baseline of the model gate (issue 28, "Baselines"): what a user would run
instead of kparity's decode loop. The same GGUF file, loaded by transformers
(`AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=...)`, which dequantizes
every Q4_1 / Q8_0 tensor with gguf's own code and casts it to the dtype; it needs `gguf` and
`accelerate` besides torch), run as a dense Llama (`nn.Linear` weights in the dtype) in PyTorch.
`GgufConfig(dequantize=True)` says so explicitly: transformers 5.24 dequantizes a Llama GGUF
anyway (its packed-weight path covers other architectures only), but without the flag it warns
that the weights "stay quantized" (they do not), and a later version that kept them packed would
run ggml's kernels instead of the bf16 model the issue asks for.

    hf-bf16            the weights dequantized to bf16, bf16 activations; eager, DynamicCache
    hf-f32             the same in f32
    hf-bf16-compiled   bf16, a StaticCache and the decode step under torch.compile, the way
                       `generate(cache_implementation="static")` runs it: the first token eager
                       (it allocates the cache), every later step through
                       `model.get_compiled_call()` (inductor, mode "reduce-overhead": CUDA
                       graphs). CUDA only: transformers compiles its static-cache decode only on
                       an accelerator (`GenerationMixin._valid_auto_compile_criteria`), and the
                       repo's other torch.compile baselines are CUDA only too
                       (`gpu_impls/torch/norms.py`).

Logits (`HFArm.logits`): teacher-forced, float64 [T, vocab], row i the logits after token i.
The eager arms take them the standard teacher-forced way, one forward over the whole sequence
with the causal mask (no cache): the same function as a token-by-token decode, another
summation order in attention and in the GEMMs. The compiled arm takes them from its decode
steps (a compiled forward over T tokens would be another graph than the one it times).

Speed (`HFArm.time`): teacher-forced decode at batch 1 from position 0, one forward per token
with the arm's cache, each step between two synchronizes (what `models.decode_speed.time_decode`
times for a plan: the model's forward, no sampling); the median after a warm-up of 3 steps
(the compiled arm's warm-up also covers the compile and the CUDA-graph recording, so its first
step compiles for tens of seconds).

The row is `report`, never gated: transformers computes another function than the reference
plan's (bf16 or f32 weights and activations, not the Q4_1 weights with the contracts'
rounding points). The KLD of hf-f32 against the reference at `--dtype f32` is the conversion
check: both compute the same model in f32-or-better arithmetic, so it is ~1e-11 here (a
conversion, Q/K row order or RoPE pairing mismatch would be O(0.1-1);
tests/test_model_baseline.py).
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.decode_speed import DecodeTiming, PrefillTiming, decode_timing
from models.plan import ModelError

TORCH_DTYPES = {"bf16": "bfloat16", "f32": "float32"}
WARMUP = 3


@dataclass(frozen=True)
class Baseline:
    """A transformers arm: its name, the dtype of its weights and activations, compiled or not."""

    name: str
    dtype: str
    compiled: bool = False

    def available(self) -> tuple[bool, str]:
        """(True, "") where it can run here, else (False, why and the fix)."""
        import importlib.util

        missing = [m for m in ("torch", "transformers", "gguf", "accelerate")
                   if importlib.util.find_spec(m) is None]
        if missing:
            return False, (f"{self.name} needs {', '.join(missing)}: pip install "
                           "'kparity[model]'")
        if self.compiled:
            from gpu_impls.torch.norms import needs_gpu_and_triton

            return needs_gpu_and_triton()
        return True, ""


BASELINES = {b.name: b for b in (Baseline("hf-bf16", "bf16"), Baseline("hf-f32", "f32"),
                                 Baseline("hf-bf16-compiled", "bf16", compiled=True))}


@functools.lru_cache(maxsize=2)
def load_hf_model(path: str, dtype: str, device: str):
    """transformers' model of the GGUF at `path`, its weights dequantized to `dtype`, on
    `device`, in eval mode (cached: hf-bf16 and hf-bf16-compiled share one)."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    file = Path(path)
    model = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=getattr(torch, TORCH_DTYPES[dtype]),
        quantization_config=GgufConfig(dequantize=True), local_files_only=True)
    return model.to(device).eval()


class HFArm:
    """A transformers model as an arm of the model gate (`models.gate.Arm`): `name`, `dtype`,
    its logits over token ids, its decode timing, the bytes a step reads."""

    gated = False
    timed_backend = "torch"  # the copy ceiling of the roofline: torch's, on the same device
    on_tokens = None  # called with each forward's token count (`models.decode.Decoder`'s)

    def __init__(self, spec: Baseline, model, max_len: int):
        import torch

        self.spec, self.model, self.max_len = spec, model, int(max_len)
        self.name, self.dtype = spec.name, spec.dtype
        self.torch_device = next(model.parameters()).device
        self.device = (f"cuda:0 {torch.cuda.get_device_name(self.torch_device)}"
                       if self.torch_device.type == "cuda" else self.torch_device.type)
        self.backend = "torch"
        self._caches = {}  # the compiled arm's StaticCache per batch, reused (as generate does)
        self.notes = [f"baseline: transformers {type(model).__name__} in {spec.dtype} (the "
                      "GGUF's weights dequantized), another function than the reference plan's: "
                      "reported, not gated"]

    def describe(self) -> dict:
        """What runs (the row's `plan_json`)."""
        import transformers

        return {"transformers": transformers.__version__, "model": type(self.model).__name__,
                "dtype": self.dtype, "attention": self.model.config._attn_implementation,
                "cache": "StaticCache" if self.spec.compiled else "DynamicCache",
                "compile": ("model.get_compiled_call() (inductor, reduce-overhead)"
                            if self.spec.compiled else "eager")}

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits after each token: float64 [len(ids), vocab] (module
        docstring: one causal forward for the eager arms, the decode steps for the compiled)."""
        import torch

        if self.spec.compiled:
            return self.step_logits(ids)
        ids = self._checked(ids)
        with torch.no_grad():
            out = self.model(input_ids=torch.as_tensor(ids, device=self.torch_device)[None],
                             use_cache=False)
        self._tokens_done(len(ids))
        return out.logits[0].double().cpu().numpy()

    def step_logits(self, ids) -> np.ndarray:
        """The logits of the token-by-token decode `time` runs: float64 [len(ids), vocab]."""
        return np.stack(self._decode(self._checked(ids), keep=True)[0])

    def time(self, ids, warmup: int = WARMUP) -> DecodeTiming:
        """Decode over `ids` one token a step from position 0, the steps after `warmup` timed:
        the `DecodeTiming` a plan's `time_decode` gives."""
        ids = self._checked(ids)
        if len(ids) <= warmup:
            raise ModelError(f"{self.name}: {len(ids)} tokens leave no step after {warmup} "
                             "warm-up steps")
        samples = self._decode(ids, keep=False)[1][warmup:]
        return decode_timing(self.name, self.device, self.dtype, samples, warmup)

    def time_batch(self, ids, warmup: int = WARMUP) -> DecodeTiming:
        """`time` over `ids` [batch, T]: a token of every sequence per step; tokens/s summed
        over the batch."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] > self.max_len or ids.shape[1] <= warmup:
            raise ModelError(f"{self.name}: a batch is [batch, T] ids with {warmup} < T <= "
                             f"{self.max_len}, got shape {ids.shape}")
        samples = self._decode(ids, keep=False)[1][warmup:]
        return decode_timing(self.name, self.device, self.dtype, samples, warmup, len(ids))

    def time_eager(self, ids):
        """None: `time` is the arm's own way (the compiled arm's graphs are inductor's)."""
        return None

    def time_prefill(self, ids, repeats: int = 5, warmup: int = 1) -> PrefillTiming:
        """One forward over all of `ids` as a prompt with a fresh cache (eager for the compiled
        arm too: generate compiles the decode step only), `warmup` + `repeats` times."""
        import torch

        ids = self._checked(ids)
        sync = torch.cuda.synchronize if self.torch_device.type == "cuda" else (lambda: None)
        x = torch.as_tensor(ids, device=self.torch_device)[None]
        samples = []
        with torch.no_grad():
            for i in range(warmup + repeats):
                cache = self._new_cache()
                sync()
                t0 = time.perf_counter()
                self.model(input_ids=x, use_cache=True, **self._cache_kw(cache))
                sync()
                if i >= warmup:
                    samples.append((time.perf_counter() - t0) * 1e3)
                self._tokens_done(len(ids))
        median = statistics.median(samples)
        return PrefillTiming(self.name, self.device, self.dtype, len(ids), repeats, warmup,
                             median, min(samples), max(samples), len(ids) * 1e3 / median,
                             tuple(samples))

    def step_bytes(self, position: int) -> int:
        """Bytes a decode step at `position` reads at least: every weight once (the tied
        embedding once, as the lm_head reads it), the K and V of positions 0..position."""
        cfg = self.model.config
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        item = next(self.model.parameters()).element_size()
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * (position + 1)
        return weights + kv * item

    # --- internals ----------------------------------------------------------------------

    def _checked(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or not ids.size or ids.size > self.max_len:
            raise ModelError(f"{self.name}: token ids must be a 1-D sequence of 1..{self.max_len} "
                             f"ids, got shape {ids.shape}")
        return ids

    def _cache_kw(self, cache) -> dict:
        """The cache as the forward's keyword: `cache` (transformers >= 5.2x) or
        `past_key_values` (earlier; an unknown keyword would be swallowed by **kwargs and
        every step would run without its past)."""
        import inspect

        params = inspect.signature(type(self.model).forward).parameters
        return {"cache" if "cache" in params else "past_key_values": cache}

    def _new_cache(self, batch: int = 1):
        from transformers import DynamicCache, StaticCache

        if not self.spec.compiled:
            return DynamicCache(config=self.model.config)
        if batch not in self._caches:  # its tensors take the batch of their first update
            self._caches[batch] = StaticCache(config=self.model.config,
                                              max_cache_len=self.max_len)
        self._caches[batch].reset()
        return self._caches[batch]

    def _decode(self, ids: np.ndarray, keep: bool) -> tuple[list[np.ndarray], list[float]]:
        """One forward per token from position 0 with a fresh cache, `ids` [T] or [batch, T]
        (a token of every sequence per step): (the logits of each step as float64 host rows
        where `keep`, of sequence 0; each step's milliseconds)."""
        import torch

        ids = ids[None] if ids.ndim == 1 else ids
        sync = torch.cuda.synchronize if self.torch_device.type == "cuda" else (lambda: None)
        cache = self._new_cache(len(ids))
        compiled = self.model.get_compiled_call(None) if self.spec.compiled else None
        rows, samples = [], []
        with torch.no_grad():
            for p in range(ids.shape[1]):
                x = torch.tensor(ids[:, p:p + 1], device=self.torch_device)
                step = compiled if compiled is not None and p > 0 else self.model
                sync()
                t0 = time.perf_counter()
                out = step(input_ids=x, use_cache=True, **self._cache_kw(cache))
                sync()
                samples.append((time.perf_counter() - t0) * 1e3)
                if keep:  # copied out now: a CUDA graph's replay overwrites its output
                    rows.append(out.logits[0, -1].double().cpu().numpy())
                self._tokens_done(len(ids))
        return rows, samples

    def _tokens_done(self, n: int) -> None:
        if self.on_tokens is not None:
            self.on_tokens(n)


def baseline(name: str) -> Baseline:
    """The baseline `name` (`BASELINES`), else ModelError."""
    if name not in BASELINES:
        raise ModelError(f"unknown baseline {name!r}; baselines: {', '.join(BASELINES)}")
    return BASELINES[name]


def hf_arm(spec: Baseline, gguf_path: Path | None, max_len: int) -> HFArm:
    """The arm of `spec` over the GGUF at `gguf_path`, on CUDA where torch sees a GPU, else
    the CPU. RuntimeError where it cannot run here (`Baseline.available`); ModelError without
    a file (a synthetic model)."""
    if gguf_path is None:
        raise ModelError(f"{spec.name}: a transformers baseline loads the model's GGUF file; a "
                         "synthetic model has none (run it on --model smollm2)")
    ok, why = spec.available()
    if not ok:
        raise RuntimeError(f"{spec.name}: {why}")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return HFArm(spec, load_hf_model(str(gguf_path), spec.dtype, device), max_len)

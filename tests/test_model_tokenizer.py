"""The model's tokenizer (models/tokenizer.py, transformers' GGUF loading) against the file's own
vocabulary, and the fixed text set (models/texts.py)."""

from __future__ import annotations

import re
import pytest

from models import gguf_file
from models.texts import FOLDER, load_texts

pytest.importorskip("gguf")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def path():
    return gguf_file.fetch()


@pytest.fixture(scope="module")
def tok(path):
    from models.tokenizer import load_tokenizer

    return load_tokenizer(path)


@pytest.fixture(scope="module")
def vocab(path):
    """{token string: id} from the file's tokenizer.ggml.tokens array, read by gguf."""
    tokens = gguf_file.gguf_reader(path).fields["tokenizer.ggml.tokens"].contents()
    return {t: i for i, t in enumerate(tokens)}


def test_text_set():
    """Five fixed texts, each listed in the folder's README with its source."""
    texts = load_texts()
    assert sorted(texts) == ["austen_pride", "dickens_two_cities", "lincoln_gettysburg",
                             "melville_moby_dick", "shelley_frankenstein"]
    listed = set(re.findall(r"`(\w+)\.txt`", (FOLDER / "README.md").read_text()))
    assert listed == set(texts)
    assert all(len(t) > 500 and not t.endswith("\n") for t in texts.values())


def test_round_trip(tok):
    for name, text in load_texts().items():
        ids = tok.encode(text)
        assert len(ids) > 100, name
        assert tok.decode(ids) == text, name


def test_special_ids_from_the_file(tok, path):
    fields = gguf_file.gguf_reader(path).fields
    assert tok.bos_id == fields["tokenizer.ggml.bos_token_id"].contents() == 1
    assert tok.eos_id == fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert tok.vocab_size == len(fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]


def test_ids_against_the_vocabulary(tok, vocab):
    """Ids checked by hand against the file's vocabulary (byte-level BPE spells a leading
    space as 'Ġ'; this vocabulary has single digits only)."""
    assert tok.encode("Call me Ishmael") == [vocab["Call"], vocab["Ġme"], vocab["ĠIshmael"]]
    assert tok.encode("Dec. 17") == [vocab["Dec"], vocab["."], vocab["Ġ"], vocab["1"],
                                     vocab["7"]]
    assert tok.decode([vocab["Ġworld"], vocab["!"]]) == " world!"
    assert tok.encode("—") == [vocab["âĢĶ"]]  # U+2014 is bytes e2 80 94


def test_digits_merge_with_nothing(path):
    """The file's "smollm" pre-tokenizer splits each digit off; transformers splits as GPT-2
    does: equal tokens while no merge joins an ASCII digit to anything (models/tokenizer.py)."""
    fields = gguf_file.gguf_reader(path).fields
    merges = fields["tokenizer.ggml.merges"].contents()
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert len(merges) == 48900 and not [m for m in merges if re.search("[0-9]", m)]

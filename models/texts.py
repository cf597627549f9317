"""The model gate's fixed evaluation texts: a few public-domain paragraphs committed in
`models/texts/` (its README says where each is from), teacher-forced through the decode loop."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).with_name("texts")


def load_texts() -> dict[str, str]:
    """{name: text} for every `models/texts/NAME.txt`, sorted by name; a file's final newline is
    not part of its text."""
    return {p.stem: p.read_text(encoding="utf-8").removesuffix("\n")
            for p in sorted(FOLDER.glob("*.txt"))}

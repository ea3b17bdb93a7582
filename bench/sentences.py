"""A few hundred real English sentences for the embedding parity tests (tests/engine/
test_minilm_parity.py, tests/e2e/test_openai_embeddings.py) and bench/embeddings.py: the sentences
of this repository's own documentation (README.md, docs/*.md), in file order."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_sentences(count: int = 300, *, min_words: int = 4, max_words: int = 60) -> list[str]:
    """``count`` distinct sentences of 4 to 60 words from the docs (fewer if the docs run out)."""
    sentences: list[str] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", " ", path.read_text(encoding="utf-8"), flags=re.S)
        for sentence in re.split(r"(?<=[.!?])\s+|\n\s*\n", text):
            sentence = " ".join(sentence.split()).strip("#-*|> ")
            if min_words <= len(sentence.split()) <= max_words and sentence not in sentences:
                sentences.append(sentence)
                if len(sentences) == count:
                    return sentences
    return sentences

"""`exact_token_counter` gives `len(tokenizer.encode(text).ids)` for every text, by pieces where it may."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest

from ki.embedding.local import _counting_tokenizer, _package_file, resolve_local_model
from ki.embedding.token_count import exact_token_counter
from tests.unit.projections.chunking_golden import GOLDEN

TRICKY = [
    "",
    " ",
    "\n\n\t ",
    "▁",
    "▁▁ ▁x",
    "a  b   c\u00a0d\u2009e\u3000f\u200bg",
    "<s> Vertrag </s> <mask> <unk><pad>",  # added tokens: encode splits them off first
    "x<mask>y",
    unicodedata.normalize("NFD", "Äußerung über Öl") + " \u0308a",
    "ﬁnanziell ① ㎏ Ａｂｃ …",
    "👨\u200d👩\u200d👧 😀🏽 \U000e0067",
    "\ud800 lone surrogate",
    "passage: Titel | Vertrag\r\nDer Mieter zahlt 1.234,56 € (vgl. § 573 Abs. 2 BGB).",
    "x" * 5000,
]


def _tokenizer(model: str) -> Any:
    spec = resolve_local_model(model)
    return _counting_tokenizer(str(_package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)))


def _windows() -> list[str]:
    """Slices of the golden texts: statutes, contracts, URLs, tables, odd whitespace, cut anywhere."""
    texts = json.loads(GOLDEN.read_text(encoding="utf-8"))["texts"].values()
    return [w for text in texts for i in range(0, len(text), 211) for w in (text[i : i + 1300], text[i : i + 9])]


@pytest.mark.parametrize("model", ["multilingual-e5-small", "all-MiniLM-L6-v2"])
def test_counts_are_the_encoders_counts(model: str) -> None:
    tokenizer = _tokenizer(model)
    count = exact_token_counter(tokenizer)
    for text in [*TRICKY, *_windows()]:
        try:
            expected = len(tokenizer.encode(text).ids)
        except Exception:  # the tokenizer refuses the text (a lone surrogate): so may the count
            with pytest.raises(Exception):  # noqa: B017 - whatever the tokenizer raises
                count(text)
            continue
        assert count(text) == expected, text[:80]
        assert count(text) == expected, text[:80]  # the remembered pieces give the same count


def test_sentencepiece_tokenizer_is_counted_by_pieces_others_by_encode() -> None:
    assert exact_token_counter(_tokenizer("multilingual-e5-small")).__name__ == "by_pieces"
    assert exact_token_counter(_tokenizer("all-MiniLM-L6-v2")).__name__ == "by_encode"  # WordPiece

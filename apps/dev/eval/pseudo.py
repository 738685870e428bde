"""Pseudo-queries from a live corpus, for `ki eval --self` (apps.dev.eval.self_check). Pure.

A deployment has no labelled questions, but its documents say what they are about. From each sampled
document (its latest final version) come at most two queries, each with that document as the one relevant
answer:

* `heading`: a heading inside the text (a short line without closing punctuation that more text follows,
  e.g. "§ 5 Kündigung" or "II. Haftung"), its numbering removed;
* `sentence`: a sentence of five or more words, picked by a hash of the document (not always the first,
  which is often a formula), cut to `MAX_SENTENCE_WORDS` words.

Identifiers are stripped from both (the document's own identifiers, section signs and numbers, tokens with
digits), so the identity preflight does not answer them and the test is about ranking.

The bias, stated in the report and in docs/search-api.md: both kinds are the document's own words, so they
favour the lexical leg (a user's question paraphrases more). A deployment where hybrid does not lose even
on these is one where it helps; one where it loses significantly on them has a semantic leg that adds
noise. That is the only question the gate asks.

Each document falls into the `tuning` or the `confirming` half by a hash of its id and the run's salt, so
both queries of a document are in the same half.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["heading", "sentence"]
Half = Literal["tuning", "confirming"]

MIN_WORDS = 2  # a query of fewer words after stripping says too little to rank anything
MAX_HEADING_WORDS = 12
MIN_SENTENCE_WORDS = 5
MAX_SENTENCE_WORDS = 14

# Leading numbering of a heading: "§ 5", "§§ 3-4", "Art. 12", "II.", "3.1", "a)", "(2)", "Abschnitt 4".
_NUMBERING = re.compile(
    r"^\s*(?:#+\s*)?(?:(?:§§?|Art\.?|Artikel|Abschnitt|Teil|Kapitel|Nr\.?|Ziffer)\s*)?"
    r"(?:[0-9]+[a-z]?(?:[.\-–][0-9]+[a-z]?)*|[IVXLC]+|[a-z])?[.)]?\s+",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ0-9(\"„])")
_WORD = re.compile(r"\S+")
_DIGITS = re.compile(r"\d")
_SECTION_SIGNS = re.compile(r"§+|\bArt\.|\bAbs\.|\bNr\.|\bS\.|\bAz\.")


@dataclass(frozen=True)
class PseudoQuery:
    qid: str  # "<document id>:<kind>"
    document_id: int
    kind: Kind
    text: str
    half: Half


def digest(text: str) -> str:
    """How a query text appears in a report that may not keep query texts."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def strip_identifiers(text: str, identifiers: Sequence[str] = ()) -> str:
    """`text` without the document's identifiers (case-insensitive), section signs and abbreviations of
    references, and any word containing a digit; whitespace collapsed, edge punctuation trimmed."""
    out = text
    for identifier in sorted((i for i in identifiers if i.strip()), key=len, reverse=True):
        out = re.sub(re.escape(identifier.strip()), " ", out, flags=re.IGNORECASE)
    out = _SECTION_SIGNS.sub(" ", out)
    tokens = _WORD.findall(out)

    def numbered(i: int) -> bool:
        return 0 <= i < len(tokens) and bool(_DIGITS.search(tokens[i]))

    # Gone: words with digits, punctuation alone, and a short mark between numbers ("7 U 12/20").
    words = [
        w
        for i, w in enumerate(tokens)
        if not numbered(i) and any(c.isalpha() for c in w) and not (len(w) <= 2 and numbered(i - 1) and numbered(i + 1))
    ]
    return " ".join(words).strip(" \t,;:-–()[]")


def _heading_lines(lines: Sequence[str]) -> list[int]:
    """Indices of the lines that look like headings: 1..MAX_HEADING_WORDS words, no closing sentence
    punctuation, and more text after them."""
    last_text = max((i for i, line in enumerate(lines) if line), default=-1)
    return [
        i
        for i, line in enumerate(lines)
        if line
        and i < last_text
        and not line.endswith((".", ",", ";", ":", "!", "?"))
        and len(line.split()) <= MAX_HEADING_WORDS
    ]


def headings(text: str) -> list[str]:
    """The text's headings (`_heading_lines`) with their leading numbering removed."""
    lines = [line.strip() for line in text.splitlines()]
    found = (_NUMBERING.sub("", lines[i], count=1).strip().lstrip("#").strip() for i in _heading_lines(lines))
    return [title for title in found if title]


def sentences(text: str) -> list[str]:
    """The text's sentences of at least MIN_SENTENCE_WORDS words, heading lines left out."""
    lines = [line.strip() for line in text.splitlines()]
    skip = set(_heading_lines(lines))
    body = " ".join(line for i, line in enumerate(lines) if line and i not in skip)
    return [s.strip() for s in _SENTENCE_END.split(body) if len(s.split()) >= MIN_SENTENCE_WORDS]


def _pick(items: Sequence[str], key: str) -> str:
    """One of `items` chosen by a hash of `key`: stable across runs, spread across documents."""
    return items[int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % len(items)]


def half_of(document_id: int, salt: str) -> Half:
    h = int(hashlib.sha256(f"{salt}:{document_id}".encode()).hexdigest()[:8], 16)
    return "tuning" if h % 2 == 0 else "confirming"


def queries_for(document_id: int, text: str, identifiers: Sequence[str] = (), *, salt: str = "") -> list[PseudoQuery]:
    """At most one `heading` and one `sentence` query for the document, identifiers stripped; none that is
    shorter than MIN_WORDS words after stripping."""
    half = half_of(document_id, salt)
    key = f"{salt}:{document_id}"
    out: list[PseudoQuery] = []
    usable = [h for h in (strip_identifiers(h, identifiers) for h in headings(text)) if len(h.split()) >= MIN_WORDS]
    if usable:
        out.append(PseudoQuery(f"{document_id}:heading", document_id, "heading", _pick(usable, key), half))
    candidates = sentences(text)
    if candidates:
        words = strip_identifiers(_pick(candidates, key + ":s"), identifiers).split()[:MAX_SENTENCE_WORDS]
        if len(words) >= MIN_WORDS:
            sentence = " ".join(words).rstrip(".,;: ")
            out.append(PseudoQuery(f"{document_id}:sentence", document_id, "sentence", sentence, half))
    return out

"""Split a version's text into overlapping body-chunk windows.

Windows are measured in Python code points (what `str` indexes by), so a German umlaut or an
emoji counts as one character and can never be cut in half at the byte level. A window prefers
to end just after a newline, then just after whitespace, and only then cuts hard; a hard cut is
nudged back so it does not separate a base character from its combining marks or split an
emoji ZWJ sequence.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Chunk:
    """One body window: `text == source[start:end]` (code-point offsets)."""

    ordinal: int
    start: int
    end: int
    text: str


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """The embedder's window: `count_tokens(s)` is what the model sees for `s` as a document (prefix
    and special tokens included, no truncation); a string fits when that is at most `max_tokens`."""

    count_tokens: Callable[[str], int]
    max_tokens: int

    def fits(self, embed_input: str) -> bool:
        return self.count_tokens(embed_input) <= self.max_tokens


# Characters that must stay attached to the character before them.
_ZERO_WIDTH_JOINER = "\u200d"


def _glues_to_previous(ch: str) -> bool:
    code = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or ch == _ZERO_WIDTH_JOINER
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0x1F3FB <= code <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xDC00 <= code <= 0xDFFF  # lone low surrogate (surrogateescape'd input)
        or 0xE0020 <= code <= 0xE007F  # emoji tag sequences
    )


def _is_safe_boundary(text: str, pos: int) -> bool:
    """True when cutting between text[pos-1] and text[pos] keeps grapheme clusters whole."""
    if pos <= 0 or pos >= len(text):
        return True
    return not _glues_to_previous(text[pos]) and text[pos - 1] != _ZERO_WIDTH_JOINER


def _find_cut(text: str, earliest: int, limit: int) -> int:
    """Best end offset in (earliest, limit]: after a newline, else after whitespace, else hard."""
    newline = text.rfind("\n", earliest, limit)
    if newline != -1:
        return newline + 1
    for pos in range(limit - 1, earliest - 1, -1):
        if text[pos].isspace() and _is_safe_boundary(text, pos + 1):
            return pos + 1
    for pos in range(limit, earliest, -1):
        if _is_safe_boundary(text, pos):
            return pos
    return limit  # one giant cluster: a hard cut is the only way to keep the window size


def _safe_start(text: str, start: int, floor: int) -> int:
    """Move an overlap start back (never to or below `floor`) so it does not begin mid-cluster."""
    while start > floor + 1 and not _is_safe_boundary(text, start):
        start -= 1
    return start


def _fitting_end(text: str, start: int, end: int, floor: int, fits: Callable[[str], bool]) -> int:
    """The longest window end in (floor, end) whose window `text[start:cut]` fits, by bisection.

    Each probed limit is cut like an ordinary window (newline, then whitespace, then a safe hard
    cut, in the probed window's second half). If not even the shortest window fits (one enormous
    token run), the shortest is taken: the embedder truncates it and the eval counts it as truncated.
    """

    def cut_at(limit: int) -> int:
        earliest = max(floor, start + (limit - start) // 2)
        return _find_cut(text, earliest, limit) if limit - earliest > 1 else limit

    # Neighbouring limits often cut at the same newline or space: each window is asked about once.
    answers: dict[int, bool] = {}
    best = floor + 1
    lo, hi = floor + 1, end  # every limit >= hi is known not to fit
    while lo < hi:
        mid = (lo + hi) // 2
        cut = cut_at(mid)
        fitting = answers.get(cut)
        if fitting is None:
            fitting = answers[cut] = fits(text[start:cut])
        if fitting:
            best, lo = max(best, cut), mid + 1
        else:
            hi = mid
    return best


def split_text(
    text: str, chunk_chars: int, overlap_chars: int, fits: Callable[[str], bool] | None = None
) -> list[Chunk]:
    """Split `text` into windows of at most `chunk_chars` code points.

    Consecutive windows share `overlap_chars` characters (a little more when the overlap start is
    moved back to a cluster boundary). Together the windows cover the whole text; windows that
    would hold only whitespace are dropped, and ordinals stay consecutive. Deterministic: the
    same input gives the same chunks.

    `fits`, if given, says whether a window's text fits the embedder (its caller counts the
    model's tokens, header and prefix included; chunking itself stays free of any tokenizer). A
    window that does not fit is cut shorter — still preferring newlines and spaces — until it does,
    so `chunk_chars` is an upper bound and the token window the real limit.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    if overlap_chars < 0:
        raise ValueError(f"overlap_chars must be >= 0, got {overlap_chars}")
    if overlap_chars >= chunk_chars:
        raise ValueError(f"overlap_chars ({overlap_chars}) must be smaller than chunk_chars ({chunk_chars})")
    if not text or text.isspace():
        return []

    # A cut never happens before this many characters into the window: half the window (so we do
    # not produce tiny chunks at an early newline) and always past the overlap (so every window
    # moves the start forward and the loop terminates).
    min_advance = max(chunk_chars // 2, overlap_chars + 1)
    chunks: list[Chunk] = []
    start = 0
    length = len(text)
    while True:
        limit = start + chunk_chars
        end = length if limit >= length else _find_cut(text, start + min_advance, limit)
        if fits is not None and not fits(text[start:end]):
            # Token-dense text (numbers, citations, foreign words): shorter windows, still past the overlap.
            end = _fitting_end(text, start, end, start + overlap_chars, fits)
        window = text[start:end]
        if not window.isspace():
            chunks.append(Chunk(ordinal=len(chunks), start=start, end=end, text=window))
        if end >= length:
            return chunks
        start = _safe_start(text, end - overlap_chars, floor=start)

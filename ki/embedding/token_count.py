"""Token counts, exactly ``len(tokenizer.encode(text).ids)``, several times faster for SentencePiece tokenizers.

The chunker asks for one count per body chunk (`projections.chunking`: does the window fit the model?), and a
first load's plan step spent most of its time in those ``encode`` calls (BENCHMARKS.md, issue 53 item 2). A
Metaspace pre-tokenizer (XLM-R's, hence e5's) cuts the normalised text before every ``▁`` (a space) and the
Unigram model tokenises each piece on its own, so a text's count is the special tokens plus the sum of its
pieces' counts: legal German repeats its words, and a piece's count is remembered. The normaliser still runs
on the whole text, in the tokenizer itself, exactly as ``encode`` runs it.

Only for exactly that pipeline (checked on the tokenizer's own description and on a probe of texts against
``encode`` when the counter is made); any other tokenizer -- or a text holding one of its added tokens, which
``encode`` would match before normalising -- is counted by ``encode`` itself.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

__all__ = ["exact_token_counter"]

_METASPACE = "\u2581"
_PIECE = re.compile(f"{_METASPACE}[^{_METASPACE}]*|[^{_METASPACE}]+")
# Distinct pieces remembered per counter, past which the memory starts afresh: ~140 bytes a piece, and all of
# gesetze-headings-dev (17.5M characters of statutes) has 87,000.
_MAX_PIECES = 100_000
# Texts the fast count must agree with `encode` on before it is used.
_PROBES = (
    "",
    " ",
    "Kündigung nach § 573 Abs. 2 BGB",
    "  zwei  Leerzeichen\tund\nZeilen\r\n\n  Ende  ",
    "passage: Titel | Vertrag\nDer Mieter zahlt 1.234,56 € bis zum 3. Werktag (vgl. BGH, Urt. v. 1.2.2024).",
    "Straße\u00a0Nr.\u200912 – „Anführung“ … ﬁ ① ㎏ Ａ\u200b\u0308 😀👨\u200d👩\u200d👧 \u2581x\u2581\u2581y",
    "https://example.org/a_b?c=d&e=f Donaudampfschifffahrtsgesellschaftskapitän",
)


# XLM-R's normaliser: a character map (per grapheme cluster), then every run of spaces made one.
_XLMR_NORMALISER = ["Precompiled", ("Replace", {"Regex": " {2,}"}, " ")]
_SPACE_RUN = re.compile(" {2,}")
# Characters that are a grapheme cluster of their own in any text (no mark, joiner, format character, CR or
# Prepend), in the blocks German texts are written in: Latin, Greek, Cyrillic, Hebrew, punctuation, currency.
_OWN_CLUSTER_BLOCKS = ((0x0000, 0x0600), (0x2000, 0x2070), (0x20A0, 0x20D0))
_NOT_OWN_CLUSTER = frozenset({"Mn", "Mc", "Me", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


class _CharwiseNormaliser:
    """XLM-R's normaliser by string replacements, for texts whose every character is its own grapheme cluster:
    the character map then maps character by character (the tokenizer maps whole clusters), so each one's
    mapping is learnt once from the tokenizer. None for any other text (the tokenizer's normaliser runs)."""

    def __init__(self, normalizer: Any) -> None:
        self._normalizer = normalizer
        self._known: set[str] = set()
        self._changes: dict[str, str] = {}  # the known characters the map changes, and what into

    def _learn(self, char: str) -> bool:
        code = ord(char)
        if char == "\r" or unicodedata.category(char) in _NOT_OWN_CLUSTER:
            return False
        if not any(low <= code < high for low, high in _OWN_CLUSTER_BLOCKS):
            return False
        mapped = self._normalizer.normalize_str(char)
        if mapped != char:
            # Replaced one after the other, so what a character becomes must not be replaced again.
            if any(self._normalizer.normalize_str(part) != part for part in mapped):
                return False
            self._changes[char] = mapped
        self._known.add(char)
        return True

    def __call__(self, text: str) -> str | None:
        chars = set(text)
        unknown = chars - self._known
        if unknown and not all(self._learn(char) for char in unknown):
            return None
        for char in chars & self._changes.keys():
            text = text.replace(char, self._changes[char])
        return _SPACE_RUN.sub(" ", text)


def _normaliser_steps(normalizer: Any) -> list[Any] | None:
    if normalizer is None:
        return None
    described = json.loads(normalizer.__getstate__())
    steps: list[Any] = []
    for step in described.get("normalizers", [described]):
        if step.get("type") == "Replace":
            steps.append(("Replace", step.get("pattern"), step.get("content")))
        else:
            steps.append(step.get("type"))
    return steps


def _description(tokenizer: Any) -> dict[str, Any]:
    """The parts of the tokenizer's JSON description the fast count depends on (not its vocabulary)."""

    def state(component: Any) -> Any:
        return json.loads(component.__getstate__()) if component is not None else None

    return {
        "model": {"type": type(tokenizer.model).__name__},
        "pre_tokenizer": state(tokenizer.pre_tokenizer),
        "post_processor": state(tokenizer.post_processor),
        "truncation": tokenizer.truncation,
        "padding": tokenizer.padding,
        "added_tokens": [{"content": t.content} for t in tokenizer.get_added_tokens_decoder().values()],
    }


def _is_metaspace_unigram(described: dict[str, Any]) -> bool:
    pre = described.get("pre_tokenizer") or {}
    post = described.get("post_processor") or {}
    return bool(
        (described.get("model") or {}).get("type") == "Unigram"
        and pre.get("type") == "Metaspace"
        and pre.get("replacement") == _METASPACE
        and pre.get("split", True) is True
        and (pre.get("prepend_scheme") == "always" or ("prepend_scheme" not in pre and pre.get("add_prefix_space")))
        and post.get("type") == "TemplateProcessing"
        and described.get("truncation") is None
        and described.get("padding") is None
    )


def _special_tokens(described: dict[str, Any]) -> int | None:
    """Tokens the template adds around one text, or None if it does more than add fixed special tokens."""
    template = described["post_processor"]
    single = template.get("single") or []
    total = 0
    for item in single:
        if "Sequence" in item:
            continue
        special = item.get("SpecialToken")
        if special is None:
            return None
        ids = (template.get("special_tokens") or {}).get(special["id"], {}).get("ids")
        if ids is None:
            return None
        total += len(ids)
    if sum("Sequence" in item for item in single) != 1:
        return None
    return total


def exact_token_counter(tokenizer: Any) -> Callable[[str], int]:
    """A function giving ``len(tokenizer.encode(text).ids)`` for any text (the tokenizer's own padding and
    truncation as they are now), by pieces where the tokenizer allows it (see the module docstring)."""

    def by_encode(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    described = _description(tokenizer)
    if not _is_metaspace_unigram(described):
        return by_encode
    specials = _special_tokens(described)
    if specials is None:
        return by_encode
    added = [token["content"] for token in described.get("added_tokens") or [] if token["content"]]
    holds_added = re.compile("|".join(map(re.escape, added))).search if added else lambda text: None
    normalizer = tokenizer.normalizer
    model = tokenizer.model
    memory: dict[str, int] = {}
    remembered = memory.__getitem__
    charwise = _CharwiseNormaliser(normalizer) if _normaliser_steps(normalizer) == _XLMR_NORMALISER else None

    def by_pieces(text: str) -> int:
        if holds_added(text):
            return by_encode(text)  # `encode` splits added tokens off before anything else
        normalized = charwise(text) if charwise is not None else None
        if normalized is None:
            normalized = normalizer.normalize_str(text) if normalizer is not None else text
            if holds_added(normalized):
                return by_encode(text)
        if not normalized:
            return specials
        normalized = normalized.replace(" ", _METASPACE)
        if normalized[0] != _METASPACE:
            normalized = _METASPACE + normalized
        pieces = _PIECE.findall(normalized)
        try:
            return specials + sum(map(remembered, pieces))
        except KeyError:  # a piece not seen before: count the new ones (a local table: another thread may clear)
            if len(memory) > _MAX_PIECES:
                memory.clear()
            counts: dict[str, int] = {}
            for piece in set(pieces):
                count = memory.get(piece)
                if count is None:
                    count = memory[piece] = len(model.tokenize(piece))
                counts[piece] = count
            return specials + sum(map(counts.__getitem__, pieces))

    if any(by_pieces(probe) != by_encode(probe) for probe in _PROBES):
        return by_encode
    return by_pieces

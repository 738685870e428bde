"""The answer's lexical coverage of the question: a second signal for the answer gate, reading query and passage
together (`retrieval.answer_coverage_gate`).

The semantic floor compares one cosine with a threshold; an in-domain question whose answer is gone still has an
on-topic nearest passage at the cosine of a real answer. What the passage then usually lacks is the question's
own specific words (the year, the name, the detail asked about). `coverage` is the share of the question's content
words found in the best of the first hits; `coverage_empties_answer` makes the answer empty when that share is low
and the best semantic similarity is below a bar too.

Content words: casefolded word forms with German umlauts and ß folded (as the `german_normalization` filter does),
stopwords of German and English and question words dropped. A word counts as found when its light stem (a few
inflection and derivation suffixes cut, at least `MIN_STEM` characters left) occurs inside the passage's folded
text: that finds the word inflected, with a `ge-` prefix, and as a part of a compound ("Kündigungsfrist" holds
"kündigung"). Short words (acronyms, numbers) must occur as a whole word. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from search.ranking.floor import cosine_from_score
from search.ranking.fusion import Candidate
from search.ranking.legs import LegHit

# At least this many characters of a stem are kept; a word no longer than this matches as a whole word only.
MIN_STEM = 4
_WORD = re.compile(r"\w+")
_FOLD = str.maketrans({"ä": "a", "ö": "o", "ü": "u", "ß": "ss"})
# Longest first: the first that leaves MIN_STEM characters is cut.
_SUFFIXES = (
    "ungen", "ations", "ation", "heiten", "keiten", "lichen", "ischen", "ingen", "ings", "ions", "ern", "ung",
    "heit", "keit", "lich", "isch", "ing", "ion", "ies", "ed", "en", "er", "es", "em", "et", "st", "ly", "e", "n",
    "s", "t",
)  # fmt: skip
_GERMAN_STOP = """
    aber alle allem allen aller alles als also am an ander andere anderem anderen anderer anderes anders auch auf aus
    bei beim bin bis bist da dabei dadurch dafür dagegen daher damals damit dann darauf daraus darin darum darüber das
    dass daß davon dazu dein dem den denen denn der deren derer des deshalb dessen die dies diese diesem diesen dieser
    dieses doch dort du durch ein eine einem einen einer eines einige einigen einiger er es etwa etwas euch euer für
    gab gegen gibt habe haben hat hatte hatten hier hin hinter ich ihm ihn ihnen ihr ihre ihrem ihren ihrer ihres im
    in ins ist ja jede jedem jeden jeder jedes jedoch jene jenem jenen jener jenes kann kein keine keinem keinen
    keiner konnte können könnte man manche mehr mein meine mit muss musste nach nicht nichts noch nun nur ob oder
    ohne sehr sein seine seinem seinen seiner seit sich sie sind so solche soll sollte sondern sowie über um und uns
    unter viel viele vom von vor wann war waren warum was weil welche welchem welchen welcher welches wem wen wenn
    wer werden wessen wie wieso wieviel wieviele viele wir wird wo wodurch woher wohin womit woran worauf worin
    worüber wozu wurde wurden zu zum zur zwischen
"""
_ENGLISH_STOP = """
    a about above after again against all am an and any are as at be because been before being below between both
    but by can could did do does doing down during each few for from further had has have having he her here hers
    him his how i if in into is it its itself just me more most my no nor not now of off on once only or other our
    out over own same she should so some such than that the their them then there these they this those through to
    too under until up very was we were what when where which while who whom why will with would you your
"""
STOPWORDS: frozenset[str] = frozenset(w.translate(_FOLD) for w in (_GERMAN_STOP + _ENGLISH_STOP).split())


def fold(text: str) -> str:
    """Casefolded, umlauts and ß folded."""
    return text.casefold().translate(_FOLD)


def stem(word: str) -> str:
    """The folded word less its first suffix (longest first) that leaves at least MIN_STEM characters."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= MIN_STEM:
            return word[: -len(suffix)]
    return word


def content_words(query: str) -> tuple[str, ...]:
    """The query's folded words that carry content (stopwords dropped, single letters too), each once, in order."""
    words = (w for w in _WORD.findall(fold(query)) if w not in STOPWORDS and (len(w) > 1 or w.isdigit()))
    return tuple(dict.fromkeys(words))


def _found(word: str, text: str, tokens: frozenset[str]) -> bool:
    if len(word) <= MIN_STEM:
        return word in tokens
    return stem(word) in text


def coverage(words: Sequence[str], passages: Iterable[str]) -> float | None:
    """The largest share of `words` (see `content_words`) that one of the passages holds; None without words
    (nothing to cover: the signal says nothing), 0.0 without passages."""
    if not words:
        return None
    best = 0.0
    for passage in passages:
        text = fold(passage)
        tokens = frozenset(_WORD.findall(text))
        best = max(best, sum(1 for w in words if _found(w, text, tokens)) / len(words))
    return best


def coverage_empties_answer(
    best_similarity: float | None, covered: float | None, below_similarity: float, min_coverage: float
) -> bool:
    """`retrieval.answer_coverage_gate`: empty when the semantic leg's best similarity is below `below_similarity`
    and the best passage covers less than `min_coverage` of the question's content words. Never without a
    similarity (the semantic leg did not run) or without content words."""
    if best_similarity is None or covered is None:
        return False
    return best_similarity < below_similarity and covered < min_coverage


@dataclass(frozen=True)
class AnswerEvidence:
    """What the gate reads from the answer's first hits: their best semantic similarity (None when the semantic
    leg did not run; -1.0 when none of them came from it), their best coverage of the question's content words
    (None without content words), and whether one of them matched an identifier."""

    similarity: float | None
    coverage: float | None
    identifier: bool

    def to_json(self, empty: bool) -> dict[str, Any]:
        similarity = None if self.similarity is None else round(self.similarity, 4)
        covered = None if self.coverage is None else round(self.coverage, 4)
        return {"similarity": similarity, "coverage": covered, "identifier": self.identifier, "empty": empty}


def answer_evidence(
    query: str,
    head: Sequence[Candidate],
    semantic: Sequence[LegHit] | None,
    space_type: str,
) -> AnswerEvidence:
    """The evidence of `head` (the answer's first hits, re-verified: only rows the caller may see), with
    `semantic` the semantic leg as fused (None when it did not run), whose ranks the candidates carry."""
    similarity: float | None = None
    if semantic is not None:
        cosines = [
            cosine_from_score(semantic[c.ranks["semantic"]].score, space_type)
            for c in head
            if "semantic" in c.ranks and c.ranks["semantic"] < len(semantic)
        ]
        similarity = max(cosines, default=-1.0)
    covered = coverage(content_words(query), (str(c.source.get("text") or "") for c in head))
    identifier = any(c.matched_identifiers or "identifier" in c.ranks for c in head)
    return AnswerEvidence(similarity, covered, identifier)

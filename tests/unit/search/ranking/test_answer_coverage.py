"""The answer gate's second signal (search.ranking.coverage): the question's content words, their coverage by a
passage, and when the gate empties an answer."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from search.ranking.coverage import (
    answer_evidence,
    content_words,
    coverage,
    coverage_empties_answer,
    stem,
)
from search.ranking.fusion import Candidate
from search.ranking.legs import LegHit


def test_content_words_drop_stopwords_and_fold_umlauts() -> None:
    assert content_words("Wann wurde die Universität in Warschau gegründet?") == (
        "universitat", "warschau", "gegrundet",
    )  # fmt: skip
    assert content_words("What is the role of the ribosome?") == ("role", "ribosome")
    assert content_words("wer ist das") == ()


@pytest.mark.parametrize(
    ("word", "expected"),
    [("kundigungen", "kundig"), ("gegrundet", "gegrund"), ("miete", "miet"), ("bgb", "bgb"), ("proteins", "protein")],
)
def test_a_stem_cuts_one_suffix_and_keeps_four_characters(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_coverage_finds_inflections_compounds_and_whole_short_words() -> None:
    words = content_words("Kündigung der Miete 1939")
    assert coverage(words, ["Die Kündigungsfrist für Mieten betrug 1939 drei Monate."]) == 1.0
    assert coverage(words, ["Die Kündigungsfrist betrug 19390 Tage."]) == pytest.approx(1 / 3)  # no whole 1939
    assert coverage(words, ["nichts davon", "Miete und Kündigung"]) == pytest.approx(2 / 3)  # the best passage
    assert coverage(words, []) == 0.0
    assert coverage((), ["anything"]) is None


def test_the_gate_empties_only_below_both_bars() -> None:
    assert coverage_empties_answer(0.84, 0.2, 0.86, 0.5)
    assert not coverage_empties_answer(0.87, 0.2, 0.86, 0.5)  # similar enough
    assert not coverage_empties_answer(0.84, 0.5, 0.86, 0.5)  # covered enough
    assert not coverage_empties_answer(None, 0.0, 0.86, 0.5)  # no semantic leg
    assert not coverage_empties_answer(0.5, None, 0.86, 0.5)  # no content words


def _candidate(chunk: str, text: str, ranks: dict[str, int], identifiers: tuple[str, ...] = ()) -> Candidate:
    return Candidate(chunk, 1.0, {"text": text}, ranks=ranks, matched_identifiers=identifiers)


def test_answer_evidence_reads_the_first_hits_similarity_coverage_and_identifiers() -> None:
    semantic = [LegHit("a", 0.92, {}), LegHit("b", 0.90, {})]  # cosinesimil: cosine = 2 * score - 1
    head = [
        _candidate("b", "Warschau liegt an der Weichsel.", {"semantic": 1, "lexical": 0}),
        _candidate("c", "Die Universität Warschau", {"lexical": 1}),
    ]
    evidence = answer_evidence("Wann wurde die Universität Warschau gegründet?", head, semantic, "cosinesimil")
    assert evidence.similarity == pytest.approx(0.80)
    assert evidence.coverage == pytest.approx(2 / 3)
    assert not evidence.identifier
    lexical_only = answer_evidence("Warschau", head[1:], semantic, "cosinesimil")
    assert lexical_only.similarity == -1.0  # none of the first hits came from the semantic leg
    assert answer_evidence("Warschau", head, None, "cosinesimil").similarity is None  # the leg did not run
    named = [_candidate("d", "§ 573 BGB", {"identifier": 0}, ("§ 573 BGB",))]
    assert answer_evidence("§ 573 BGB", named, semantic, "cosinesimil").identifier


class _Request:
    def __init__(self, query: str, explain: bool = False) -> None:
        self.query, self.explain = query, explain


class _Identity:
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


class _Ctx:
    """The fields the stage reads and writes (search.pipeline.QueryContext has them too)."""

    def __init__(self, query: str, kept: list[Candidate], outcome: str = "none") -> None:
        self.request, self.kept, self.identity = _Request(query), kept, _Identity(outcome)
        self.legs = {"semantic": [LegHit("a", 0.91, {})], "lexical": []}  # cosine 0.82
        self.answer_gate: dict | None = None


class _Index:
    """The page rows' read, as the index answers it: the legs' candidates carry no text, the rows do."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts, self.asked = texts, []  # type: list[str]

    async def page_rows(self, page: Any) -> list[Candidate]:
        self.asked += [c.chunk_id for c in page]
        return [dataclasses.replace(c, source={**c.source, "text": self.texts[c.chunk_id]}) for c in page]


def _stage(enabled: bool = True, index: _Index | None = None) -> Any:
    from ki.settings import AnswerCoverageSettings, RetrievalSettings
    from search.stages.coverage import AnswerCoverageStage

    gate = AnswerCoverageSettings(similarity={"sig": 0.86}, min_coverage=0.5, hits=3)
    retrieval = RetrievalSettings(answer_coverage_gate_enabled=enabled, answer_coverage_gate=gate)

    async def as_they_are(page: Any) -> list[Candidate]:
        return list(page)

    return AnswerCoverageStage(retrieval, lambda: "sig", index.page_rows if index else as_they_are)


def test_the_stage_reads_the_first_hits_text_from_the_index() -> None:
    bare = [Candidate(chunk, 1.0, {}, ranks={"semantic": 0}) for chunk in ("a", "b", "c", "d")]
    index = _Index({"a": "Die Kündigungsfrist im Mietvertrag", "b": "x", "c": "y", "d": "z"})
    ctx = _Ctx("Kündigungsfrist Mietvertrag", bare)
    asyncio.run(_stage(index=index).run(ctx))
    assert index.asked == ["a", "b", "c"]  # the gate's first hits only
    assert ctx.answer_gate is not None and ctx.answer_gate["coverage"] == 1.0 and not ctx.answer_gate["empty"]
    assert [c.chunk_id for c in ctx.kept] == ["a", "b", "c", "d"] and ctx.kept[0].source["text"]


def test_the_stage_empties_an_uncovered_answer_and_never_a_named_document() -> None:
    off_topic = [_candidate("a", "Der Igel schläft im Winter.", {"semantic": 0})]
    ctx = _Ctx("Kündigungsfrist Mietvertrag", off_topic)
    asyncio.run(_stage().run(ctx))
    assert ctx.kept == [] and ctx.answer_gate == {"similarity": 0.82, "coverage": 0.0, "identifier": False,
                                                  "empty": True}  # fmt: skip
    named = _Ctx("Kündigungsfrist Mietvertrag", list(off_topic), outcome="unique")
    asyncio.run(_stage().run(named))
    assert named.kept == off_topic and named.answer_gate is not None and not named.answer_gate["empty"]
    covered = _Ctx("Kündigungsfrist Mietvertrag", [_candidate("a", "Kündigungsfrist im Mietvertrag", {"semantic": 0})])
    asyncio.run(_stage().run(covered))
    assert covered.kept and covered.answer_gate is not None and covered.answer_gate["coverage"] == 1.0
    off = _Ctx("Kündigungsfrist Mietvertrag", list(off_topic))
    asyncio.run(_stage(enabled=False).run(off))
    assert off.kept == off_topic  # off: read (for explain), never emptied


def test_the_gate_is_off_as_shipped_and_its_bar_is_a_cosine() -> None:
    from pathlib import Path

    from ki.settings import AnswerCoverageSettings, load_settings

    shipped = load_settings(Path(__file__).parents[4] / "config.json", environ={})
    assert shipped.retrieval.answer_coverage_gate_enabled is False
    with pytest.raises(ValueError, match="cosine similarity"):
        AnswerCoverageSettings(similarity={"sig": 1.5})

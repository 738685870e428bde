"""The query plan (search.plan): made once per request from one reading of the mode gate, immutable, and
what every step reads; a gate that changes its default while a request runs does not change that request."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from ki.settings import load_settings
from search.plan import ModeUnavailable, QueryPlan, SemanticUnavailable, leg_weights, plan_query
from search.ranking.mode_gate import GateDecision
from search.request import SearchRequest

RETRIEVAL = load_settings(environ={}).retrieval
HYBRID = GateDecision("hybrid", "evidence: hybrid beats lexical")
LEXICAL = GateDecision("lexical", "no evidence for vectors")


def test_the_gates_default_decides_only_when_the_request_names_no_mode() -> None:
    plan = plan_query(SearchRequest(query="Kaution"), RETRIEVAL, LEXICAL, None)
    assert (plan.mode, plan.requested, plan.reason) == ("lexical", None, LEXICAL.reason)
    assert "semantic" not in plan.legs and not plan.needs_vector
    asked = plan_query(SearchRequest(query="Kaution", mode="hybrid"), RETRIEVAL, LEXICAL, None)
    assert (asked.mode, asked.reason) == ("hybrid", "requested 'hybrid'") and asked.needs_vector
    assert asked.mode_json() == {"used": "hybrid", "requested": "hybrid", "reason": "requested 'hybrid'"}


def test_legs_weights_depth_and_expansion_are_in_the_plan() -> None:
    request = SearchRequest(query="Kündigung Mietvertrag", limit=20, offset=10)
    plan = plan_query(request, RETRIEVAL, HYBRID, [["Mietvertrag", "Mietverhältnis"]])
    assert dict(plan.weights) == leg_weights(RETRIEVAL, "hybrid")
    assert plan.legs == frozenset(leg for leg, w in plan.weights.items() if w > 0)
    assert plan.depth == 150  # min(max(5 x 30, 50), 2500)
    assert plan.expansion.added == ("Mietverhältnis",) and "Mietverhältnis" in plan.expansion.text
    shown = plan.to_json()
    assert shown["synonyms_added"] == ["Mietverhältnis"] and shown["leg_depth"] == 150
    assert shown["fusion"] == {"method": RETRIEVAL.fusion_method, "rrf_k": RETRIEVAL.fusion_rrf_k}


def test_a_plan_cannot_be_changed() -> None:
    plan = plan_query(SearchRequest(query="Kaution"), RETRIEVAL, HYBRID, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mode = "lexical"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.weights["semantic"] = 0.0  # type: ignore[index]


def test_a_mode_that_needs_vectors_where_there_are_none_is_refused() -> None:
    off = RETRIEVAL.model_copy(update={"weight_semantic": 0.0})
    with pytest.raises(SemanticUnavailable):
        plan_query(SearchRequest(query="Kaution", mode="semantic"), off, HYBRID, None)
    assert plan_query(SearchRequest(query="Kaution", mode="lexical"), off, HYBRID, None).mode == "lexical"


def test_an_explicit_mode_with_vectors_where_the_evidence_says_keyword_only_is_refused_with_its_reason() -> None:
    unproven = GateDecision("lexical", "no evaluation report matches these settings", vectors_proven=False)
    for mode in ("hybrid", "semantic"):
        with pytest.raises(ModeUnavailable) as refused:
            plan_query(SearchRequest(query="Kaution", mode=mode), RETRIEVAL, unproven, None)
        assert refused.value.field == "mode" and "no evaluation report matches" in refused.value.message
    assert plan_query(SearchRequest(query="Kaution", mode="lexical"), RETRIEVAL, unproven, None).mode == "lexical"
    assert plan_query(SearchRequest(query="Kaution"), RETRIEVAL, unproven, None).mode == "lexical"
    # The operator may honour it; a pinned default (not judged) and proven vectors honour it anyway.
    honour = RETRIEVAL.model_copy(
        update={"mode_gate": RETRIEVAL.mode_gate.model_copy(update={"explicit_without_evidence": "honour"})}
    )
    assert plan_query(SearchRequest(query="Kaution", mode="hybrid"), honour, unproven, None).mode == "hybrid"
    pinned = GateDecision("lexical", "pinned by the operator", vectors_proven=None)
    assert plan_query(SearchRequest(query="Kaution", mode="semantic"), RETRIEVAL, pinned, None).mode == "semantic"
    assert plan_query(SearchRequest(query="Kaution", mode="hybrid"), RETRIEVAL, HYBRID, None).mode == "hybrid"


class _FlippingGate:
    """The service's `gate` attribute, flipped to lexical by the first reading (as a refresh in the middle of
    a request would); counts the readings."""

    def __init__(self) -> None:
        self.reads = 0

    def __get__(self, _service: Any, _owner: Any) -> GateDecision:
        self.reads += 1
        return HYBRID if self.reads == 1 else LEXICAL


def test_a_gate_flip_in_the_middle_of_a_request_does_not_change_its_plan() -> None:
    """`SearchService.search` makes the plan before its first await and hands it to the ranked search: the gate is
    read once, and the stages after the flip still run the hybrid plan (embedding included)."""
    from search.service import SearchService
    from search.stages.ranked import RankedSearch

    gate = _FlippingGate()
    seen: list[QueryPlan] = []
    embedded: list[str] = []

    async def embed(query: str, principals: Any = ()) -> list[float]:
        embedded.append(query)
        return [0.1]

    async def compile_scope(principals: Any, project_ids: Any) -> Any:
        await asyncio.sleep(0)  # the request yields here; the gate may change meanwhile
        return "scope"

    class Stages(RankedSearch):
        def __init__(self) -> None:  # no stages: `run` below records what the request hands it
            self.compile_scope, self.embed = compile_scope, embed

        async def run(self, principals: Any, request: Any, scope: Any, plan: QueryPlan, **kw: Any) -> Any:
            seen.append(plan)
            await kw["vector"]
            return service.plan(request)  # a later reading: the flipped gate

    class Probe(SearchService):
        def __init__(self) -> None:  # no clients
            from search.ports import SqlReader

            self.settings = load_settings(environ={})
            self.synonym_groups = None
            none: Any = None
            self.sql = SqlReader(self.settings, none, none)  # only its release grid is used
            self.ranked = Stages()

    Probe.gate = gate  # type: ignore[assignment]
    service = Probe()
    later = asyncio.run(service.search(["user:anna"], SearchRequest(query="Kaution")))
    assert [p.mode for p in seen] == ["hybrid"] and embedded == ["Kaution"] and gate.reads == 2
    assert later.mode == "lexical"  # the gate did flip; the request's own plan did not follow it


def test_the_query_words_are_read_into_the_plan_and_shown_but_can_be_turned_off() -> None:
    import datetime as dt

    request = SearchRequest(query="Mietvertrag in der Fassung vom 1. März 2020 § 5 Abs. 2")
    plan = plan_query(request, RETRIEVAL, LEXICAL, None)
    assert plan.words is not None and plan.words.as_of == dt.date(2020, 3, 1)
    shown = plan.to_json()["query_words"]
    assert shown["as_of"] == "2020-03-01" and shown["provisions"]
    off = plan_query(request, RETRIEVAL.model_copy(update={"query_words_enabled": False}), LEXICAL, None)
    assert off.words is None and off.to_json()["query_words"] is None
    # The text legs search the query without the phrase that asked for the date; turned off, the whole query.
    assert plan.expansion.text == "Mietvertrag § 5 Abs. 2" and off.expansion.text == request.query
    assert plan.as_of == dt.date(2020, 3, 1) and off.as_of is None
    assert plan.applied(request).as_of == dt.date(2020, 3, 1) and off.applied(request) is request


def test_an_explicit_as_of_wins_and_a_day_without_a_version_word_stays_a_word() -> None:
    import datetime as dt

    dated = SearchRequest(query="Mietvertrag Stand 2019", as_of="2021-06-30")
    plan = plan_query(dated, RETRIEVAL, LEXICAL, None)
    assert plan.words is not None and plan.words.as_of == dt.date(2019, 12, 31)  # read, shown
    assert plan.as_of is None and plan.applied(dated) is dated  # and the request's own day kept
    assert plan.expansion.text == dated.query

    # A statute's title date, a question's range: read and shown, but searched as words and applied to nothing.
    for query in (
        "Übergangsvorschrift zum Gesetz zur Änderung des Zugewinnausgleichs- und Vormundschaftsrechts vom 6. Juli 2009",
        "In wie vielen Phasen wurde die Metro zwischen 1980 und 1984 eröffnet?",
        "Wie viel höher war die Abholzungsrate von 2000 bis 2005 im Vergleich zu 1995 bis 2000?",
    ):
        request = SearchRequest(query=query)
        plan = plan_query(request, RETRIEVAL, LEXICAL, None)
        assert plan.words is not None and plan.words.spans, query
        assert (plan.as_of, plan.compare_with, plan.expansion.text) == (None, None, query)
        assert plan.applied(request) is request


def test_a_comparison_searches_its_later_side_and_labels_the_earlier_one() -> None:
    import datetime as dt

    previous = plan_query(SearchRequest(query="Unterschied zur vorherigen Fassung des Mietvertrags"),
                          RETRIEVAL, LEXICAL, None)  # fmt: skip
    assert (previous.as_of, previous.compare_with) == (None, "previous")  # the current version, and its predecessor
    assert previous.to_json()["from_query_words"]["compare_with"] == "previous"
    since = plan_query(
        SearchRequest(query="Was hat sich seit 2019 geändert am Arbeitsvertrag"), RETRIEVAL, LEXICAL, None
    )
    assert (since.as_of, since.compare_with) == (None, dt.date(2019, 1, 1))
    assert since.expansion.text == "am Arbeitsvertrag"
    plain = plan_query(SearchRequest(query="Unterschied zwischen Kündigung und Aufhebungsvertrag"),
                       RETRIEVAL, LEXICAL, None)  # fmt: skip
    assert plain.compare_with is None and plain.as_of is None  # two things compared, no versions

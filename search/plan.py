"""The plan of one ranked search, made once: mode, leg weights, the legs that run, the query's expansion, each leg's
depth, what the query's own words say (search.query_words). Pure: built from the request, the retrieval settings
and one reading of the mode gate.

What the query's own words say applies where the request is silent (`QueryPlan.applied`): a version asked for
by its day ("in der Fassung vom 1. März 2020", "Stand 2019") becomes `as_of`; a comparison of versions
("Unterschied zur vorherigen Fassung", "seit 2019 geändert") searches the later side and labels each hit with
the caller's version of the earlier one; the text legs search the query without those phrases. A day or a range
without a word that names a version ("Gesetz ... vom 6. Juli 2009", "zwischen 1980 und 1984") is shown in
`explain` but stays a searchable word: on the dev sets every such phrase was a title's date or the question's
subject. An explicit `as_of` always wins.

Every later step reads the plan; none resolves any of it again. The mode gate may change its default while a
request runs (`SearchService.refresh_gate`, a new self-evaluation report): a plan made before that keeps the
mode it was made with, so one request never sees two modes (a semantic leg asked for with no vector embedded,
or a vector embedded for a lexical search). `explain` shows the plan.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ki.errors import RequestInvalid
from ki.settings import RetrievalSettings
from search.query_words import ParsedQuery, Side, parse_query, version_cued, without_spans
from search.ranking.fusion import FusionMethod
from search.ranking.legs import REGISTRY, LegName, active_legs, leg_depth
from search.ranking.mode_gate import GateDecision, Mode
from search.ranking.synonyms import DEFAULT_SYNONYMS, Expansion, expand_query
from search.request import SearchRequest


class SemanticUnavailable(RequestInvalid):
    """The request asked for a mode with the semantic leg, but this service has no query vectors to give."""

    def __init__(self, message: str) -> None:
        super().__init__("mode", message)


class ModeUnavailable(RequestInvalid):
    """The request asked for hybrid or semantic where the evidence says keyword-only: a typed refusal with the
    gate's reason, not a silent substitution (`retrieval.mode_gate.explicit_without_evidence`)."""

    def __init__(self, mode: str, reason: str) -> None:
        self.mode, self.reason = mode, reason
        super().__init__("mode", f"{mode!r} is unavailable here: {reason}")


@dataclass(frozen=True)
class QueryPlan:
    """What one ranked search does, decided before any of it runs (immutable)."""

    mode: Mode
    requested: Mode | None  # the request's own mode, if it named one
    reason: str  # why this mode: the request's, or the gate's sentence
    weights: Mapping[str, float]  # per leg; a leg weighted 0 does not run
    legs: frozenset[LegName]
    expansion: Expansion  # the query with synonyms added (what the lexical and semantic legs search)
    depth: int  # hits per leg for the request's window
    fusion_method: FusionMethod
    fusion_rrf_k: int
    words: ParsedQuery | None = None  # what the query's own words say (dates, comparison, provisions), if read
    # What the words decided where the request was silent (None: the request's own fields apply).
    as_of: dt.date | None = None
    compare_with: Side | None = None  # a comparison's earlier side, each hit labelled with it

    def applied(self, request: SearchRequest) -> SearchRequest:
        """`request` with the day its words asked for where it named none itself."""
        return request.model_copy(update={"as_of": self.as_of}) if self.as_of is not None else request

    @property
    def needs_vector(self) -> bool:
        return "semantic" in self.legs

    def mode_json(self) -> dict[str, Any]:
        """The answer's `mode`: which mode ran and why."""
        return {"used": self.mode, "requested": self.requested, "reason": self.reason}

    def to_json(self) -> dict[str, Any]:
        """The plan as `explain` shows it."""
        return {
            "mode": self.mode,
            "requested": self.requested,
            "reason": self.reason,
            "weights": dict(self.weights),
            "legs": sorted(self.legs),
            "lexical_query": self.expansion.text,
            "synonyms_added": list(self.expansion.added),
            "leg_depth": self.depth,
            "fusion": {"method": self.fusion_method, "rrf_k": self.fusion_rrf_k},
            "query_words": self.words.to_json() if self.words is not None else None,
            "from_query_words": {
                "as_of": self.as_of.isoformat() if self.as_of else None,
                "compare_with": _side_json(self.compare_with),
            },
        }


def _side_json(side: Side | None) -> str | None:
    return side.isoformat() if isinstance(side, dt.date) else side


def words_decide(request: SearchRequest, words: ParsedQuery | None) -> dict[str, Any]:
    """What the query's words decide for the plan where the request names no `as_of` itself: the day a version
    is asked for, or a comparison's later side (`as_of`; the current version: none) and its earlier one."""
    if words is None or request.as_of is not None:
        return {}
    if words.compare is not None and version_cued(words, "compare"):
        later = words.compare.later
        return {"as_of": later if isinstance(later, dt.date) else None, "compare_with": words.compare.earlier}
    if words.as_of is not None and version_cued(words, "as_of"):
        return {"as_of": words.as_of}
    return {}


def leg_text(query: str, words: ParsedQuery | None, decided: Mapping[str, Any]) -> str:
    """What the text legs search: the query without the phrases whose date or comparison the plan applies."""
    if words is None or not decided:
        return query
    kinds = {"compare"} if "compare_with" in decided else {"as_of"}
    text = without_spans(query, [s for s in words.spans if s.kind in kinds])
    return text if text.strip() else query


def leg_weights(retrieval: RetrievalSettings, mode: Mode) -> dict[str, float]:
    """Weights of the legs `mode` runs (each leg's `weight_key` setting); a leg weighted 0 is not run."""
    return {leg.name: getattr(retrieval, leg.weight_key) if mode in leg.modes else 0.0 for leg in REGISTRY}


def resolve_mode(retrieval: RetrievalSettings, gate: GateDecision, requested: Mode | None) -> Mode:
    """The request's mode if it names one, else the evidence gate's default. A mode with the semantic leg is
    refused where that leg is off, and where the evidence says keyword-only unless the operator honours it."""
    if requested is None:
        return gate.default_mode
    if requested != "lexical" and retrieval.weight_semantic <= 0:
        raise SemanticUnavailable(
            f"mode {requested!r} needs the semantic leg, which is off here (retrieval.weight_semantic is 0)"
        )
    refuse = retrieval.mode_gate.explicit_without_evidence == "refuse"
    if requested != "lexical" and gate.vectors_proven is False and refuse:
        raise ModeUnavailable(requested, gate.reason)
    return requested


def synonym_groups(retrieval: RetrievalSettings) -> list[list[str]] | None:
    """The synonym groups the query's expansion uses: the configured ones, else the shipped list (None: off)."""
    if not retrieval.synonyms_enabled:
        return None
    return retrieval.synonyms if retrieval.synonyms is not None else [list(g) for g in DEFAULT_SYNONYMS]


def expansion_of(query: str, synonym_groups: Sequence[Sequence[str]] | None) -> Expansion:
    """The query with synonyms added (search.ranking.synonyms), or as it is when synonyms are off."""
    return Expansion(query, ()) if synonym_groups is None else expand_query(query, synonym_groups)


def plan_query(
    request: SearchRequest,
    retrieval: RetrievalSettings,
    gate: GateDecision,
    synonym_groups: Sequence[Sequence[str]] | None,
) -> QueryPlan:
    """The plan of `request` under these settings and this reading of the mode gate."""
    mode = resolve_mode(retrieval, gate, request.mode)
    weights = leg_weights(retrieval, mode)
    words = parse_query(request.query) if retrieval.query_words_enabled else None
    decided = words_decide(request, words)
    return QueryPlan(
        mode=mode,
        requested=request.mode,
        reason=gate.reason if request.mode is None else f"requested {request.mode!r}",
        weights=MappingProxyType(weights),
        legs=active_legs(weights),
        expansion=expansion_of(leg_text(request.query, words, decided), synonym_groups),
        depth=leg_depth(request.window),
        fusion_method=retrieval.fusion_method,
        fusion_rrf_k=retrieval.fusion_rrf_k,
        words=words,
        **{k: v for k, v in decided.items() if v is not None},
    )

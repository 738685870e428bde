"""Pure ranking steps: weighted reciprocal rank fusion or a weighted sum of per-query normalised leg
scores (`fuse`), matched identifiers, version-status boost and per-document collapse. No I/O.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from search.ranking.legs import LEGS, LegHit


@dataclass(frozen=True)
class Candidate:
    """One chunk after fusion. `ranks` is its 0-based rank per leg it appeared in; `parts` the RRF
    contribution of each of those legs; `boost` the version-status multiplier and `decay` the age
    multiplier applied afterwards, and `bonus` what a promoted document's row gets added last, so
    `score == sum(parts) * boost * decay + bonus` (the fused score); `rerank_score`, when set, replaces it
    in the answer."""

    chunk_id: str
    score: float
    source: dict[str, Any]
    ranks: dict[str, int] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    boost: float = 1.0
    decay: float = 1.0  # temporal decay multiplier (1.0 when off)
    bonus: float = 0.0  # `retrieval.promoted_bonus` for a promoted document's row, else 0
    matched_identifiers: tuple[str, ...] = ()
    rerank_score: float | None = None
    # "ranked", or why the identity preflight put it first ("identifier" / "title")
    match_reason: str = "ranked"

    @property
    def final_score(self) -> float:
        return self.score if self.rerank_score is None else self.rerank_score

    @property
    def document_id(self) -> int:
        return int(self.source["document_id"])

    @property
    def version_id(self) -> int:
        return int(self.source["document_version_id"])

    @property
    def project_id(self) -> int:
        return int(self.source["project_id"])


def matched_identifiers(identifiers: Sequence[str], query: str) -> tuple[str, ...]:
    """The document's identifiers whose casefolded text occurs in the casefolded query."""
    folded = query.casefold()
    return tuple(i for i in identifiers if i.strip() and i.casefold() in folded)


def rrf(legs: Mapping[str, Sequence[LegHit]], weights: Mapping[str, float], k: int, query: str = "") -> list[Candidate]:
    """score(chunk) = sum over legs of weight_leg / (k + rank), rank from 0; sorted by score, then id.

    Candidates found by the identifier leg get `matched_identifiers` (reported, not scored).
    """
    return _combine(legs, lambda leg, rank, hit: float(weights.get(leg, 0.0)) / (k + rank), query)


def _combine(
    legs: Mapping[str, Sequence[LegHit]], contribution: Callable[[str, int, LegHit], float], query: str
) -> list[Candidate]:
    """Each chunk's score is the sum of its legs' `contribution(leg, rank, hit)`, ranks from 0; a leg lists a
    chunk once (its best rank counts). Sorted by score, then id."""
    scores: dict[str, float] = {}
    sources: dict[str, dict[str, Any]] = {}
    ranks: dict[str, dict[str, int]] = {}
    parts: dict[str, dict[str, float]] = {}
    for leg in LEGS:
        for rank, hit in enumerate(legs.get(leg, ())):
            if hit.id in ranks and leg in ranks[hit.id]:
                continue
            part = contribution(leg, rank, hit)
            scores[hit.id] = scores.get(hit.id, 0.0) + part
            sources.setdefault(hit.id, hit.source)
            ranks.setdefault(hit.id, {})[leg] = rank
            parts.setdefault(hit.id, {})[leg] = part
    out = []
    for chunk_id, score in scores.items():
        source = sources[chunk_id]
        matched: tuple[str, ...] = ()
        if "identifier" in ranks[chunk_id]:
            matched = matched_identifiers(source.get("identifiers") or [], query)
        out.append(Candidate(chunk_id, score, source, ranks[chunk_id], parts[chunk_id], matched_identifiers=matched))
    return sort_candidates(out)


FusionMethod = Literal["rrf", "minmax", "dbsf"]


def normalise(scores: Sequence[float], method: FusionMethod) -> list[float]:
    """One leg's scores mapped to [0, 1] per query, for a weighted sum across legs (`fuse`).

    * `minmax`: (s - min) / (max - min);
    * `dbsf` (distribution-based): (s - (mean - 3 sd)) / (6 sd), clipped to [0, 1] -- scores further than
      3 sd from the leg's mean are clipped, and a leg's scale is its spread, not its two extremes.

    A leg with one hit, or with equal scores, gives each hit 1.0 (each is as good as that leg's best); an
    empty leg gives nothing."""
    if not scores:
        return []
    if method == "minmax":
        low, high = min(scores), max(scores)
        return [1.0 if high == low else (s - low) / (high - low) for s in scores]
    mean = math.fsum(scores) / len(scores)
    sd = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    if sd == 0.0:
        return [1.0 for _ in scores]
    low = mean - 3 * sd
    return [min(1.0, max(0.0, (s - low) / (6 * sd))) for s in scores]


def fuse(
    legs: Mapping[str, Sequence[LegHit]],
    weights: Mapping[str, float],
    method: FusionMethod,
    k: int,
    query: str = "",
) -> list[Candidate]:
    """The legs' lists as one ranking: weighted RRF (`rrf`), or the weighted sum of each leg's scores
    normalised per query over the list the caller's filter gave (`minmax`, `dbsf`: `normalise`). Either way
    `ranks` keeps each leg's 0-based rank and `parts` each leg's weighted contribution (the score before
    the boost is their sum)."""
    if method == "rrf":
        return rrf(legs, weights, k, query)
    normalised = {leg: normalise([h.score for h in hits], method) for leg, hits in legs.items()}
    return _combine(legs, lambda leg, rank, hit: float(weights.get(leg, 0.0)) * normalised[leg][rank], query)


def sort_candidates(candidates: Sequence[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.score, c.chunk_id))


def apply_boost(candidates: Sequence[Candidate], boosts: Mapping[str, float]) -> list[Candidate]:
    """Multiply each score by boosts[version_status] (1.0 for unlisted statuses) and re-sort."""
    boosted = []
    for c in candidates:
        factor = float(boosts.get(str(c.source.get("version_status")), 1.0))
        boosted.append(replace(c, score=c.score * factor, boost=factor))
    return sort_candidates(boosted)


def apply_promoted(candidates: Sequence[Candidate], bonus: float) -> list[Candidate]:
    """Add `bonus` to the score of each promoted document's row (`promoted` in its source) and re-sort; the
    others are as they were. A bonus of 0 changes nothing."""
    if bonus == 0.0:
        return list(candidates)
    added = [replace(c, score=c.score + bonus, bonus=bonus) if c.source.get("promoted") else c for c in candidates]
    return sort_candidates(added)


DAYS_PER_YEAR = 365.25


def age_factor(doc_date: str | None, today: dt.date, floor: float) -> float:
    """`floor + (1 - floor) / (1 + age_years)`: 1.0 for a document of `today`, 0.9 at one year with floor
    0.8, tending to `floor`. A document without a date counts as old (`floor`); a future date as new."""
    if not doc_date:
        return floor
    try:
        day = dt.date.fromisoformat(str(doc_date)[:10])
    except ValueError:
        return floor
    age_years = max((today - day).days, 0) / DAYS_PER_YEAR
    return floor + (1.0 - floor) / (1.0 + age_years)


def apply_decay(candidates: Sequence[Candidate], today: dt.date, floor: float) -> list[Candidate]:
    """Multiply each score by its document age factor (`age_factor`) and re-sort."""
    decayed = []
    for c in candidates:
        factor = age_factor(c.source.get("doc_date"), today, floor)
        decayed.append(replace(c, score=c.score * factor, decay=factor))
    return sort_candidates(decayed)


def collapse(
    candidates: Sequence[Candidate],
    *,
    per_document: bool,
    max_chunks_per_document: int,
    is_latest_final: Callable[[Candidate], bool],
) -> list[Candidate]:
    """One hit per document (best score; ties go to the document's latest final version), or with
    `per_document=False` up to `max_chunks_per_document` chunks per document. Ordered by score."""
    groups: dict[int, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.document_id, []).append(c)
    keep = 1 if per_document else max_chunks_per_document
    kept: list[Candidate] = []
    for group in groups.values():
        group.sort(key=lambda c: (-c.score, not is_latest_final(c), c.chunk_id))
        kept.extend(group[:keep])
    kept.sort(key=lambda c: (-c.score, not is_latest_final(c), c.chunk_id))
    return kept


def put_first(
    hit: Candidate, kept: Sequence[Candidate], *, per_document: bool, max_chunks_per_document: int
) -> list[Candidate]:
    """`hit` (the identity preflight's) first, then `kept` without it and, as collapse would, without its
    document's other chunks (one hit per document) or beyond that document's chunk cap."""
    return put_at(hit, kept, 0, per_document=per_document, max_chunks_per_document=max_chunks_per_document)


def put_at(
    hit: Candidate, kept: Sequence[Candidate], position: int, *, per_document: bool, max_chunks_per_document: int
) -> list[Candidate]:
    """`kept` with `hit` at `position` (at most its end), and, as collapse would, without the hit's document's
    other chunks (one hit per document) or beyond that document's chunk cap. Nothing else is dropped."""
    rest: list[Candidate] = []
    same_document = 1
    for c in kept:
        if c.chunk_id == hit.chunk_id:
            continue
        if c.document_id == hit.document_id:
            if per_document or same_document >= max_chunks_per_document:
                continue
            same_document += 1
        rest.append(c)
    at = min(max(position, 0), len(rest))
    return [*rest[:at], hit, *rest[at:]]

"""The documented ranking of `POST /v1/search` (docs/search-api.md), written out for the oracle test
(`tests/integration/test_search_oracle.py`) without importing anything of `search/`: a bug in the code under
test must not pass both sides.

Two parts:

* **The legs as an administrator sees them** (`admin_legs`): the lexical (BM25 `match` on `text`), kNN
  (`embedding`) and identifier (`match` on `identifiers_text`) legs as plain OpenSearch query bodies over
  a world's projects, every row deep, in one `_msearch` whose NDJSON is encoded and whose answer is parsed
  here. Filters are in filter context, so a row's score does not depend on them; the same index answers
  the oracle and the API, so term statistics are the same too.
* **The ranking over one caller's rows** (`expected`), pure: the rows the caller may see (the reference
  evaluator decides) that pass the request's metadata filters and `as_of`, each leg's first `leg_depth`
  of them, the semantic floor, fusion (weighted RRF, min-max or dbsf), the version-status boost, the
  promoted bonus, the SQL re-verify (with `as_of`, only the version in force), one hit per document (best
  score, ties to the caller's latest final version, then chunk id), the page at `offset`, `has_more`, the
  empty answer's `reason`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opensearchpy import OpenSearch

# The legs in the order the fused score sums them (docs/search-api.md, "Explain": `rrf_parts`).
LEGS = ("lexical", "semantic", "identifier")
FINAL_STATUSES = frozenset({"final", "executed"})
MAX_LEG_DEPTH = 2500  # docs: hits per leg for a window n = offset + limit are min(max(5 n, 50), 2500)
ADMIN_SIZE = 1000  # rows per leg the oracle asks for: more than a world has, so every row of it
SOURCE_FIELDS = [
    "promoted",
    "document_id",
    "document_version_id",
    "project_id",
    "version_status",
    "chunk_kind",
    "doc_date",
    "language",
    "identifiers",
]


def leg_depth(window: int) -> int:
    """Hits each leg contributes for a window of `window` (= offset + limit) ranked answers."""
    return min(max(5 * window, 50), MAX_LEG_DEPTH)


# ---------------------------------------------------------------------------------------------------
# The legs, as an administrator
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One index row as a leg found it."""

    chunk_id: str
    score: float
    document_id: int
    version_id: int
    project_id: int
    status: str
    language: str | None
    doc_date: dt.date | None
    identifiers: tuple[str, ...]
    promoted: bool = False


def _row(hit: Mapping[str, Any]) -> Row:
    source = hit["_source"]
    date = source.get("doc_date")
    return Row(
        chunk_id=str(hit["_id"]),
        score=float(hit["_score"]),
        document_id=int(source["document_id"]),
        version_id=int(source["document_version_id"]),
        project_id=int(source["project_id"]),
        status=str(source.get("version_status")),
        language=source.get("language"),
        doc_date=dt.date.fromisoformat(str(date)[:10]) if date else None,
        identifiers=tuple(source.get("identifiers") or ()),
        promoted=bool(source.get("promoted")),
    )


def admin_bodies(query: str, vector: Sequence[float], projects: Iterable[int]) -> dict[str, dict[str, Any]]:
    """Every leg's query body over `projects`, every row deep. Scoring clauses as documented: BM25 `match`
    of the query on `text` (lexical) and on `identifiers_text` (identifier), the kNN of the query vector
    on `embedding` with the filter inside the kNN clause (semantic, exact below `k` filtered rows)."""
    where = {"terms": {"project_id": [str(p) for p in projects]}}
    common = {"size": ADMIN_SIZE, "_source": SOURCE_FIELDS, "track_total_hits": False}

    def matching(text_field: str) -> dict[str, Any]:
        return {"bool": {"must": [{"match": {text_field: {"query": query}}}], "filter": [where]}}

    knn = {"embedding": {"vector": list(vector), "k": ADMIN_SIZE, "filter": where}}
    return {
        "lexical": {**common, "query": matching("text")},
        "semantic": {**common, "query": {"knn": knn}},
        "identifier": {**common, "query": matching("identifiers_text")},
    }


def ndjson(index: str, bodies: Mapping[str, Mapping[str, Any]]) -> str:
    """An `_msearch` request: a header line and a body line per search, newline-terminated."""
    lines: list[str] = []
    for body in bodies.values():
        lines += [json.dumps({"index": index}), json.dumps(body, ensure_ascii=False)]
    return "\n".join(lines) + "\n"


def admin_legs(client: OpenSearch, index: str, bodies: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Row]]:
    """Each leg's rows in OpenSearch's order (one `_msearch`); a failed leg fails the test."""
    response = client.msearch(body=ndjson(index, bodies))
    answers = response["responses"]
    assert len(answers) == len(bodies), response
    out: dict[str, list[Row]] = {}
    for leg, answer in zip(bodies, answers, strict=True):
        assert "error" not in answer, (leg, answer)
        rows = [_row(hit) for hit in answer["hits"]["hits"]]
        assert len(rows) < ADMIN_SIZE, f"{leg}: a world has more rows than the oracle reads"
        out[leg] = rows
    return out


# ---------------------------------------------------------------------------------------------------
# The ranking over one caller's rows
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranking:
    """The settings the ranking reads (`retrieval.*`)."""

    weights: Mapping[str, float]  # per leg, hybrid mode
    rrf_k: int
    method: str  # rrf | minmax | dbsf
    boosts: Mapping[str, float]  # version status -> multiplier (unlisted: 1)
    floor: float | None  # minimum cosine similarity of a semantic hit (None: no floor)
    space_type: str  # the kNN space type, how a score maps to a cosine
    promoted_bonus: float = 0.0  # added to a promoted document's rows, after the boost

    def leg_weights(self, mode: str) -> dict[str, float]:
        """The legs a mode runs and their weights: hybrid all three, lexical the lexical and identifier
        legs, semantic the kNN leg alone; a leg weighted 0 is not run."""
        on = {"hybrid": LEGS, "lexical": ("lexical", "identifier"), "semantic": ("semantic",)}[mode]
        return {leg: float(self.weights[leg]) for leg in on if float(self.weights[leg]) > 0}


@dataclass(frozen=True)
class Version:
    """A version as the database holds it."""

    id: int
    document_id: int
    project_id: int
    version_no: int  # upstream's number
    status: str
    doc_date: dt.date | None


@dataclass(frozen=True)
class View:
    """One caller's view of a world: the versions it may see, every version of the world, the documents'
    upstream latest-final pointers."""

    visible: frozenset[int]
    versions: Mapping[int, Version]
    pointers: Mapping[int, int | None]

    def of_document(self, document_id: int) -> list[Version]:
        """The caller's visible versions of a document, in upstream order."""
        mine = [v for v in self.versions.values() if v.document_id == document_id and v.id in self.visible]
        return sorted(mine, key=lambda v: (v.version_no, v.id))

    def latest_final(self, document_id: int) -> int | None:
        """The upstream pointer when the caller may see that version, else the caller's highest-numbered
        final or executed version, else none."""
        mine = self.of_document(document_id)
        pointer = self.pointers.get(document_id)
        if pointer is not None and any(v.id == pointer for v in mine):
            return pointer
        finals = [v.id for v in mine if v.status in FINAL_STATUSES]
        return finals[-1] if finals else None

    def in_force(self, document_id: int, as_of: dt.date) -> int | None:
        """The caller's final or executed version dated on or before `as_of`: latest date, then number."""
        dated = [
            v
            for v in self.of_document(document_id)
            if v.status in FINAL_STATUSES and v.doc_date is not None and v.doc_date <= as_of
        ]
        return max(dated, key=lambda v: (v.doc_date, v.version_no)).id if dated else None

    def shown_number(self, version_id: int) -> int:
        """A version's number as the caller reads it: its position among the document's visible versions."""
        document = self.versions[version_id].document_id
        return [v.id for v in self.of_document(document)].index(version_id) + 1


@dataclass(frozen=True)
class Ask:
    """One ranked request."""

    query: str
    mode: str
    limit: int
    offset: int = 0
    filters: Mapping[str, Any] = field(default_factory=dict)
    as_of: dt.date | None = None

    @property
    def window(self) -> int:
        return self.offset + self.limit

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.query, "mode": self.mode, "limit": self.limit, "explain": True}
        if self.offset:
            out["offset"] = self.offset
        if self.filters:
            out["filters"] = dict(self.filters)
        if self.as_of is not None:
            out["as_of"] = self.as_of.isoformat()
        return out

    def has_clauses(self) -> bool:
        return bool(self.filters) or self.as_of is not None

    def passes(self, row: Row) -> bool:
        """The request's metadata filters (each list any of its values, AND-ed) and `as_of`'s clauses (a
        final or executed row dated on or before it)."""
        f = self.filters
        if "project_id" in f and row.project_id not in f["project_id"]:
            return False
        if "version_status" in f and row.status not in f["version_status"]:
            return False
        if "language" in f and row.language not in f["language"]:
            return False
        for bound, ok in (("date_from", lambda d, b: d >= b), ("date_to", lambda d, b: d <= b)):
            if bound in f and (row.doc_date is None or not ok(row.doc_date, dt.date.fromisoformat(f[bound]))):
                return False
        if self.as_of is not None:
            return row.status in FINAL_STATUSES and row.doc_date is not None and row.doc_date <= self.as_of
        return True


@dataclass
class Hit:
    chunk_id: str
    row: Row
    ranks: dict[str, int] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    boost: float = 1.0
    bonus: float = 0.0
    score: float = 0.0
    latest: bool = False


@dataclass
class Expected:
    """The answer the documentation promises, and what the case exercised (for the test's coverage)."""

    hits: list[dict[str, Any]]
    has_more: bool
    reason: str | None
    mode: str
    floor: dict[str, Any]
    cut_by_depth: bool = False  # some leg had more of the caller's rows than its depth
    tie_to_latest: bool = False  # a document's best score was tied and the latest final version won it
    statuses: set[str] = field(default_factory=set)  # statuses of the page's hits


def cosine(score: float, space_type: str) -> float:
    """The cosine similarity behind a kNN score of the index's space type (vectors are unit length):
    cosinesimil scores (1 + cos) / 2; inner product 1 + ip (ip >= 0) or 1 / (1 - ip); l2 1 / (1 + d^2)
    with d^2 = 2 - 2 cos."""
    if space_type == "cosinesimil":
        return 2.0 * score - 1.0
    if space_type == "innerproduct":
        return score - 1.0 if score >= 1.0 else 1.0 - 1.0 / score
    assert space_type == "l2", space_type
    return 1.0 - (1.0 / score - 1.0) / 2.0


def normalised(scores: Sequence[float], method: str) -> list[float]:
    """A leg's scores scaled to [0, 1] over the caller's list: min-max, or dbsf (mean +- 3 population
    standard deviations, clipped); one hit or equal scores: 1 each."""
    if method == "minmax":
        low, high = min(scores, default=0.0), max(scores, default=0.0)
        return [1.0 if high == low else (s - low) / (high - low) for s in scores]
    assert method == "dbsf", method
    if not scores:
        return []
    mean = math.fsum(scores) / len(scores)
    sd = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    if sd == 0.0:
        return [1.0] * len(scores)
    return [min(1.0, max(0.0, (s - (mean - 3 * sd)) / (6 * sd))) for s in scores]


def expected(
    ask: Ask,
    admin: Mapping[str, Sequence[Row]],
    view: View,
    ranking: Ranking,
    *,
    per_document: bool = False,
) -> Expected:
    """The documented answer to `ask` for the caller of `view`. `per_document`: the legs over the rows of
    every version of the documents the caller sees one version of instead, the hidden versions' rows
    dropped only after fusion (a per-document filter) -- for the test to show its worlds tell them apart."""
    weights = ranking.leg_weights(ask.mode)
    depth = leg_depth(ask.window)
    documents = {view.versions[v].document_id for v in view.visible}

    def admitted(row: Row) -> bool:
        seen = row.document_id in documents if per_document else row.version_id in view.visible
        return seen and ask.passes(row)

    legs: dict[str, list[Row]] = {}
    cut = False
    for leg in weights:
        mine = [r for r in admin[leg] if admitted(r)]
        cut = cut or len(mine) > depth
        legs[leg] = mine[:depth]
    dropped = 0
    if "semantic" in legs and ranking.floor is not None:
        kept = [r for r in legs["semantic"] if cosine(r.score, ranking.space_type) >= ranking.floor]
        dropped = len(legs["semantic"]) - len(kept)
        legs["semantic"] = kept

    hits: dict[str, Hit] = {}
    for leg in LEGS:
        if leg not in legs:
            continue
        rows = legs[leg]
        if ranking.method == "rrf":
            parts = [weights[leg] / (ranking.rrf_k + rank) for rank in range(len(rows))]
        else:
            parts = [weights[leg] * x for x in normalised([r.score for r in rows], ranking.method)]
        for rank, (row, part) in enumerate(zip(rows, parts, strict=True)):
            hit = hits.setdefault(row.chunk_id, Hit(row.chunk_id, row))
            if leg not in hit.ranks:
                hit.ranks[leg], hit.parts[leg] = rank, part
    for hit in hits.values():
        total = 0.0
        for leg in LEGS:
            if leg in hit.parts:
                total += hit.parts[leg]
        hit.boost = float(ranking.boosts.get(hit.row.status, 1.0))
        hit.bonus = ranking.promoted_bonus if hit.row.promoted else 0.0
        hit.score = total * hit.boost + hit.bonus

    # The SQL re-verify: the caller may see the version and, with `as_of`, it is the one in force.
    def verified(hit: Hit) -> bool:
        if hit.row.version_id not in view.visible:
            return False
        return ask.as_of is None or view.in_force(hit.row.document_id, ask.as_of) == hit.row.version_id

    survivors = [h for h in hits.values() if verified(h)]
    for h in survivors:
        h.latest = view.latest_final(h.row.document_id) == h.row.version_id

    def order(h: Hit) -> tuple[float, bool, str]:
        return (-h.score, not h.latest, h.chunk_id)

    groups: dict[int, list[Hit]] = {}
    for h in survivors:
        groups.setdefault(h.row.document_id, []).append(h)
    tie = False
    best: list[Hit] = []
    for group in groups.values():
        group.sort(key=order)
        best.append(group[0])
        tie = tie or (len(group) > 1 and group[1].score == group[0].score and group[0].latest != group[1].latest)
    best.sort(key=order)
    page = best[ask.offset : ask.window]

    reason = None
    if not best:
        in_scope = {
            v
            for v in view.visible
            if "project_id" not in ask.filters or view.versions[v].project_id in ask.filters["project_id"]
        }
        if not in_scope:
            reason = "scope_empty"
        elif not ask.has_clauses():
            reason = "no_credible_evidence"
        else:
            # The kNN leg lists every row of the world (with its vector): are any of the caller's left?
            passing = any(r.version_id in in_scope and ask.passes(r) for r in admin["semantic"])
            reason = "no_credible_evidence" if passing else "filtered_out"
    return Expected(
        hits=[
            {
                "document_id": h.row.document_id,
                "version_id": h.row.version_id,
                "chunk_id": h.chunk_id,
                "version_no": view.shown_number(h.row.version_id),
                "version_status": h.row.status,
                "matched_identifiers": _matched(h, ask.query),
                "ranks": h.ranks,
                "weights": {leg: weights[leg] for leg in h.ranks},
                "fusion": ranking.method,
                "status_boost": h.boost,
                "promoted_bonus": h.bonus,
                "score": h.score,
                "rrf_parts": h.parts,
            }
            for h in page
        ],
        has_more=len(best) > ask.window,
        reason=reason,
        mode=ask.mode,
        floor={"similarity": ranking.floor, "dropped": dropped},
        cut_by_depth=cut,
        tie_to_latest=tie,
        statuses={h.row.status for h in page},
    )


def _matched(hit: Hit, query: str) -> list[str]:
    """A hit the identifier leg found names the document's identifiers that occur in the query (casefolded)."""
    if "identifier" not in hit.ranks:
        return []
    folded = query.casefold()
    return [i for i in hit.row.identifiers if i.strip() and i.casefold() in folded]

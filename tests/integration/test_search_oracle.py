"""The oracle property test: what a caller's search answers equals what the documented ranking
gives over the rows the caller may see -- so no row the caller may not see has any effect on it.

Random ACL worlds (`tests/integration/acl_worlds.py`: per-version access through projects, documents,
source objects with known or unknown ACLs, denies, nested groups, aliases; derandomised), each version
with a few words of a small legal vocabulary, are written to PostgreSQL and reach the index through the
real CDC path (an isolated sync worker and API). A world stays under 50 index rows, so every kNN search
here is exact. For each world's callers and a few queries, in lexical and hybrid mode:

* the oracle runs the legs as an administrator over the world's projects at depth 200 (every row), drops
  the rows of versions the reference evaluator (`tests/acl_reference.py`) says the caller may not see,
  keeps each leg's first `leg_depth` rows, and applies the documented ranking written out here (not
  imported): weighted RRF `sum w_leg / (k + rank)` or min-max (whichever is configured), the
  version-status boost, one hit per document (best score; ties to the caller's latest final version, then
  chunk id), the page;
* `POST /v1/search` as the caller must answer the same, field by field: the page's documents, versions,
  chunks, scores and per-leg ranks, `has_more`, `reason` and `mode`.

The same index answers both, so term statistics are the same.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ki.clients import make_sync_client
from ki.embedding import create_embedder
from ki.principals import canonical_principal
from ki.settings import Settings, load_settings
from search.access.version_view import VersionFacts, latest_final
from search.ranking.legs import LegHit, LegName, build_leg_bodies, leg_depth, msearch_lines, parse_msearch
from search.web.auth import mint_token
from tests import acl_reference as ref
from tests.conftest import wait_for
from tests.integration.acl_worlds import TAG, Written, cases, draw, write
from tests.integration.search_harness import Server, remove_world, synced_api

pytestmark = pytest.mark.stack

WORLDS = 3
SEED = 2028
VOCABULARY = ("Kaution", "Miete", "Kündigung", "Frist", "Haftung", "Schaden", "Zahlung", "Verzug", "Anlage")
QUERIES = ("Kaution", "Frist Haftung", "Zahlung im Verzug", "Kündigung der Miete")
LIMIT = 4
ADMIN_DEPTH_WINDOW = 40  # leg_depth(40) = 200 rows per leg: every row of a world


@dataclass
class Oracle:
    world: ref.World
    written: Written
    callers: list[tuple[str, ...]]  # each caller's raw principals (well-formed: a token carries them)

    @property
    def projects(self) -> list[int]:
        return sorted(self.written.projects.values())


def _texts(seed: int) -> Any:
    def text_of(version: ref.Version) -> str:
        rng = random.Random(seed * 1000 + version.id)
        return "Vermerk: " + " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(2, 7))) + "."

    return text_of


@pytest.fixture(scope="module")
def oracles(engine: Engine, settings: Settings) -> Iterator[tuple[list[Oracle], Server, Settings]]:
    env = {"KI_API__JWT__CLAIMS_CARRY_KINDS": "true", "KI_RETRIEVAL__NAME_LOOKUP_ENABLED": "false"}
    with synced_api(settings, "ki-oracle", "oracle-api", **env) as (server, _worker, isolation):
        drawn = [
            draw(
                cases("sufficient", max_documents=5, max_objects=4, min_grants=3, max_grants=10, tag=f"{TAG}o{w}"),
                1,
                SEED + w,
            )[0]  # fmt: skip
            for w in range(WORLDS)
        ]
        built: list[Oracle] = []
        try:
            with engine.begin() as conn:
                for w, case in enumerate(drawn):
                    written = write(conn, case.world, _texts(SEED + w))
                    callers = {
                        tuple(p for p in principals if isinstance(p, str) and canonical_principal(p) is not None)
                        for principals in [case.caller, *((g.principal,) for g in case.world.grants[:3])]
                    }
                    built.append(Oracle(case.world, written, sorted(c for c in callers if c)))
            iso_settings = load_settings(environ={**os.environ, **isolation})
            _wait_until_synced(server, settings, built)
            yield built, server, iso_settings
        finally:
            projects = [p for o in built for p in o.projects]
            with engine.connect() as conn:
                sources = (
                    conn.execute(
                        text("SELECT DISTINCT so.source_id FROM source_objects so WHERE so.id = ANY(:o)"),
                        {"o": [i for o in built for i in o.written.objects.values()]},
                    )
                    .scalars()
                    .all()
                )
            remove_world(engine, projects, list(sources))


def _indexable(oracle: Oracle) -> set[int]:
    """Database ids of the versions an administrator finds (live document, an active observation)."""
    deleted = {d.id for d in oracle.world.documents if d.deleted}
    observed = {o.version_id for o in oracle.world.observations if not o.deleted}
    return {
        oracle.written.versions[v.id]
        for v in oracle.world.versions
        if v.document_id not in deleted and v.id in observed
    }


def _wait_until_synced(server: Server, settings: Settings, built: list[Oracle]) -> None:
    admin = mint_token(settings.api, "root", roles=["admin"])
    projects = [p for o in built for p in o.projects]
    expected = set().union(*(_indexable(o) for o in built))

    def synced() -> bool:
        status, body = server.call("/v1/search/filter", {"limit": 100, "filters": {"project_id": projects}}, admin)
        return status == 200 and {h["version_id"] for h in body["hits"]} >= expected

    wait_for(synced, timeout=180, what="the oracle worlds in the index")


def _admin_legs(
    settings: Settings, oracle: Oracle, query: str, vector: list[float] | None, legs: frozenset[LegName]
) -> dict[LegName, list[LegHit]]:
    """Every leg as an administrator sees it, over the world's projects, every row deep."""
    strict = {"bool": {"filter": [{"terms": {"project_id": [str(p) for p in oracle.projects]}}]}}
    bodies = build_leg_bodies(
        query, vector, strict, ADMIN_DEPTH_WINDOW, legs, ef_search=settings.retrieval.hnsw_ef_search
    )
    client = make_sync_client(settings)
    try:
        response = client.msearch(body=msearch_lines(settings.retrieval.index_name, bodies))
    finally:
        client.close()
    return parse_msearch(bodies, response)


def _expected(
    settings: Settings,
    oracle: Oracle,
    caller: tuple[str, ...],
    query: str,
    mode: str,
    vector: list[float],
    *,
    per_document: bool = False,
) -> dict[str, Any]:
    """The documented ranking over the caller's rows. `per_document`: over the rows of every version of the
    documents the caller sees one version of instead, the rows of hidden versions dropped only after fusion
    (the code before per-version filtering) -- to show the worlds tell the two apart."""
    r = settings.retrieval
    weights: dict[LegName, float] = {"lexical": r.weight_lexical, "identifier": r.weight_identifier,
                                     "semantic": r.weight_semantic if mode == "hybrid" else 0.0}  # fmt: skip
    security = settings.security
    resolved = ref.resolve(oracle.world, caller, security)
    seen = {oracle.written.versions[v] for v in ref.visible(oracle.world, resolved, security)}
    legs_on = frozenset(leg for leg, w in weights.items() if w > 0)
    admin = _admin_legs(settings, oracle, query, vector if "semantic" in legs_on else None, legs_on)
    depth = leg_depth(LIMIT)
    documents = {d for v, d in _document_of(oracle).items() if v in seen}

    def admitted(hit: LegHit) -> bool:
        if per_document:
            return int(hit.source["document_id"]) in documents
        return int(hit.source["document_version_id"]) in seen

    legs = {leg: [h for h in found if admitted(h)][:depth] for leg, found in admin.items()}
    # Weighted RRF (ranks from 0) or, with `minmax`, the weighted sum of each leg's scores scaled to [0, 1]
    # over the caller's own list (one hit or equal scores: 1); then the version-status boost.
    assert r.fusion_method in ("rrf", "minmax"), "the reference knows RRF and min-max"
    fused: dict[str, dict[str, Any]] = {}
    for leg, hits in legs.items():
        low, high = min((h.score for h in hits), default=0.0), max((h.score for h in hits), default=0.0)
        for rank, hit in enumerate(hits):
            row = fused.setdefault(hit.id, {"source": hit.source, "ranks": {}, "rrf": 0.0})
            row["ranks"][leg] = rank
            if r.fusion_method == "rrf":
                row["rrf"] += weights[leg] / (r.fusion_rrf_k + rank)
            else:
                row["rrf"] += weights[leg] * (1.0 if high == low else (hit.score - low) / (high - low))
    for chunk, row in fused.items():
        row["score"] = row["rrf"] * float(r.version_status_boost.get(str(row["source"].get("version_status")), 1.0))
        row["chunk"] = chunk
    # One hit per document: best score, ties to the caller's latest final version, then chunk id.
    facts = [
        VersionFacts(oracle.written.versions[v.id], oracle.written.documents[v.document_id], 0, "final")
        for v in oracle.world.versions
        if oracle.written.versions[v.id] in seen
    ]
    # Upstream numbers grow with the ids here (`write` numbers a document's versions in order).
    facts = [VersionFacts(f.version_id, f.document_id, f.version_id, f.status) for f in facts]
    latest = latest_final(facts, {})

    def order(row: dict[str, Any]) -> tuple[float, bool, str]:
        source = row["source"]
        is_latest = latest.get(int(source["document_id"])) == int(source["document_version_id"])
        return (-row["score"], not is_latest, row["chunk"])

    best: dict[int, dict[str, Any]] = {}
    for row in sorted(fused.values(), key=order):
        if int(row["source"]["document_version_id"]) in seen:  # the SQL re-verify
            best.setdefault(int(row["source"]["document_id"]), row)
    kept = sorted(best.values(), key=order)
    page = kept[:LIMIT]
    return {
        "hits": [
            (
                int(h["source"]["document_id"]),
                int(h["source"]["document_version_id"]),
                h["chunk"],
                round(h["score"], 12),
                h["ranks"],
            )
            for h in page
        ],  # fmt: skip
        "has_more": len(kept) > LIMIT,
        "reason": None if kept else ("scope_empty" if not seen else "no_credible_evidence"),
        "mode": mode,
    }


def _document_of(oracle: Oracle) -> dict[int, int]:
    """Database version id -> database document id."""
    return {oracle.written.versions[v.id]: oracle.written.documents[v.document_id] for v in oracle.world.versions}


def _answered(server: Server, settings: Settings, caller: tuple[str, ...], query: str, mode: str) -> dict[str, Any]:
    token = mint_token(settings.api, caller[0], groups=list(caller[1:]))
    status, body = server.call("/v1/search", {"query": query, "mode": mode, "limit": LIMIT, "explain": True}, token)
    assert status == 200, body
    return {
        "hits": [
            (h["document_id"], h["version_id"], h["chunk_id"], round(h["score"], 12), h["explain"]["ranks"])
            for h in body["hits"]
        ],  # fmt: skip
        "has_more": body["has_more"],
        "reason": body.get("reason"),
        "mode": body["mode"]["used"],
    }


def test_a_callers_search_is_the_documented_ranking_over_their_own_rows(
    oracles: tuple[list[Oracle], Server, Settings],
) -> None:
    built, server, settings = oracles
    embedder = create_embedder(settings)
    vectors = {q: [float(x) for x in embedder.embed_queries([q])[0]] for q in QUERIES}
    compared = nonempty = told_apart = 0
    for oracle in built:
        for caller in oracle.callers:
            for query in QUERIES:
                for mode in ("lexical", "hybrid"):
                    expected = _expected(settings, oracle, caller, query, mode, vectors[query])
                    assert _answered(server, settings, caller, query, mode) == expected, (caller, query, mode)
                    compared += 1
                    nonempty += bool(expected["hits"])
                    before = _expected(settings, oracle, caller, query, mode, vectors[query], per_document=True)
                    told_apart += before != expected
    # The worlds exercise something: answers with hits, and answers a per-document leg filter would change.
    assert compared >= 24 and nonempty >= compared // 4 and told_apart >= 3, (compared, nonempty, told_apart)

"""Every metadata filter of the search API proven on a real index (issue 50, item 4).

`tests/unit/search/test_search_filters.py` checks the OpenSearch clauses as JSON; this module checks what they
select. One world of ten documents and fourteen versions is written to PostgreSQL, synced by a real `ki sync run`
worker into an index of its own and asked through a real `ki serve`: for each filter (and some combinations) the
hits of `POST /v1/search` in `lexical`, `semantic` and `hybrid` mode and of `POST /v1/search/filter` are compared
with a reference computed here from the rows written -- the exact set, never "contains".

What the reference models (projections.rows, search.request.metadata_clauses):
* Filters select index rows; every list matches any of its values and the filters are AND-ed on one row. A
  version matches when one of its rows does, a document when one of its versions does.
* Rows of a version: a body chunk (always; every body here is one chunk), a profile row (only the document's
  latest final version), a clause row per notable clause (only final and executed versions: a draft's clauses
  are never indexed, so `clause_type` and `chunk_kind: clause` never find a draft).
* `doc_type` matches the node's whole subtree (rows list their type's ancestors); `clause_type` matches the
  node itself only -- a parent clause type does not find its children's clauses.
* `date_from` / `date_to` bound the version's `doc_date`, both inclusive; a version without a date never matches.
* `/v1/search`: one hit per document (collapse), the hit a row that matches. `/v1/search/filter`: one hit per
  version, `doc_date` descending (undated last), equal dates in the *string* order of the version id (the index
  keeps ids as keywords).

The query word is in every row's text (body, profile, clause), the page (50) is larger than the world and the
legs' depth (5 x 50 = 250) larger than its 28 rows, so every leg's candidate set is every row the filters admit:
a hit missing or too many is the filter's doing. The semantic floor is off on this server (it is a relevance cut
of its own, tested in test_identity.py); every row has its vector before the first test.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Connection, Engine, text

from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, remove_world, synced_api, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack

LIMIT = 50
MODES = ("lexical", "semantic", "hybrid")
CLAUSE_STATUSES = {"final", "executed"}

# The ontology: doc types  vertrag > kauf, miete > gewerbemiete;  schriftsatz (a root of its own)
#               clause types  haftung > haftungsgrenze;  kuendigung
DOC_TYPES: dict[str, str | None] = {
    "vertrag": None, "kauf": "vertrag", "miete": "vertrag", "gewerbemiete": "miete", "schriftsatz": None,
}  # fmt: skip
CLAUSE_TYPES: dict[str, str | None] = {"haftung": None, "haftungsgrenze": "haftung", "kuendigung": None}


@dataclass(frozen=True)
class VersionSpec:
    status: str
    language: str
    doc_date: dt.date | None
    clauses: tuple[str, ...] = ()  # clause type keys of its notable clauses
    latest: bool = True  # a final/executed version written with latest=True becomes the latest final


D = dt.date
# key: (doc type, matter, versions). Boundaries: date_from 2024-03-01 and date_to 2024-06-30 are each some
# version's date, 2024-02-29 and 2024-07-01 lie just outside; documents have versions on both sides of filters.
DOCUMENTS: dict[str, tuple[str | None, str | None, tuple[VersionSpec, ...]]] = {
    "kauf": (
        "kauf",
        "m1",
        (
            VersionSpec("final", "de", D(2023, 1, 10), ("haftung",), latest=False),
            VersionSpec("final", "de", D(2024, 3, 1)),
        ),
    ),
    "miete": (
        "miete",
        "m1",
        (
            VersionSpec("draft", "de", D(2024, 6, 30), ("kuendigung",)),  # a draft: its clause is not indexed
            VersionSpec("executed", "en", D(2024, 7, 1), ("kuendigung",)),
        ),
    ),
    "gewerbe": ("gewerbemiete", "m2", (VersionSpec("final", "en", D(2024, 2, 29), ("haftungsgrenze",)),)),
    "rahmen": ("vertrag", None, (VersionSpec("unknown", "fr", None),)),
    "klage": ("schriftsatz", "m2", (VersionSpec("final", "de", D(2024, 4, 15), ("haftung", "kuendigung")),)),
    "notiz": (
        None,
        None,
        (  # drafts only: no latest final version, so no profile row
            VersionSpec("draft", "en", D(2024, 5, 5)),
            VersionSpec("draft", "de", D(2024, 5, 6)),
        ),
    ),
    "altkauf": ("kauf", "m2", (VersionSpec("executed", "de", D(2022, 12, 31), ("haftungsgrenze",)),)),
    "laden": ("miete", None, (VersionSpec("final", "fr", D(2024, 6, 30)),)),
    "vermerk": (None, "m1", (VersionSpec("unknown", "de", D(2024, 3, 1)),)),
    "replik": (
        "schriftsatz",
        "m1",
        (
            VersionSpec("final", "de", D(2025, 1, 1), ("haftung",)),
            VersionSpec("draft", "en", D(2025, 2, 1), ("haftung",)),
        ),
    ),
}


@dataclass(frozen=True)
class Row:
    kind: str
    clause_type: int | None


@dataclass(frozen=True)
class Version:
    id: int
    document_id: int
    spec: VersionSpec
    latest_final: bool
    matter_id: int | None
    doc_type_ancestors: frozenset[int]  # the type and its ancestors (empty: no type)
    clause_types: tuple[int, ...]

    def rows(self) -> list[Row]:
        rows = [Row("chunk", None)]
        if self.latest_final:
            rows.append(Row("profile", None))
        if self.spec.status in CLAUSE_STATUSES:
            rows += [Row("clause", c) for c in self.clause_types]
        return rows


@dataclass
class Scene:
    tag: str
    word: str
    project: int
    source: int
    doc_types: dict[str, int]
    clause_types: dict[str, int]
    matters: dict[str, int]
    docs: dict[str, int]
    versions: list[Version] = field(default_factory=list)

    def token(self, settings: Settings) -> str:
        return mint_token(settings.api, f"filterer-{self.tag}")


# --- the reference ------------------------------------------------------------------------------------


def row_matches(filters: dict[str, Any], v: Version, row: Row) -> bool:
    """One index row against the request's filters, as the rows written say it should go."""
    spec, day = v.spec, v.spec.doc_date
    checks = [
        "matter_id" not in filters or v.matter_id in filters["matter_id"],
        "doc_type" not in filters or bool(v.doc_type_ancestors & set(filters["doc_type"])),
        "version_status" not in filters or spec.status in filters["version_status"],
        "language" not in filters or spec.language in filters["language"],
        "clause_type" not in filters or row.clause_type in filters["clause_type"],
        "chunk_kind" not in filters or row.kind in filters["chunk_kind"],
        "date_from" not in filters or (day is not None and day >= D.fromisoformat(filters["date_from"])),
        "date_to" not in filters or (day is not None and day <= D.fromisoformat(filters["date_to"])),
    ]  # fmt: skip
    return all(checks)


def matching_kinds(scene: Scene, filters: dict[str, Any]) -> dict[int, set[str]]:
    """Each matching version's id: the kinds of its rows that match."""
    out: dict[int, set[str]] = {}
    for v in scene.versions:
        kinds = {r.kind for r in v.rows() if row_matches(filters, v, r)}
        if kinds:
            out[v.id] = kinds
    return out


def newest_first(scene: Scene, version_ids: set[int]) -> list[int]:
    """`/v1/search/filter`'s order: doc_date descending, undated last, ties by the version id as a string."""
    by_id = {v.id: v for v in scene.versions}

    def key(vid: int) -> tuple[bool, int, str]:
        day = by_id[vid].spec.doc_date
        return day is None, -(day.toordinal() if day else 0), str(vid)

    return sorted(version_ids, key=key)


# --- the cases: each filter alone (hits, non-hits, boundaries) and some combinations -------------------

Case = Callable[[Scene], dict[str, Any]]
CASES: dict[str, Case] = {
    "none": lambda s: {},
    "matter_id": lambda s: {"matter_id": [s.matters["m1"]]},
    "matter_id-two": lambda s: {"matter_id": [s.matters["m1"], s.matters["m2"]]},
    "doc_type-root-subtree": lambda s: {"doc_type": [s.doc_types["vertrag"]]},
    "doc_type-inner-subtree": lambda s: {"doc_type": [s.doc_types["miete"]]},
    "doc_type-leaf": lambda s: {"doc_type": [s.doc_types["gewerbemiete"]]},
    "doc_type-two": lambda s: {"doc_type": [s.doc_types["kauf"], s.doc_types["schriftsatz"]]},
    "version_status-draft": lambda s: {"version_status": ["draft"]},
    "version_status-final-executed": lambda s: {"version_status": ["final", "executed"]},
    "version_status-unknown": lambda s: {"version_status": ["unknown"]},
    "language-en": lambda s: {"language": ["en"]},
    "language-en-fr": lambda s: {"language": ["en", "fr"]},
    "date_from": lambda s: {"date_from": "2024-03-01"},
    "date_to": lambda s: {"date_to": "2024-06-30"},
    "date-range": lambda s: {"date_from": "2024-03-01", "date_to": "2024-06-30"},
    "date-one-day": lambda s: {"date_from": "2024-06-30", "date_to": "2024-06-30"},
    "clause_type": lambda s: {"clause_type": [s.clause_types["haftung"]]},  # not its child haftungsgrenze
    "clause_type-child": lambda s: {"clause_type": [s.clause_types["haftungsgrenze"]]},
    "clause_type-draft-only": lambda s: {"clause_type": [s.clause_types["kuendigung"]], "date_to": "2024-06-30"},
    "chunk_kind-clause": lambda s: {"chunk_kind": ["clause"]},
    "chunk_kind-profile": lambda s: {"chunk_kind": ["profile"]},
    "chunk_kind-chunk": lambda s: {"chunk_kind": ["chunk"]},
    "chunk_kind-profile-clause": lambda s: {"chunk_kind": ["profile", "clause"]},
    "doc_type+version_status": lambda s: {"doc_type": [s.doc_types["vertrag"]], "version_status": ["final"]},
    "matter_id+date-range": lambda s: {"matter_id": [s.matters["m1"]], "date_from": "2024-03-01",
                                       "date_to": "2024-06-30"},  # fmt: skip
    "language+doc_type": lambda s: {"language": ["en"], "doc_type": [s.doc_types["miete"]]},
    "clause_type+chunk_kind-chunk": lambda s: {"clause_type": [s.clause_types["haftung"]], "chunk_kind": ["chunk"]},
    "chunk_kind-profile+draft": lambda s: {"chunk_kind": ["profile"], "version_status": ["draft"]},
    "chunk_kind-clause+language": lambda s: {"chunk_kind": ["clause"], "language": ["de"]},
    "every-filter": lambda s: {
        "project_id": [s.project], "matter_id": [s.matters["m2"]], "doc_type": [s.doc_types["vertrag"]],
        "version_status": ["final"], "language": ["en"], "date_from": "2024-01-01", "date_to": "2024-12-31",
        "clause_type": [s.clause_types["haftungsgrenze"]], "chunk_kind": ["clause"],
    },
}  # fmt: skip

# The reference alone is checked too (`test_the_world_gives_every_case_hits_and_non_hits`): each case leaves
# some versions out and keeps some, but the empty combinations and those keeping every version (every version
# has a body chunk: `chunk_kind: chunk` shows in which row each hit is, never in which versions).
EMPTY_CASES = {"clause_type+chunk_kind-chunk", "chunk_kind-profile+draft"}
EVERY_VERSION_CASES = {"none", "chunk_kind-chunk"}


# --- the world ------------------------------------------------------------------------------------------


def _node(conn: Connection, kind: str, key: str, parent: int | None) -> int:
    return int(
        conn.execute(
            text("INSERT INTO ontology_nodes (kind, key, label, parent_id) VALUES (:k, :key, :l, :p) RETURNING id"),
            {"k": kind, "key": key, "l": key.split("-")[0].capitalize(), "p": parent},
        ).scalar_one()
    )


def _ancestors(key: str | None, ids: dict[str, int]) -> frozenset[int]:
    out: set[int] = set()
    while key is not None:
        out.add(ids[key])
        key = DOC_TYPES[key]
    return frozenset(out)


@pytest.fixture(scope="module")
def stack(settings: Settings) -> Iterator[Server]:
    with synced_api(settings, "ki-filters-test", "filters-api", KI_RETRIEVAL__SEMANTIC_FLOOR_ENABLED="false") as (
        server, _worker, _isolation,
    ):  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def scene(engine: Engine, stack: Server, settings: Settings) -> Iterator[Scene]:
    with engine.begin() as conn:
        w = World(conn)
        word = f"filterwort{w.tag}"
        project = w.project("Filter")
        source = w.source("local_fs")
        obj = w.source_object(source)
        doc_types: dict[str, int] = {}
        for key, parent in DOC_TYPES.items():  # parents come first
            doc_types[key] = _node(conn, "doc_type", f"{key}-{w.tag}", doc_types[parent] if parent else None)
        clause_types: dict[str, int] = {}
        for key, parent in CLAUSE_TYPES.items():
            clause_types[key] = _node(conn, "clause_type", f"{key}-{w.tag}", clause_types[parent] if parent else None)
        matters = {
            m: int(
                conn.execute(
                    text("INSERT INTO matters (project_id, title) VALUES (:p, :t) RETURNING id"),
                    {"p": project, "t": f"Mandat {m} {w.tag}"},
                ).scalar_one()
            )  # fmt: skip
            for m in ("m1", "m2")
        }
        s = Scene(w.tag, word, project, source, doc_types, clause_types, matters, {})
        for key, (doc_type, matter, specs) in DOCUMENTS.items():
            document_id = w.document(project, f"Akte {key} {w.tag}")
            conn.execute(
                text("UPDATE documents SET doc_type_id = :t, matter_id = :m WHERE id = :d"),
                {"t": doc_types[doc_type] if doc_type else None, "m": matters[matter] if matter else None,
                 "d": document_id},
            )  # fmt: skip
            s.docs[key] = document_id
            written: list[tuple[int, VersionSpec]] = []
            for n, spec in enumerate(specs, start=1):
                clauses = [
                    {"clause_type_id": clause_types[c], "locus": f"§ {i + 1}",
                     "text": f"{word} Klausel {c} der Akte {key}, Fassung {n}."}
                    for i, c in enumerate(spec.clauses)
                ]  # fmt: skip
                body = f"{word} Akte {key}, Fassung {n}: Die Parteien vereinbaren das Folgende."
                vid = w.version(document_id, body, version_no=n, status=spec.status, clauses=clauses,
                                latest=spec.latest, doc_date=spec.doc_date)  # fmt: skip
                conn.execute(text("UPDATE document_versions SET language = :l WHERE id = :v"),
                             {"l": spec.language, "v": vid})  # fmt: skip
                w.observe(vid, obj)
                written.append((vid, spec))
            finals = [vid for vid, spec in written if spec.latest and spec.status in CLAUSE_STATUSES]
            latest_final = finals[-1] if finals else None
            for vid, spec in written:
                s.versions.append(Version(
                    vid, document_id, spec, vid == latest_final, matters[matter] if matter else None,
                    _ancestors(doc_type, doc_types), tuple(clause_types[c] for c in spec.clauses),
                ))  # fmt: skip
        w.grant("project", project, f"user:filterer-{w.tag}")
    try:
        wait_until_indexed(stack, settings, [s.project], set(s.docs.values()), "the filter world in the index")
        yield s
    finally:
        remove_world(engine, [s.project], [s.source])
        with engine.begin() as conn:  # children before their parents
            for nodes in (s.doc_types, s.clause_types):
                for node in reversed(list(nodes.values())):
                    conn.execute(text("DELETE FROM ontology_nodes WHERE id = :i"), {"i": node})


# --- the tests ------------------------------------------------------------------------------------------


def test_the_world_gives_every_case_hits_and_non_hits(stack: Server, scene: Scene) -> None:
    """The reference itself: a case that kept every version or none (but the two meant to be empty) would
    prove nothing about its filter."""
    everything = {v.id for v in scene.versions}
    for name, case in CASES.items():
        kept = set(matching_kinds(scene, case(scene)))
        if name in EVERY_VERSION_CASES:
            assert kept == everything, name
        elif name in EMPTY_CASES:
            assert kept == set(), name
        else:
            assert kept and kept != everything, name


def test_the_index_holds_exactly_the_rows_the_reference_models(stack: Server, scene: Scene, search: OpenSearch) -> None:
    """Body chunk, profile only on the latest final version, clauses only on final and executed ones: the
    reference's rows are the index's, kind and clause type."""
    index = load_settings(environ={**os.environ, **stack.process.env}).retrieval.index_name
    query = {"terms": {"document_id": [str(d) for d in scene.docs.values()]}}
    body = {"size": 1000, "query": query, "_source": ["document_version_id", "chunk_kind", "clause_type"]}
    found = search.search(index=index, body=body)["hits"]["hits"]
    indexed = sorted(
        (int(h["_source"]["document_version_id"]), h["_source"]["chunk_kind"], h["_source"].get("clause_type"))
        for h in found
    )
    modelled = sorted(
        (v.id, r.kind, None if r.clause_type is None else str(r.clause_type)) for v in scene.versions for r in v.rows()
    )
    assert indexed == modelled and len(indexed) == 28


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_ranked_search_finds_exactly_the_matching_documents(
    stack: Server, scene: Scene, settings: Settings, case: str, mode: str
) -> None:
    filters = CASES[case](scene)
    body = {"query": scene.word, "mode": mode, "limit": LIMIT, "filters": filters}
    status, answer = stack.call("/v1/search", body, scene.token(settings))
    assert status == 200, answer
    assert answer["mode"]["used"] == mode
    expected = matching_kinds(scene, filters)
    expected_docs = {v.document_id for v in scene.versions if v.id in expected}
    hits = answer["hits"]
    found = [h["document_id"] for h in hits]
    assert len(found) == len(set(found)), f"not collapsed: {found}"
    extra, missing = sorted(set(found) - expected_docs), sorted(expected_docs - set(found))
    assert not extra and not missing, f"{case} {mode}: found too many {extra}, missed {missing}"
    for h in hits:  # the hit itself is a row the filters admit, of a version they admit
        assert h["version_id"] in expected, (case, mode, h["chunk_id"])
        assert h["chunk_kind"] in expected[h["version_id"]], (case, mode, h["chunk_id"])
    assert answer["has_more"] is False
    if not expected_docs:
        assert answer["reason"] == "filtered_out"


@pytest.mark.parametrize("case", list(CASES))
def test_filter_search_lists_exactly_the_matching_versions_newest_first(
    stack: Server, scene: Scene, settings: Settings, case: str
) -> None:
    filters = CASES[case](scene)
    status, answer = stack.call("/v1/search/filter", {"limit": LIMIT, "filters": filters}, scene.token(settings))
    assert status == 200, answer
    expected = matching_kinds(scene, filters)
    listed = [h["version_id"] for h in answer["hits"]]
    assert listed == newest_first(scene, set(expected)), case
    dates = [h["doc_date"] for h in answer["hits"] if h["doc_date"] is not None]
    assert dates == sorted(dates, reverse=True)
    for h in answer["hits"]:
        assert h["score"] == 0.0
        assert h["chunk_kind"] in expected[h["version_id"]], (case, h["chunk_id"])
    assert answer["has_more"] is False


def test_filter_search_embeds_nothing(stack: Server, scene: Scene, settings: Settings) -> None:
    """No query vector (the embedding cache is asked for every one: neither a hit nor a miss) and no ranked
    `_msearch`; a ranked semantic search in the same place moves both, so the counters do see embedding."""
    counters = ("ki_search_embed_cache_total", "ki_search_msearch_duration_seconds_count")
    before = {c: stack.metric(c) for c in counters}
    for case in CASES.values():
        body = {"limit": LIMIT, "filters": case(scene)}
        assert stack.call("/v1/search/filter", body, scene.token(settings))[0] == 200
    assert {c: stack.metric(c) for c in counters} == before
    query = {"query": f"{scene.word} eingebettet", "mode": "semantic", "limit": 5}
    assert stack.call("/v1/search", query, scene.token(settings))[0] == 200
    assert all(stack.metric(c) == before[c] + 1 for c in counters)

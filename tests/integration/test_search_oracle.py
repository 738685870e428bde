"""The oracle property test: what a caller's search answers equals what the documented ranking gives over
the rows the caller may see -- so no row the caller may not see has any effect on it.

Worlds: random ACL worlds (`tests/integration/acl_worlds.py`: per-version access through projects,
documents, source objects with known or unknown ACLs, denies, nested groups, aliases; derandomised) and one
larger world whose reader sees more rows than a leg's depth. Every version gets a status (draft, final,
executed, unknown), a language, maybe a date, and a few words: of a small legal vocabulary, off-topic ones
(which the semantic floor keeps out of legal queries), or its predecessor's very words and status (equal
scores, so collapse's tie goes to the caller's latest final version); some documents carry identifiers and
an upstream latest-final pointer (which also gives that version a profile row). They are written to
PostgreSQL and reach the index through the real CDC path (an isolated sync worker), and one API process per
fusion method (`rrf`, `minmax`, `dbsf`) answers over that one index: config.json's (min-max) is asked every
case below, the other two the hybrid first page and one variant of each.

For each world's callers (an administrator among them), queries, modes (lexical, hybrid, semantic), offsets,
metadata filters (status, language, date range, project) and points in time (`as_of`):

* the oracle (`tests/integration/oracle_ranking.py`, nothing imported from `search/`) runs its own leg queries
  as an administrator over the world's projects, every row deep, keeps the rows of the versions the
  reference evaluator (`tests/acl_reference.py`) says the caller may see that pass the filters and `as_of`,
  each leg's first `leg_depth(offset + limit)`, and applies the documented ranking: the semantic floor,
  fusion, the version-status boost, the re-verify (`as_of`: the version in force), one hit per document, the
  page;
* `POST /v1/search` as the caller must answer the same, field by field: the page's documents, versions,
  chunks, version numbers and statuses, scores and each leg's part of them (within a float tolerance),
  per-leg ranks, weights, boosts, matched identifiers, `has_more`, `reason`, `mode` and the floor's
  `{similarity, dropped}`.

The same index answers both (merged to one segment once synced), so term statistics are the same -- except
that other tests sharing the stack write rows this index's worker also projects: an answer that differs is
compared once more after the oracle has read its legs again. Each world stays small enough for every kNN
search to be exact.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jwt
import pytest
from opensearchpy import NotFoundError, OpenSearch
from sqlalchemy import Connection, Engine, text

from ki.clients import make_sync_client
from ki.embedding import create_embedder
from ki.principals import canonical_principal
from ki.settings import ApiSettings, Settings, load_settings
from tests import acl_reference as ref
from tests.conftest import wait_for
from tests.integration import oracle_ranking as oracle
from tests.integration.acl_worlds import TAG, Written, cases, draw, write
from tests.integration.search_harness import (
    Child,
    Server,
    SyncWorker,
    isolated,
    remove_world,
    wait_until_vectored,
)

pytestmark = pytest.mark.stack

WORLDS = 5
SEED = 2028
LIMIT = 4
VOCABULARY = ("Kaution", "Miete", "Kündigung", "Frist", "Haftung", "Schaden", "Zahlung", "Verzug", "Anlage")
OFF_TOPIC = ("Tomaten", "Basilikum", "Nudeln", "Olivenöl", "Knoblauch", "Ofen", "Teig", "Zwiebeln")
IDENTIFIERS = (("7 O 12/24",), ("AZ 2024-17",), ("7 O 99/23", "B-17"))
QUERIES = (
    "Kaution",
    "Frist Haftung",
    "Zahlung im Verzug",
    "Kündigung der Miete",
    "Haftung 7 O 12/24",  # an identifier: the identifier leg
    "Rezept mit Tomaten und Basilikum",  # off-topic: the floor keeps the legal rows out
    "Wie wird das Wetter morgen?",  # nothing: no_credible_evidence
)
STATUSES = ("final", "final", "executed", "draft", "unknown")
LANGUAGES = ("de", "de", "en")
DATES = (None, dt.date(2021, 3, 1), dt.date(2022, 6, 15), dt.date(2023, 1, 10), dt.date(2024, 9, 30))
MODES = ("lexical", "hybrid", "semantic")
METHODS = ("rrf", "minmax", "dbsf")  # `retrieval.fusion_method`: one API each
ADMIN = ("role:admin",)  # with `claims_carry_kinds` a token's subject may name it
API_ENV = {"KI_API__JWT__CLAIMS_CARRY_KINDS": "true", "KI_RETRIEVAL__NAME_LOOKUP_ENABLED": "false"}
BULK_DOCUMENTS = 28  # the larger world: its reader sees more rows than a leg's depth at small windows

# Request variants besides the plain first page (a case asks the plain one and a few of these, drawn).
VARIANTS: tuple[dict[str, Any], ...] = (
    {"offset": LIMIT},
    {"offset": 2},
    {"filters": {"version_status": ["final", "executed"]}},
    {"filters": {"version_status": ["draft", "unknown"]}},
    {"filters": {"language": ["en"]}},
    {"filters": {"date_from": "2022-01-01", "date_to": "2023-12-31"}},
    {"filters": {"project_id": "first"}, "offset": 1},
    {"as_of": dt.date(2023, 6, 30)},
    {"as_of": dt.date(2022, 12, 31), "filters": {"language": ["de"]}},
)
# The larger world also pages deeper: the window decides each leg's depth (50 up to a window of 10, 60 at 12,
# 90 at 18).
BULK_VARIANTS: tuple[dict[str, Any], ...] = ({"offset": 8}, {"offset": 12, "limit": 6})


@dataclass(frozen=True)
class Flavour:
    """What a version is written with besides its access."""

    text: str
    status: str
    language: str
    doc_date: dt.date | None


@dataclass
class Oracle:
    name: str
    world: ref.World
    written: Written
    flavours: dict[int, Flavour]  # by the world's version id
    pointers: dict[int, int | None]  # database document id -> upstream latest-final version
    callers: list[tuple[str, ...]]  # each caller's raw principals (well-formed: a token carries them)
    legs: dict[str, dict[str, list[oracle.Row]]] = field(default_factory=dict)  # query -> the admin's legs

    @property
    def projects(self) -> list[int]:
        return sorted(self.written.projects.values())

    def versions(self) -> dict[int, oracle.Version]:
        documents = {d.id: d for d in self.world.documents}
        numbers: Counter[int] = Counter()
        out = {}
        for v in self.world.versions:  # `write` numbers a document's versions in this order
            numbers[v.document_id] += 1
            f = self.flavours[v.id]
            out[self.written.versions[v.id]] = oracle.Version(
                self.written.versions[v.id],
                self.written.documents[v.document_id],
                self.written.projects[documents[v.document_id].project_id],
                numbers[v.document_id],
                f.status,
                f.doc_date,
            )
        return out

    def view(self, caller: Sequence[str], settings: Settings) -> oracle.View:
        resolved = ref.resolve(self.world, caller, settings.security)
        seen = frozenset(self.written.versions[v] for v in ref.visible(self.world, resolved, settings.security))
        return oracle.View(seen, self.versions(), self.pointers)

    def indexable(self) -> set[int]:
        """Database ids of the versions whose rows the index holds and an administrator may find (a document
        neither deleted nor expired, an active observation)."""
        deleted = {d.id for d in self.world.documents if d.deleted or d.expired}
        observed = {o.version_id for o in self.world.observations if not o.deleted}
        return {
            self.written.versions[v.id]
            for v in self.world.versions
            if v.document_id not in deleted and v.id in observed
        }


def _flavours(world: ref.World, seed: int) -> dict[int, Flavour]:
    out: dict[int, Flavour] = {}
    previous: dict[int, Flavour] = {}
    for v in world.versions:
        rng = random.Random(seed * 1000 + v.id)
        language, date = rng.choice(LANGUAGES), rng.choice(DATES)
        before = previous.get(v.document_id)
        if before is not None and rng.random() < 0.35:  # its predecessor's words and status: equal scores
            flavour = Flavour(before.text, before.status, language, date)
        else:
            off_topic = rng.random() < 0.2
            words = OFF_TOPIC if off_topic else VOCABULARY
            head = "Rezept: " if off_topic else "Vermerk: "
            body = head + " ".join(rng.choice(words) for _ in range(rng.randint(2, 7))) + "."
            flavour = Flavour(body, rng.choice(STATUSES), language, date)
        out[v.id] = previous[v.document_id] = flavour
    return out


def _text_of(flavours: dict[int, Flavour]) -> Callable[[ref.Version], str]:
    return lambda version: flavours[version.id].text


def _enrich(
    conn: Connection, world: ref.World, written: Written, flavours: dict[int, Flavour], seed: int
) -> dict[int, int | None]:
    """Statuses, languages and dates of the versions; identifiers and latest-final pointers of the
    documents (in the transaction that wrote them). Answers the pointers."""
    rng = random.Random(seed)
    conn.execute(
        text("UPDATE document_versions SET status = :s, language = :l, doc_date = :d WHERE id = :id"),
        [{"id": written.versions[v], "s": f.status, "l": f.language, "d": f.doc_date} for v, f in flavours.items()],
    )
    pointers: dict[int, int | None] = {}
    for d in world.documents:
        mine = [v.id for v in world.versions if v.document_id == d.id]
        finals = [v for v in mine if flavours[v].status in ("final", "executed")]
        pointer = written.versions[rng.choice(finals)] if finals and rng.random() < 0.5 else None
        named = rng.choice(IDENTIFIERS) if rng.random() < 0.4 else ()
        pointers[written.documents[d.id]] = pointer
        conn.execute(
            text("UPDATE documents SET latest_final_version_id = :p, identifiers = :i WHERE id = :id"),
            {"id": written.documents[d.id], "p": pointer, "i": list(named)},
        )
    return pointers


def _bulk_world() -> tuple[ref.World, str]:
    """One reader allowed on two projects, denied one document; every version observed at one local object."""
    reader = f"acl{TAG}b:reader"
    rng = random.Random(SEED)
    documents = tuple(ref.Document(i, 1 + i % 2) for i in range(1, BULK_DOCUMENTS + 1))
    versions: list[ref.Version] = []
    for d in documents:
        for _ in range(rng.randint(1, 3)):
            versions.append(ref.Version(len(versions) + 1, d.id))
    world = ref.World(
        projects=(1, 2),
        documents=documents,
        versions=tuple(versions),
        sources=(ref.Source(1, "local_fs"),),
        objects=(ref.SourceObject(1, 1),),
        observations=tuple(ref.Observation(v.id, 1) for v in versions),
        grants=(
            ref.Grant("project", 1, reader),
            ref.Grant("project", 2, reader),
            ref.Grant("document", 3, reader, "deny"),
        ),
    )
    return world, reader


@dataclass
class Api:
    method: str
    server: Server
    ranking: oracle.Ranking


@dataclass
class Stack:
    built: list[Oracle]
    apis: dict[str, Api]
    settings: Settings  # the isolated index's
    vectors: dict[str, list[float]]
    shipped: str  # config.json's fusion method


Case = tuple[Oracle, tuple[str, ...], oracle.Ask]  # a world, a caller, a request


def _ranking(settings: Settings, signature: str) -> oracle.Ranking:
    r = settings.retrieval
    # What the reference does not model must be off.
    assert not (r.decay_enabled or r.rerank_enabled or r.graph_rag_enabled or r.synonyms_enabled)
    assert r.authoritative_doc_type is None and r.evidence_budget_chars is None and not r.name_lookup_enabled
    assert r.collapse_per_document
    return oracle.Ranking(
        weights={"lexical": r.weight_lexical, "semantic": r.weight_semantic, "identifier": r.weight_identifier},
        rrf_k=r.fusion_rrf_k,
        method=r.fusion_method,
        boosts=dict(r.version_status_boost),
        floor=r.semantic_floor.get(signature) if r.semantic_floor_enabled else None,
        space_type=r.vector_space_type,
        promoted_bonus=r.promoted_bonus,
    )


@pytest.fixture(scope="module")
def stack(engine: Engine, settings: Settings) -> Iterator[Stack]:
    with isolated(settings, prefix="ki-oracle") as env:
        worker = SyncWorker(env)
        lanes = worker.lane_env
        servers = {
            m: Server(f"oracle-api-{m}", **env, **lanes, **API_ENV, KI_RETRIEVAL__FUSION_METHOD=m) for m in METHODS
        }
        for server in servers.values():  # they start while the worker starts and the worlds are written
            server.process.start()
        built: list[Oracle] = []
        try:
            worker.start()
            with engine.begin() as conn:
                built = _write_worlds(conn)
            for server in servers.values():
                why = server.process.wait_ready(partial(Child._up, f"{server.base}/healthz"), 120)
                assert why is None, f"{server.name}: {why}; see {server.log_path}"
            iso = load_settings(environ={**os.environ, **env, **API_ENV})
            _wait_until_synced(iso, built)
            embedder = create_embedder(iso)
            vectors = {q: [float(x) for x in embedder.embed_queries([q])[0]] for q in QUERIES}
            apis = {
                m: Api(m, s, _ranking(load_settings(environ={**os.environ, **s.process.env}), embedder.signature))
                for m, s in servers.items()
            }
            shipped = iso.retrieval.fusion_method
            assert apis[shipped].ranking == _ranking(iso, embedder.signature), "only the fusion method differs"
            yield Stack(built, apis, iso, vectors, shipped)
        finally:
            with ThreadPoolExecutor(len(servers) + 1) as pool:  # each waits for its process to exit
                list(pool.map(lambda child: child.stop(), [*servers.values(), worker]))
            _remove(engine, built)


def _write_worlds(conn: Connection) -> list[Oracle]:
    drawn = [
        draw(
            cases("sufficient", max_documents=5, max_objects=4, min_grants=3, max_grants=10, tag=f"{TAG}o{w}"),
            1,
            SEED + w,
        )[0]  # fmt: skip
        for w in range(WORLDS)
    ]
    built: list[Oracle] = []
    worlds: list[tuple[str, ref.World, list[tuple[str, ...]]]] = []
    for w, case in enumerate(drawn):
        held = {
            tuple(p for p in principals if isinstance(p, str) and canonical_principal(p) is not None)
            for principals in [case.caller, *((g.principal,) for g in case.world.grants[:3])]
        }
        extra: list[tuple[str, ...]] = [ADMIN] if w == 0 else []
        world = case.world
        worlds.append((f"acl-{w}", world, sorted(c for c in held if c) + extra))
    bulk, reader = _bulk_world()
    worlds.append(("bulk", bulk, [(reader,), ADMIN]))
    for n, (name, world, callers) in enumerate(worlds):
        flavours = _flavours(world, SEED + n)
        written = write(conn, world, _text_of(flavours))
        pointers = _enrich(conn, world, written, flavours, SEED + n)
        built.append(Oracle(name, world, written, flavours, pointers, callers))
    return built


def _remove(engine: Engine, built: list[Oracle]) -> None:
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


def _wait_until_synced(iso: Settings, built: list[Oracle]) -> None:
    """Until every version an administrator finds has its rows with the status, language and date written
    (and the pointer's version its profile row), then every row its vector; then one segment."""
    index = iso.retrieval.index_name
    projects = [str(p) for o in built for p in o.projects]
    expected: set[tuple[int, str, str, str, str | None]] = set()
    for o in built:
        versions = {o.written.versions[v.id]: o.flavours[v.id] for v in o.world.versions}
        for v in o.indexable():
            f = versions[v]
            date = f.doc_date.isoformat() if f.doc_date else None
            kinds = ["chunk"] + (["profile"] if v in o.pointers.values() else [])
            expected |= {(v, kind, f.status, f.language, date) for kind in kinds}
    client = make_sync_client(iso, timeout_s=30)
    body = {"size": 2000, "_source": ["document_version_id", "chunk_kind", "version_status", "language", "doc_date"],
            "query": {"terms": {"project_id": projects}}}  # fmt: skip

    def present() -> set[tuple[int, str, str, str, str | None]]:
        try:
            client.indices.refresh(index=index)
            found = client.search(index=index, body=body)["hits"]["hits"]
        except NotFoundError:  # the worker creates the index with its first write
            return set()
        rows = [h["_source"] for h in found]
        return {
            (int(r["document_version_id"]), r["chunk_kind"], r["version_status"], r["language"], r["doc_date"])
            for r in rows
        }

    try:
        wait_for(lambda: present() >= expected, timeout=180, interval=0.5,
                 what=lambda: f"the oracle worlds' rows; missing {sorted(expected - present())[:5]}")  # fmt: skip
    finally:
        client.close()
    wait_until_vectored(iso, index, {"terms": {"project_id": projects}}, "the oracle worlds")


# ---------------------------------------------------------------------------------------------------
# Asking
# ---------------------------------------------------------------------------------------------------


def _token(api: ApiSettings, caller: Sequence[str]) -> str:
    """An HMAC token whose subject and groups are the caller's principals (`claims_carry_kinds`)."""
    now = int(time.time())
    claims: dict[str, Any] = {api.jwt.subject_claim: caller[0], "iss": api.jwt.issuer, "aud": api.jwt.audience,
                              "iat": now, "exp": now + 3600}  # fmt: skip
    if caller[1:]:
        claims[api.jwt.groups_claim] = list(caller[1:])
    return jwt.encode(claims, api.jwt.secret, algorithm=api.jwt.algorithm)


def _ask(o: Oracle, caller: Sequence[str], query: str, mode: str, variant: dict[str, Any]) -> oracle.Ask:
    filters = dict(variant.get("filters", {}))
    if filters.get("project_id") == "first":
        filters["project_id"] = o.projects[:1]
    if caller == ADMIN:  # an administrator sees every world: keep to this one
        filters["project_id"] = sorted(set(filters.get("project_id", o.projects)) & set(o.projects))
    return oracle.Ask(query, mode, variant.get("limit", LIMIT), variant.get("offset", 0), filters, variant.get("as_of"))


def _answered(api: Api, token: str, ask: oracle.Ask) -> dict[str, Any]:
    status, body = api.server.call("/v1/search", ask.body(), token)
    assert status == 200, (ask, body)
    hits = []
    for h in body["hits"]:
        e = h["explain"]
        hits.append(
            {
                "document_id": h["document_id"],
                "version_id": h["version_id"],
                "chunk_id": h["chunk_id"],
                "version_no": h["version_no"],
                "version_status": h["version_status"],
                "matched_identifiers": h["matched_identifiers"],
                "match_reason": h["match_reason"],
                "ranks": e["ranks"],
                "weights": e["weights"],
                "fusion": e["fusion"],
                "status_boost": e["status_boost"],
                "promoted_bonus": e["promoted_bonus"],
                "decay": e["decay"],
                "rerank_score": e["rerank_score"],
                "score": h["score"],
                "fused_score": e["fused_score"],
                "rrf_parts": e["rrf_parts"],
            }
        )
    return {
        "hits": hits,
        "offset": body["offset"],
        "has_more": body["has_more"],
        "reason": body.get("reason"),
        "mode": body["mode"]["used"],
        "semantic_floor": body.get("semantic_floor"),
    }


def _promised(ask: oracle.Ask, want: oracle.Expected) -> dict[str, Any]:
    hits = [{**h, "match_reason": "ranked", "decay": 1.0, "rerank_score": None, "fused_score": h["score"]}
            for h in want.hits]  # fmt: skip
    return {"hits": hits, "offset": ask.offset, "has_more": want.has_more, "reason": want.reason, "mode": want.mode,
            "semantic_floor": want.floor}  # fmt: skip


FLOATS = ("score", "fused_score", "rrf_parts")


def _differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Field by field; scores and their parts within a float tolerance (the oracle sums the same terms, but
    need not in the same order)."""

    def close(a: Any, b: Any) -> bool:
        if isinstance(a, dict) or isinstance(b, dict):
            same_keys = isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
            return same_keys and all(close(a[k], b[k]) for k in a)
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        return numbers and abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)

    out = [f"{k}: want {want[k]!r}, got {got[k]!r}" for k in want if k != "hits" and want[k] != got[k]]
    if len(want["hits"]) != len(got["hits"]):
        out.append(f"{len(want['hits'])} hits wanted, {len(got['hits'])} answered")
    for i, (w, g) in enumerate(zip(want["hits"], got["hits"], strict=False)):
        for k in w:
            same = close(w[k], g[k]) if k in FLOATS else w[k] == g[k]
            if not same:
                out.append(f"hit {i} {k}: want {w[k]!r}, got {g[k]!r}")
    return out


@dataclass
class Tally:
    """What the compared cases exercised."""

    compared: int = 0
    nonempty: int = 0
    told_apart: int = 0  # answers a per-document leg filter would change
    floor_dropped: int = 0  # answers whose semantic leg lost rows to the floor
    depth_cut: int = 0  # answers where a leg had more of the caller's rows than its depth
    tie_to_latest: int = 0  # answers where collapse's tie went to the latest final version
    identifier: int = 0  # answers with a hit the identifier leg found
    has_more: int = 0
    reread: int = 0  # answers compared again after reading the legs again
    statuses: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str | None] = field(default_factory=Counter)
    variants: Counter[str] = field(default_factory=Counter)  # nonempty answers per kind of request
    modes: Counter[str] = field(default_factory=Counter)  # nonempty answers per mode


def _kind(ask: oracle.Ask) -> str:
    parts = [k for k in ("version_status", "language", "date_from") if k in ask.filters]
    parts += ["offset"] * bool(ask.offset) + ["as_of"] * (ask.as_of is not None)
    return "+".join(parts) or "plain"


def _admin_legs(stack: Stack, client: OpenSearch, o: Oracle, query: str) -> dict[str, list[oracle.Row]]:
    bodies = oracle.admin_bodies(query, stack.vectors[query], o.projects)
    return oracle.admin_legs(client, stack.settings.retrieval.index_name, bodies)


def _check(stack: Stack, api: Api, plan: list[Case]) -> Tally:
    tally = Tally()
    client = make_sync_client(stack.settings, timeout_s=30)
    views: dict[tuple[str, tuple[str, ...]], oracle.View] = {}
    tokens: dict[tuple[str, ...], str] = {}
    failures: list[str] = []
    try:
        for o, caller, ask in plan:
            if ask.query not in o.legs:
                o.legs[ask.query] = _admin_legs(stack, client, o, ask.query)
            view = views.setdefault((o.name, caller), o.view(caller, stack.settings))
            token = tokens.setdefault(caller, _token(stack.settings.api, caller))
            want = oracle.expected(ask, o.legs[ask.query], view, api.ranking)
            got = _answered(api, token, ask)
            wrong = _differences(_promised(ask, want), got)
            if wrong:
                # Other tests share the stack: rows they write reach this index too (its worker reads every
                # change) and move its term statistics, so the legs read earlier may be stale. Read them
                # again and ask again; an answer that still differs is wrong.
                tally.reread += 1
                o.legs[ask.query] = _admin_legs(stack, client, o, ask.query)
                want = oracle.expected(ask, o.legs[ask.query], view, api.ranking)
                got = _answered(api, token, ask)
                wrong = _differences(_promised(ask, want), got)
            if wrong:
                failures.append(f"{api.method} {o.name} {caller} {ask.body()}:\n    " + "\n    ".join(wrong[:8]))
            tally.compared += 1
            if want.hits:
                tally.nonempty += 1
                tally.variants[_kind(ask)] += 1
                tally.modes[ask.mode] += 1
            before = oracle.expected(ask, o.legs[ask.query], view, api.ranking, per_document=True)
            tally.told_apart += before.hits != want.hits or before.has_more != want.has_more
            tally.floor_dropped += want.floor["dropped"] > 0
            tally.depth_cut += want.cut_by_depth
            tally.tie_to_latest += want.tie_to_latest
            tally.identifier += any("identifier" in h["ranks"] for h in want.hits)
            tally.has_more += want.has_more
            tally.statuses.update(want.statuses)
            tally.reasons[want.reason] += 1
    finally:
        client.close()
    assert not failures, f"{len(failures)} of {tally.compared} answers differ from the oracle:\n" + "\n".join(
        failures[:10]
    )
    return tally


def _plan(stack: Stack, modes: Sequence[str], extra: int, seed: int) -> list[Case]:
    """Each world's callers x queries x `modes`: the plain first page and `extra` variants (drawn). A caller
    who may see nothing is asked each query once (in one of the modes, with or without a variant)."""
    rng = random.Random(seed)
    plan: list[Case] = []
    for o in stack.built:
        variants = VARIANTS + (BULK_VARIANTS if o.name == "bulk" else ())
        for caller in o.callers:
            sees = bool(o.view(caller, stack.settings).visible)
            for query in QUERIES:
                if not sees:
                    plan.append((o, caller, _ask(o, caller, query, rng.choice(modes), rng.choice([{}, *variants]))))
                    continue
                for mode in modes:
                    for variant in [{}, *rng.sample(variants, extra)]:
                        plan.append((o, caller, _ask(o, caller, query, mode, variant)))
    return plan


def test_a_callers_search_is_the_documented_ranking_over_their_own_rows(stack: Stack) -> None:
    """The shipped settings (config.json: min-max fusion, the semantic floor) in every mode, with offsets,
    filters and `as_of`."""
    tally = _check(stack, stack.apis[stack.shipped], _plan(stack, MODES, 2, SEED))
    # The worlds exercise something: answers with hits, in every mode and for every kind of request, that a
    # per-document leg filter would change, that the floor, the depth and collapse's tie-break shape.
    assert tally.compared >= 500 and tally.nonempty >= tally.compared // 4, tally
    assert tally.told_apart >= 3 and tally.floor_dropped >= 20 and tally.depth_cut >= 5, tally
    assert tally.tie_to_latest >= 1 and tally.identifier >= 5 and tally.has_more >= 20, tally
    assert set(tally.statuses) == {"draft", "final", "executed", "unknown"}, tally
    assert {"scope_empty", "filtered_out", "no_credible_evidence"} <= set(tally.reasons), tally
    assert all(tally.modes[m] >= 20 for m in MODES), tally
    kinds = {"plain", "offset", "version_status", "language", "date_from", "as_of", "language+as_of"}
    assert all(tally.variants[k] >= 3 for k in kinds), tally


def test_every_fusion_method_is_the_documented_one(stack: Stack) -> None:
    """The other fusion methods over the same worlds (hybrid, every leg: the first page and one variant)."""
    others = [m for m in METHODS if m != stack.shipped]
    assert len(others) == 2, (stack.shipped, METHODS)
    for n, method in enumerate(others):
        tally = _check(stack, stack.apis[method], _plan(stack, ("hybrid",), 1, SEED + 1 + n))
        assert tally.nonempty >= tally.compared // 4 and tally.floor_dropped >= 5 and tally.depth_cut >= 1, tally

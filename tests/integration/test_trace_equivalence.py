"""Trace equivalence: the service does the same backend work whether or not hidden rows exist.

Random small worlds W (derandomised: a few seeds) are written to PostgreSQL and reach the index through the real
CDC path (an isolated sync worker). An in-process `SearchService` (scope and name caches on, fed by its real
invalidation feed; a scope filter budget so small that every scope is over it) answers a caller's requests --
ranked search (lexical, hybrid, an identifier, a word found only in hidden documents, a comparison with the previous
version), the metadata listing, documents, reading a version's text (an expired document's too), related (both
ways, one kind), traverse (a visible start and 100 more ids), decision search, lookup (the caller's identifier and
title, a title only hidden documents carry) -- while every SQL statement (text, parameter names, rows returned) and
every OpenSearch request (method, path, body; hits per response) it makes for the request is recorded. Then W' = W
plus what the caller may not see: documents of another project (the asked words, the caller's identifier, titles
the caller's queries name), 100 documents at exactly the ids W asked about as missing, a document of the caller's
own project whose expiry has passed, a hidden version of a visible document, relations from and to hidden
documents, decisions on hidden documents; and before the caller asks again, a colleague who may see the other
project runs the caller's name queries. Each request must leave the same trace and get the same answer under W' as
under W.

Which finding of the issue "Indistinguishable" each part catches on the code before it:
* hidden neighbours (related/traverse read the edges to hidden documents, then asked about them) -- the
  related and traverse traces (rows of the edge statement, one more visibility statement);
* the shared name cache -- the cold name query after the colleague's (no look-up statement: their entry);
* superset callers -- every ranked search (a superset filter's fill rounds and hits);
* scope-cache invalidation -- the first search after W' (the scope compiled in SQL again);
* hidden decisions -- the decision traces (their rows reached the service);
* batched ids (a timing difference with the same statements) -- the release on the time grid: each answer of
  documents, related, traverse and decisions leaves at a multiple of `api.limits.release_quantum_ms`.
The world lives in its own projects and index and is removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from ki.clients import make_async_engine, make_client, make_sync_client
from ki.embedding import create_embedder
from ki.settings import Settings, load_settings
from search.access.scope_cache import ScopeCache
from search.documents.chunks import ChunkId
from search.operations import scope_cache_state
from search.request import (
    parse_decision_request,
    parse_filter_request,
    parse_lookup_request,
    parse_read_request,
    parse_related_request,
    parse_search_request,
    parse_traverse_request,
)
from search.service import SearchService
from tests.conftest import wait_for
from tests.integration.search_harness import SyncWorker, isolated, remove_world, wait_until_vectored
from tests.integration.world import World

pytestmark = pytest.mark.stack

SEEDS = (3, 11)
VOCABULARY = ("Kaution", "Miete", "Kündigung", "Frist", "Haftung", "Schaden", "Zahlung", "Verzug")
# The hidden documents' words: none a traced query asks for but SECRET and the identifier, so that the index's
# term statistics (the one residual: IDF counts every row) move the caller's scores little and their order not.
HIDDEN_WORDS = ("Tomaten", "Basilikum", "Olivenöl", "Knoblauch", "Zwiebeln", "Teig")
SECRET = "Geheimklausel"
HIDDEN_IDS = 100
#: How many rounds W's traces may take to repeat (each of W's changes the feed delivers late costs one).
STABLE_ROUNDS = 10
TRACE: contextvars.ContextVar[list[tuple[Any, ...]] | None] = contextvars.ContextVar("trace", default=None)


@dataclass
class Scene:
    seed: int
    tag: str
    caller: str
    colleague: str
    mine: int
    theirs: int
    source: int
    obj: int
    documents: list[int]
    versions: list[int]
    identifier: str
    title: str
    missing_base: int
    phase_words: dict[str, str] = field(default_factory=dict)


class Tracer:
    """Records what the service does for the request being traced: statements on its engines (text,
    parameter names, rows) and OpenSearch requests (method, path, body, hits per response). Background
    refreshes run in a context of their own and are not part of any request's trace."""

    def __init__(self, service: SearchService) -> None:
        self.service = service
        for engine in {id(e): e for e in (service.engine, service.verify_engine)}.values():
            event.listen(engine.sync_engine, "before_cursor_execute", self._before)
            event.listen(engine.sync_engine, "after_cursor_execute", self._after)
        transport = service.client.transport
        perform = transport.perform_request

        async def traced(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            # Entered when the request starts, as a statement is (its hits added when it answers): appended on the
            # answer, the legs' `_msearch` fell before or after the identity preflight's statements by how fast
            # OpenSearch answered on a loaded machine, and W's traces never settled.
            trace = TRACE.get()
            at = -1
            if trace is not None:
                body = kwargs.get("body", args[1] if len(args) > 1 else None)
                trace.append(("opensearch", method, url, _body(body)))
                at = len(trace) - 1
            answer = await perform(method, url, *args, **kwargs)
            if trace is not None:
                trace[at] = (*trace[at], _hits(answer))
            return answer

        transport.perform_request = traced

    @staticmethod
    def _before(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        trace = TRACE.get()
        if trace is not None:
            names = tuple(sorted(parameters)) if isinstance(parameters, dict) else ()
            trace.append(("sql", statement, names))

    @staticmethod
    def _after(_conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        trace = TRACE.get()
        if trace is None:
            return
        # The identity preflight's statements run while the legs' request is in flight: find this one's entry.
        for i in range(len(trace) - 1, -1, -1):
            if trace[i][0] == "sql" and trace[i][1] == statement and len(trace[i]) == 3:
                trace[i] = (*trace[i], cursor.rowcount)
                return

    async def run(self, call: Callable[[], Awaitable[Any]]) -> tuple[Any, list[tuple[Any, ...]], float]:
        trace: list[tuple[Any, ...]] = []
        token = TRACE.set(trace)
        started = time.perf_counter()
        try:
            answer = await call()
        finally:
            TRACE.reset(token)
        elapsed = time.perf_counter() - started
        await self.service.settled()
        return answer, trace, elapsed


def _body(body: Any) -> Any:
    if isinstance(body, bytes):
        body = body.decode()
    if isinstance(body, str):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        return lines
    return body


def _hits(answer: Any) -> Any:
    if isinstance(answer, dict) and "responses" in answer:
        return [len(r.get("hits", {}).get("hits", [])) for r in answer["responses"]]
    if isinstance(answer, dict) and "hits" in answer:
        return len(answer["hits"].get("hits", []))
    return None


def _json(answer: Any) -> Any:
    """The answer without scores, and a ranked page's hits in id order: BM25's term statistics count hidden rows
    too (the documented residual), which can swap two nearly equal scores."""
    out = _without(json.loads(json.dumps(answer.to_json() if hasattr(answer, "to_json") else answer)), "score")
    if isinstance(out, dict) and isinstance(out.get("hits"), list) and "mode" in out:
        out["hits"] = sorted(out["hits"], key=lambda h: str(h.get("chunk_id")))
    return out


# What a hit says of the row that represents its version (which of the version's rows scored best).
ROW_FIELDS = ("chunk_id", "chunk_kind", "text", "span", "evidence", "locus", "match_reason", "matched_identifiers",
              "context", "injection")  # fmt: skip


def _version_level(value: Any) -> Any:
    """A ranked page's hits cut to their versions, and row ids to their version's: which of a version's rows
    represents it is decided by BM25 scores, whose term statistics count hidden rows too (the documented
    residual) -- with two of its rows nearly tied, another can represent it."""
    raw = json.dumps(value, default=str, sort_keys=True)
    out = json.loads(re.sub(r'"(\d+):[a-z_]+:-?\d+"', r'"\1:<row>"', raw))
    if isinstance(out, dict) and isinstance(out.get("hits"), list) and "mode" in out:
        out["hits"] = sorted(
            ({k: v for k, v in hit.items() if k not in ROW_FIELDS} for hit in out["hits"]),
            key=lambda h: (str(h.get("document_id")), str(h.get("version_id"))),
        )
    return out


def _without(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


def _first_difference(want: Any, got: Any, path: str = "") -> str:
    """Where two JSON values first differ, for the failure message."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if want.get(key) != got.get(key):
                return _first_difference(want.get(key), got.get(key), f"{path}.{key}")
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"at {path or '.'}: {json.dumps(want, default=str)[:300]} -> {json.dumps(got, default=str)[:300]}"


def _sql(trace: list[Any]) -> list[Any]:
    return [step for step in trace if step[0] == "sql"]


def _opensearch(trace: list[Any]) -> list[Any]:
    return [step for step in trace if step[0] == "opensearch"]


def _hidden_versions_named(trace: list[Any]) -> list[Any]:
    """The trace with the exact filter's list of hidden versions of visible documents taken out of the
    OpenSearch bodies: the filter names them to exclude them (a residual: a list of the caller's visible
    versions instead would not depend on them)."""
    raw = json.dumps(trace, default=str)
    return json.loads(re.sub(r', "must_not": \[\{"terms": \{"document_version_id": \[[^\]]*\]\}\}\]', "", raw))


def write_world(engine: Engine, seed: int) -> Scene:
    """W: the caller's project (documents, versions, relations, an identifier, a decision) and a colleague's
    project with one document of its own."""
    rng = random.Random(seed)
    with engine.begin() as conn:
        w = World(conn)
        mine, theirs = w.project("Mandat"), w.project("Wand")
        source = w.source("local_fs")
        obj = w.source_object(source)
        caller, colleague = f"user:trace-{w.tag}", f"user:kollege-{w.tag}"
        w.grant("project", mine, caller)
        w.grant("project", theirs, colleague)
        identifier = f"{rng.randint(1, 40)} O {rng.randint(100, 999)}/{rng.randint(19, 25)}"
        documents, versions = [], []
        for i in range(rng.randint(3, 5)):
            words = " ".join(rng.sample(VOCABULARY, 4))
            doc = w.document(mine, f"Akte {i} {w.tag}", identifiers=[identifier] if i == 0 else [])
            version = w.version(doc, f"{words}. Vermerk {i} zur {rng.choice(VOCABULARY)}.")
            w.observe(version, obj)
            documents.append(doc)
            versions.append(version)
        for a, b in zip(documents, documents[1:], strict=False):
            w.relation(rng.choice(["references", "thread"]), a, b)
        own = w.document(theirs, f"Wandakte {w.tag}")
        w.observe(w.version(own, "Vermerk der anderen Seite."), obj)
        conn.execute(
            text("INSERT INTO decision_records (project_id, document_id, rationale) VALUES (:p, :d, :r)"),
            {"p": mine, "d": documents[0], "r": f"Kündigungsfrist {rng.choice(VOCABULARY)} verlängert"},
        )
        missing = int(conn.execute(text("SELECT coalesce(max(id), 0) + 500000 FROM documents")).scalar_one())
    return Scene(seed, w.tag, caller, colleague, mine, theirs, source, obj, documents, versions, identifier,
                 f"Akte 0 {w.tag}", missing)  # fmt: skip


def write_hidden(engine: Engine, scene: Scene) -> tuple[list[int], int]:
    """W -> W': what the caller may not see. Answers the observed hidden versions (to wait for) and the hidden
    version of a visible document (which the caller's scope lists)."""
    rng = random.Random(scene.seed + 1)
    hidden_versions = []
    with engine.begin() as conn:
        w = World(conn, tag=scene.tag)
        hidden = []
        for i in range(3):
            words = " ".join(rng.sample(HIDDEN_WORDS, 4))
            doc = w.document(scene.theirs, scene.title if i == 0 else f"Geheim {i} {scene.tag}",
                             identifiers=[scene.identifier])  # fmt: skip
            version = w.version(doc, f"{words} {SECRET}. {scene.identifier}.")
            w.observe(version, scene.obj)
            hidden.append(doc)
            hidden_versions.append(version)
        # Documents at the ids W asked about as missing (no version: visible to nobody).
        for i in range(HIDDEN_IDS):
            conn.execute(
                text("INSERT INTO documents (id, project_id, title, identifiers) VALUES (:i, :p, :t, :a)"),
                {"i": scene.missing_base + i, "p": scene.theirs, "t": f"Leer {i} {scene.tag}", "a": [scene.identifier]},
            )
        # Just past the ids asked about as missing: a document of the caller's own project, granted and observed,
        # whose expiry has passed (visible to nobody) -- an expired document must answer as one that never was.
        conn.execute(
            text("INSERT INTO documents (id, project_id, title, identifiers, expires_at) "
                 "VALUES (:i, :p, :t, :a, now() - interval '1 day')"),
            {"i": scene.missing_base + HIDDEN_IDS, "p": scene.mine, "t": f"Abgelaufen {scene.tag}",
             "a": [scene.identifier]},
        )  # fmt: skip
        expired = w.version(scene.missing_base + HIDDEN_IDS, f"Kaution Frist Haftung {rng.choice(VOCABULARY)}.")
        w.observe(expired, scene.obj)
        # A hidden version of a visible document (observed nowhere), newer than the visible one.
        draft = w.version(scene.documents[-1], f"{SECRET} Entwurf {rng.choice(HIDDEN_WORDS)}.", version_no=2,
                          latest=False)  # fmt: skip
        w.relation("references", hidden[0], scene.documents[0])
        w.relation("thread", scene.documents[0], scene.missing_base)
        w.relation("references", scene.missing_base + 1, scene.documents[-1])
        for doc in (hidden[0], scene.missing_base + 2):
            conn.execute(
                text("INSERT INTO decision_records (project_id, document_id, rationale) VALUES (:p, :d, :r)"),
                {"p": scene.theirs, "d": doc, "r": f"Kündigungsfrist {SECRET} verlängert"},
            )
    return hidden_versions, draft


def requests(scene: Scene, service: SearchService, phase: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    """The caller's requests, by name; `phase` words make the cold name query new in each phase."""
    api, who = service.settings.api, [scene.caller]
    asked = scene.missing_base

    def search(body: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
        return lambda: service.search(who, parse_search_request(body, api))

    return {
        "search lexical": search({"query": "Kaution Frist Haftung", "mode": "lexical", "limit": 5}),
        # Whole pages: a page cut between two nearly equal scores could move with the term statistics.
        "search hybrid": search({"query": "Zahlung im Verzug", "mode": "hybrid", "limit": 10}),
        "search hidden word": search({"query": SECRET, "mode": "lexical"}),
        "search identifier": search({"query": f"{scene.identifier} Kündigung", "mode": "lexical"}),
        "search named": search({"query": f"{scene.title} Vertrag", "mode": "lexical"}),
        # A comparison: each hit's earlier side is read among the document's versions (W': a hidden one too).
        "search compare": search({"query": "Kaution Frist vorherige Fassung", "mode": "lexical"}),
        "cold name query": search({"query": f"Übernahme Zielfirma Z{phase}{scene.tag} Holding", "mode": "lexical"}),
        "filter": lambda: service.search_filter(who, parse_filter_request({"limit": 10}, api)),
        "document": lambda: service.get_document(who, scene.documents[0]),
        "document hidden or missing": lambda: service.get_document(who, asked),
        "read": lambda: service.read_text(who, scene.documents[0], None, parse_read_request({"length": "40"}, api)),
        "read hidden or missing": lambda: service.read_text(who, asked, None, parse_read_request({}, api)),
        "document expired or missing": lambda: service.get_document(who, asked + HIDDEN_IDS),
        "read expired or missing": lambda: service.read_text(
            who, asked + HIDDEN_IDS, None, parse_read_request({}, api)
        ),
        "chunk": lambda: service.read_chunk(who, ChunkId(scene.versions[0], "chunk", 0)),
        "related both": lambda: service.related(
            who, scene.documents[0], parse_related_request({"direction": "both"}, api)
        ),
        "related incoming references": lambda: service.related(
            who, scene.documents[0], parse_related_request({"direction": "incoming", "kinds": "references"}, api)
        ),
        "related last": lambda: service.related(who, scene.documents[-1], parse_related_request({}, api)),
        "related hidden or missing": lambda: service.related(who, asked, parse_related_request({}, api)),
        "traverse": lambda: service.traverse(
            who,
            parse_traverse_request(
                {"start": [scene.documents[0], *range(asked, asked + HIDDEN_IDS - 1)], "depth": 2, "direction": "both"},
                api,
            ),
        ),
        "decisions": lambda: service.search_decisions(who, parse_decision_request({"query": "Kündigungsfrist"}, api)),
        "decisions hidden word": lambda: service.search_decisions(who, parse_decision_request({"query": SECRET}, api)),
        # W': three hidden documents and 100 without a version carry the identifier, one hidden the title.
        "lookup identifier": lambda: service.lookup(who, parse_lookup_request({"identifier": scene.identifier}, api)),
        "lookup title": lambda: service.lookup(who, parse_lookup_request({"title": scene.title}, api)),
        "lookup hidden or missing": lambda: service.lookup(
            who, parse_lookup_request({"title": f"Geheim 1 {scene.tag}"}, api)
        ),
    }


def _wait_feed_current(service: SearchService) -> None:
    """Until the invalidation feed is within a second of PostgreSQL: every change committed before (W's own, and the
    removal of the world before it, each of which drops cache entries) has been applied."""
    feed = service.feed
    assert feed is not None

    def current() -> bool:
        health = feed.health()
        return health.usable and health.lag_s is not None and health.lag_s < 1.0

    wait_for(current, timeout=180, interval=0.5, what="the invalidation feed to apply W")


GRID = ("document", "read", "chunk", "related", "traverse", "decisions", "lookup")
SEARCH_GRID = ("search", "cold", "filter")  # api.limits.search_release_quantum_ms


def _normalised(value: Any, scene: Scene, phase: str) -> Any:
    """The trace or answer with the phase's own words (the cold query) taken out."""
    raw = json.dumps(value, default=str, sort_keys=True)
    return json.loads(re.sub(f"Z{phase}{scene.tag}", "Z<phase>", raw, flags=re.IGNORECASE))


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def isolation(settings: Settings) -> Iterator[dict[str, str]]:
    with isolated(settings, prefix="ki-trace-test") as env:
        yield env


def _wait_indexed(settings: Settings, index: str, versions: list[int], what: str) -> None:
    client = make_sync_client(settings, timeout_s=30)
    ids = [str(v) for v in versions]

    def indexed() -> bool:
        client.indices.refresh(index=index, ignore_unavailable=True)
        body = {"size": 0, "query": {"terms": {"document_version_id": ids}},
                "aggs": {"v": {"terms": {"field": "document_version_id", "size": len(ids)}}}}  # fmt: skip
        found = client.search(index=index, body=body, ignore=[404])
        buckets = found.get("aggregations", {}).get("v", {}).get("buckets", [])
        return {b["key"] for b in buckets} >= set(ids)

    try:
        wait_for(indexed, timeout=180, what=what)
    finally:
        client.close()
    wait_until_vectored(settings, index, {"terms": {"document_version_id": ids}}, what)


@pytest.mark.parametrize("seed", SEEDS)
def test_hidden_rows_change_no_trace_and_no_answer(engine: Engine, isolation: dict[str, str], seed: int) -> None:
    # Stale entries answered for as long as the test takes: whether the first search after W' is served from its
    # stale scope must not depend on how long the hidden rows took to index.
    settings = load_settings(environ={**os.environ, **isolation, "KI_API__CACHES__SCOPE_STALE_S": "600"})
    quantum = settings.api.limits.release_quantum_ms / 1000
    search_quantum = settings.api.limits.search_release_quantum_ms / 1000
    worker = SyncWorker(isolation)
    worker.start()
    loop = Loop()
    scene = write_world(engine, seed)
    try:
        index = settings.retrieval.index_name
        _wait_indexed(settings, index, scene.versions, "the world W")

        async def build() -> SearchService:
            service = SearchService(settings, make_async_engine(settings), make_client(settings),
                                    create_embedder(settings), scope_cache=True)  # fmt: skip
            service.filter_budget = 20  # every scope over the budget
            service.start()
            return service

        service = loop.run(build())
        tracer = Tracer(service)
        try:
            wait_for(
                lambda: scope_cache_state(service.scope_cache, service.feed)["usable"],
                timeout=60,
                what="the invalidation feed",
            )
            _wait_feed_current(service)
            # W: every request once to warm the caches (a request's first look-ups are its own), then traced.
            for call in requests(scene, service, "w0").values():  # "w0": the cold name query stays cold for "w"
                loop.run(call())
            # Traced until two rounds leave the same traces: W's own last changes may still be on their way through
            # the invalidation feed, and each drops cache entries (a warm entry of one round, a miss in the next).
            phase = "w"
            before = {name: loop.run(tracer.run(call)) for name, call in requests(scene, service, phase).items()}
            moved: list[str] = []
            for round_no in range(1, STABLE_ROUNDS + 1):
                again = {name: loop.run(tracer.run(call))
                         for name, call in requests(scene, service, f"w{round_no}r").items()}  # fmt: skip
                moved = [
                    n
                    for n in before
                    if _normalised(again[n][1], scene, f"w{round_no}r") != _normalised(before[n][1], scene, phase)
                ]
                phase, before = f"w{round_no}r", again
                if not moved:
                    break
            else:
                pytest.fail(f"W's traces did not settle in {STABLE_ROUNDS} rounds; the last round moved: {moved}")
            caller = loop.run(service.compile_scope([scene.caller], None))
            key = ScopeCache.scope_key(service.scope_cache.caller(ScopeCache.raw_key([scene.caller]), 600)[0], None)
            assert caller is service.scope_cache.scope(key, 600)[0]
            hidden, draft = write_hidden(engine, scene)
            _wait_indexed(settings, index, hidden, "the hidden rows of W'")
            wait_for(lambda: service.scope_cache.scope(key, 600)[1], timeout=60, what="the caller's scope to go stale")
            # The first search after W': its scope went stale; it is answered from it (no SQL of its own) while
            # it is compiled again in the background.
            first = requests(scene, service, "w1")["search lexical"]
            _, trace_first, _ = loop.run(tracer.run(first))

            def settled() -> bool:
                """Every change of W' delivered and the caller's entries fresh again (each request once more)."""
                for call in requests(scene, service, "w2x").values():
                    loop.run(call())
                loop.run(service.settled())
                health = service.feed.health() if service.feed is not None else None
                scope, stale = service.scope_cache.scope(key, 600)
                return (health is not None and health.usable and health.lag_s is not None and health.lag_s < 1.0
                        and scope is not None and not stale and draft in scope.hidden_version_ids)  # fmt: skip

            wait_for(settled, timeout=90, interval=0.5, what="the invalidation feed to deliver W'")
            # A colleague behind the wall runs the caller's next name queries first.
            colleague = [scene.colleague]
            for name in ("cold name query", "search named", "search identifier"):
                body = {
                    "cold name query": f"Übernahme Zielfirma Zw2{scene.tag} Holding",  # the caller's next one
                    "search named": f"{scene.title} Vertrag",
                    "search identifier": f"{scene.identifier} Kündigung",
                }[name]
                loop.run(service.search(colleague, parse_search_request({"query": body}, service.settings.api)))
            loop.run(service.settled())
            problems: list[str] = []  # every difference, not only the first
            if _sql(trace_first) != _sql(before["search lexical"][1]):
                problems.append("first search after W': the scope compiled again in the request")
            after = {name: loop.run(tracer.run(call)) for name, call in requests(scene, service, "w2").items()}
            for name in before:
                (answer_w, trace_w, _), (answer_w2, trace_w2, elapsed) = before[name], after[name]
                got, want = _normalised(trace_w2, scene, "w2"), _normalised(trace_w, scene, phase)
                assert trace_w, f"{name}: no backend work recorded"
                # Statements and requests each in their order (the preflight's SQL interleaves with the legs).
                if _sql(got) != _sql(want):
                    problems.append(f"{name}: SQL {_sql(want)} -> {_sql(got)}")
                requests_got = _hidden_versions_named(_opensearch(got))
                requests_want = _hidden_versions_named(_opensearch(want))
                want_answer = _normalised(_json(answer_w), scene, phase)
                got_answer = _normalised(_json(answer_w2), scene, "w2")
                # Only another row of the same version shown (and fetched): the term-statistics residual.
                row_moved = (requests_got, got_answer) != (requests_want, want_answer) and (
                    _version_level(requests_got),
                    _version_level(got_answer),
                ) == (_version_level(requests_want), _version_level(want_answer))
                if row_moved and name.startswith("search"):
                    print(f"{name}: another row of the same version represents it (term statistics)")
                    requests_got, got_answer = requests_want, want_answer
                if requests_got != requests_want:
                    problems.append(f"{name}: OpenSearch {_opensearch(want)} -> {_opensearch(got)}")
                if got_answer != want_answer:
                    problems.append(f"{name}: answer {_first_difference(want_answer, got_answer)}")
                if name.split()[0] in GRID and quantum > 0 and elapsed < quantum * 0.99:
                    problems.append(f"{name}: answered after {elapsed * 1000:.1f} ms, off the release grid")
                if name.split()[0] in SEARCH_GRID and search_quantum > 0 and elapsed < search_quantum * 0.99:
                    problems.append(f"{name}: answered after {elapsed * 1000:.2f} ms, before the search grid's point")
            assert not problems, "\n".join(p[:600] for p in problems)
        finally:

            async def shutdown() -> None:
                await service.close()
                await service.client.close()
                await service.engine.dispose()

            loop.run(shutdown())
    finally:
        worker.stop()
        remove_world(engine, [scene.mine, scene.theirs], [scene.source])

"""Randomised authorisation soak through the HTTP API.

A few random ACL worlds (the strategies of `tests/integration/acl_worlds.py`, drawn with a fixed seed,
each with principals of its own tag so the worlds' memberships and aliases, which are global tables, do
not merge into one group graph) are committed to PostgreSQL; every version's text carries one shared
search word. A real `ki sync run` worker indexes them through Debezium and Kafka into an index of this
module's own; two real `ki serve` processes answer over HTTP, one per `security.source_acl_mode`, both
with administrators and aliases from settings.

Random callers (tokens with a random subject, groups and roles: a world's principals in random case and
whitespace, sometimes another world's, settings aliases, a settings administrator reached directly or
through an alias, `role:admin`, unknown principals) send random queries to `POST /v1/search` and
`POST /v1/search/filter`, optionally narrowed to some projects. Every hit must be allowed by the pure
reference evaluator (`tests/acl_reference.py`) on the world as it is in PostgreSQL at that moment: its
version visible, its document and project the version's own, its citation naming exactly the source
objects the caller may cite. Nothing visible may be missing either (the index content is complete before
the soak starts and only access changes afterwards): the search returns one hit per visible document, the
filter endpoint one per visible version, both up to `limit` -- with the servers' scope caches on, except
what was still invisible in a world read within the cache's freshness bound (counted).

Meanwhile a background thread changes access (revokes allows, adds denies, removes memberships, deletes
observations; and, so the worlds do not dry up, the opposite of each) and never waits for the index.

Concurrency: changes and requests interleave but never overlap. One lock, granted in arrival order, is
held by the changer for each change's transaction and by the querier from reading the world, through the
request, to reading the raw index. We chose this over time-stamping commits and accepting a hit if the
reference allowed it both before and after every change that committed during the request: that rule is
weaker (a hit from either side of a change passes) and blurs where a request reads what (the ranked
search resolves the caller's groups and aliases while compiling the scope and reads grants again in its
re-verify). Under the lock each request has exactly one correct answer, and the index is still stale: the
worker applies a change a second or more after its commit, the next request comes milliseconds later.

Counted, printed and asserted non-zero: hits, changes (every kind of removal), queries on a stale index
(some version of the narrowed worlds has index rows whose `allowed_principals`/`denied_principals` differ
from the projection of the current rows, `acl_reference.projection` == `ki.acl.version_projections`),
queries where that stale projection decides differently for the caller's own principals, queries whose
scope documents hold versions the caller may not see (their chunks pass the OpenSearch scope filter; only
the SQL re-verify can drop them), and queries whose answer depends on `source_acl_mode`. After the soak
the worker must catch up (the index's projection equals the reference's for every version) and a final
round of queries is checked the same way.

Marked `faults` (long; part of `make test`; alone: `pytest -m faults tests/integration/test_authorisation_soak.py`).
`KI_SOAK_ITERATIONS` (default 400) sets the number of queries, `KI_SOAK_SEED` (default 6) the worlds,
callers and changes (which change lands between which queries still depends on timing). The default run
takes ~40 s on a warm stack on the 2-core machine.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from opensearchpy import OpenSearch, TransportError
from sqlalchemy import Connection, Engine, text

from ki.clients import make_engine, make_sync_client
from ki.settings import ApiSettings, SecuritySettings, Settings, load_settings
from search.web.auth import mint_token, principals_from_claims
from tests import acl_reference as ref
from tests.conftest import wait_for
from tests.integration.acl_worlds import NAMES, TAG, Written, cases, draw, read_world, write
from tests.integration.search_harness import Server, SyncWorker, isolated

pytestmark = [pytest.mark.stack, pytest.mark.faults]

ITERATIONS = int(os.environ.get("KI_SOAK_ITERATIONS") or 400)
SEED = int(os.environ.get("KI_SOAK_SEED") or 6)
WORLDS = 6
WORD = f"soak{TAG}"
QUERIES = (WORD, f"{WORD} Lieferung", f"Vertrag {WORD.upper()}", "Vertrag über die Lieferung")
CHANGE_PAUSE_S = 0.1  # pacing of the changer between two changes (it never waits for the index)


def principal(name: str, world: int | None = None) -> str:
    """A principal of the soak (`world=None`) or of one world: each world draws its principals from a tag
    of its own, so the worlds' memberships and aliases (global tables) do not merge into one group graph."""
    return f"acl{world_tag(world)}:{name}"


def world_tag(world: int | None) -> str:
    return TAG if world is None else f"{TAG}w{world}"


# Administrators through settings: a name no world mentions (so a world's alias or membership cannot
# make one), reachable as itself or through a settings alias.
CHIEF, DEPUTY = principal("chief"), principal("deputy")
ALIAS_ONLY = principal("alias-only")  # a name that only a settings alias gives meaning
STRANGER = principal("stranger")  # in no world
NAMES_OF = [tuple(principal(n, w) for n in NAMES) for w in range(WORLDS)]  # each world's own names
SECURITY_ENV = {
    "KI_SECURITY__ADMIN_PRINCIPALS": json.dumps(["role:admin", f" {CHIEF.upper()} "]),
    # The soak's tokens carry its principals (kind:name) in `sub` and `groups`.
    "KI_API__JWT__CLAIMS_CARRY_KINDS": "true",
    "KI_SECURITY__ALIASES": json.dumps(
        {principal("strasse", 0): principal("g1", 0), ALIAS_ONLY: principal("İrem", 1), DEPUTY: CHIEF}
    ),
}
MODES = ref.MODES


def text_of(version: ref.Version) -> str:
    return f"{WORD}: Vertrag {version.id} über die Lieferung"


def cased(rng: random.Random, value: str) -> str:
    """Random case and surrounding whitespace (the token strips it, the ACL folds the case)."""
    flipped = "".join(c.upper() if rng.random() < 0.3 else c for c in value)
    return rng.choice(("", " ", "\u3000")) + flipped + rng.choice(("", "\t", " "))


# ---------------------------------------------------------------------------------------------------
# The stack: worlds, worker, servers
# ---------------------------------------------------------------------------------------------------


@dataclass
class Soak:
    engine: Engine
    search: OpenSearch
    index: str
    servers: dict[str, Server]  # source_acl_mode -> server
    security: dict[str, SecuritySettings]
    api: ApiSettings
    worlds: list[Written] = field(default_factory=list)  # database ids of each world's rows
    memberships: list[int] = field(default_factory=list)  # ids of the memberships the worlds and the changer wrote
    aliases: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    # Worlds read by the querier within the scope cache's freshness bound (seconds), oldest first.
    freshness_bound_s: float = 0.0
    history: deque[tuple[float, ref.World]] = field(default_factory=deque)

    @property
    def projects(self) -> list[int]:
        return sorted(p for w in self.worlds for p in w.projects.values())

    def world(self, conn: Connection) -> ref.World:
        return read_world(conn, self.projects)

    def indexed_so_far(self) -> set[int]:
        """The versions the index carries now, for the wait before the soak: an index just created answers 503
        until its shard has started (a CI run saw it), which means nothing is indexed yet."""
        try:
            return set(self.index_projection())
        except TransportError as error:
            if error.status_code != 503:
                raise
            return set()

    def index_projection(self) -> dict[int, set[tuple[frozenset[str], frozenset[str]]]]:
        """Per version: the (allowed, denied) principals its rows in the index carry right now."""
        response = self.search.search(
            index=self.index,
            ignore_unavailable=True,  # the worker creates the alias with its first write
            body={
                "query": {"terms": {"project_id": [str(p) for p in self.projects]}},
                "size": 10_000,
                "_source": ["document_version_id", "allowed_principals", "denied_principals"],
            },
        )
        out: dict[int, set[tuple[frozenset[str], frozenset[str]]]] = {}
        for hit in response["hits"]["hits"]:
            s = hit["_source"]
            pair = (frozenset(s.get("allowed_principals") or ()), frozenset(s.get("denied_principals") or ()))
            out.setdefault(int(s["document_version_id"]), set()).add(pair)
        return out


@pytest.fixture(scope="module")
def engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings, pool_size=3)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def soak(settings: Settings, engine: Engine) -> Iterator[Soak]:
    drawn = [
        draw(
            cases("sufficient", max_documents=12, max_objects=6, min_grants=12, max_grants=30, tag=world_tag(w)),
            1,
            SEED + w,
        )[0]
        for w in range(WORLDS)
    ]
    with isolated(settings, prefix="ki-soak") as iso:
        env = {**iso, **SECURITY_ENV}
        worker = SyncWorker(env)
        servers = {mode: Server(f"soak-api-{mode}", **env, KI_SECURITY__SOURCE_ACL_MODE=mode) for mode in MODES}
        security = {
            mode: load_settings(environ={**os.environ, **env, "KI_SECURITY__SOURCE_ACL_MODE": mode}).security
            for mode in MODES
        }
        search = make_sync_client(settings, timeout_s=60)
        api = settings.api.model_copy(update={"jwt": settings.api.jwt.model_copy(update={"claims_carry_kinds": True})})
        state = Soak(engine, search, env["KI_RETRIEVAL__INDEX_NAME"], servers, security, api)
        state.freshness_bound_s = (
            settings.api.caches.scope_max_feed_lag_s + 2 * settings.connect.heartbeat_interval_ms / 1000
        )
        try:
            worker.start()
            for server in servers.values():
                server.start()
            with engine.begin() as conn:
                for case in drawn:
                    ids = write(conn, case.world, text_of)
                    state.worlds.append(ids)
                    state.memberships += ids.memberships
                    state.aliases += ids.aliases
                objects = [o for w in state.worlds for o in w.objects.values()]
                sql = "SELECT DISTINCT source_id AS id FROM source_objects WHERE id = ANY(:o)"
                state.sources = [r.id for r in conn.execute(text(sql), {"o": objects})]
                world = state.world(conn)
            indexed = {v.id for v in world.versions if not _deleted_document(world, v)}
            print(
                f"\nsoak worlds (seed {SEED}): {len(state.worlds)} worlds, {len(state.projects)} projects, "
                f"{len(world.documents)} documents, {len(world.versions)} versions ({len(indexed)} indexed), "
                f"{len(world.grants)} grants, {len(world.memberships)} memberships, {len(world.aliases)} aliases"
            )
            wait_for(
                lambda: state.indexed_so_far() >= indexed,
                timeout=400,
                interval=1.0,
                what="the worker to index every version of the soak worlds",
            )
            yield state
        finally:
            for child in (*servers.values(), worker):
                child.stop()
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM group_memberships WHERE id = ANY(:i)"), {"i": state.memberships})
                conn.execute(text("DELETE FROM principal_aliases WHERE id = ANY(:i)"), {"i": state.aliases})
                conn.execute(text("DELETE FROM projects WHERE id = ANY(:i)"), {"i": state.projects})
                conn.execute(text("DELETE FROM sources WHERE id = ANY(:i)"), {"i": state.sources})


def _deleted_document(world: ref.World, version: ref.Version) -> bool:
    """Whether the version's document is deleted or expired: it has no rows."""
    return any(d.deleted or d.expired for d in world.documents if d.id == version.document_id)


# ---------------------------------------------------------------------------------------------------
# The changer
# ---------------------------------------------------------------------------------------------------


class TurnLock:
    """A lock granted in arrival order: a plain Lock lets the querier, which re-acquires it at once,
    starve the changer."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


_OURS_GRANTS = (
    "SELECT id FROM grants WHERE effect = :e AND (project_id = ANY(:p) OR source_object_id = ANY(:o) "
    "OR document_id IN (SELECT id FROM documents WHERE project_id = ANY(:p))) ORDER BY id"
)
_OURS_OBSERVATIONS = (
    "SELECT so.id FROM source_observations so JOIN document_versions dv ON dv.id = so.document_version_id "
    "JOIN documents d ON d.id = dv.document_id WHERE d.project_id = ANY(:p) AND (so.deleted_at IS NULL) = :active "
    "ORDER BY so.id"
)


class Changer:
    """Changes access in the soak worlds from a background thread, one change per transaction, each under
    `lock`; paced by CHANGE_PAUSE_S and never waiting for the index."""

    SHRINKING = ("allow revoked", "deny added", "membership removed", "observation deleted")
    GROWING = ("allow added", "deny revoked", "membership added", "observation restored")

    def __init__(self, soak: Soak, lock: TurnLock, seed: int) -> None:
        self.soak, self.lock, self.rng = soak, lock, random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-changer", daemon=True)

    def start(self) -> Changer:
        self._thread.start()
        return self

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the changer did not stop"
        if self.error is not None:
            raise AssertionError(f"the changer failed: {self.error!r}") from self.error
        return self.counts

    def _run(self) -> None:
        try:
            while not self._stop.wait(CHANGE_PAUSE_S):
                with self.lock, self.soak.engine.begin() as conn:
                    kind = self.change(conn)
                self.counts[kind] += 1
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def change(self, conn: Connection) -> str:
        """One random change; 55 % of them take access away. Falls back to a grant when there is nothing
        of the picked kind to change."""
        kinds = self.SHRINKING if self.rng.random() < 0.55 else self.GROWING
        kind = self.rng.choice(kinds)
        w = self.rng.randrange(WORLDS)  # a change within one world: its rows and its principals
        p, o = list(self.soak.worlds[w].projects.values()), list(self.soak.worlds[w].objects.values())
        if kind in ("allow revoked", "deny revoked"):
            ids = [r.id for r in conn.execute(text(_OURS_GRANTS), {"e": kind.split()[0], "p": p, "o": o})]
            if ids:
                conn.execute(text("DELETE FROM grants WHERE id = :i"), {"i": self.rng.choice(ids)})
                return kind
            kind = "allow added" if kind == "deny revoked" else "deny added"
        if kind in ("allow added", "deny added"):
            self._grant(conn, w, kind.split()[0])
            return kind
        if kind == "membership removed":
            if self.soak.memberships:
                gone = self.soak.memberships.pop(self.rng.randrange(len(self.soak.memberships)))
                conn.execute(text("DELETE FROM group_memberships WHERE id = :i"), {"i": gone})
                return kind
            kind = "membership added"
        if kind == "membership added":
            group, member = self.rng.sample(NAMES_OF[w], 2)
            new = conn.execute(
                text("INSERT INTO group_memberships (group_principal, member_principal) VALUES (:g, :m) RETURNING id"),
                {"g": cased(self.rng, group), "m": cased(self.rng, member)},
            ).scalar_one()
            self.soak.memberships.append(int(new))
            return kind
        active = kind == "observation deleted"
        ids = [r.id for r in conn.execute(text(_OURS_OBSERVATIONS), {"p": p, "active": active})]
        if not ids:
            self._grant(conn, w, "allow")
            return "allow added"
        conn.execute(
            text(f"UPDATE source_observations SET deleted_at = {'now()' if active else 'NULL'} WHERE id = :i"),
            {"i": self.rng.choice(ids)},
        )
        return kind

    def _grant(self, conn: Connection, w: int, effect: str) -> None:
        scope = self.rng.choice(ref.SCOPES)
        target = self.rng.choice(
            {
                "project": list(self.soak.worlds[w].projects.values()),
                "document": list(self.soak.worlds[w].documents.values()),
                "source_object": list(self.soak.worlds[w].objects.values()),
            }[scope]
        )
        column = {"project": "project_id", "document": "document_id", "source_object": "source_object_id"}[scope]
        conn.execute(
            text(f"INSERT INTO grants (scope, {column}, principal, effect) VALUES (:s, :t, :p, :e)"),
            {"s": scope, "t": target, "p": cased(self.rng, self.rng.choice(NAMES_OF[w])), "e": effect},
        )


# ---------------------------------------------------------------------------------------------------
# Queries and their check
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    mode: str
    path: str
    body: dict[str, Any]
    claims: dict[str, Any]
    projects: frozenset[int] | None  # the project filter, if any


def random_query(rng: random.Random, soak: Soak) -> Query:
    """A random caller (mostly one world's principals), endpoint, server (mode), project filter and limit."""
    w = rng.randrange(WORLDS)
    roll = rng.random()
    if roll < 0.1:
        subject = f"stranger-{TAG}"  # no namespace: becomes user:stranger-<tag>, known nowhere
    elif roll < 0.15:
        subject = CHIEF
    elif roll < 0.2:
        subject = DEPUTY
    elif roll < 0.3:
        subject = ALIAS_ONLY
    else:
        subject = rng.choice(NAMES_OF[w])
    pool = NAMES_OF[w] if rng.random() < 0.8 else (*NAMES_OF[rng.randrange(WORLDS)], ALIAS_ONLY, STRANGER)
    groups = [cased(rng, g) for g in rng.sample(pool, rng.choice((0, 0, 1, 2, 3)))]
    roles = rng.choice([["reader"], ["reader"], ["admin"]]) if rng.random() < 0.15 else []
    claims: dict[str, Any] = {"sub": cased(rng, subject), "groups": groups, "roles": roles}
    roll = rng.random()
    projects: list[int] | None = None
    if roll < 0.4:
        projects = sorted(soak.worlds[w].projects.values())
    elif roll < 0.55:
        projects = rng.sample(soak.projects, rng.randint(1, min(4, len(soak.projects))))
    body: dict[str, Any] = {"limit": rng.choice((3, 10, 40, 100)), "explain": rng.random() < 0.3}
    if projects:
        body["filters"] = {"project_id": projects}
    ranked = rng.random() < 0.7
    if ranked:
        body["query"] = rng.choice(QUERIES)
    return Query(
        rng.choice(MODES),
        "/v1/search" if ranked else "/v1/search/filter",
        body,
        claims,
        frozenset(projects) if projects else None,
    )


@dataclass
class Tally:
    queries: int = 0
    hits: int = 0
    admin_queries: int = 0
    foreign_pages: int = 0  # an unfiltered administrator's pages that other tests' projects shared
    empty_scope_queries: int = 0
    stale_queries: int = 0  # the index's projection of a version in the narrowed worlds was stale
    stale_for_caller: int = 0  # ... and decided differently for this caller's principals
    stale_would_leak: int = 0  # versions the stale projection would show the caller but SQL hides
    reverify_queries: int = 0  # scope documents holding versions the caller may not see
    truncated: int = 0  # more visible than `limit`
    cache_lagged: int = 0  # something visible was missing, but invisible in a world within the freshness bound
    modes_differ: int = 0  # the other source_acl_mode would have shown the caller other versions
    by: Counter[str] = field(default_factory=Counter)


def projected_visible(pair: tuple[frozenset[str], frozenset[str]], principals: set[str]) -> bool:
    allowed, denied = pair
    return bool(principals & allowed) and not principals & denied


def expected(
    query: Query, hits: list[dict[str, Any]], world: ref.World, raw: list[str], security: SecuritySettings
) -> tuple[list[int], set[int]]:
    """(what the answer lists, what `world` says it should list): document ids for a ranked search (one
    hit per document), version ids for the filter endpoint."""
    project_of = {d.id: d.project_id for d in world.documents}
    document_of = {v.id: v.document_id for v in world.versions}
    visible = {
        v
        for v in ref.visible(world, ref.resolve(world, raw, security), security)
        if query.projects is None or project_of[document_of[v]] in query.projects
    }
    if query.path == "/v1/search":
        return [h["document_id"] for h in hits], {document_of[v] for v in visible}
    return [h["version_id"] for h in hits], visible


def check(
    query: Query,
    status: int,
    body: dict[str, Any],
    world: ref.World,
    indexed: dict[int, set[tuple[frozenset[str], frozenset[str]]]],
    soak: Soak,
    tally: Tally,
    recent: Sequence[ref.World] = (),
) -> None:
    """Every hit allowed by the reference on `world` (PostgreSQL during the request), nothing visible
    missing unless it was invisible in one of the `recent` worlds; and the counts of what this query
    exercised."""
    assert status == 200, (query, body)
    security = soak.security[query.mode]
    raw = principals_from_claims(query.claims, soak.api)
    caller = ref.resolve(world, raw, security)
    documents = {d.id: d for d in world.documents}
    versions = {v.id: v for v in world.versions}
    in_filter = {
        v.id for v in world.versions if query.projects is None or documents[v.document_id].project_id in query.projects
    }
    visible = ref.visible(world, caller, security) & in_filter
    citable: dict[int, set[int]] = {}
    for i in ref.citable(world, caller, security):
        o = world.observations[i]
        citable.setdefault(o.version_id, set()).add(o.object_id)
    why = f"{query} -> {raw} resolved {caller}"

    hits = body["hits"]
    foreign = 0
    if caller.is_admin and query.projects is None:
        # An administrator without a project filter sees every project of the stack, other tests' too: only
        # the soak's are judged, and a page partly filled by others cannot be judged for completeness.
        hits = [h for h in hits if h["version_id"] in versions]
        foreign = len(body["hits"]) - len(hits)
    for hit in hits:
        v = hit["version_id"]
        assert v in visible, (
            f"hit outside the caller's scope: version {v} ({ref.verdicts(world, caller, security).get(v)}); {why}"
        )
        document = documents[versions[v].document_id]
        assert (hit["document_id"], hit["project_id"]) == (document.id, document.project_id), hit
        citation = hit["citation"]
        assert (citation["version_id"], citation["document_id"], citation["project_id"]) == (
            v,
            document.id,
            document.project_id,
        ), hit
        assert set(citation["source_object_ids"]) == citable[v], f"citation of version {v}: {citation}; {why}"

    # Nothing visible missing: one hit per visible document (ranked) or version (filter), up to `limit` --
    # except what became visible within the scope cache's freshness bound (a new grant, membership or
    # observation may take the invalidation feed that long to reach a cached scope): what was invisible
    # in a world read during that bound may be missing, nothing else.
    got, want = expected(query, hits, world, raw, security)
    assert len(got) == len(set(got)), f"a hit listed twice: {got}"
    assert set(got) <= want, (got, want)
    limit = query.body["limit"]
    missing = want - set(got)
    # A full page that says nothing more follows missed some: the API's scope did not hold them yet.
    unaware = len(got) == limit and body["has_more"] is False
    if missing and not foreign and (len(want) <= limit or len(got) < limit or unaware):
        late = {x for x in missing if any(x not in expected(query, hits, w, raw, security)[1] for w in recent)}
        assert missing <= late, f"missing {sorted(missing - late)}; {why}"
        tally.cache_lagged += 1
    if foreign:
        tally.foreign_pages += 1
    elif len(want) <= limit:
        assert body["has_more"] is False or missing, body["has_more"]
    elif len(got) == limit:  # says more follow, or missed only what became visible late (checked above)
        tally.truncated += 1

    # What this query exercised.
    tally.queries += 1
    tally.hits += len(hits)
    tally.by[f"{query.path} {query.mode}"] += 1
    tally.admin_queries += caller.is_admin
    tally.empty_scope_queries += not visible
    other = soak.security[next(m for m in MODES if m != query.mode)]
    tally.modes_differ += ref.visible(world, ref.resolve(world, raw, other), other) & in_filter != visible
    scope_documents = {versions[v].document_id for v in visible}
    tally.reverify_queries += any(
        versions[v].document_id in scope_documents for v in in_filter - visible if v in indexed
    )
    folded = {p for p in (ref.normalize(r) for r in raw) if p}
    fresh = ref.projection(world, security)
    stale = [v for v in in_filter & indexed.keys() if indexed[v] != {fresh[v]}]
    tally.stale_queries += bool(stale)
    stale = [
        v
        for v in stale
        if any(projected_visible(pair, folded) != projected_visible(fresh[v], folded) for pair in indexed[v])
    ]
    tally.stale_for_caller += bool(stale)
    tally.stale_would_leak += sum(
        1
        for v in stale
        if v not in visible
        and not projected_visible(fresh[v], folded)
        and any(projected_visible(pair, folded) for pair in indexed[v])
    )


def one_query(soak: Soak, rng: random.Random, lock: TurnLock, tally: Tally) -> None:
    query = random_query(rng, soak)
    token = mint_token(soak.api, query.claims["sub"], groups=query.claims["groups"], roles=query.claims["roles"])
    with lock:  # no change commits between reading the world and the index and answering the request
        with soak.engine.connect() as conn:
            world = soak.world(conn)
        indexed = soak.index_projection()
        status, body = soak.servers[query.mode].call(query.path, query.body, token)
    now = time.monotonic()
    soak.history.append((now, world))
    while soak.history and now - soak.history[0][0] > soak.freshness_bound_s:
        soak.history.popleft()
    check(query, status, body, world, indexed, soak, tally, [w for _, w in soak.history])


def index_caught_up(soak: Soak) -> bool:
    """Every indexed version's rows carry the projection of the current rows (and nothing else)."""
    with soak.engine.connect() as conn:
        world = soak.world(conn)
    fresh = ref.projection(world, soak.security[MODES[0]])
    indexed = soak.index_projection()
    behind = [v for v, pairs in indexed.items() if pairs != {fresh[v]}]
    return not behind


def test_no_hit_outside_the_callers_scope_while_grants_change(soak: Soak) -> None:
    rng = random.Random(SEED)
    lock = TurnLock()
    tally = Tally()
    changer = Changer(soak, lock, SEED + 1).start()
    try:
        for _ in range(ITERATIONS):
            one_query(soak, rng, lock, tally)
    finally:
        changes = changer.stop()
    print(f"soak: {ITERATIONS} queries while {sum(changes.values())} changes committed: {dict(changes)}")
    print(
        f"soak: {tally.hits} hits checked ({tally.truncated} answers truncated at limit), "
        f"{tally.admin_queries} admin callers, {tally.empty_scope_queries} callers who see nothing; "
        f"{tally.stale_queries} queries on a stale projection, {tally.stale_for_caller} of them stale for the "
        f"caller ({tally.stale_would_leak} versions a projection filter would have leaked), "
        f"{tally.reverify_queries} queries whose scope documents held invisible versions, {tally.modes_differ} whose "
        f"answer depends on source_acl_mode, {tally.cache_lagged} missing what became visible within the scope "
        f"cache's freshness bound ({soak.freshness_bound_s:.0f} s); {dict(tally.by)}"
    )
    cache = {
        mode: {r: s.metric("ki_search_scope_cache_total", result=r) for r in ("hit", "miss", "bypass")}
        for mode, s in soak.servers.items()
    }
    print(f"soak: scope cache lookups per server: {cache}")
    # A miss is only counted while the cache is in use (it then stores the scope): both servers used it.
    assert all(c["hit"] + c["miss"] > 0 for c in cache.values()), "a server never used its scope cache"
    assert tally.hits > 0, "no query returned anything"
    assert all(changes[k] for k in Changer.SHRINKING), f"not every kind of access removal happened: {changes}"
    assert tally.stale_queries > 0, "the index was never stale: the soak did not race the worker"
    assert tally.stale_for_caller > 0, "the index was never stale for a caller's principals"
    assert tally.reverify_queries > 0, "no query needed the SQL re-verify"
    assert tally.modes_differ > 0, "no answer depended on source_acl_mode"

    # The worker catches up with the last change, and the answers still hold with a fresh index.
    wait_for(lambda: index_caught_up(soak), timeout=240, interval=1.0, what="the index projection to catch up")
    final = Tally()
    for _ in range(max(10, ITERATIONS // 10)):
        one_query(soak, rng, lock, final)
    assert final.stale_queries == 0, "stale projection after the worker caught up"
    print(f"soak: after catching up, {final.queries} queries with {final.hits} hits checked")

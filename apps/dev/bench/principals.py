"""`ki bench principals`: a caller who belongs to very many groups, against a caller of one group who sees
exactly the same documents.

Memberships live in PostgreSQL (`group_memberships`), not in the token: a token carries the subject only,
as with Entra ID's group overage. Two bench users are written to the database of the running stack:

* `one`: a member of one group, which is a member of every group of the demo corpus's broadest user
  (so it sees what that user's groups see);
* `many`: a member of that same group and of `groups - 1` more; `granting` of those hold a document allow
  on a document `one` sees already (the grants a real firm's groups carry), the rest hold nothing.

Both therefore see the same documents (checked and reported), and every difference in their searches is
the cost of the groups: resolving them (SQL), compiling the scope, the cache's memory, the re-verify that
resolves them again on every search, and the scope filter's bytes. The API runs as a child process
(`ki serve`); the two callers alternate round by round at each concurrency level, beside the raw
`_msearch` of the same legs. The rows are committed (the API reads them through its own connections),
the sync has projected them before anything is timed, and they are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import tracemalloc
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

from sqlalchemy import Engine, text

from apps.dev.bench.search import (
    ApiClient,
    BenchCaller,
    BenchError,
    RawClient,
    ServeChild,
    Spec,
    _corpus_identifiers,
    _progress,
    demo_callers,
    ensure_corpus,
    measure_level,
    pick_callers,
    plan_specs,
    query_mix,
    with_generated_corpus_removed,
)
from apps.dev.bench.stats import machine
from apps.dev.checkout import REPO_ROOT
from ki.acl import Caller, Walk, resolve_caller
from ki.clients import make_async_engine, make_client, make_engine
from ki.embedding import create_embedder
from ki.settings import Settings
from search.access.reverify import reverify
from search.access.scope import CompiledScope, compile_scope, strict_filter
from search.service import SearchService
from search.web.auth import decode_token, mint_token, principals_from_claims

GOAL_RATIO_P50 = 1.2  # the many-group caller's p50 against the one-group caller's, once cached
REVERIFY_PAGE = 30  # candidate versions in one re-verify statement (a page of 10 with room to collapse)
SETTLE_TIMEOUT_S = 900.0
CDC_QUIET_S = 15.0


@dataclass(frozen=True)
class PrincipalsOptions:
    groups: int = 25_000
    granting: int = 5_000
    scale: int = 200  # the demo corpus to search (reused when it is indexed already)
    seed: int = 7
    concurrency: tuple[int, ...] = (1, 8)
    rounds: int = 3
    requests: int = 120
    repeats: int = 5  # of each direct SQL measurement
    out_dir: Path = REPO_ROOT / "build" / "bench"
    config: str | None = None
    command: str = "ki bench principals"


@dataclass(frozen=True)
class BenchUsers:
    tag: str
    source_id: int
    one: str
    many: str
    groups: int
    granting: int


def _bench_caller(settings: Settings, subject: str) -> BenchCaller:
    """A caller as the API will see it: principals from its own token (`role:operator` for `timings_ms`)."""
    token = mint_token(settings.api, subject.removeprefix("user:"), roles=["operator"], ttl_s=6 * 3600)
    principals = tuple(principals_from_claims(decode_token(token, settings.api), settings.api))
    return BenchCaller(subject, token, principals)


def insert_users(engine: Engine, settings: Settings, reference: BenchCaller, options: PrincipalsOptions) -> BenchUsers:
    """The two bench users and their groups, committed in one transaction (set-based: 25k rows in ~1 s)."""
    tag = uuid.uuid4().hex[:8]
    prefix = f"group:bench-groups-{tag}-"
    one, many = f"user:bench-groups-{tag}-one", f"user:bench-groups-{tag}-many"
    with engine.begin() as conn:
        expanded = resolve_caller(conn, reference.principals, settings.security)
        reference_groups = sorted(p for p in expanded.principals if p.startswith("group:"))
        if not reference_groups:
            raise BenchError(f"{reference.subject} belongs to no group; the bench needs a demo user who does")
        source = conn.execute(
            text("INSERT INTO sources (kind, name) VALUES ('directory', :n) RETURNING id"), {"n": f"bench groups {tag}"}
        ).scalar_one()
        first = f"{prefix}0"
        conn.execute(
            text(
                "INSERT INTO group_memberships (source_id, group_principal, member_principal)"
                " SELECT :s, g, :m FROM unnest(CAST(:groups AS text[])) g"
            ),
            {"s": source, "m": first, "groups": reference_groups},
        )
        conn.execute(
            text("INSERT INTO group_memberships (source_id, group_principal, member_principal) VALUES (:s, :g, :u)"),
            {"s": source, "g": first, "u": one},
        )
        conn.execute(
            text(
                "INSERT INTO group_memberships (source_id, group_principal, member_principal)"
                " SELECT :s, :prefix || i, :u FROM generate_series(0, :n - 1) i"
            ),
            {"s": source, "prefix": prefix, "u": many, "n": options.groups},
        )
        visible = compile_scope(conn, resolve_caller(conn, [one], settings.security), settings.security)
        documents = sorted(visible.document_ids)[:500]
        if options.granting and documents:
            conn.execute(
                text(
                    "INSERT INTO grants (scope, document_id, principal, effect)"
                    " SELECT 'document', (CAST(:docs AS bigint[]))[1 + (i % cardinality(CAST(:docs AS bigint[])))],"
                    " :prefix || i, 'allow' FROM generate_series(1, :k) i"
                ),
                {"docs": documents, "prefix": prefix, "k": min(options.granting, options.groups - 1)},
            )
        conn.execute(text("ANALYZE group_memberships, grants"))
    return BenchUsers(tag, source, one, many, options.groups, min(options.granting, options.groups - 1))


def delete_users(engine: Engine, users: BenchUsers) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM grants WHERE principal LIKE :like"), {"like": f"group:bench-groups-{users.tag}-%"}
        )
        conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": users.source_id})  # memberships cascade


async def wait_for_sync(settings: Settings, timeout_s: float = SETTLE_TIMEOUT_S) -> float:
    """Until every running lane has consumed every change (the memberships and grants re-project the versions
    they reach, which would compete with the timed rounds); answers the seconds it took."""
    from streams.status import lane_lags

    started = time.monotonic()
    last, seen = -1, False
    while True:
        lags = [lane for lane in await asyncio.to_thread(lane_lags, settings) if lane.running]
        if not lags:
            return 0.0  # no sync worker runs: nothing projects the rows, nothing competes with the timing
        waiting = sum(int(lane.total) for lane in lags)
        seen = seen or waiting > 0
        # The change events reach Kafka a moment after the commit: done once they were seen and consumed
        # (or none showed within CDC_QUIET_S: consumed between two readings).
        if waiting == 0 and (seen or time.monotonic() - started > CDC_QUIET_S):
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise BenchError(f"the sync still has {waiting} change event(s) to consume after {timeout_s:.0f} s")
        if waiting != last:
            _progress(f"bench principals: waiting for the sync ({waiting} change event(s) left)")
            last = waiting
        await asyncio.sleep(1)


def _ms(times: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(times) * 1000, 2), "min_ms": round(min(times) * 1000, 2)}


def _retained_bytes(build: Any) -> tuple[Any, int]:
    """What `build()` returns, and the bytes still allocated for it afterwards (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        value = build()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return value, sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def measure_sql(
    engine: Engine,
    settings: Settings,
    caller: BenchCaller,
    version_ids: Sequence[int],
    budget: int | None,
    repeats: int,
) -> dict[str, Any]:
    """Resolve + compile (what a scope-cache miss costs), the re-verify statement over one page of
    candidates (what every search costs), the memory a cached caller and scope hold, the filter's bytes."""
    security = settings.security
    resolve_s, compile_s = [], []
    reverify_s: dict[Walk, list[float]] = {walk: [] for walk in get_args(Walk)}
    caller_resolved: Caller | None = None
    scope: CompiledScope | None = None
    with engine.connect() as conn:
        for _ in range(repeats):
            t = time.perf_counter()
            caller_resolved = resolve_caller(conn, caller.principals, security)
            resolve_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            scope = compile_scope(conn, caller_resolved, security, max_terms_count=settings.opensearch.max_terms_count)
            compile_s.append(time.perf_counter() - t)
            answers = []
            for walk, times in reverify_s.items():  # both ways the statement can find the caller's groups
                t = time.perf_counter()
                answers.append(reverify(conn, caller.principals, settings, version_ids, walk=walk))
                times.append(time.perf_counter() - t)
            assert all(a == answers[0] for a in answers), "the re-verify's walks answered differently"
            verified = answers[0]
        assert caller_resolved is not None and scope is not None

        def cached_entries() -> tuple[Caller, CompiledScope]:
            resolved = resolve_caller(conn, caller.principals, security)
            return resolved, compile_scope(
                conn, resolved, security, max_terms_count=settings.opensearch.max_terms_count
            )

        _, held = _retained_bytes(cached_entries)
    chosen = scope.bounded_filter(budget)
    return {
        "principals_resolved": len(caller_resolved.principals),
        "resolve": _ms(resolve_s),
        "compile_scope": _ms(compile_s),
        "resolve_and_compile_p50_ms": round(
            statistics.median(a + b for a, b in zip(resolve_s, compile_s, strict=True)) * 1000, 2
        ),
        # What every search costs: the statement with the walk the scope chose for this caller, and each walk.
        "reverify_page": {
            **_ms(reverify_s[scope.reverify_walk]),
            "walk": scope.reverify_walk,
            "candidates": len(version_ids),
            "visible": len(verified),
        },
        "reverify_page_by_walk": {walk: _ms(times) for walk, times in reverify_s.items()},
        "cached_caller_and_scope_bytes": held,
        "visible_documents": len(scope.document_ids),
        "visible_projects": len(scope.project_ids),
        "scope_filter": {
            "kind": chosen.kind,
            "bytes": len(json.dumps(strict_filter(chosen, []))),
            "budget_bytes": budget,
            "within_budget": budget is None or len(json.dumps(chosen.clause)) <= budget,
        },
        "_documents": scope.document_ids,
    }


def _with_caller(specs: Sequence[Spec], caller: BenchCaller) -> list[Spec]:
    return [replace(s, caller=caller) for s in specs]


async def run(settings: Settings, options: PrincipalsOptions) -> dict[str, Any]:
    """The benchmark; a corpus it generates is removed at the end (also on failure), one it reuses stays."""
    return await with_generated_corpus_removed(
        settings, options.seed, options.scale, lambda label: _run(settings, options, label)
    )


async def _run(settings: Settings, options: PrincipalsOptions, new_label: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    engine = make_engine(settings)
    embedder = await asyncio.to_thread(create_embedder, settings)
    corpus = await ensure_corpus(settings, engine, options.seed, options.scale, index_missing=True, new_label=new_label)
    async_engine = make_async_engine(settings)
    service = SearchService(settings, async_engine, make_client(settings), embedder)
    operator = mint_token(settings.api, "ki-bench", roles=["operator"], ttl_s=6 * 3600)
    server = ServeChild(options.config, options.out_dir / "principals-api.log", operator)
    users: BenchUsers | None = None
    api = compare = raw = None
    try:
        reference = (await pick_callers(service, demo_callers(settings), 1, "broad"))[0]
        _progress(f"bench principals: writing a caller of 1 group and one of {options.groups} groups")
        started = time.perf_counter()
        users = await asyncio.to_thread(insert_users, engine, settings, reference, options)
        insert_s = time.perf_counter() - started
        settle_s = await wait_for_sync(settings)
        _progress(f"bench principals: rows written in {insert_s:.1f} s, projected by the sync in {settle_s:.1f} s")
        one, many = _bench_caller(settings, users.one), _bench_caller(settings, users.many)

        identifiers, doc_type = await asyncio.to_thread(_corpus_identifiers, engine, corpus.label)
        bodies = query_mix(options.seed, identifiers, doc_type)
        specs, _ = await plan_specs(service, settings, [one], bodies)
        page = sorted(corpus.version_ids)[:REVERIFY_PAGE]
        budget = settings.api.limits.max_scope_filter_bytes
        _progress("bench principals: SQL (resolve, compile, re-verify) and cache memory, per caller")
        sql = {
            name: await asyncio.to_thread(measure_sql, engine, settings, who, page, budget, options.repeats)
            for name, who in (("one_group", one), ("many_groups", many))
        }
        same_scope = sql["one_group"].pop("_documents") == sql["many_groups"].pop("_documents")
        if not same_scope:
            raise BenchError("the two bench callers see different documents; the comparison would not be fair")
        if not sql["one_group"]["visible_documents"]:
            raise BenchError("the bench callers see no document of the corpus; nothing would be measured")

        _progress(f"bench principals: starting `ki serve` on port {server.port}")
        await server.start()
        api = ApiClient(server.base, max(options.concurrency))
        compare = ApiClient(server.base, max(options.concurrency))
        raw = RawClient(settings)
        first = {}  # each caller's first search: a scope-cache miss (resolve + compile in SQL)
        for name, who in (("one_group", one), ("many_groups", many)):
            t = time.perf_counter()
            await api.call(_with_caller(specs, who)[0])
            first[name] = round((time.perf_counter() - t) * 1000, 2)
        levels = []
        for c in options.concurrency:
            _progress(f"bench principals: concurrency {c}, {options.rounds} rounds (one group / many groups / raw)")
            level = await measure_level(
                api, raw, specs, c, options.rounds, options.requests, compare, compare_specs=_with_caller(specs, many)
            )
            level.pop("latencies_ms", None)
            a, b = level["api"], level["compare"]["api"]
            level["many_over_one"] = {
                "p50": round(b["p50_ms"] / a["p50_ms"], 3),
                "p99": round(b["p99_ms"] / a["p99_ms"], 3),
            }
            _progress(f"  c={c}: one group p50 {a['p50_ms']:.1f} ms, {users.groups} groups p50 {b['p50_ms']:.1f} ms"
                      f" ({level['many_over_one']['p50']:.2f}x)")  # fmt: skip
            levels.append(level)
        scope_cache = server.metric("ki_search_scope_cache", "result")
    finally:
        server.stop()
        for closer in (api, compare, raw):
            if closer is not None:
                await closer.close()
        if users is not None:
            _progress("bench principals: deleting the bench users, groups and grants")
            await asyncio.to_thread(delete_users, engine, users)
        await service.client.close()
        await async_engine.dispose()
        engine.dispose()

    worst = max(level["many_over_one"]["p50"] for level in levels)
    return {
        "benchmark": "principals",
        "command": options.command,
        "machine": machine(load_start),
        "corpus": {"label": corpus.label, "versions": len(corpus.version_ids), "documents": corpus.documents},
        "callers": {
            "reference_demo_user": reference.subject,
            "one_group": {"subject": users.one, "groups": 1},
            "many_groups": {"subject": users.many, "groups": users.groups, "groups_with_grants": users.granting},
            "same_documents": same_scope,
        },
        "setup": {"insert_s": round(insert_s, 1), "sync_settled_s": round(settle_s, 1), "corpus_reused": corpus.reused},
        "sql": sql,
        "first_search_ms": first,
        "levels": levels,
        "api_scope_cache": scope_cache,
        "method": {
            "memberships": "in PostgreSQL (group_memberships), the token names the subject only",
            "sql": f"median of {options.repeats} runs on one connection; re-verify over {len(page)} corpus versions",
            "memory": "tracemalloc: bytes still allocated for one resolved caller and its compiled scope",
            "api": (
                "POST /v1/search to a `ki serve` child; the two callers alternate within each round beside the raw "
                "_msearch of the same legs; the scope cache is warm (each caller searched once before)"
            ),
        },
        "goal": {
            "text": f"the many-group caller's search p50 within {GOAL_RATIO_P50}x of the one-group caller's, cached",
            "worst_ratio_p50": worst,
            "met": worst <= GOAL_RATIO_P50,
        },
    }


def main(settings: Settings, options: PrincipalsOptions) -> int:
    options.out_dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(settings, options))
    path = options.out_dir / f"principals-{options.groups}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    sql = result["sql"]
    print(
        f"principals: resolve+compile {sql['one_group']['resolve_and_compile_p50_ms']:.1f} ms (1 group) vs "
        f"{sql['many_groups']['resolve_and_compile_p50_ms']:.1f} ms ({options.groups} groups); re-verify "
        f"{sql['one_group']['reverify_page']['p50_ms']:.1f} vs {sql['many_groups']['reverify_page']['p50_ms']:.1f} ms; "
        f"cache {sql['one_group']['cached_caller_and_scope_bytes'] / 1024:.0f} vs "
        f"{sql['many_groups']['cached_caller_and_scope_bytes'] / 1024:.0f} KiB"
    )
    for level in result["levels"]:
        print(f"  c={level['concurrency']}: search p50 ratio many/one {level['many_over_one']['p50']:.2f}x, "
              f"p99 {level['many_over_one']['p99']:.2f}x")  # fmt: skip
    print(f"goal (p50 <= {GOAL_RATIO_P50}x): {'met' if result['goal']['met'] else 'missed'}; wrote {path}")
    return 0

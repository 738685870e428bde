"""`ki demo` and `ki demo generate`."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
import time
from typing import Any

from aiohttp import ClientSession, web
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.demo.generator import DEMO_TAG, demo_data_exists, generate
from apps.dev.stack.paths import StackPaths
from apps.dev.worker_process import SyncWorker
from apps.runtime.progress import ProgressReport
from ki.clients import make_engine, make_sync_client
from ki.exposure import refuse_exposure
from ki.settings import Settings
from search.web.auth import mint_token
from streams.status import LagProbe, lag_summary, synced
from streams.writer import pending_vectors_of, pending_vectors_query


def _progress(line: str) -> None:
    print(line, flush=True)


def run_generate(settings: Settings, *, scale: int, seed: int) -> int:
    engine = make_engine(settings, pooled=False)
    try:
        summary = generate(engine, scale=scale, seed=seed, progress=_progress)
    finally:
        engine.dispose()
    for line in summary.lines():
        print(line)
    return 0


def _demo_user(engine: Engine) -> str:
    """A partner of the demo firm: sees a lot, but not everything (deny grants and foreign sources apply)."""
    with engine.connect() as conn:
        user = conn.execute(
            text(
                "SELECT member_principal FROM group_memberships WHERE group_principal = 'group:partner'"
                " ORDER BY member_principal LIMIT 1"
            )
        ).scalar()
    if not user:
        raise RuntimeError("no demo partner found; was the demo corpus generated? (`ki demo generate`)")
    return str(user)


def _indexed_versions(search: OpenSearch, alias: str) -> int:
    if not search.indices.exists_alias(name=alias):
        return 0
    # The highest precision threshold: exact counts far beyond any demo scale.
    cardinality = {"field": "document_version_id", "precision_threshold": 40_000}
    body = {"size": 0, "aggs": {"versions": {"cardinality": cardinality}}}
    return int(search.search(index=alias, body=body)["aggregations"]["versions"]["value"])


def _vector_rows(search: OpenSearch, alias: str) -> tuple[int, int]:
    """(rows in the index, rows of them that have their vector)."""
    if not search.indices.exists_alias(name=alias):
        return 0, 0
    rows = int(search.count(index=alias)["count"])
    waiting, _ = pending_vectors_of(search.search(index=alias, body=pending_vectors_query()))
    return rows, rows - waiting


def _wait_until_synced(settings: Settings, engine: Engine, poll_s: float = 2.0, settle_s: float = 60.0) -> None:
    """Two phases, each a bar on a terminal and plain lines otherwise, with its own rate and ETA: versions in
    the index against the versions to index (rows are written text first, so this is "keyword-searchable"),
    then rows with their vector against the rows in the index as the content lane embeds -- until every lane
    has applied every CDC event (lag 0 on every partition of each lane a worker has joined) and every version
    is in the index."""
    with engine.connect() as conn:
        total = conn.execute(
            text(
                "SELECT count(*) FROM document_versions v JOIN documents d ON d.id = v.document_id"
                " WHERE d.deleted_at IS NULL AND (d.expires_at IS NULL OR d.expires_at > now())"
                " AND btrim(v.text) <> ''"
            )  # fmt: skip
        ).scalar_one()
    search = make_sync_client(settings, timeout_s=30)
    probe = LagProbe(settings)
    started = time.monotonic()
    try:
        alias = settings.retrieval.index_name
        last_indexed, last_change = -1, time.monotonic()
        report = ProgressReport("ki demo: keyword-searchable", "versions", total, stream=sys.stdout)
        vectors: ProgressReport | None = None  # the second phase, once every version is keyword-searchable
        try:
            while True:
                lanes = probe.read_all()
                indexed = _indexed_versions(search, alias)
                if vectors is None:
                    report.update(indexed, note=lag_summary(lanes))
                if indexed >= total and vectors is None:
                    report.close()
                    elapsed = time.monotonic() - started
                    print(f"ki demo: every version keyword-searchable ({elapsed:.0f}s); vectors follow", flush=True)
                    vectors = report = ProgressReport("ki demo: vectors", "rows", stream=sys.stdout)
                if vectors is not None:
                    rows, embedded = _vector_rows(search, alias)
                    vectors.update(embedded, total=rows, note=lag_summary(lanes))
                # Lag 0 alone is not enough: Debezium may not have read the newest rows from the WAL yet, so
                # the lanes can be caught up with topics that are still growing. Every version must be in the
                # index too, unless the count stands still for `settle_s` (rows the sync skips by design).
                if indexed != last_indexed:
                    last_indexed, last_change = indexed, time.monotonic()
                # The demo's worker runs both lanes: one without members (still loading, or dropped by its
                # group) is not a lane this deployment does without, as `synced` would take it.
                both = all(lane.running for lane in lanes)
                if both and synced(lanes) and (indexed >= total or time.monotonic() - last_change > settle_s):
                    if indexed < total:
                        report.message(f"ki demo: {total - indexed} version(s) not in the index; serving anyway")
                    break
                time.sleep(poll_s)
        finally:
            report.close()
    finally:
        probe.close()
    print(f"ki demo: synced, every vector in place ({time.monotonic() - started:.0f}s)", flush=True)


def example_requests() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) pairs that return hits on the demo corpus whenever the demo user sees any of it. The filter
    example names no status: a small corpus (`--scale 12`) can leave the partner a single visible document, one
    with no final version yet (a status filter answered 0 hits in one CI run)."""
    return [
        ("/v1/search", {"query": "fristlose Kündigung wegen Zahlungsverzug", "limit": 3}),
        ("/v1/search", {"query": "§ 535 BGB", "limit": 3, "explain": True}),
        ("/v1/search/filter", {"filters": {"language": ["de"]}, "limit": 3}),
    ]


def _curl(settings: Settings, token: str, path: str, body: dict[str, Any]) -> str:
    url = f"http://{settings.api.host}:{settings.api.port}{path}"
    return (
        f"curl -s {shlex.quote(url)} -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json'"
        f" -d {shlex.quote(json.dumps(body, ensure_ascii=False))}"
    )


async def _serve(settings: Settings, token: str) -> None:
    """The search API in the foreground; first prove the example requests return hits."""
    from search.web.api import create_app

    runner = web.AppRunner(await create_app(settings), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.api.host, settings.api.port).start()
    try:
        base = f"http://{settings.api.host}:{settings.api.port}"
        headers = {"Authorization": f"Bearer {token}"}
        print("ki demo: the search API is up; example requests (token valid 24 h):", flush=True)
        async with ClientSession(headers=headers) as http:
            for path, body in example_requests():
                async with http.post(base + path, json=body) as response:
                    answer = await response.json()
                hits = answer.get("hits") or []
                top = hits[0].get("title") if hits else None
                print(f"\n  {_curl(settings, token, path, body)}", flush=True)
                print(f"  -> HTTP {response.status}, {len(hits)} hit(s)" + (f", top: {top!r}" if top else ""))
        print(f"\nki demo: the console: {base}/console/ (demo mode: sign in by picking a demo user, "
              "or paste the token above; demo-admin also sees the operations dashboard)")  # fmt: skip
        print(f"ki demo: serving on {base} (OpenAPI at {base}/openapi.json); Ctrl-C stops API and worker.")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(settings: Settings, *, scale: int, seed: int, config: str | None = None) -> int:
    from apps.dev.stack import manager

    # The console's demo-user picker mints tokens for anyone who reaches the API: the demo only, on loopback
    # (refused before anything starts otherwise).
    demo = settings.model_copy(update={"api": settings.api.model_copy(update={"demo_mode": True})})
    refuse_exposure(demo)
    print("ki demo: starting the local stack (`ki stack up`) ...", flush=True)
    code = manager.up(settings)
    if code != 0:
        return code
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops API and worker as Ctrl-C does
    engine = make_engine(settings, pooled=False)
    worker = SyncWorker(settings, StackPaths.from_settings(settings).log_file("sync-worker"), config=config)
    try:
        if demo_data_exists(engine):
            print(f"ki demo: demo data ({DEMO_TAG}-*) already in PostgreSQL; not generating more "
                  "(`ki demo generate --scale N` adds another corpus)")  # fmt: skip
        else:
            summary = generate(engine, scale=scale, seed=seed, progress=_progress)
            for line in summary.lines():
                print(line)
        user = _demo_user(engine)
        print("ki demo: " + worker.ensure(), flush=True)
        _wait_until_synced(settings, engine)
        token = mint_token(settings.api, user.removeprefix("user:"), ttl_s=86_400)  # the token's sub is the name
        print(f"ki demo: searching as {user} (a partner of the demo firm)")
        asyncio.run(_serve(demo, token))
    except KeyboardInterrupt:
        print("\nki demo: stopping")
    finally:
        worker.stop()
        engine.dispose()
    return 0

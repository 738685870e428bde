"""`ki bench freshness`: commit in PostgreSQL → visible in OpenSearch search results, under sustained load.

The whole real path is measured: PostgreSQL commit → Debezium → Kafka → sync worker → `_bulk` → refresh →
search. A load thread commits `rate` row changes per second (document-scope grant inserts and deletes on a
tagged corpus, each one an access-only change of one version). A probe thread commits one more grant on a
dedicated probe document every `probe_interval` seconds, naming a fresh principal; the main thread polls
OpenSearch for that principal in `allowed_principals` and records when it first becomes searchable.

Needs a sync worker on this stack: the one already running (its /metrics answers), or one started here.
Prints progress and one JSON object; the lag percentiles sit next to the refresh interval they are bounded by.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.bench.corpus import write_corpus
from apps.bench.stats import percentile
from apps.plotting import pyplot, save_figure
from apps.worker_process import SyncWorker
from ki.clients import make_engine, make_sync_client
from ki.settings import REPO_ROOT, Settings
from streams.writer import interval_seconds


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_corpus(engine: Engine, docs: int, tag: str) -> tuple[list[int], int, list[int]]:
    """`docs` one-version documents plus a probe document; returns (document ids, probe doc, version ids)."""
    corpus = write_corpus(
        engine,
        label=f"freshness {tag}",
        docs=docs + 1,
        text_of=lambda n: f"Vertrag Nr. {n}: Die Mietsache wird zum Monatsende übergeben. {tag}",
        principal=f"group:freshness-{tag}",
    )
    return corpus.document_ids[:-1], corpus.document_ids[-1], corpus.version_ids


class _Load(threading.Thread):
    """Commits `rate` row changes per second in small transactions (one every 50 ms) until stopped."""

    def __init__(self, engine: Engine, doc_ids: list[int], rate: int, tag: str) -> None:
        super().__init__(daemon=True)
        self.engine, self.doc_ids, self.rate, self.tag = engine, doc_ids, rate, tag
        self.stop_event = threading.Event()
        self.changes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the caller; a dead load thread must not look like low lag
            self.error = exc

    def _run(self) -> None:
        tick = 0.05
        per_tick = max(1, round(self.rate * tick))
        live: deque[int] = deque()
        rng = random.Random(7)
        started = time.monotonic()
        n = 0
        while not self.stop_event.is_set():
            with self.engine.begin() as conn:
                for _ in range(per_tick):
                    if len(live) > 200 and rng.random() < 0.5:
                        conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": live.popleft()})
                    else:
                        n += 1
                        live.append(
                            conn.execute(
                                text(
                                    "INSERT INTO grants (scope, document_id, principal, effect)"
                                    " VALUES ('document', :d, :w, 'allow') RETURNING id"
                                ),
                                {"d": rng.choice(self.doc_ids), "w": f"user:load-{self.tag}-{n}"},
                            ).scalar_one()
                        )
            self.changes += per_tick
            # Pace against the start time, so slow commits do not lower the rate unnoticed.
            behind = started + self.changes / self.rate - time.monotonic()
            if behind > 0:
                self.stop_event.wait(behind)


def run_freshness_bench(
    settings: Settings, *, rate: int = 200, seconds: float = 60, docs: int = 200, probe_interval: float = 0.5
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    engine = make_engine(settings)
    search = make_sync_client(settings, timeout_s=30)
    alias = settings.retrieval.index_name
    worker = SyncWorker(settings, REPO_ROOT / "build" / "bench-freshness-worker.log")
    _progress("freshness: " + worker.ensure())
    try:
        _progress(f"freshness: writing {docs} documents (+1 probe) through CDC")
        doc_ids, probe_doc, version_ids = _write_corpus(engine, docs, tag)
        deadline = time.monotonic() + 600
        while True:
            indexed = _count(search, alias, {"terms": {"document_version_id": [str(v) for v in version_ids]}})
            _progress(f"  indexed {indexed}/{len(version_ids)} versions")
            if indexed >= len(version_ids):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the corpus was not indexed within 600 s; is the worker keeping up?")
            time.sleep(2)

        _progress(f"freshness: {rate} row changes/s for {seconds:.0f} s, a probe every {probe_interval}s")
        load = _Load(engine, doc_ids, rate, tag)
        load.start()
        outstanding: dict[str, float] = {}
        lags: list[float] = []
        samples: list[tuple[float, float]] = []  # (seconds into the run when committed, lag)
        lost: list[str] = []
        started = time.monotonic()
        next_probe = started
        probes = 0
        last_report = started
        while True:
            now = time.monotonic()
            if now - started < seconds and now >= next_probe:
                probes += 1
                name = f"probe:{tag}-{probes}"
                with engine.begin() as conn:
                    conn.execute(
                        text(
                            "INSERT INTO grants (scope, document_id, principal, effect)"
                            " VALUES ('document', :d, :w, 'allow')"
                        ),
                        {"d": probe_doc, "w": name},
                    )
                outstanding[name] = time.monotonic()  # the commit has returned
                next_probe += probe_interval
            if outstanding:
                visible = _visible(search, alias, list(outstanding))
                seen_at = time.monotonic()
                for name in visible:
                    committed_at = outstanding.pop(name)
                    lags.append(seen_at - committed_at)
                    samples.append((round(committed_at - started, 3), round(seen_at - committed_at, 3)))
            if now - started >= seconds:
                load.stop_event.set()
                if not outstanding or now - started > seconds + 60:
                    lost = sorted(outstanding)
                    break
            if now - last_report >= 10:
                median = statistics.median(lags or [0])
                _progress(f"  {now - started:.0f}s: {len(lags)} probes seen, p50 so far {median:.2f}s")
                last_report = now
            time.sleep(0.02)
        load.join(30)
        if load.error:
            raise RuntimeError(f"the load thread failed: {load.error}")
        achieved = load.changes / seconds
        return {
            "write_rate": {"target_row_changes_per_s": rate, "achieved_row_changes_per_s": round(achieved, 1)},
            "duration_s": seconds,
            "refresh_interval": settings.opensearch.refresh_interval,
            "probes": {"sent": probes, "seen": len(lags), "never_seen_within_60s": len(lost)},
            "commit_to_visible_s": {
                "p50": round(percentile(lags, 50), 3),
                "p95": round(percentile(lags, 95), 3),
                "p99": round(percentile(lags, 99), 3),
                "max": round(max(lags), 3),
            }
            if lags
            else None,
            "samples": sorted(samples),
        }
    finally:
        worker.stop()
        engine.dispose()


def _count(search: OpenSearch, alias: str, query: dict[str, Any]) -> int:
    if not search.indices.exists_alias(name=alias):
        return 0
    response = search.count(index=alias, body={"query": query})
    return int(response["count"])


def _visible(search: OpenSearch, alias: str, names: list[str]) -> set[str]:
    """Which of these principals are searchable now (through the normal refresh, never a forced one)."""
    response = search.search(
        index=alias,
        body={
            "size": 0,
            "query": {"terms": {"allowed_principals": names}},
            "aggs": {"names": {"terms": {"field": "allowed_principals", "include": names, "size": len(names)}}},
        },
    )
    return {bucket["key"] for bucket in response["aggregations"]["names"]["buckets"]}


def _plot(result: dict[str, Any], path: Path) -> Path | None:
    """Lag of every probe over the run, with the p99 and the refresh-interval + 1 s goal."""
    plt = pyplot()
    if plt is None or not result["samples"]:
        return None
    xs, ys = zip(*result["samples"], strict=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, ys, marker=".", linestyle="-", linewidth=0.6)
    ax.axhline(result["commit_to_visible_s"]["p99"], color="tab:red", linestyle="--", label="p99")
    goal = interval_seconds(result["refresh_interval"]) + 1
    ax.axhline(goal, color="tab:green", linestyle=":", label="goal: refresh interval + 1 s")
    rate = result["write_rate"]["achieved_row_changes_per_s"]
    ax.set(xlabel="seconds into the run", ylabel="commit → visible (s)", title=f"Freshness at {rate} row changes/s")
    ax.legend()
    return save_figure(fig, path)


def main(settings: Settings, *, rate: int, seconds: float, docs: int) -> int:
    result = run_freshness_bench(settings, rate=rate, seconds=seconds, docs=docs)
    out = REPO_ROOT / "build" / "bench" / "freshness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    _progress(f"freshness: results in {out}")
    chart = _plot(result, out.with_suffix(".png"))
    _progress(f"freshness: chart in {chart}" if chart else "freshness: matplotlib not installed, no chart")
    return 0 if result["commit_to_visible_s"] else 1

"""`ki bench freshness`: commit in PostgreSQL → visible in OpenSearch search results, for access changes under
sustained load — without and with a content backlog being embedded, and at stepped access-change rates.

The whole real path is measured: PostgreSQL commit → Debezium → Kafka → sync worker → `_bulk` → refresh →
search. Everything is written into a project and source of the run's own (`apps.dev.bench.cleanup`), removed
when the run ends (also on failure or Ctrl-C) after the worker has deleted its rows from the index.

Phases, all in one run:
* **without backlog**: a load thread commits `rate` row changes per second (document-scope grant inserts and
  deletes on a tagged corpus, each an access-only change of one version); a probe every `probe_interval`
  seconds on a dedicated probe document alternates a grant insert (visible when its fresh principal is in
  `allowed_principals`) and the revocation of an earlier probe grant (visible when it is gone). The main
  thread polls OpenSearch (never forcing a refresh) and records when each probe becomes visible.
* **with backlog** (`content_backlog` chunks): the same embedded strings are first embedded directly with
  `ki.embedding.create_embedder(settings)` in-process (the embedder's standalone rate, same thread setting),
  then documents chunking to about that many chunks are committed at once and the same access load and
  probes run while the worker embeds them; the content throughput (chunks/s from commit to all visible) is
  reported next to the standalone rate.
* **access rates** (`access_rates`): the load steps through the rates, `step_seconds` each, and stops at the
  first whose probe p99 exceeds the goal (2 s). Each probe also carries the time Debezium produced its CDC
  event (read from the grants topic), and the worker's `ki_sync_freshness_seconds` histogram (commit → write
  acknowledged, scraped from its /metrics) is differenced per phase, so the lag splits into capture (commit
  → Kafka), worker (→ write) and refresh (→ visible), which names the component that saturates.

Needs a sync worker on this stack: the one already running (its /metrics answers), or one started here.
Prints progress and a table to stderr, one JSON object to stdout and to `<out>/freshness*.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.bench import cpu
from apps.dev.bench.cleanup import Footprint, Removal, bench_label, remove_bench_rows
from apps.dev.bench.corpus import write_corpus
from apps.dev.bench.search import ServeChild
from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.plotting import pyplot, save_figure
from apps.dev.worker_process import SyncWorker
from ki import exposition
from ki.clients import make_engine, make_kafka_consumer, make_sync_client
from ki.embedding import Embedder, create_embedder
from ki.settings import Settings
from projections.cdc import topic_name
from projections.chunking import TokenBudget
from projections.plan import VECTOR_PENDING
from projections.rows import AccessProjection, DocumentState, VersionState, build_rows
from search.web.auth import mint_token
from streams.topics import LANES, lane_web_port
from streams.writer import interval_seconds

GOAL_P99_S = 2.0
GRACE_S = 60.0  # how long a probe may take after its phase before it counts as never seen
BACKLOG_PARAGRAPHS = 8
BACKLOG_PARAGRAPH = (
    "Absatz {i} ({tag}): Der Auftragnehmer haftet für Schäden, die durch vorsätzliche oder grob fahrlässige "
    "Pflichtverletzungen entstehen; Nummer {n} dieses Rückstands. Die Haftung für leichte Fahrlässigkeit ist "
    "auf vorhersehbare, vertragstypische Schäden begrenzt; § 823 BGB bleibt unberührt."
)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _pcts(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p95": round(percentile(values, 95), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }


# --------------------------------------------------------------------------------------------------
# Load and probes
# --------------------------------------------------------------------------------------------------


class AccessLoad(threading.Thread):
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


@dataclass
class _Probe:
    kind: str  # "grant": visible when the principal appears; "revoke": when it is gone
    principal: str
    grant_id: int
    committed_wall: float
    committed: float  # monotonic, after the commit returned
    seen: float | None = None
    captured_wall: float | None = None  # when Debezium produced the CDC event (its `ts_ms`)

    def sample(self, started: float) -> dict[str, Any]:
        """This probe for the JSON, `at_s` counted from the start of its phase."""
        lag = None if self.seen is None else self.seen - self.committed
        capture = None if self.captured_wall is None else self.captured_wall - self.committed_wall
        return {
            "kind": self.kind,
            "at_s": round(self.committed - started, 3),
            "lag_s": None if lag is None else round(lag, 3),
            "capture_s": None if capture is None else round(capture, 3),
        }


class _Capture(threading.Thread):
    """Reads the grants CDC topic from its end (assigned partitions, nothing committed, so no consumer group
    is left behind) and notes when Debezium produced the event of each probe grant."""

    def __init__(self, settings: Settings, tag: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic_name(settings.kafka.topic_prefix, "grants")
        self.consumer = make_kafka_consumer(
            settings, f"ki-bench-freshness-{tag}", **{"enable.auto.commit": False, "auto.offset.reset": "latest"}
        )
        self.wanted: dict[int, list[_Probe]] = {}  # grant id -> probes (its insert and its revocation)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.ready = threading.Event()

    def watch(self, probe: _Probe) -> None:
        with self.lock:
            self.wanted.setdefault(probe.grant_id, []).append(probe)

    def run(self) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        try:
            partitions = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            self.consumer.assign([TopicPartition(self.topic, p, OFFSET_END) for p in partitions])
            self.ready.set()
            while not self.stop_event.is_set():
                msg = self.consumer.poll(0.2)
                if msg is None or msg.error() or msg.value() is None:
                    continue
                value = json.loads(msg.value())
                value = value.get("payload", value)
                row = value.get("after") or value.get("before") or {}
                op = value.get("op")
                with self.lock:
                    for probe in self.wanted.get(int(row.get("id", -1)), []):
                        if (probe.kind == "grant") == (op == "c") and probe.captured_wall is None:
                            probe.captured_wall = value.get("ts_ms", msg.timestamp()[1]) / 1000
        except Exception as exc:  # noqa: BLE001 - the capture split is optional: the lag figures stand alone
            _progress(f"freshness: reading the grants topic failed ({exc}); no capture figures")
        finally:
            self.ready.set()
            self.consumer.close()


def _scrape_freshness(settings: Settings) -> tuple[dict[float, float], float]:
    """The workers' `ki_sync_freshness_seconds` buckets (cumulative counts, summed over both lanes' /metrics)
    and their summed consumer lag."""
    buckets: dict[float, float] = {}
    lag = 0.0
    for port in sorted({lane_web_port(settings, lane) for lane in LANES}):
        try:
            samples = exposition.scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=2)
        except OSError:
            continue
        for le, count in exposition.histogram(samples, "ki_sync_freshness_seconds").items():
            buckets[le] = buckets.get(le, 0.0) + count
        lag += exposition.total(samples, "ki_sync_consumer_lag")
    return buckets, lag


def _bucket_percentiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any] | None:
    """p50/p99 of the events written between two scrapes, as the bucket bound they fall under."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None

    def at(q: float) -> float:
        return next(le for le in sorted(delta) if delta[le] >= q * total)

    return {"observations": int(total), "p50_at_most": at(0.5), "p99_at_most": at(0.99)}


@dataclass
class _Phase:
    name: str
    rate: int
    started: float = 0.0  # monotonic
    probes: list[_Probe] = field(default_factory=list)
    seconds: float = 0.0
    achieved: float = 0.0
    worker: dict[str, Any] | None = None
    consumer_lag_at_end: float | None = None
    cpu_cores: dict[str, float] = field(default_factory=dict)  # while the load ran (apps.dev.bench.cpu)

    def lags(self, kind: str | None = None) -> list[float]:
        return [p.seen - p.committed for p in self.probes if p.seen is not None and kind in (None, p.kind)]

    def summary(self) -> dict[str, Any]:
        captures = [p.captured_wall - p.committed_wall for p in self.probes if p.captured_wall is not None]
        lost = sum(1 for p in self.probes if p.seen is None)
        p99 = _pcts(self.lags())
        return {
            "target_row_changes_per_s": self.rate,
            "achieved_row_changes_per_s": round(self.achieved, 1),
            "duration_s": round(self.seconds, 1),
            "probes": {"sent": len(self.probes), "seen": len(self.probes) - lost, "never_seen": lost},
            "commit_to_visible_s": p99,
            "grant_insert_to_visible_s": _pcts(self.lags("grant")),
            "revocation_to_visible_s": _pcts(self.lags("revoke")),
            "commit_to_captured_s": _pcts(captures),
            "worker_commit_to_write_s": self.worker,
            "consumer_lag_at_end": self.consumer_lag_at_end,
            "cpu_cores": self.cpu_cores,
            "saturated": _saturated(self, p99, _pcts(captures)),
        }


def _saturated(phase: _Phase, lag: dict[str, Any] | None, capture: dict[str, Any] | None) -> str | None:
    """Which component holds the p99 over the goal, from the split of the lag."""
    if lag is not None and lag["p99"] <= GOAL_P99_S and not any(p.seen is None for p in phase.probes):
        return None
    if phase.achieved < 0.9 * phase.rate:
        return "the load itself: PostgreSQL commits did not reach the target rate"
    if capture is not None and capture["p99"] > GOAL_P99_S / 2:
        return "Debezium capture (commit → CDC event in Kafka)"
    worker = phase.worker
    if worker is not None and worker["p99_at_most"] > GOAL_P99_S:
        return "sync worker (CDC event → write acknowledged by OpenSearch)"
    return "refresh / search (write acknowledged → visible)"


class _Run:
    """One freshness run's shared state: connections, the probe document, the capture thread."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        search: OpenSearch,
        tag: str,
        probe_doc: int,
        processes: Mapping[str, int],
    ) -> None:
        self.settings, self.engine, self.search, self.tag = settings, engine, search, tag
        self.processes = processes  # component -> the pid at the top of its process tree, for CPU figures
        self.probe_doc = probe_doc
        self.alias = settings.retrieval.index_name
        self.capture = _Capture(settings, tag)
        self.granted: deque[_Probe] = deque()  # probe grants seen and not yet revoked
        self.count = 0

    def probe(self) -> _Probe:
        """Commit the next probe: revoke the oldest seen probe grant every second time, else grant."""
        self.count += 1
        wall = time.time()
        with self.engine.begin() as conn:
            if self.count % 2 == 0 and self.granted:
                old = self.granted.popleft()
                conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": old.grant_id})
                probe = _Probe("revoke", old.principal, old.grant_id, wall, 0.0)
            else:
                name = f"probe:{self.tag}-{self.count}"
                grant = conn.execute(
                    text(
                        "INSERT INTO grants (scope, document_id, principal, effect)"
                        " VALUES ('document', :d, :w, 'allow') RETURNING id"
                    ),
                    {"d": self.probe_doc, "w": name},
                ).scalar_one()
                probe = _Probe("grant", name, int(grant), wall, 0.0)
        probe.committed = time.monotonic()  # the commit has returned
        self.capture.watch(probe)
        return probe

    def settle(self, outstanding: list[_Probe]) -> list[_Probe]:
        """Mark the probes now visible; returns those still outstanding."""
        present = _present(self.search, self.alias, sorted({p.principal for p in outstanding}))
        now = time.monotonic()
        left = []
        for p in outstanding:
            if (p.principal in present) == (p.kind == "grant"):
                p.seen = now
                if p.kind == "grant":
                    self.granted.append(p)
            else:
                left.append(p)
        return left

    def phase(
        self,
        name: str,
        rate: int,
        doc_ids: list[int],
        *,
        seconds: float,
        probe_interval: float,
        until: Callable[[], bool] | None = None,
        max_seconds: float | None = None,
    ) -> _Phase:
        """Load at `rate` with probes for `seconds` (or, with `until`, until it says done), then wait up to
        GRACE_S for the last probes."""
        result = _Phase(name, rate)
        before, _ = _scrape_freshness(self.settings)
        load = AccessLoad(self.engine, doc_ids, rate, f"{self.tag}-{name}")
        load.start()
        cpu_start, cpu_end = cpu.sample(self.processes), None
        outstanding: list[_Probe] = []
        started = result.started = time.monotonic()
        next_probe, last_report, ended = started, started, None
        try:
            while True:
                now = time.monotonic()
                if ended is None:
                    done = until() if until is not None else now - started >= seconds
                    if done or (max_seconds is not None and now - started >= max_seconds):
                        ended = now
                        load.stop_event.set()
                        cpu_end = cpu.sample(self.processes)
                        result.seconds = now - started
                if ended is None and now >= next_probe:
                    probe = self.probe()
                    result.probes.append(probe)
                    outstanding.append(probe)
                    next_probe += probe_interval
                if outstanding:
                    outstanding = self.settle(outstanding)
                if ended is not None and (not outstanding or now - ended > GRACE_S):
                    break
                if now - last_report >= 10:
                    lags = result.lags()
                    _progress(
                        f"  {name}: {now - started:.0f}s, {len(lags)}/{len(result.probes)} probes seen,"
                        f" p50 so far {statistics.median(lags or [0]):.2f}s"
                    )
                    last_report = now
                time.sleep(0.02)
        finally:
            load.stop_event.set()
            load.join(30)
        if load.error:
            raise RuntimeError(f"the load thread failed: {load.error}")
        result.achieved = load.changes / max(result.seconds, 1e-9)
        if cpu_end is not None:
            result.cpu_cores = cpu.cores_used(cpu_start, cpu_end)
        after, lag = _scrape_freshness(self.settings)
        result.worker = _bucket_percentiles(before, after)
        result.consumer_lag_at_end = lag if after else None
        return result


NEW_DOCUMENT_INTERVAL_S = 2.0  # one new document per this many seconds during the backlog
NEW_DOCUMENT_GIVE_UP_S = 60.0  # a new document not found by then counts as never found


class _NewDocuments(threading.Thread):
    """New-document probes through the API: every `interval` seconds a new document (one paragraph with a
    word of its own and a file number) is committed, granted to the probe caller; each is then looked for
    with `POST /v1/search` as that caller, by its word and by its file number, until found. Records commit
    -> found per query kind (the hard goal of text-first rows: found while a content backlog is embedded)."""

    def __init__(self, engine: Engine, project: int, label: str, base_url: str, token: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.engine, self.project, self.label, self.base, self.token = engine, project, label, base_url, token
        self.tag = label.rsplit(" ", 1)[1]
        self.interval = interval
        self.stop_event = threading.Event()
        self.found: dict[str, list[float]] = {"keyword": [], "identifier": []}
        self.committed = 0
        self.version_ids: list[int] = []
        self.vectors_pending_seen = 0
        self.error: BaseException | None = None
        self.started = time.monotonic()
        # per probe found: seconds from the start of the probes to its commit, kind, commit -> found,
        # searches it took, and the slowest of those searches (to tell indexing from answer time)
        self.probes: list[tuple[float, str, float, int, float]] = []

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _commit(self, n: int) -> tuple[float, int, dict[str, str]]:
        word, number = f"neudok{self.tag}x{n}", f"NP {n}/{self.tag}"
        with self.engine.begin() as conn:
            doc = conn.execute(
                text("INSERT INTO documents (project_id, title, identifiers) VALUES (:p, :t, :i) RETURNING id"),
                {"p": self.project, "t": f"Neuer Schriftsatz {n} {self.tag}", "i": [number]},
            ).scalar_one()
            version = conn.execute(
                text(
                    "INSERT INTO document_versions (document_id, version_no, status, text)"
                    " VALUES (:d, 1, 'final', :b) RETURNING id"
                ),
                {"d": doc, "b": f"{word}: Der Schriftsatz wird fristgerecht eingereicht und begründet."},
            ).scalar_one()
            self.version_ids.append(int(version))
            # Observed at an object of the run's source, as every corpus document (no observation: no access).
            obj = conn.execute(
                text(
                    "INSERT INTO source_objects (source_id, external_ref)"
                    " SELECT id, :r FROM sources WHERE name = :label RETURNING id"
                ),
                {"r": f"{self.label}-new-{n}", "label": self.label},
            ).scalar_one()
            conn.execute(
                text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
                {"v": version, "o": obj},
            )
        return time.monotonic(), int(doc), {"keyword": word, "identifier": number}

    def _search(self, query: str, document: int) -> bool:
        """Whether the answer to `query` names `document` (other hits -- the semantic leg finds neighbours
        of any text -- are not it). Sets `last_search_s`, the answer's time."""
        request = urllib.request.Request(
            f"{self.base}/v1/search", data=json.dumps({"query": query, "limit": 10}).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {self.token}")
        asked = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 503:  # e.g. overloaded for a moment: look again
                return False
            raise
        finally:
            self.last_search_s = time.monotonic() - asked
        found = any(hit["document_id"] == document for hit in body["hits"])
        if found and body.get("mode", {}).get("vectors_pending"):
            self.vectors_pending_seen += 1
        return found

    def _run(self) -> None:
        outstanding: list[tuple[float, int, str, str]] = []  # (committed, document, kind, query)
        searches: dict[tuple[int, str], list[float]] = {}  # (document, kind) -> each search's seconds
        next_commit = time.monotonic()
        while not self.stop_event.is_set() or outstanding:
            now = time.monotonic()
            if not self.stop_event.is_set() and now >= next_commit:
                self.committed += 1
                committed, document, queries = self._commit(self.committed)
                outstanding += [(committed, document, kind, query) for kind, query in queries.items()]
                next_commit += self.interval
            left = []
            for committed, document, kind, query in outstanding:
                hit = self._search(query, document)
                took = searches.setdefault((document, kind), [])
                took.append(self.last_search_s)
                if hit:
                    lag = time.monotonic() - committed
                    self.found[kind].append(lag)
                    self.probes.append((round(committed - self.started, 2), kind, round(lag, 3), len(took),
                                        round(max(took), 3)))  # fmt: skip
                elif time.monotonic() - committed < NEW_DOCUMENT_GIVE_UP_S:
                    left.append((committed, document, kind, query))
            outstanding = left
            time.sleep(0.05)

    def figures(self) -> dict[str, Any]:
        return {
            "documents": self.committed,
            "interval_s": self.interval,
            "commit_to_found_s": {kind: _pcts(lags) for kind, lags in self.found.items()},
            "never_found": {kind: self.committed - len(lags) for kind, lags in self.found.items()},
            "answers_saying_vectors_pending": self.vectors_pending_seen,
            "slowest_probes": [
                dict(
                    zip(("committed_at_s", "kind", "commit_to_found_s", "searches", "slowest_search_s"), p, strict=True)
                )
                for p in sorted(self.probes, key=lambda p: -p[2])[:10]
            ],
        }


def _present(search: OpenSearch, alias: str, names: list[str]) -> set[str]:
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


def _count(search: OpenSearch, alias: str, query: dict[str, Any]) -> int:
    if not search.indices.exists_alias(name=alias):
        return 0
    return int(search.count(index=alias, body={"query": query})["count"])


def wait_indexed(search: OpenSearch, alias: str, version_ids: list[int], rows: int | None, timeout: float) -> None:
    """Until every version has its rows with their vectors (or, with `rows`, that many rows are searchable):
    a phase that starts while the content lane still embeds the load's documents measures the two lanes
    racing for the same rows, not access changes."""
    query = {"terms": {"document_version_id": [str(v) for v in version_ids]}}
    done = {"bool": {"filter": query, "must_not": {"exists": {"field": VECTOR_PENDING}}}}
    deadline = time.monotonic() + timeout
    while True:
        if rows is None:
            body = {"size": 0, "query": done, "aggs": {"v": {"cardinality": {"field": "document_version_id"}}}}
            want = len(version_ids)
            have = 0  # on a fresh stack the worker creates the index with its first batch
            if search.indices.exists_alias(name=alias):
                answer = search.search(index=alias, body=body)
                pending = _count(search, alias, {"bool": {"filter": [query, {"exists": {"field": VECTOR_PENDING}}]}})
                have = int(answer["aggregations"]["v"]["value"]) if not pending else 0
        else:
            have, want = _count(search, alias, query), rows
        _progress(f"  indexed {have}/{want}")
        if have >= want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not indexed within {timeout:.0f} s; is the sync worker keeping up?")
        time.sleep(2)


# --------------------------------------------------------------------------------------------------
# Content backlog
# --------------------------------------------------------------------------------------------------


@dataclass
class _Backlog:
    titles: list[str]
    texts: list[str]
    embed_inputs: list[str]  # exactly what the sync will embed for these documents


def _plan_backlog(settings: Settings, embedder: Embedder, chunks: int, label: str) -> _Backlog:
    """Documents of BACKLOG_PARAGRAPHS distinct paragraphs until their rows (as `build_rows` cuts them for
    this embedder's window) reach `chunks`."""
    budget = TokenBudget(embedder.count_tokens, embedder.max_tokens)
    access = AccessProjection((), (), 1)
    plan = _Backlog([], [], [])
    while len(plan.embed_inputs) < chunks:
        n = len(plan.titles)
        title = f"Rückstand {n} ({label})"
        body = "\n".join(BACKLOG_PARAGRAPH.format(i=i, n=n, tag=label) for i in range(BACKLOG_PARAGRAPHS))
        rows = build_rows(
            DocumentState(id=1, project_id=1, title=title),
            VersionState(id=1, document_id=1, version_no=1, status="draft", language="de", doc_date=None, text=body),
            doc_type_ancestors=(),
            doc_type_label=None,
            matter_title=None,
            access=access,
            settings=settings.retrieval,
            token_budget=budget,
        )
        plan.titles.append(title)
        plan.texts.append(body)
        plan.embed_inputs += [row.embed_input for row in rows]
    return plan


def _standalone_rate(embedder: Embedder, inputs: list[str], batch: int) -> dict[str, Any]:
    """The embedder alone on the backlog's strings, in-process: chunks/s."""
    started = time.perf_counter()
    for i in range(0, len(inputs), batch):
        embedder.embed(inputs[i : i + batch])
    seconds = time.perf_counter() - started
    return {"chunks": len(inputs), "seconds": round(seconds, 2), "chunks_per_s": round(len(inputs) / seconds, 2)}


def _write_backlog(engine: Engine, project: int, plan: _Backlog) -> list[int]:
    """The backlog documents in one transaction (CDC sees them at once); returns their version ids."""
    versions = []
    with engine.begin() as conn:
        for title, body in zip(plan.titles, plan.texts, strict=True):
            doc = conn.execute(
                text("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id"),
                {"p": project, "t": title},
            ).scalar_one()
            versions.append(
                int(
                    conn.execute(
                        text(
                            "INSERT INTO document_versions (document_id, version_no, status, text)"
                            " VALUES (:d, 1, 'draft', :t) RETURNING id"
                        ),
                        {"d": doc, "t": body},
                    ).scalar_one()
                )
            )
    return versions


class _Drain:
    """Polls how many backlog rows are searchable by their words (text first) and how many have their
    vector (every 0.5 s, from the phase's loop)."""

    def __init__(self, search: OpenSearch, alias: str, version_ids: list[int], rows: int) -> None:
        self.search, self.alias, self.rows = search, alias, rows
        versions = {"terms": {"document_version_id": [str(v) for v in version_ids]}}
        self.text_query = versions
        self.query = {"bool": {"filter": versions, "must_not": {"exists": {"field": VECTOR_PENDING}}}}
        self.committed = time.monotonic()
        self.samples: list[tuple[float, int]] = []
        self.all_text_s: float | None = None  # commit -> every row searchable by its words
        self.last_poll = 0.0
        self.last_report = self.committed

    def done(self) -> bool:
        now = time.monotonic()
        if now - self.last_poll >= 0.5:
            self.last_poll = now
            if self.all_text_s is None and _count(self.search, self.alias, self.text_query) >= self.rows:
                self.all_text_s = round(now - self.committed, 2)
            have = _count(self.search, self.alias, self.query)
            if not self.samples or have != self.samples[-1][1]:
                self.samples.append((round(now - self.committed, 2), have))
            if now - self.last_report >= 10:
                _progress(f"  backlog: {have}/{self.rows} chunks with vectors ({now - self.committed:.0f}s)")
                self.last_report = now
        return bool(self.samples) and self.samples[-1][1] >= self.rows

    def figures(self, standalone: dict[str, Any]) -> dict[str, Any]:
        drained = self.samples[-1][1] >= self.rows if self.samples else False
        first = next(((t, n) for t, n in self.samples if n > 0), None)
        end_t, end_n = self.samples[-1] if self.samples else (0.0, 0)
        rate = end_n / end_t if end_t > 0 else 0.0
        steady = (end_n - first[1]) / (end_t - first[0]) if first and end_t > first[0] else None
        return {
            "chunks": self.rows,
            "drained": drained,
            "commit_to_all_text_searchable_s": self.all_text_s,
            "commit_to_all_visible_s": end_t if drained else None,
            "chunks_per_s": round(rate, 2),
            "chunks_per_s_after_first_visible": round(steady, 2) if steady is not None else None,
            "embedder_standalone_chunks_per_s": standalone["chunks_per_s"],
            "ratio_to_standalone": round(rate / standalone["chunks_per_s"], 3) if standalone["chunks_per_s"] else None,
            "progress": self.samples,
        }


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FreshnessOptions:
    rate: int = 200
    seconds: float = 60
    docs: int = 200
    probe_interval: float = 0.5
    content_backlog: int = 0
    access_rates: tuple[int, ...] = ()
    step_seconds: float = 20
    past_break: bool = False  # every step, also after the p99 broke the goal (CPU profile of each rate)
    config: str | None = None
    command: str = "ki bench freshness"


def _processes(settings: Settings, worker: SyncWorker, api: ServeChild | None) -> dict[str, int]:
    """The top pid of each component whose CPU a step reports: the stack's services, the sync worker (ours or
    the one already running), the search API and this benchmark (its load threads and probes)."""
    found = cpu.stack_processes(settings)
    worker_pid = worker.child.pid if worker.child is not None else cpu.find_pid("apps.cli sync run")
    if worker_pid is not None:
        found["sync worker"] = worker_pid
    if api is not None and api.child.alive:
        found["search API"] = api.child.pid
    return found


def run_freshness_bench(settings: Settings, options: FreshnessOptions) -> dict[str, Any]:
    if options.rate < 1 or options.seconds <= 0 or options.docs < 1 or options.content_backlog < 0:
        raise ValueError("rate, seconds and docs must be positive and content_backlog at least 0")
    if any(r < 1 for r in options.access_rates):
        raise ValueError("every access rate must be at least 1 row change per second")
    label = bench_label("freshness")
    tag = label.rsplit(" ", 1)[1]
    load_start = os.getloadavg()
    engine = make_engine(settings)
    search = make_sync_client(settings, timeout_s=30)
    alias = settings.retrieval.index_name
    worker = SyncWorker(settings, REPO_ROOT / "build" / "bench-freshness-worker.log", config=options.config)
    _progress("freshness: " + worker.ensure())
    result: dict[str, Any] = {"benchmark": "freshness", "command": options.command, "label": label}
    run: _Run | None = None
    removal: Removal | None = None
    api: ServeChild | None = None
    try:
        _progress(f"freshness: writing {options.docs} documents (+1 probe) as `{label}` (removed at the end)")
        corpus = write_corpus(
            engine,
            label=label,
            docs=options.docs + 1,
            text_of=lambda n: f"Vertrag Nr. {n}: Die Mietsache wird zum Monatsende übergeben. {tag}",
            principal=f"group:freshness-{tag}",
        )
        doc_ids, probe_doc = corpus.document_ids[:-1], corpus.document_ids[-1]
        result["postgres"] = {"project": corpus.project, "version_ids": corpus.version_ids}
        wait_indexed(search, alias, corpus.version_ids, None, 600)

        backlog: _Backlog | None = None
        standalone: dict[str, Any] | None = None
        if options.content_backlog:
            embedder = create_embedder(settings)
            backlog = _plan_backlog(settings, embedder, options.content_backlog, label)
            _progress(
                f"freshness: the embedder alone on the backlog's {len(backlog.embed_inputs)} chunks"
                f" ({embedder.signature}, embedding.threads={settings.embedding.threads})"
            )
            standalone = _standalone_rate(embedder, backlog.embed_inputs, settings.embedding.batch_size)
            _progress(f"  {standalone['chunks_per_s']} chunks/s")
            del embedder  # its threads and memory are the worker's during the backlog
            # New documents are looked for through the API, as a caller granted the run's project.
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :w, 'allow')"
                    ),
                    {"p": corpus.project, "w": f"user:newdoc-{tag}"},
                )
            operator = mint_token(settings.api, f"freshness-{tag}", roles=["operator"])
            api = ServeChild(options.config, REPO_ROOT / "build" / "bench-freshness-api.log", operator)
            _progress("freshness: starting `ki serve` for the new-document probes")
            asyncio.run(api.start())

        run = _Run(settings, engine, search, tag, probe_doc, _processes(settings, worker, api))
        run.capture.start()
        run.capture.ready.wait(15)

        _progress(f"freshness: without backlog: {options.rate} row changes/s for {options.seconds:.0f} s")
        quiet = run.phase(
            "quiet", options.rate, doc_ids, seconds=options.seconds, probe_interval=options.probe_interval
        )
        phases = {"without_backlog": quiet}

        if backlog is not None and standalone is not None:
            rows = len(backlog.embed_inputs)
            _progress(f"freshness: with backlog: {len(backlog.titles)} documents, {rows} chunks to embed")
            backlog_versions = _write_backlog(engine, corpus.project, backlog)
            drain = _Drain(search, alias, backlog_versions, rows)
            result["postgres"]["version_ids"] += backlog_versions
            limit = max(300.0, 3 * rows / max(standalone["chunks_per_s"], 0.1) + 60)
            assert api is not None
            caller = mint_token(settings.api, f"newdoc-{tag}")
            probes = _NewDocuments(engine, corpus.project, label, api.base, caller, NEW_DOCUMENT_INTERVAL_S)
            probes.start()
            try:
                phases["with_backlog"] = run.phase(
                    "backlog", options.rate, doc_ids, seconds=options.seconds, probe_interval=options.probe_interval,
                    until=drain.done, max_seconds=limit,
                )  # fmt: skip
            finally:
                probes.stop_event.set()
                probes.join(120)
                result["postgres"]["version_ids"] += probes.version_ids  # also when the phase failed
            if probes.error is not None:
                raise RuntimeError(f"the new-document probes failed: {probes.error}")
            result["content_backlog"] = {"target_chunks": options.content_backlog, **drain.figures(standalone)}
            result["content_backlog"]["embedder_standalone"] = standalone
            result["content_backlog"]["new_documents_through_the_api"] = probes.figures()

        steps = []
        for rate in options.access_rates:
            _progress(f"freshness: access rate {rate} row changes/s for {options.step_seconds:.0f} s")
            step = run.phase(
                f"rate{rate}", rate, doc_ids, seconds=options.step_seconds, probe_interval=options.probe_interval
            )
            summary = {"rate": rate, **step.summary()}
            steps.append(summary)
            p99 = (summary["commit_to_visible_s"] or {}).get("p99", float("inf"))
            _progress(f"  p99 {p99:.2f}s" + (f"; saturated: {summary['saturated']}" if summary["saturated"] else ""))
            busy = sorted(summary["cpu_cores"].items(), key=lambda kv: -kv[1])
            _progress("  cores busy: " + ", ".join(f"{name} {cores:.2f}" for name, cores in busy))
            if (p99 > GOAL_P99_S or summary["probes"]["never_seen"]) and not options.past_break:
                break
        if options.access_rates:
            broke = next((s for s in steps if s["saturated"] is not None), None)
            # (with --past-break a later step may pass by chance: the goal holds up to the first break only)
            within = [s["rate"] for s in steps[: steps.index(broke) if broke else len(steps)]]
            result["access_rates"] = {
                "goal_p99_s": GOAL_P99_S,
                "step_seconds": options.step_seconds,
                "highest_rate_within_goal": max(within) if within else None,
                "broke_at": broke["rate"] if broke else None,
                "saturated_component": broke["saturated"] if broke else None,
                "steps": steps,
            }

        result["access"] = {name: phase.summary() for name, phase in phases.items()}
        # The headline figures of the run without backlog, where earlier versions of this benchmark had them.
        result["write_rate"] = {
            "target_row_changes_per_s": options.rate,
            "achieved_row_changes_per_s": round(quiet.achieved, 1),
        }
        result["duration_s"] = options.seconds
        result["probes"] = result["access"]["without_backlog"]["probes"]
        result["commit_to_visible_s"] = result["access"]["without_backlog"]["commit_to_visible_s"]
        result["samples"] = {name: [p.sample(phase.started) for p in phase.probes] for name, phase in phases.items()}
    finally:
        if run is not None:
            run.capture.stop_event.set()
        try:
            # While the worker still runs: it deletes the index rows through CDC.
            removal = remove_bench_rows(settings, Footprint.of_label(label), what="freshness")
        finally:
            if api is not None:
                api.stop()
            worker.stop()
            search.close()
            engine.dispose()
    result["cleanup"] = removal.as_dict()
    result["refresh_interval"] = settings.opensearch.refresh_interval
    emb = settings.embedding
    result["embedding"] = {"provider": emb.provider, "model": emb.model, "threads": emb.threads}
    if emb.provider == "openai":  # the server's address stays out: it may name an internal host
        result["embedding"] |= {"batch_size": emb.batch_size, "concurrency": emb.concurrency}
    result["machine"] = machine(load_start)
    return result


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _fmt(p: dict[str, Any] | None, key: str) -> str:
    return "—" if not p else f"{p[key]:.2f}"


def table(result: dict[str, Any]) -> str:
    """The run's figures as a readable table (Markdown, so it can go into BENCHMARKS.md as is)."""
    lines = [
        "| access changes | rate (achieved/s) | probes seen/sent | p50 s | p95 s | p99 s | commit→Kafka p99 s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = [(name.replace("_", " "), s) for name, s in result.get("access", {}).items()]
    rows += [(f"rate step {s['rate']}/s", s) for s in result.get("access_rates", {}).get("steps", [])]
    for name, s in rows:
        lag = s["commit_to_visible_s"]
        lines.append(
            f"| {name} | {s['achieved_row_changes_per_s']} | {s['probes']['seen']}/{s['probes']['sent']}"
            f" | {_fmt(lag, 'p50')} | {_fmt(lag, 'p95')} | {_fmt(lag, 'p99')}"
            f" | {_fmt(s['commit_to_captured_s'], 'p99')} |"
        )
    backlog = result.get("content_backlog")
    if backlog:
        lines += [
            "",
            f"content backlog: {backlog['chunks']} chunks, {backlog['chunks_per_s']} chunks/s commit → all visible"
            f" ({'drained' if backlog['drained'] else 'NOT drained'}); embedder alone"
            f" {backlog['embedder_standalone_chunks_per_s']} chunks/s; ratio {backlog['ratio_to_standalone']}",
        ]
    rates = result.get("access_rates")
    if rates:
        lines.append(
            f"highest access-change rate with p99 ≤ {rates['goal_p99_s']} s: {rates['highest_rate_within_goal']}/s;"
            + (
                f" broke at {rates['broke_at']}/s ({rates['saturated_component']})"
                if rates["broke_at"]
                else " never broke in the rates tried"
            )  # fmt: skip
        )
    cleanup = result.get("cleanup")
    if cleanup:
        lines.append(
            f"cleanup: {cleanup['versions']} versions removed from PostgreSQL,"
            f" {cleanup['index_rows_at_start']} index rows removed"
            f" ({cleanup['index_rows_removed_by_worker']} by the worker), {cleanup['index_rows_left']} left"
        )
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> Path | None:
    """Lag of every probe over each phase, with the goal."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, samples in result["samples"].items():
        points = [(s["at_s"], s["lag_s"]) for s in samples if s["lag_s"] is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=".", linestyle="-", linewidth=0.6, label=name.replace("_", " "))
    goal = interval_seconds(result["refresh_interval"]) + 1
    ax.axhline(goal, color="tab:green", linestyle=":", label="refresh interval + 1 s")
    ax.set(xlabel="seconds into the phase", ylabel="commit → visible (s)", title="Access changes: commit → visible")
    ax.legend()
    return save_figure(fig, path)


def output_name(options: FreshnessOptions) -> str:
    name = "freshness"
    if options.content_backlog:
        name += f"-backlog{options.content_backlog}"
    if options.access_rates:
        name += "-rates"
    return name + ".json"


def main(settings: Settings, options: FreshnessOptions, out_dir: Path | None = None) -> int:
    result = run_freshness_bench(settings, options)
    out = (out_dir or REPO_ROOT / "benchmarks") / output_name(options)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2, ensure_ascii=False))
    _progress("\n" + table(result) + "\n")
    _progress(f"freshness: results in {out}")
    chart = _plot(result, out.with_suffix(".png"))
    _progress(f"freshness: chart in {chart}" if chart else "freshness: matplotlib not installed, no chart")
    return 0 if result["commit_to_visible_s"] else 1

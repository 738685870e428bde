"""`ki bench first-load`: a firm's first load through the real CDC path, until every version is
keyword-searchable and then until its vectors are in place, with access changes and searches meanwhile.

Unlike `ki bench corpus` (a direct bulk path with a bank of shared vectors) nothing is taken around the
sync: the demo generator (`ki demo generate`'s German contracts, opinions and decisions with their grants,
source objects and observations) writes `scale` versions to PostgreSQL **one document per transaction** (the document,
its versions, objects, observations and grants) or whole documents of about `--versions-per-transaction`
versions per transaction (an upstream system's import batch), as an upstream system commits them, while
the Debezium connector runs (its stream, not its snapshot: the stack's connector exists before the load and
a firm's first load arrives through the same stream as every later change; the snapshot would need the
connector created after the data, which no running installation does). Both lanes of the sync worker
(the one running, or `ki sync run` started here) turn it into the index: text-first rows, then vectors.

Measured, all in one run (JSON `<out>/first-load-<chunks>.json`):
* **keyword phase**: from the first commit until every version the run wrote has its rows in the index
  (exact: the index's distinct `document_version_id`s of the run's projects against PostgreSQL's live
  versions of them); progress lines and samples (versions written, versions and chunks searchable, chunks
  with vectors); cores per component while PostgreSQL is written (`writing`) and after, until searchable
  (`catching_up`), from `apps.dev.bench.cpu`.
* **access changes** during the load at a steady rate (`--access-rate`, document grants inserted and
  deleted on documents of the run's own), with probes every `--probe-interval` s whose commit -> visible
  lag gives p50/p99 (`apps.dev.bench.freshness`'s measurement, the same probes and capture split).
* **searches** during the load through `ki serve` (`POST /v1/search`, a demo partner who may see every
  project), one every `--search-interval` s: p50/p99 and how many failed, per phase.
* **vector phase**: after the keyword phase, until every chunk has its vector or for `--vector-seconds`
  (a time box: a real first load embeds for hours on two cores), the vectors/s the content lane reached,
  against the embedder's own rate measured in the same run, in-process and alone (the worker stopped when
  this run started it), with the content lane's model-run setting, on the `text` of a random sample of the
  run's chunks (the lane embeds the same text after a short context header, a few tokens more).

What the run wrote is removed at the end (`apps.dev.bench.cleanup`) unless `--keep`: through CDC when a worker
runs, directly from the index when this run stopped its own for the embedder's measurement.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.bench import cpu
from apps.dev.bench.cleanup import Footprint, Removal, bench_label, remove_bench_rows
from apps.dev.bench.corpus import write_corpus
from apps.dev.bench.freshness import _Phase, _Run, wait_indexed
from apps.dev.bench.search import ServeChild
from apps.dev.bench.soak import call_api
from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.demo.generator import NAME_SEPARATOR, generate, users
from apps.dev.worker_process import SyncWorker
from ki.clients import make_engine, make_sync_client
from ki.embedding import create_embedder
from ki.settings import Settings, with_overrides
from projections.plan import VECTOR_PENDING
from search.web.auth import mint_token
from streams.status import LagProbe
from streams.topics import LANES

QUERIES = ("Kündigung der Mietsache", "Haftung für Schäden", "Gewährleistung Mangel", "Vertragsstrafe",
           "Zuständigkeit Landgericht", "Schadensersatz § 823 BGB", "Räumungsklage", "Datenschutzvorfall")  # fmt: skip
POLL_S = 2.0


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _access_lane_caught_up(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Wait until the access lane has no lag before the load starts: a previous run's cleanup, written through CDC
    while its worker was stopped, would otherwise sit in the lane's stream ahead of this run's first events (and
    its access probes). The content lane may lag (a kept corpus embeds for hours): its lag is only recorded."""
    probe = LagProbe(settings)
    began = said = time.monotonic()
    try:
        lag = {lane: probe.read(lane).total for lane in LANES}
        while not (access := probe.read("access")).caught_up:
            if time.monotonic() - began > timeout_s:
                raise RuntimeError(f"the access lane is still {access.total} events behind after {timeout_s:.0f} s")
            if time.monotonic() - said >= 10:
                _progress(f"first-load: waiting for the access lane to catch up first: {access.total} events behind")
                said = time.monotonic()
            time.sleep(1.0)
    finally:
        probe.close()
    return {"lag_events": lag, "access_caught_up_after_s": round(time.monotonic() - began, 1)}


def _pcts(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"n": len(values), "p50": round(percentile(values, 50), 1), "p99": round(percentile(values, 99), 1),
            "max": round(max(values), 1)}  # fmt: skip


def size_name(chunks: int) -> str:
    """The load's size in file names, to one significant digit: 101,234 chunks -> 100k, 987 -> 1k."""
    magnitude = 10 ** max(3, len(str(max(chunks, 1))) - 1)
    nominal = max(magnitude, round(chunks / magnitude) * magnitude)
    return f"{nominal // 1_000_000}m" if nominal >= 1_000_000 else f"{nominal // 1000}k"


# --------------------------------------------------------------------------------------------------
# The writer, the searches and the index counts
# --------------------------------------------------------------------------------------------------


class _Writer(threading.Thread):
    """The demo corpus into PostgreSQL, whole documents (versions, objects, observations, grants) per transaction:
    one document, or as many as make `per_transaction` versions (an upstream system's import batch)."""

    def __init__(self, engine: Engine, scale: int, seed: int, label: str, per_transaction: int = 1) -> None:
        super().__init__(daemon=True)
        self.engine, self.scale, self.seed, self.label = engine, scale, seed, label
        self.per_transaction = per_transaction
        self.versions = 0
        self.finished: float | None = None  # monotonic
        self.error: BaseException | None = None

    def _note(self, line: str) -> None:
        if "versions," in line:
            self.versions = int(line.split(": ", 1)[1].split("/", 1)[0])

    def run(self) -> None:
        try:
            summary = generate(self.engine, scale=self.scale, seed=self.seed, batch_size=self.per_transaction,
                               label=self.label, progress=self._note)  # fmt: skip
            self.versions = summary.versions
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.finished = time.monotonic()


class _Searches(threading.Thread):
    """One search every `interval` s as a demo partner, through `ki serve`; each answer's time and status,
    by the phase it fell in."""

    def __init__(self, base: str, token: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.base, self.token, self.interval = base, token, interval
        self.phase = "keyword"
        self.samples: dict[str, list[float]] = {}
        self.failed: dict[str, int] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        rng = random.Random(53)
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            ms, status, _ = call_api(self.base, self.token, {"query": rng.choice(QUERIES), "limit": 10}, timeout=30)
            if status == 200:
                self.samples.setdefault(self.phase, []).append(ms)
            else:
                self.failed[self.phase] = self.failed.get(self.phase, 0) + 1
            next_at += self.interval
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def figures(self) -> dict[str, Any]:
        phases = sorted(set(self.samples) | set(self.failed))
        return {p: {"ms": _pcts(self.samples.get(p, [])), "failed": self.failed.get(p, 0)} for p in phases}


def _project_ids(engine: Engine, label: str) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM projects WHERE name LIKE :p"), {"p": f"%{NAME_SEPARATOR}{label}"})
        return [int(r.id) for r in rows]


def _live_versions(engine: Engine, projects: list[int]) -> set[int]:
    """The run's versions that have rows in a correct index (`streams.replay.live_version_ids`, scoped)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT dv.id FROM document_versions dv JOIN documents d ON d.id = dv.document_id"
                " WHERE d.project_id = ANY(:p) AND d.deleted_at IS NULL"
                " AND (d.expires_at IS NULL OR d.expires_at > now()) AND btrim(dv.text) <> ''"
            ),
            {"p": projects},
        )
        return {int(r.id) for r in rows}


#: From this share of the expected versions (by the approximate count) on, each poll checks exactly which are in.
EXACT_CHECK_FROM = 0.99


def _scope(projects: list[int]) -> dict[str, Any]:
    return {"terms": {"project_id": [str(p) for p in projects]}}


def _counts(search: OpenSearch, alias: str, projects: list[int]) -> tuple[int, int, int]:
    """(chunks, chunks with their vector, versions with rows -- approximate above 40,000) of these projects."""
    if not projects or not search.indices.exists_alias(name=alias):
        return 0, 0, 0
    answer = search.search(
        index=alias,
        body={
            "size": 0,
            "track_total_hits": True,
            "query": _scope(projects),
            "aggs": {
                "versions": {"cardinality": {"field": "document_version_id", "precision_threshold": 40000}},
                "pending": {"filter": {"exists": {"field": VECTOR_PENDING}}},
            },
        },
    )
    chunks = int(answer["hits"]["total"]["value"])
    pending = int(answer["aggregations"]["pending"]["doc_count"])
    return chunks, chunks - pending, int(answer["aggregations"]["versions"]["value"])


def _indexed_versions(search: OpenSearch, alias: str, projects: list[int]) -> set[int]:
    """Exactly which versions of these projects have rows (a composite aggregation, page by page)."""
    found: set[int] = set()
    after: dict[str, Any] | None = None
    while True:
        composite: dict[str, Any] = {"size": 5000, "sources": [{"v": {"terms": {"field": "document_version_id"}}}]}
        if after is not None:
            composite["after"] = after
        answer = search.search(index=alias, body={"size": 0, "query": _scope(projects),
                                                   "aggs": {"v": {"composite": composite}}})  # fmt: skip
        buckets = answer["aggregations"]["v"]["buckets"]
        found.update(int(b["key"]["v"]) for b in buckets)
        after = answer["aggregations"]["v"].get("after_key")
        if not buckets or after is None:
            return found


class _Load:
    """The keyword phase's `until`: polls every POLL_S, prints progress, samples the cores at the end of the
    writing and when every version is searchable."""

    def __init__(self, settings: Settings, engine: Engine, search: OpenSearch, writer: _Writer,
                 processes: dict[str, int], label: str) -> None:  # fmt: skip
        self.settings, self.engine, self.search, self.writer, self.label = settings, engine, search, writer, label
        self.alias = settings.retrieval.index_name
        self.processes = processes
        self.started = time.monotonic()
        self.cpu = {"start": cpu.sample(processes)}
        self.samples: list[dict[str, Any]] = []
        self.projects: list[int] = []
        self.expected: set[int] | None = None
        self.written_s: float | None = None
        self.searchable_s: float | None = None
        self.missing: list[int] = []
        self.last_poll = 0.0
        self.last_report = 0.0

    def sample(self) -> dict[str, Any]:
        if not self.projects:
            self.projects = _project_ids(self.engine, self.label)
        chunks, vectored, versions = _counts(self.search, self.alias, self.projects)
        point = {"t_s": round(time.monotonic() - self.started, 1), "versions_written": self.writer.versions,
                 "versions_searchable": versions, "chunks_searchable": chunks,
                 "chunks_with_vector": vectored}  # fmt: skip
        self.samples.append(point)
        return point

    def done(self) -> bool:
        if self.writer.error is not None:
            raise RuntimeError(f"writing the corpus to PostgreSQL failed: {self.writer.error}")
        now = time.monotonic()
        if now - self.last_poll < POLL_S:
            return False
        self.last_poll = now
        if self.writer.finished is not None and self.expected is None:
            self.written_s = round(self.writer.finished - self.started, 1)
            self.cpu["written"] = cpu.sample(self.processes)
            self.projects = _project_ids(self.engine, self.label)
            self.expected = _live_versions(self.engine, self.projects)
            _progress(f"first-load: PostgreSQL written in {self.written_s:.0f} s: {len(self.expected)} live versions")
        point = self.sample()
        if now - self.last_report >= 10:
            self.last_report = now
            elapsed = max(point["t_s"], 1e-9)
            _progress(f"  {point['t_s']:.0f}s: {point['versions_written']} versions written,"
                      f" {point['versions_searchable']} searchable ({point['chunks_searchable']} chunks,"
                      f" {point['chunks_searchable'] / elapsed:.0f}/s),"
                      f" {point['chunks_with_vector']} with vectors")  # fmt: skip
        # The cardinality is approximate (hash collisions undercount a few versions in some runs): the exact
        # check runs as soon as it is close, never gated on the estimate reaching the total.
        if self.expected is None or point["versions_searchable"] < EXACT_CHECK_FROM * len(self.expected):
            return False
        indexed = _indexed_versions(self.search, self.alias, self.projects)
        self.missing = sorted(self.expected - indexed)
        if self.missing:
            return False
        self.searchable_s = point["t_s"]
        self.cpu["searchable"] = cpu.sample(self.processes)
        return True

    def cores(self) -> dict[str, dict[str, float]]:
        phases = {}
        if "written" in self.cpu:
            phases["writing"] = cpu.cores_used(self.cpu["start"], self.cpu["written"])
            if "searchable" in self.cpu:
                phases["catching_up"] = cpu.cores_used(self.cpu["written"], self.cpu["searchable"])
        if "searchable" in self.cpu:
            phases["keyword_phase"] = cpu.cores_used(self.cpu["start"], self.cpu["searchable"])
        return phases


# --------------------------------------------------------------------------------------------------
# The embedder alone
# --------------------------------------------------------------------------------------------------


def _sample_texts(search: OpenSearch, alias: str, projects: list[int], count: int) -> list[str]:
    random_rows = {"query": _scope(projects), "random_score": {"seed": 53, "field": "_seq_no"}}
    body = {"size": count, "_source": ["text"], "query": {"function_score": random_rows}}
    return [hit["_source"]["text"] for hit in search.search(index=alias, body=body)["hits"]["hits"]]


def embedder_alone(settings: Settings, texts: list[str]) -> dict[str, Any]:
    """The embedder's own rate on these texts, in-process, with the content lane's model-run setting and the
    lane's micro-batches (`streams.embed_micro_batch_rows`); a warm-up batch first."""
    lane_threads = settings.streams.content_embed_threads
    if lane_threads:
        settings = with_overrides(settings, {"embedding": {"threads": lane_threads}})
    embedder = create_embedder(settings)
    batch = settings.streams.embed_micro_batch_rows
    embedder.embed(texts[:2])
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        embedder.embed(texts[i : i + batch])
    seconds = time.perf_counter() - started
    return {"signature": embedder.signature, "threads": settings.embedding.threads, "chunks": len(texts),
            "seconds": round(seconds, 2), "chunks_per_s": round(len(texts) / seconds, 2)}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstLoadOptions:
    scale: int
    seed: int = 7
    access_rate: int = 100
    access_docs: int = 100  # documents of the run's own that the access load changes grants on
    probe_interval: float = 0.5
    search_interval: float = 0.5
    vector_seconds: float = 120  # 0: until every vector is in place
    standalone_chunks: int = 64
    versions_per_transaction: int = 1  # 1: one document per transaction; more: whole documents up to this many
    timeout_s: float = 4 * 3600
    keep: bool = False
    out: Path | None = None  # default benchmarks/first-load-<chunks>.json
    config: str | None = None
    command: str = "ki bench first-load"


def _index_rows(search: OpenSearch, alias: str) -> int:
    if not search.indices.exists_alias(name=alias):
        return 0
    return int(search.count(index=alias)["count"])


def _index_settings(search: OpenSearch, alias: str) -> dict[str, Any]:
    found = search.indices.get_settings(index=alias, include_defaults=False)
    index = next(iter(found.values()))["settings"]["index"]
    return {k: index.get(k) for k in ("number_of_shards", "number_of_replicas", "refresh_interval")}


def run_first_load(settings: Settings, options: FirstLoadOptions) -> dict[str, Any]:
    if options.scale < 1 or options.access_rate < 1 or options.probe_interval <= 0 or options.search_interval <= 0:
        raise ValueError("scale and access rate must be at least 1, the intervals above 0")
    label = bench_label("first-load")
    per_transaction = (
        "one document per transaction"
        if options.versions_per_transaction == 1
        else f"whole documents, about {options.versions_per_transaction} versions per transaction"
    )
    tag = label.rsplit(" ", 1)[1]
    load_start = os.getloadavg()
    engine = make_engine(settings)
    search = make_sync_client(settings, timeout_s=60)
    alias = settings.retrieval.index_name
    rows_at_start = _index_rows(search, alias)
    worker = SyncWorker(settings, REPO_ROOT / "build" / "bench-first-load-worker.log", config=options.config)
    _progress("first-load: " + worker.ensure())
    backlog = _access_lane_caught_up(settings, options.timeout_s)
    result: dict[str, Any] = {"benchmark": "first-load", "command": options.command, "label": label,
                              "scale": options.scale, "seed": options.seed, "index_rows_at_start": rows_at_start,
                              "backlog_at_start": backlog,
                              "path": f"PostgreSQL ({per_transaction}) -> Debezium stream -> Kafka ->"
                                      " both sync lanes -> OpenSearch"}  # fmt: skip
    run: _Run | None = None
    api: ServeChild | None = None
    searches: _Searches | None = None
    removal: Removal | None = None
    try:
        _progress(f"first-load: {options.access_docs} documents for the access load as `{label}`")
        access = write_corpus(engine, label=label, docs=options.access_docs + 1,
                              text_of=lambda n: f"Zugriffsänderung {n}: Die Vollmacht gilt bis auf Widerruf. {tag}",
                              principal=f"group:first-load-{tag}")  # fmt: skip
        doc_ids, probe_doc = access.document_ids[:-1], access.document_ids[-1]
        wait_indexed(search, alias, access.version_ids, len(access.version_ids), 600)
        operator = mint_token(settings.api, f"first-load-{tag}", roles=["operator"])
        api = ServeChild(options.config, REPO_ROOT / "build" / "bench-first-load-api.log", operator)
        asyncio.run(api.start())
        partner = users()[0]  # every fifth demo user is a partner; partners are granted every project
        searches = _Searches(api.base, mint_token(settings.api, partner.split(":", 1)[1], ttl_s=12 * 3600),
                             options.search_interval)  # fmt: skip
        processes = cpu.stack_processes(settings)
        worker_pid = worker.child.pid if worker.child is not None else cpu.find_pid("apps.cli sync run")
        if worker_pid is not None:
            processes["sync worker"] = worker_pid
        processes["search API"] = api.child.pid
        run = _Run(settings, engine, search, tag, probe_doc, processes)
        run.capture.start()
        run.capture.ready.wait(15)

        _progress(f"first-load: writing {options.scale} versions, {per_transaction}; access changes"
                  f" at {options.access_rate}/s, a search every {options.search_interval} s")  # fmt: skip
        writer = _Writer(engine, options.scale, options.seed, label, options.versions_per_transaction)
        load = _Load(settings, engine, search, writer, processes, label)
        writer.start()
        searches.start()
        keyword = run.phase("keyword", options.access_rate, doc_ids, seconds=0, probe_interval=options.probe_interval,
                            until=load.done, max_seconds=options.timeout_s)  # fmt: skip
        writer.join()
        if load.searchable_s is None:
            # What was reached still says the rate: kept as a partial result before the run fails.
            partial = options.out or REPO_ROOT / "benchmarks" / "first-load-partial.json"
            result.update(keyword_incomplete_after_s=options.timeout_s, keyword_cpu_cores=load.cores(),
                          access=keyword.summary(), searches=searches.figures(), progress=load.samples,
                          machine=machine(load_start))  # fmt: skip
            partial.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
            raise RuntimeError(f"not keyword-searchable within {options.timeout_s:.0f} s; partial figures in {partial}")
        final = load.sample()
        chunks = final["chunks_searchable"]
        _progress(f"first-load: {len(load.expected or ())} versions ({chunks} chunks) keyword-searchable after"
                  f" {load.searchable_s:.0f} s ({chunks / load.searchable_s:.0f} chunks/s)")  # fmt: skip

        searches.phase = "vectors"
        vectors_start = final["chunks_with_vector"]
        vectors_done = _vector_poll(load, chunks)
        vector = run.phase("vectors", options.access_rate, doc_ids, seconds=options.vector_seconds or 1e9,
                           probe_interval=options.probe_interval, until=vectors_done,
                           max_seconds=options.vector_seconds or options.timeout_s)  # fmt: skip
        window_s = vector.seconds
        end = load.samples[-1]
        searches.stop_event.set()
        searches.join(60)
        vectored = end["chunks_with_vector"] - vectors_start
        lane_rate = vectored / window_s if window_s > 0 else 0.0

        texts = _sample_texts(search, alias, load.projects, options.standalone_chunks)
        worker_running = worker.child is None
        if not worker_running:
            worker.stop()  # the embedder alone: no lane competes for the cores
        _progress(f"first-load: the embedder alone on {len(texts)} of the run's chunks"
                  f"{' (the worker keeps running: not started here)' if worker_running else ''}")  # fmt: skip
        alone = {**embedder_alone(settings, texts), "worker_running": worker_running}
        _progress(f"  {alone['chunks_per_s']} chunks/s alone; the content lane reached {lane_rate:.2f}")

        versions = len(load.expected or ())
        result["postgres"] = {"versions": versions, "versions_per_transaction": options.versions_per_transaction,
                              "written_s": load.written_s,
                              "versions_per_s": round(versions / max(load.written_s or 0, 1e-9), 1)}  # fmt: skip
        result["keyword"] = {
            "versions_searchable": len(load.expected or ()) - len(load.missing),
            "chunks": chunks,
            "first_commit_to_all_searchable_s": load.searchable_s,
            "chunks_per_s": round(chunks / load.searchable_s, 1),
            "cpu_cores": load.cores(),
            "access": keyword.summary(),
        }
        result["vectors"] = {
            "complete": end["chunks_with_vector"] >= chunks,
            "window_s": round(window_s, 1),
            "time_boxed": bool(options.vector_seconds),
            "chunks_with_vector_at_start": vectors_start,
            "chunks_with_vector_at_end": end["chunks_with_vector"],
            "lane_chunks_per_s": round(lane_rate, 2),
            "embedder_alone": alone,
            "ratio_to_embedder_alone": round(lane_rate / alone["chunks_per_s"], 3) if alone["chunks_per_s"] else None,
            "cpu_cores": vector.cpu_cores,
            "access": vector.summary(),
        }
        result["searches"] = searches.figures()
        result["progress"] = load.samples
        result["index"] = _index_settings(search, alias)
        _check_phase(keyword)
    finally:
        if searches is not None:
            searches.stop_event.set()
        if run is not None:
            run.capture.stop_event.set()
        try:
            if not options.keep:
                removal = remove_bench_rows(settings, Footprint.ending_in(label), what="first-load", wait_s=1800)
        finally:
            if api is not None:
                api.stop()
            worker.stop()
            search.close()
            engine.dispose()
    result["cleanup"] = removal.as_dict() if removal is not None else "kept (--keep)"
    result["settings"] = {
        "refresh_interval": settings.opensearch.refresh_interval,
        "bulk_max_rows": settings.streams.bulk_max_rows,
        "batch_max_events": settings.streams.batch_max_events,
        "content_batch_max_events": settings.streams.content_batch_max_events,
        "embed_micro_batch_rows": settings.streams.embed_micro_batch_rows,
        "content_embed_threads": settings.streams.content_embed_threads,
        "embedding_model": settings.embedding.model,
    }
    result["machine"] = machine(load_start)
    return result


def _vector_poll(load: _Load, chunks: int) -> Callable[[], bool]:
    """The vector phase's `until`: a count every POLL_S; done when every chunk has its vector."""
    last, report = 0.0, time.monotonic()

    def done() -> bool:
        nonlocal last, report
        now = time.monotonic()
        if now - last < POLL_S:
            return False
        last = now
        point = load.sample()
        if now - report >= 10:
            report = now
            _progress(f"  {point['t_s']:.0f}s: {point['chunks_with_vector']}/{chunks} chunks with vectors")
        return bool(point["chunks_with_vector"] >= chunks)

    return done


def _check_phase(phase: _Phase) -> None:
    if not phase.probes:
        raise RuntimeError("no access-change probe was sent during the load")


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _f(value: Any, key: str) -> str:
    return "—" if not value else f"{value[key]}"


def table(result: dict[str, Any]) -> str:
    kw, vec = result["keyword"], result["vectors"]
    lines = [
        "| phase | seconds | chunks/s | access p50 s | access p99 s | probes seen/sent | search p50 ms"
        " | search p99 ms | search failed | cores (machine) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, seconds, rate, phase, cores in (
        ("keyword (first commit → all searchable)", kw["first_commit_to_all_searchable_s"], kw["chunks_per_s"],
         kw["access"], kw["cpu_cores"].get("keyword_phase", {})),
        ("vectors" + (" (time box)" if vec["time_boxed"] else ""), vec["window_s"], vec["lane_chunks_per_s"],
         vec["access"], vec["cpu_cores"]),
    ):  # fmt: skip
        lag = phase["commit_to_visible_s"]
        s = result["searches"].get("keyword" if name.startswith("keyword") else "vectors", {})
        lines.append(
            f"| {name} | {seconds} | {rate} | {_f(lag, 'p50')} | {_f(lag, 'p99')}"
            f" | {phase['probes']['seen']}/{phase['probes']['sent']} | {_f(s.get('ms'), 'p50')}"
            f" | {_f(s.get('ms'), 'p99')} | {s.get('failed', 0)} | {cores.get('machine', '—')} |"
        )
    lines += [
        "",
        f"{result['postgres']['versions']} versions, {kw['chunks']} chunks; PostgreSQL written in"
        f" {result['postgres']['written_s']} s ({result['postgres']['versions_per_s']} versions/s, up to"
        f" {result['postgres']['versions_per_transaction']} versions per transaction);"
        f" vectors: content lane {vec['lane_chunks_per_s']} chunks/s, embedder alone"
        f" {vec['embedder_alone']['chunks_per_s']} chunks/s, ratio {vec['ratio_to_embedder_alone']}",
    ]
    for phase, cores in kw["cpu_cores"].items():
        busy = sorted(((k, v) for k, v in cores.items() if k != "machine"), key=lambda kv: -kv[1])
        lines.append(f"cores {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in busy) + f"; machine {cores['machine']}")
    return "\n".join(lines)


def main(settings: Settings, options: FirstLoadOptions) -> int:
    result = run_first_load(settings, options)
    out = options.out or REPO_ROOT / "benchmarks" / f"first-load-{size_name(result['keyword']['chunks'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("progress",)}, ensure_ascii=False))
    _progress("\n" + table(result) + "\n")
    _progress(f"first-load: results in {out}")
    return 0

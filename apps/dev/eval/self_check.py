"""`ki eval --self`: does the semantic leg help on *this* deployment's corpus? Measured on pseudo-queries made
from the live documents (apps.dev.eval.pseudo), through the real search path, and stored where every API
process reads it (PostgreSQL `ki_self_eval`; search.ranking.mode_gate decides the default mode from the newest row).

1. Refuses while the index is behind: change events still waiting in the content lane, or index rows
   without a vector (they would make the semantic leg look worse than it is).
2. Samples up to `max_documents` documents (their latest final versions; a fixed-seed order by hash, so a
   re-run on an unchanged corpus asks the same questions) and makes at most two pseudo-queries each,
   each document falling into the tuning or the confirming half.
3. Runs every query in lexical, semantic and hybrid mode as an administrator, with the retrieval
   statistics and the access audit off (these are not users' queries).
4. Decides: lexical when hybrid ranks below lexical (nDCG@10) by more than `retrieval.mode_gate.self_eval_margin` on
   the tuning half *and* significantly so on the confirming half (paired permutation test at
   `retrieval.mode_gate.significance_level`); hybrid otherwise. The tuning half says which way to look, the
   confirming half tests only that, so looking at three modes on many queries does not manufacture a
   difference. The margin answers the pseudo-queries' bias: they are the documents' own words, lexical
   sits near its ceiling on them, and a loss of a point or two there says nothing about users' questions;
   a useless semantic leg loses by far more. Lexical also when the semantic leg alone finds almost nothing
   (its nDCG@10 significantly below USEFUL_SHARE of lexical's, by the same two halves): a robust fusion
   absorbs such noise, but it costs a query embedding and can only mislead.
5. Writes the report to `ki_self_eval` and to `<out>/self-eval-<id>.json` (deployment data: outside
   `benchmarks/`; query texts hashed unless `api.stats.store_query_text`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from opensearchpy import AsyncOpenSearch
from sqlalchemy import text

from apps.dev.eval import pseudo
from apps.dev.eval.metrics import METRICS, evaluate, per_query_scores
from apps.dev.eval.queries import MemoClient, Mode, ModeRun, run_queries
from apps.dev.eval.significance import paired_comparison
from ki.errors import PermanentError
from ki.evidence_keys import signed_with
from ki.settings import Settings, with_overrides

Progress = Callable[[str], None]
MODES: tuple[Mode, ...] = ("lexical", "semantic", "hybrid")
SUBJECT = "ki-self-eval"
LIMIT = 10  # the decision is on nDCG@10
MIN_QUERIES_PER_HALF = 10  # fewer cannot show a significant difference
# A semantic leg whose own nDCG@10 stays significantly below this share of lexical's finds almost nothing:
# noise that a robust fusion mostly absorbs, but that costs an embedding per query and can only mislead.
# (On pseudo-queries a useful leg reaches 0.8-0.97 of lexical -- e5 and even the English MiniLM on German
# text; near-constant vectors 0.03-0.09.)
USEFUL_SHARE = 0.25


class SelfEvalError(PermanentError):
    """`ki eval --self` cannot run (or must not yet); the message is one readable line."""


@dataclass(frozen=True)
class SampledDocument:
    document_id: int
    version_id: int
    identifiers: list[str]
    text: str


_SAMPLE_SQL = text(
    "SELECT d.id, v.id AS version_id, d.identifiers, v.text FROM documents d "
    "JOIN document_versions v ON v.id = d.latest_final_version_id "
    "WHERE d.deleted_at IS NULL AND (d.expires_at IS NULL OR d.expires_at > now()) AND btrim(v.text) <> '' "
    "ORDER BY md5(:salt || d.id::text) LIMIT :limit"
)
_CORPUS_SQL = text(
    "SELECT count(*) FROM documents WHERE deleted_at IS NULL AND (expires_at IS NULL OR expires_at > now())"
    " AND latest_final_version_id IS NOT NULL"
)


async def sample_documents(engine: Any, limit: int, salt: str) -> tuple[list[SampledDocument], int]:
    """Up to `limit` documents with a final version, in a fixed pseudo-random order; and how many there are."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_SAMPLE_SQL, {"salt": salt, "limit": limit})).all()
        total = int((await conn.execute(_CORPUS_SQL)).scalar_one())
    return [SampledDocument(int(r.id), int(r.version_id), list(r.identifiers or []), str(r.text)) for r in rows], total


def make_queries(documents: Sequence[SampledDocument], salt: str) -> list[pseudo.PseudoQuery]:
    out: list[pseudo.PseudoQuery] = []
    for doc in documents:
        out.extend(pseudo.queries_for(doc.document_id, doc.text, doc.identifiers, salt=salt))
    return out


async def rows_without_vectors(client: Any, index: str) -> int:
    """Index rows that have text but no vector yet."""
    body = {"query": {"bool": {"must_not": [{"exists": {"field": "embedding"}}]}}}
    return int((await client.count(index=index, body=body))["count"])


def waiting_reason(content_lag: int | None, unvectored: int) -> str | None:
    """Why the index is not ready to be measured, or None."""
    if content_lag:
        return f"{content_lag} change event(s) still wait in the content lane"
    if unvectored:
        return f"{unvectored} index row(s) still wait for their vectors"
    return None


def content_lag(settings: Settings) -> int | None:
    """Events the content lane has not indexed yet (None: the lag cannot be read)."""
    from streams.status import lane_lags

    for lane in lane_lags(settings):
        if lane.lane == "content":
            return int(lane.total)
    return None


def confirms(tuning: dict[str, Any], confirming: dict[str, Any], level: float) -> bool:
    """A loss the tuning half points to and the confirming half finds significant (paired comparisons)."""
    return tuning["mean_difference"] < 0 and confirming["mean_difference"] < 0 and confirming["p_value"] < level


def decision(tuning: dict[str, Any], confirming: dict[str, Any], level: float, margin: float) -> tuple[str, str]:
    """`hybrid` or `lexical` from the two halves' paired comparisons of hybrid against lexical, and why.

    Each comparison is of hybrid + `margin` against lexical (`summarise`): lexical only when hybrid loses by
    more than the margin on the tuning half and, significantly, on the confirming half."""
    confirmed = confirms(tuning, confirming, level)
    low, high = confirming["ci95"]
    beyond = (
        f"a loss beyond {margin:g} at p {confirming['p_value']:.3f}"
        if confirming["mean_difference"] < 0
        else f"no loss beyond {margin:g}"
    )
    figures = (
        f"hybrid - lexical nDCG@10 {tuning['mean_difference'] - margin:+.3f} on {tuning['queries']} tuning queries, "
        f"{confirming['mean_difference'] - margin:+.3f} (95% CI {low - margin:+.3f}..{high - margin:+.3f}; "
        f"{beyond}) on {confirming['queries']} confirming queries"
    )
    if confirmed:
        return "lexical", f"{figures}: hybrid significantly worse, keyword-only"
    return "hybrid", f"{figures}: hybrid not significantly worse"


def summarise(
    runs: dict[str, ModeRun], queries: Sequence[pseudo.PseudoQuery], level: float, margin: float
) -> dict[str, Any]:
    """Per half: each mode's metrics, hybrid against lexical paired, and the same with hybrid given
    `margin` (what decides); and the decision."""
    halves: dict[str, Any] = {}
    for half in ("tuning", "confirming"):
        qrels = {q.qid: {str(q.document_id): 1} for q in queries if q.half == half}
        if len(qrels) < MIN_QUERIES_PER_HALF:
            raise SelfEvalError(
                f"only {len(qrels)} pseudo-queries in the {half} half (at least {MIN_QUERIES_PER_HALF} needed): "
                "the corpus is too small or its texts too short for a self-evaluation"
            )
        results = {mode: {m: round(v, 6) for m, v in evaluate(runs[mode].run, qrels).items() if m in METRICS}
                   for mode in MODES}  # fmt: skip
        hybrid = per_query_scores(runs["hybrid"].run, qrels)
        lexical = per_query_scores(runs["lexical"].run, qrels)
        semantic = per_query_scores(runs["semantic"].run, qrels)
        halves[half] = {
            "queries": len(qrels),
            "results": results,
            "hybrid_vs_lexical": paired_comparison(hybrid, lexical),
            "beyond_margin": paired_comparison([h + margin for h in hybrid], lexical),
            "semantic_vs_useful": paired_comparison(semantic, [USEFUL_SHARE * x for x in lexical]),
        }
    tuning, confirming = halves["tuning"], halves["confirming"]
    mode, why = decision(tuning["beyond_margin"], confirming["beyond_margin"], level, margin)
    if mode == "hybrid" and confirms(tuning["semantic_vs_useful"], confirming["semantic_vs_useful"], level):
        sem, lex = (confirming["results"][m]["ndcg@10"] for m in ("semantic", "lexical"))
        mode, why = (
            "lexical",
            (
                f"the semantic leg alone finds almost nothing: nDCG@10 {sem:.3f} against lexical {lex:.3f} on "
                f"{confirming['queries']} confirming queries, significantly below {USEFUL_SHARE:g} of it "
                f"(p {confirming['semantic_vs_useful']['p_value']:.3f}); {why.split(': hybrid')[0]}: keyword-only"
            ),
        )
    return {"halves": halves, "decision": mode, "summary": why}


async def self_evaluate(
    settings: Settings,
    *,
    max_documents: int,
    out_dir: Path,
    progress: Progress,
    concurrency: int = 4,
    salt: str = "ki-self-eval",
    check_lag: bool = False,
) -> dict[str, Any]:
    """The whole run (see the module docstring); returns the stored report with its `id`."""
    from ki.clients import make_async_engine, make_client
    from ki.embedding import create_embedder
    from search.ranking.mode_gate import binding_for, binding_hash
    from search.ranking.query_vectors import EmbeddingCache
    from search.service import SearchService

    began = time.monotonic()
    r = settings.retrieval
    run_settings = with_overrides(settings, {"api": {"stats": {"enabled": False}, "audit": {"enabled": False}}})
    embedder = await asyncio.to_thread(create_embedder, settings)
    client = make_client(settings)
    engine = make_async_engine(settings)
    try:
        lag = await asyncio.to_thread(content_lag, settings) if check_lag else None
        why_not = waiting_reason(lag, await rows_without_vectors(client, r.index_name))
        if why_not:
            raise SelfEvalError(f"not now: {why_not}; run it again when the sync worker has caught up")
        documents, corpus_documents = await sample_documents(engine, max_documents, salt)
        queries = make_queries(documents, salt)
        progress(f"self-eval: {len(queries)} pseudo-queries from {len(documents)} of {corpus_documents} documents")
        admin = settings.security.admin_principals
        if not admin:
            raise SelfEvalError("security.admin_principals is empty: the self-evaluation searches as an administrator")
        principals = [f"user:{SUBJECT}", admin[0]]
        memo = cast(AsyncOpenSearch, MemoClient(client))
        cache = EmbeddingCache(size=max(len(queries), 1), ttl_s=24 * 3600)  # one vector per query across modes
        runs: dict[str, ModeRun] = {}
        for mode in MODES:
            service = SearchService(run_settings, engine, memo, embedder, scope_cache=False)
            service.cache = cache
            runs[mode] = await run_queries(
                service, principals, [(q.qid, q.text) for q in queries], project_id=None,
                documents=None, limit=LIMIT, concurrency=concurrency, label=f"self-eval {mode}",
                mode=mode, progress=progress,
            )  # fmt: skip
        level = r.mode_gate.significance_level
        outcome = summarise(runs, queries, level, r.mode_gate.self_eval_margin)
        fingerprint = hashlib.sha256(
            json.dumps(sorted((d.document_id, d.version_id) for d in documents)).encode()
        ).hexdigest()
        binding = binding_for(settings, embedder.signature, fingerprint)
        keep_text = settings.api.stats.store_query_text
        report: dict[str, Any] = {
            "kind": "self-eval",
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "binding": binding,
            "binding_hash": binding_hash(binding),
            "decision": outcome["decision"],
            "summary": outcome["summary"],
            "significance_level": level,
            "margin": r.mode_gate.self_eval_margin,
            "corpus": {"documents": corpus_documents, "sampled": len(documents), "salt": salt},
            "pseudo_queries": {
                "made_from": "a heading inside the text and a sentence of each sampled document's latest final "
                "version, identifiers stripped (apps.dev.eval.pseudo)",
                "bias": "the documents' own words: they favour the lexical leg",
                "count": len(queries),
                "by_kind": {k: sum(q.kind == k for q in queries) for k in ("heading", "sentence")},
            },
            "halves": outcome["halves"],
            "queries": [
                {
                    "id": q.qid,
                    "half": q.half,
                    "kind": q.kind,
                    ("text" if keep_text else "sha256"): q.text if keep_text else pseudo.digest(q.text),
                    **{
                        mode: round(per_query_scores(runs[mode].run, {q.qid: {str(q.document_id): 1}})[0], 4)
                        for mode in MODES
                    },
                }  # fmt: skip
                for q in queries
            ],
            "seconds": round(time.monotonic() - began, 1),
            "cost": {  # what a signed report binds besides relevance (ki.evidence_keys)
                "latency_ms": {mode: runs[mode].latency() for mode in MODES},
                "concurrency": concurrency,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            },
        }
        # Signed with this deployment's key: the gate counts an unsigned self-eval report as no evidence.
        report = signed_with(report, settings.retrieval.mode_gate.signing_key_file)
        report["id"] = await store(engine, report)
    finally:
        await engine.dispose()
        await client.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"self-eval-{report['id']}.json"
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    report["file"] = str(path)
    return report


async def store(engine: Any, report: dict[str, Any]) -> int:
    sql = text(
        "INSERT INTO ki_self_eval (binding_hash, decision, report) "
        "VALUES (:binding_hash, :decision, CAST(:report AS jsonb)) RETURNING id"
    )
    params = {"binding_hash": report["binding_hash"], "decision": report["decision"], "report": json.dumps(report)}
    async with engine.begin() as conn:
        return int((await conn.execute(sql, params)).scalar_one())

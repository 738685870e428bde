"""`ki bench search`: latency of `POST /v1/search` next to the raw `_msearch` of the same legs, same run.

What runs:
* **Corpus**: the demo generator's corpus (`ki demo generate --scale N --seed S`), reused when a complete
  one of that seed and scale is already in PostgreSQL (the demo's), indexed straight from PostgreSQL through
  the backfill path (`streams.replay.backfill`: the worker's Projector, real embeddings) for the versions the
  index lacks. No CDC wait. A corpus generated here is removed at the end with its index rows
  (`apps.dev.bench.cleanup`), so each run that finds none generates and indexes it again.
* **Query mix** (deterministic from the seed): word queries from the generator's vocabulary, sentence
  fragments, Aktenzeichen and statute references taken from the corpus, a third to a half with metadata
  filters; asked by demo users (their scopes come from the demo grants and mirrored groups).
* **API side**: a real `ki serve` child on a free port, `POST /v1/search` over HTTP with minted tokens.
  Its embedding cache is warmed before every timed level, so neither side pays for embedding in the
  timed rounds; the cold and warm cost of the service's embedding step is reported separately.
* **Raw side**: for every request the exact `_msearch` lines the service sends — captured from the
  service's own leg planner (`SearchService.plan_legs`) with the caller's compiled scope filter and the
  query vector computed up front — sent with the same client (`ki.clients.make_client`) at the same
  concurrency. It pays neither scope SQL, embedding, fusion, re-verification nor HTTP to the API.
* **Rounds**: at every concurrency, `rounds` rounds alternate which side goes first; per-round p50/p95/p99
  and throughput, medians over rounds, ratios API/raw per round and their median.
* **Scope compilation** (`search.access.scope.compile_scope` as the service calls it) for callers that see 100 to
  100k documents, generated set-based inside one transaction that is rolled back.

Progress goes to stderr; one JSON object to stdout and `build/bench/search.json`; a PNG of the latency
distributions to `build/bench/search_latency.png` when matplotlib (extra `bench`) is installed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger

from apps.dev.bench.cleanup import Footprint, Removal, remove_bench_rows
from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.demo.generator import (
    ADJ,
    CLAUSE_SENTENCES,
    COMMON_SENTENCES,
    FAMILY_SENTENCES,
    IDENTIFIER_PATTERNS,
    NAME_SEPARATOR,
    NOUNS,
    generate,
    plan_setup,
    run_label,
    users,
)
from apps.dev.plotting import pyplot, save_figure
from apps.runtime.processes import Child, free_port
from apps.runtime.progress import StepReport
from ki import exposition
from ki.acl import resolve_caller
from ki.clients import make_async_engine, make_client, make_engine
from ki.embedding import Embedder, create_embedder
from ki.errors import PermanentError
from ki.settings import Settings
from search.access.scope import CompiledScope, compile_scope, strict_filter
from search.plan import expansion_of
from search.ranking.legs import LegRun, leg_depth, msearch_lines
from search.request import SearchRequest, parse_search_request
from search.service import SearchService
from search.web.auth import decode_token, mint_token, principals_from_claims
from streams.writer import IndexWriter

DEFAULT_SCALE = 1000  # ~6.4k chunks: indexing them is most of a first run (~10-20 chunks/s on 2 shared cores)
DEFAULT_CONCURRENCY = (1, 8, 32)
DEFAULT_SCOPE_SIZES = (100, 1_000, 10_000, 100_000)
GOAL_RATIO_P50_C8 = 1.3
LIMIT = 10


class BenchError(PermanentError):
    """The benchmark cannot run (printed as one line by the CLI)."""


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summarize(latencies_s: Sequence[float], wall_s: float) -> dict[str, float]:
    ms = [x * 1000 for x in latencies_s]
    return {
        "requests": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p95_ms": round(percentile(ms, 95), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "throughput_rps": round(len(ms) / wall_s, 1) if wall_s > 0 else 0.0,
    }


@dataclass(frozen=True)
class BenchOptions:
    scale: int = DEFAULT_SCALE
    seed: int = 7
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    rounds: int = 5
    requests: int = 160
    scope_sizes: tuple[int, ...] = DEFAULT_SCOPE_SIZES
    scope_repeats: int = 5
    callers: int = 4
    caller_set: Literal["mix", "broad", "narrow"] = "mix"
    workers: int = 1
    index_missing: bool = True  # False: measure the index as it is (versions not indexed yet are absent)
    out_dir: Path = REPO_ROOT / "build" / "bench"
    config: str | None = None
    command: str = "ki bench search"
    # A second API with these environment overrides (e.g. a feature off), measured in the same rounds: the
    # difference of the two API/raw ratios is then read off the same machine state, round by round.
    compare_env: dict[str, str] = field(default_factory=dict)
    # Or (and) that second API from another commit of this repository (a git ref, checked out in a worktree
    # under build/): the same index and database, the code before a change.
    compare_checkout: str | None = None


# --------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    label: str
    reused: bool
    version_ids: list[int]
    documents: int
    generate_s: float = 0.0
    index_s: float = 0.0
    versions_indexed_now: int = 0
    rows_embedded_now: int = 0
    versions_not_indexed: int = 0


_LABELS_SQL = text(
    """
    SELECT substring(p.name from :pattern) AS label, count(dv.id) AS versions
    FROM projects p
    LEFT JOIN documents d ON d.project_id = p.id
    LEFT JOIN document_versions dv ON dv.document_id = d.id
    WHERE p.name LIKE :like
    GROUP BY 1
    ORDER BY 1 DESC
    """
)

_CORPUS_SQL = text(
    """
    SELECT dv.id AS version_id, d.id AS document_id
    FROM projects p JOIN documents d ON d.project_id = p.id JOIN document_versions dv ON dv.document_id = d.id
    WHERE p.name LIKE :like
    ORDER BY dv.id
    """
)


def _label_prefix(seed: int, scale: int) -> str:
    """The label `ki demo generate --scale N --seed S` gives its corpus, without the time stamp."""
    return run_label(seed, scale).rsplit("-", 1)[0]


def find_corpus(engine: Engine, seed: int, scale: int) -> str | None:
    """The newest complete demo corpus of this seed and scale already in PostgreSQL, if any."""
    prefix = _label_prefix(seed, scale)
    with engine.connect() as conn:
        rows = conn.execute(
            _LABELS_SQL,
            {
                "pattern": f"{re.escape(NAME_SEPARATOR)}({re.escape(prefix)}-[0-9T]+)$",
                "like": f"%{NAME_SEPARATOR}{prefix}-%",
            },
        ).all()
    return next((row.label for row in rows if row.label and row.versions == scale), None)


def _corpus_rows(engine: Engine, label: str) -> tuple[list[int], int]:
    with engine.connect() as conn:
        rows = conn.execute(_CORPUS_SQL, {"like": f"%{NAME_SEPARATOR}{label}"}).all()
    return [r.version_id for r in rows], len({r.document_id for r in rows})


async def ensure_corpus(
    settings: Settings,
    engine: Engine,
    seed: int,
    scale: int,
    *,
    index_missing: bool = True,
    new_label: str | None = None,
) -> Corpus:
    """Reuse or generate the corpus (labelled `new_label` if generated), then index the versions the index
    does not hold yet (backfill path; not with `index_missing=False`, which measures a partly indexed
    corpus as it is)."""
    from streams.replay import backfill

    label = await asyncio.to_thread(find_corpus, engine, seed, scale)
    reused = label is not None
    generate_s = 0.0
    if label is None:
        _progress(f"bench search: generating the demo corpus (seed {seed}, {scale} versions) in PostgreSQL")
        started = time.perf_counter()
        summary = await asyncio.to_thread(
            generate, engine, scale=scale, seed=seed, progress=lambda line: _progress(f"  {line}"), label=new_label
        )
        generate_s = time.perf_counter() - started
        label = summary.label
    else:
        _progress(f"bench search: reusing the demo corpus {label}")
    version_ids, documents = await asyncio.to_thread(_corpus_rows, engine, label)
    corpus = Corpus(label, reused, version_ids, documents, generate_s=generate_s)

    client = make_client(settings)
    try:  # no alias yet: nothing is indexed (the backfill creates it) -- asked, not retried as an error
        exists = await client.indices.exists_alias(name=settings.retrieval.index_name)
        indexed = (
            await IndexWriter(client, settings).indexed_versions("document_version_id", version_ids)
            if exists
            else set()
        )
    finally:
        await client.close()
    missing = sorted(set(version_ids) - indexed)
    corpus.versions_not_indexed = 0 if index_missing else len(missing)
    if missing and not index_missing:
        _progress(f"bench search: {len(missing)} of {len(version_ids)} versions not indexed; measuring the index as is")
    elif missing:
        _progress(f"bench search: indexing {len(missing)} version(s) straight from PostgreSQL (backfill path)")
        started = time.perf_counter()
        with StepReport("  backfill") as steps:
            stats = await backfill(settings, on_progress=steps.advance, version_ids=missing)
        corpus.index_s = time.perf_counter() - started
        corpus.versions_indexed_now = stats.versions_projected
        corpus.rows_embedded_now = stats.rows_embedded
    else:
        _progress(f"bench search: all {len(version_ids)} versions already indexed")
    return corpus


async def _count(client: Any, index: str, query: dict[str, Any]) -> int:
    return int((await client.count(index=index, body={"query": query}))["count"])


# --------------------------------------------------------------------------------------------------
# Callers and the query mix
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchCaller:
    subject: str
    token: str
    principals: tuple[str, ...]


@dataclass(frozen=True)
class Spec:
    """One request of the mix: who asks what, and the service's own `_msearch` lines for it."""

    caller: BenchCaller
    body: dict[str, Any]
    request: SearchRequest
    lines: list[dict[str, Any]] = field(default_factory=list)
    scope_documents: int = 0


_WORD = re.compile(r"[A-Za-zÄÖÜäöüß]{5,}")


def vocabulary() -> list[str]:
    """Content words of the generator's sentence templates (slots removed), sorted for determinism."""
    sentences = [*COMMON_SENTENCES, *(s for v in CLAUSE_SENTENCES.values() for s in v)]
    sentences += [s for v in FAMILY_SENTENCES.values() for s in v]
    words = {w for s in sentences for w in _WORD.findall(re.sub(r"\{[a-z_]+\}", " ", s))}
    words |= set(ADJ) | set(NOUNS)
    return sorted(words)


def _fragments() -> list[str]:
    sentences = [s for v in CLAUSE_SENTENCES.values() for s in v] + list(COMMON_SENTENCES)
    out = []
    for s in sentences:
        words = re.sub(r"\{[a-z_]+\}", " ", s).replace(";", " ").replace(",", " ").rstrip(".").split()
        if len(words) >= 6:
            out.append(" ".join(words[:7]))
    return sorted(out)


def _is_aktenzeichen(identifier: str) -> bool:
    return any(re.match(IDENTIFIER_PATTERNS[k], identifier) for k in ("bverfg", "bgh", "olg", "lg"))


def query_mix(seed: int, identifiers: Sequence[str], doc_type_id: int | None) -> list[dict[str, Any]]:
    """Deterministic request bodies: 8 word queries, 4 sentence fragments, 2 Aktenzeichen and 2 statute
    references from the corpus; every second one carries a metadata filter."""
    rng = random.Random(f"{seed}:bench-search")
    vocab = vocabulary()
    texts = [" ".join(rng.sample(vocab, rng.randint(2, 4))) for _ in range(8)]
    texts += rng.sample(_fragments(), 4)
    ordered = sorted(set(identifiers))
    akz = [i for i in ordered if _is_aktenzeichen(i)]
    statutes = [i for i in ordered if i.startswith(("§", "Art."))]
    others = [i for i in ordered if i not in akz and i not in statutes]
    texts += rng.sample(akz, min(2, len(akz))) + rng.sample(statutes, min(2, len(statutes)))
    if len(texts) < 16 and others:
        texts += rng.sample(others, min(16 - len(texts), len(others)))
    filters: list[dict[str, Any] | None] = [
        None,
        {"version_status": ["final", "executed"]},
        None,
        {"date_from": "2021-01-01", "date_to": "2023-12-31"},
        None,
        {"chunk_kind": ["chunk", "clause"]},
    ]
    if doc_type_id is not None:
        filters[4] = {"doc_type": [doc_type_id]}
    bodies = []
    for i, query in enumerate(texts):
        # Hybrid explicitly: the benchmark measures the full path, whatever the evidence gate defaults to.
        body: dict[str, Any] = {"query": query, "limit": LIMIT, "mode": "hybrid"}
        chosen = filters[i % len(filters)]
        if chosen:
            body["filters"] = chosen
        bodies.append(body)
    return bodies


def _corpus_projects(engine: Engine, version_ids: Sequence[int]) -> list[int]:
    sql = text(
        "SELECT DISTINCT d.project_id FROM documents d JOIN document_versions v ON v.document_id = d.id"
        " WHERE v.id = ANY(CAST(:v AS bigint[]))"
    ).bindparams(bindparam("v", type_=ARRAY(BigInteger)))
    with engine.connect() as conn:
        return sorted(int(r.project_id) for r in conn.execute(sql, {"v": list(version_ids)}))


def _corpus_identifiers(engine: Engine, label: str) -> tuple[list[str], int | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT DISTINCT unnest(d.identifiers) AS identifier"
                " FROM documents d JOIN projects p ON p.id = d.project_id WHERE p.name LIKE :like"
            ),
            {"like": f"%{NAME_SEPARATOR}{label}"},
        ).all()
        doc_type = conn.execute(text("SELECT id FROM ontology_nodes WHERE key = 'demo.doc.vertrag'")).scalar()
    return sorted(r.identifier for r in rows), doc_type


def demo_callers(settings: Settings) -> list[BenchCaller]:
    """The demo users, as the API will see them (principals from their own tokens). Each token also names
    `role:operator` (no grant names it, so the scope is the user's): the API shows operators `timings_ms`."""
    out = []
    for user in users():
        subject = user.removeprefix("user:")
        token = mint_token(settings.api, subject, roles=["operator"], ttl_s=6 * 3600)
        principals = tuple(principals_from_claims(decode_token(token, settings.api), settings.api))
        out.append(BenchCaller(subject, token, principals))
    return out


async def pick_callers(
    service: SearchService, candidates: Sequence[BenchCaller], count: int, which: str = "mix"
) -> list[BenchCaller]:
    """`mix`: the first `count` demo users who can see anything (an empty scope would only time
    `match_none`); `broad` / `narrow`: the one demo user who sees the most / the fewest documents."""
    sizes: list[tuple[int, BenchCaller]] = []
    for caller in candidates:
        if which == "mix" and len(sizes) == count:
            break
        seen = len((await service.compile_scope(caller.principals, None)).document_ids)
        if seen:
            sizes.append((seen, caller))
    if not sizes:
        raise BenchError("no demo user can see any document of the corpus; is it the demo generator's corpus?")
    if which == "broad":
        return [max(sizes, key=lambda pair: pair[0])[1]]
    if which == "narrow":
        return [min(sizes, key=lambda pair: pair[0])[1]]
    return [caller for _, caller in sizes]


async def plan_specs(
    service: SearchService, settings: Settings, callers: Sequence[BenchCaller], bodies: Sequence[dict[str, Any]]
) -> tuple[list[Spec], dict[str, float]]:
    """Every (caller, body) with the `_msearch` lines the service would send for it (vectors up front)."""
    vectors: dict[str, list[float]] = {}
    embed_ms: list[float] = []
    for body in bodies:
        started = time.perf_counter()
        vectors[body["query"]] = await service.embed_query(expansion_of(body["query"], service.synonym_groups).text)
        embed_ms.append((time.perf_counter() - started) * 1000)
    specs = []
    for caller in callers:
        for body in bodies:
            request = parse_search_request(body, settings.api)
            scope = await service.compile_scope(caller.principals, request.filters.project_id)
            legs = service.plan_legs(request, scope, vectors[request.query])
            lines = msearch_lines(service.index, legs)
            specs.append(Spec(caller, body, request, lines, len(scope.document_ids)))
    return specs, {"embedder_direct_ms_p50": round(statistics.median(embed_ms), 2)}


RECALL_AT = 10


def _recall_bodies(leg: dict[str, Any], space_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped kNN leg cut to its first RECALL_AT hits, and exact search over the same filter (every
    row the filter admits scored by the k-NN scoring script; rows without a vector cannot match)."""
    knn = leg["query"]["knn"]["embedding"]
    approx = {**leg, "size": RECALL_AT, "_source": False}
    script = {"source": "knn_score", "lang": "knn",
              "params": {"field": "embedding", "query_value": knn["vector"], "space_type": space_type}}  # fmt: skip
    exact_filter = {"bool": {"filter": [knn["filter"], {"exists": {"field": "embedding"}}]}}
    exact = {"size": RECALL_AT * 3, "_source": False, "track_total_hits": False,
             "query": {"script_score": {"query": exact_filter, "script": script}}}  # fmt: skip
    return approx, exact


def recall_at(approx_ids: Sequence[str], exact: Sequence[tuple[str, float]], at: int = RECALL_AT) -> float | None:
    """Recall@at of approximate ids against exact (id, score) hits, best first. Rows tied with the exact
    at-th score count as relevant (repeated inputs share one vector, so ties are common and any of them
    is a right answer). None when the filter admits no row."""
    if not exact:
        return None
    cut = exact[min(at, len(exact)) - 1][1]
    relevant = {doc_id for doc_id, score in exact if score >= cut - 1e-6}
    return len(set(approx_ids[:at]) & relevant) / min(at, len(exact))


EF_SWEEP = (0, 100, 200, 400, 800, 1600)  # ef_search values the recall is also measured at (0: engine default)


def _with_ef_search(leg: dict[str, Any], ef_search: int) -> dict[str, Any]:
    knn = dict(leg["query"]["knn"]["embedding"])
    knn.pop("method_parameters", None)
    if ef_search:
        knn["method_parameters"] = {"ef_search": max(int(knn["k"]), ef_search)}
    return {**leg, "query": {"knn": {"embedding": knn}}}


async def knn_recall(client: Any, index: str, specs: Sequence[Spec], space_type: str) -> dict[str, Any]:
    """Recall@10 of the filtered kNN leg as the service sends it (its `k`, `ef_search`, scope and metadata
    filter) against exact search, per caller; and the same leg at other `ef_search` values, with its took."""
    shipped: dict[str, list[float]] = {}
    sweep: dict[int, list[float]] = {}
    took: dict[int, list[float]] = {}
    exact_ms: list[float] = []
    for spec in specs:
        leg = next((b for b in spec.lines[1::2] if "knn" in b.get("query", {})), None)
        if leg is None:
            continue
        approx_body, exact_body = _recall_bodies(leg, space_type)
        started = time.perf_counter()
        exact = await client.search(index=index, body=exact_body, request_timeout=120)
        exact_ms.append((time.perf_counter() - started) * 1000)
        truth = [(h["_id"], h["_score"]) for h in exact["hits"]["hits"]]
        if not truth:
            continue
        approx = await client.search(index=index, body=approx_body)
        shipped.setdefault(spec.caller.subject, []).append(
            recall_at([h["_id"] for h in approx["hits"]["hits"]], truth) or 0.0
        )
        for ef in EF_SWEEP:
            answer = await client.search(index=index, body=_with_ef_search(approx_body, ef))
            sweep.setdefault(ef, []).append(recall_at([h["_id"] for h in answer["hits"]["hits"]], truth) or 0.0)
            took.setdefault(ef, []).append(float(answer["took"]))
    return {
        "at": RECALL_AT,
        "k": next((leg_depth(s.request.window) for s in specs), None),
        "method": "the service's kNN leg (its k, ef_search and filter), first 10 hits, against exact script_score "
        "(knn_score) over the same filter; rows tied with the 10th exact score count as relevant",
        "by_caller": {
            subject: {"queries": len(values), "mean": round(statistics.mean(values), 4), "min": round(min(values), 4)}
            for subject, values in shipped.items()
        },
        "by_ef_search": {
            str(ef): {
                "mean": round(statistics.mean(values), 4),
                "min": round(min(values), 4),
                "took_ms_p50": statistics.median(took[ef]),
            }  # fmt: skip
            for ef, values in sweep.items()
        },
        "exact_search_ms_p50": round(statistics.median(exact_ms), 1) if exact_ms else None,
    }


# --------------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------------


@dataclass
class SideRound:
    latencies_s: list[float]
    wall_s: float
    errors: list[str]
    server_timings: list[dict[str, float]] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)


async def run_side(
    call: Callable[[Spec], Awaitable[tuple[int, dict[str, float]]]], specs: Sequence[Spec], n: int, concurrency: int
) -> SideRound:
    """`n` requests cycling through `specs`, `concurrency` in flight; per-request latency, wall time."""
    out = SideRound([], 0.0, [])
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            try:
                result = await call(specs[i % len(specs)])
            except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
                out.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            latency = time.perf_counter() - started
            out.latencies_s.append(latency)
            hits, timings = result
            out.hits.append(hits)
            if "total" in timings:
                # What the client waited beyond the service's own total: auth, parsing, JSON, HTTP, loop waits.
                out.server_timings.append({**timings, "outside_service": latency * 1000 - timings["total"]})

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.wall_s = time.perf_counter() - started
    return out


class ApiClient:
    """`POST /v1/search` over real HTTP; a JSON body is read and decoded like any caller would."""

    def __init__(self, base: str, max_concurrency: int) -> None:
        self.url = f"{base}/v1/search"
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_concurrency, force_close=False),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        self._payloads: dict[int, bytes] = {}

    async def call(self, spec: Spec) -> tuple[int, dict[str, float]]:
        payload = self._payloads.setdefault(id(spec), json.dumps(spec.body).encode())
        headers = {"Authorization": f"Bearer {spec.caller.token}", "Content-Type": "application/json"}
        async with self.session.post(self.url, data=payload, headers=headers) as response:
            raw = await response.read()
        data = json.loads(raw)
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data}")
        return len(data["hits"]), data.get("timings_ms") or {}

    async def close(self) -> None:
        await self.session.close()


class RawClient:
    """The service's `_msearch` lines straight to OpenSearch, through the client the service uses."""

    def __init__(self, settings: Settings) -> None:
        self.client = make_client(settings)

    async def call(self, spec: Spec) -> tuple[int, dict[str, float]]:
        response = await self.client.msearch(body=spec.lines)
        responses = response.get("responses") or []
        failed = [r["error"] for r in responses if "error" in r]
        if failed or len(responses) * 2 != len(spec.lines):
            raise RuntimeError(f"_msearch failed: {failed[:1]}")
        return sum(len(r.get("hits", {}).get("hits", [])) for r in responses), {}

    async def close(self) -> None:
        await self.client.close()


# --------------------------------------------------------------------------------------------------
# The API child process
# --------------------------------------------------------------------------------------------------


class ServeChild:
    """`ki serve` as a child process on a free port, logging to build/bench/search-api.log."""

    def __init__(
        self,
        config: str | None,
        log_path: Path,
        operator_token: str,
        workers: int = 1,
        extra_env: dict[str, str] | None = None,
        *,
        needs_index: bool = True,
        checkout: Path = REPO_ROOT,
    ) -> None:
        self.operator_token = operator_token  # `/metrics` answers operators only
        self.needs_index = needs_index  # False: ready without the index (SQL-only endpoints)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [sys.executable, "-m", "apps.cli"] + (["--config", config] if config else [])
        argv += ["serve", "--workers", str(workers)]
        env = {"PYTHONUNBUFFERED": "1", "KI_API__PORT": str(self.port)}
        if checkout == REPO_ROOT:  # (an older checkout may not know the setting: its settings refuse it)
            # The benchmark measures the search: a few callers at full speed would meet the per-caller limit.
            env["KI_API__LIMITS__RATE_PER_S"] = "0"
        env.update(extra_env or {})
        self.child = Child(argv, log_path, cwd=checkout, env=env)

    def _ready(self) -> bool:
        """Ready, and its scope cache in use when it has one (timed rounds must not run on the SQL path)."""
        try:
            with urllib.request.urlopen(f"{self.base}/readyz", timeout=5) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 503: something is not ready
            answer = json.loads(exc.read() or b"{}")
        except OSError:
            return False
        checks, state = answer.get("checks", {}), answer.get("scope_cache", {})
        waiting = [name for name, check in checks.items() if check != "ok" and (name != "index" or self.needs_index)]
        return bool(checks) and not waiting and bool(state.get("usable") or not state.get("enabled"))

    def metric(self, family: str, label: str) -> dict[str, float]:
        """`<family>_total` samples by the value of `label`, from the API's /metrics (every worker's)."""
        samples = exposition.scrape(f"{self.base}/metrics", token=self.operator_token)
        return exposition.by_label(samples, f"{family}_total", label)

    async def start(self, timeout: float = 180) -> None:
        self.child.start()
        why = await asyncio.to_thread(self.child.wait_ready, self._ready, timeout)
        if why is not None:
            raise BenchError(f"`ki serve` did not become ready ({why}); see {self.log_path}")

    def stop(self) -> None:
        self.child.stop()


# --------------------------------------------------------------------------------------------------
# Scope compilation against the number of visible documents
# --------------------------------------------------------------------------------------------------

_SCOPE_DOCS_SQL = text(
    """
    WITH d AS (
        INSERT INTO documents (project_id, title)
        SELECT (CAST(:pids AS bigint[]))[1 + (g % cardinality(CAST(:pids AS bigint[])))], :title || g
        FROM generate_series(1, :n) AS g
        RETURNING id
    ), v AS (
        INSERT INTO document_versions (document_id, version_no, status, text)
        SELECT id, 1, 'final', 'Bench scope.' FROM d
        RETURNING id
    ), o AS (
        INSERT INTO source_objects (source_id, external_ref)
        SELECT :source, :title || v.id FROM v
        RETURNING id, external_ref
    )
    INSERT INTO source_observations (document_version_id, source_object_id)
    SELECT v.id, o.id FROM v JOIN o ON o.external_ref = :title || v.id
    """
).bindparams(bindparam("pids", type_=ARRAY(BigInteger)))


def _insert_scope_caller(conn: Connection, source: int, tag: str, n: int, also: Sequence[int] = ()) -> str:
    """`n` one-version documents in ceil(n/1000) projects, visible to one user through a mirrored group
    that holds project allows (the `local_fs` objects have no ACL, so they delegate to the project); the
    group also reaches the projects `also` (the indexed corpus: something for the legs to find), as a
    member of the principals their project allows name: the corpus rows' principal projections already
    name those, so a filter by projection finds them although these rows never reach the index."""
    group, user = f"group:bench-scope-{tag}-{n}", f"user:bench-scope-{tag}-{n}"
    projects = max(1, math.ceil(n / 1000))
    pids = [
        r.id
        for r in conn.execute(
            text("INSERT INTO projects (name) SELECT :name || g FROM generate_series(1, :k) g RETURNING id"),
            {"name": f"bench scope {tag} n{n} p", "k": projects},
        )
    ]
    conn.execute(
        text(
            "INSERT INTO grants (scope, project_id, principal, effect)"
            " SELECT 'project', p, :g, 'allow' FROM unnest(CAST(:pids AS bigint[])) p"
        ).bindparams(bindparam("pids", type_=ARRAY(BigInteger))),
        {"g": group, "pids": [*pids, *also]},
    )
    conn.execute(
        text("INSERT INTO group_memberships (source_id, group_principal, member_principal) VALUES (:s, :g, :u)"),
        {"s": source, "g": group, "u": user},
    )
    conn.execute(
        text(
            "INSERT INTO group_memberships (source_id, group_principal, member_principal)"
            " SELECT DISTINCT :s, principal, :g FROM grants"
            " WHERE scope = 'project' AND effect = 'allow' AND project_id = ANY(CAST(:also AS bigint[]))"
        ).bindparams(bindparam("also", type_=ARRAY(BigInteger))),
        {"s": source, "g": group, "also": list(also)},
    )
    conn.execute(_SCOPE_DOCS_SQL, {"pids": pids, "title": f"bench-scope-{tag}-{n}-", "n": n, "source": source})
    return user


_SCOPE_TABLES = (
    "projects",
    "sources",
    "documents",
    "document_versions",
    "source_objects",
    "source_observations",
    "grants",
    "group_memberships",
)


async def _bounded_against_exact(
    service: SearchService, scope: CompiledScope, request: SearchRequest, vector: list[float]
) -> dict[str, Any]:
    """The legs through the service's bounded filter next to the legs through the exact filter, leg by
    leg; for the semantic leg (approximate kNN in both) also each one's recall of the true nearest
    in-scope neighbours (brute force over the exact filter)."""
    budget = service.filter_budget
    chosen = service.scope_filter(scope)
    filter_bytes = len(json.dumps(strict_filter(chosen, [])))
    started = time.perf_counter()
    bounded, rounds = await service.run_legs_in_scope(request, scope, vector)
    legs_ms = (time.perf_counter() - started) * 1000
    service.filter_budget = None
    try:
        exact, _ = await service.run_legs_in_scope(request, scope, vector)
    finally:
        service.filter_budget = budget
    equal = {leg: [h.id for h in bounded.hits[leg]] == [h.id for h in exact.hits[leg]] for leg in exact.hits}
    depth = max(len(exact.hits["semantic"]), 1)
    truth_body = {
        "size": depth,
        "_source": False,
        "query": {
            "script_score": {
                "query": {"bool": {"filter": [scope.opensearch_filter()]}},
                "script": {
                    "source": "knn_score",
                    "lang": "knn",
                    "params": {"field": "embedding", "query_value": vector, "space_type": "cosinesimil"},
                },
            }
        },
    }
    truth = {h["_id"] for h in (await service.client.search(index=service.index, body=truth_body))["hits"]["hits"]}

    def recall(run: LegRun) -> float:
        return round(len(truth & {h.id for h in run.hits["semantic"]}) / max(len(truth), 1), 3)

    return {
        "kind": chosen.kind,
        "filter_bytes": filter_bytes,
        "legs_ms": round(legs_ms, 2),
        "rounds": rounds,
        "hits_per_leg": {leg: len(hits) for leg, hits in bounded.hits.items()},
        "legs_equal": all(equal.values()),
        "equal_per_leg": equal,
        "semantic_recall_exact_filter": recall(exact),
        "semantic_recall_bounded_filter": recall(bounded),
    }


async def scope_compilation(
    settings: Settings,
    engine: Engine,
    service: SearchService,
    sizes: Sequence[int],
    repeats: int,
    probe: tuple[SearchRequest, list[float]],
    corpus_projects: Sequence[int] = (),
) -> dict[str, Any]:
    """Compile time (resolve the caller + `compile_scope`) per visible-document count, all sizes inserted
    first so the database is the same size for each; plus the exact filter's size and one `_msearch` with
    it, and the bounded filter the service sends instead: its size, its legs' time (with the fetch-more
    rounds) and whether its legs equal the exact filter's hit for hit (each caller also sees the corpus)."""
    tag = uuid.uuid4().hex[:8]
    security, max_terms = settings.security, settings.opensearch.max_terms_count
    results = []
    conn = engine.connect()
    trans = conn.begin()
    try:
        started = time.perf_counter()
        source = conn.execute(
            text("INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id"), {"n": f"bench scope {tag}"}
        ).scalar_one()
        callers = {}
        for n in sizes:
            callers[n] = _insert_scope_caller(conn, source, tag, n, corpus_projects)
            _progress(f"  scope: {n} visible documents inserted (uncommitted)")
        # Planner statistics as a database of this size would have them.
        conn.execute(text(f"ANALYZE {', '.join(_SCOPE_TABLES)}"))
        observations = conn.execute(text("SELECT count(*) FROM source_observations")).scalar_one()
        setup_s = time.perf_counter() - started
        request, vector = probe
        for n in sizes:
            times = []
            scope = None
            for _ in range(repeats):
                t = time.perf_counter()
                caller = resolve_caller(conn, [callers[n]], security)
                scope = compile_scope(conn, caller, security, max_terms_count=max_terms)
                times.append((time.perf_counter() - t) * 1000)
            assert scope is not None
            corpus_documents = len(scope.document_ids) - n
            if corpus_documents < 0 or (corpus_projects and corpus_documents == 0):
                raise BenchError(f"scope bench: the caller of {n} documents sees {len(scope.document_ids)}")
            t = time.perf_counter()
            scope_filter = scope.opensearch_filter()
            filter_bytes = len(json.dumps(scope_filter))
            filter_ms = (time.perf_counter() - t) * 1000
            lines = msearch_lines(service.index, service.plan_legs(request, scope, vector))
            search_ms = []
            for _ in range(3):
                t = time.perf_counter()
                response = await service.client.msearch(body=lines)
                search_ms.append((time.perf_counter() - t) * 1000)
                if any("error" in r for r in response.get("responses", [])):
                    raise BenchError(f"scope bench: _msearch with a {n}-document scope failed")
            doc_terms = scope_filter["bool"]["filter"][0]
            clauses = len(doc_terms["bool"]["should"]) if "bool" in doc_terms else 1
            bounded = await _bounded_against_exact(service, scope, request, vector)
            row = {
                "synthetic_documents": n,
                "corpus_documents": corpus_documents,
                "visible_documents": len(scope.document_ids),
                "compile_ms_p50": round(statistics.median(times), 2),
                "compile_ms_min": round(min(times), 2),
                "filter_build_and_json_ms": round(filter_ms, 2),
                "filter_bytes": filter_bytes,
                "document_terms_clauses": clauses,
                "msearch_ms_p50": round(statistics.median(search_ms), 2),
                "bounded": bounded,
            }
            results.append(row)
            _progress(
                f"  scope: {n:>7} documents: compile p50 {row['compile_ms_p50']:.1f} ms, filter "
                f"{filter_bytes / 1024:.0f} KiB in {clauses} terms clause(s), _msearch {row['msearch_ms_p50']:.0f} ms; "
                f"bounded: {bounded['kind']} {bounded['filter_bytes'] / 1024:.1f} KiB, legs "
                f"{bounded['legs_ms']:.0f} ms in {bounded['rounds']} round(s), equal to the exact filter's: "
                f"{bounded['equal_per_leg']}; kNN recall exact {bounded['semantic_recall_exact_filter']}, "
                f"bounded {bounded['semantic_recall_bounded_filter']}"
            )
    finally:
        trans.rollback()
        conn.close()
        # The rollback leaves the inserted rows behind as dead tuples, and ANALYZE's table sizes in pg_class
        # are not transactional: without this, the next search (and the next run) plans for a corpus 100k
        # documents larger than it is and scans the dead rows.
        _progress("  scope: vacuuming the rolled-back rows away")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as cleanup:
            cleanup.execute(text(f"VACUUM (ANALYZE) {', '.join(_SCOPE_TABLES)}"))
    return {
        "method": "caller rows inserted set-based in one transaction, measured inside it, rolled back",
        "repeats": repeats,
        "observations_in_database": int(observations),
        "setup_s": round(setup_s, 1),
        "sizes": results,
    }


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def _revision(ref: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO_ROOT, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise BenchError(f"--compare-checkout: {ref!r} is not a commit of this repository")
    return done.stdout.strip()


def _worktree(ref: str) -> Path:
    """A detached worktree of `ref` under build/compare-checkout/ (made once, reused)."""
    revision = _revision(ref)
    path = REPO_ROOT / "build" / "compare-checkout" / revision[:12]
    if not (path / "apps" / "cli.py").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(path), revision], cwd=REPO_ROOT,
                       check=True, capture_output=True)  # fmt: skip
    return path


def _compared_label(options: BenchOptions) -> str:
    parts = [_env_label(options.compare_env)] if options.compare_env else []
    if options.compare_checkout:
        parts.append(f"checkout {options.compare_checkout}")
    return ", ".join(parts)


def _env_label(env: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items()))


def _median_of(rounds: Sequence[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in rounds), 2)


def _timings_p50(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for s in samples for k in s})
    return {k: round(statistics.median(s[k] for s in samples if k in s), 2) for k in keys}


async def _warm(api: ApiClient, specs: Sequence[Spec]) -> SideRound:
    """One untimed pass over every spec: fills the embed cache (TTL!) and warms pools on both ends."""
    return await run_side(api.call, specs, len(specs), 1)


def side_order(sides: Sequence[str], r: int) -> list[str]:
    """Round `r`'s order: the sides rotated by r, so each goes first, middle and last in turn."""
    k = r % len(sides)
    return [*sides[k:], *sides[:k]]


async def measure_level(
    api: ApiClient,
    raw: RawClient,
    specs: Sequence[Spec],
    concurrency: int,
    rounds: int,
    requests: int,
    compare: ApiClient | None = None,
    compare_specs: Sequence[Spec] | None = None,
) -> dict[str, Any]:
    """API and raw `_msearch` (and `compare`, another API or another caller: `compare_specs`) in the same
    rounds, the sides' order rotating."""
    n = max(requests, 4 * concurrency)
    side_specs = {"api": specs, "raw_msearch": specs, "api_compare": compare_specs or specs}
    clients: dict[str, ApiClient | RawClient] = {"api": api, "raw_msearch": raw}
    if compare is not None:
        clients["api_compare"] = compare
    for name, client in (("api", api), ("api_compare", compare)):
        if client is not None:
            warm = await _warm(client, side_specs[name])
            if warm.errors:
                raise BenchError(f"{name}: warm-up requests failed: {warm.errors[:2]}")
    per_round: list[dict[str, Any]] = []
    pooled: dict[str, list[float]] = {side: [] for side in clients}
    server: list[dict[str, float]] = []
    server_compare: list[dict[str, float]] = []
    hits: dict[str, list[int]] = {side: [] for side in clients}
    errors: dict[str, list[str]] = {side: [] for side in clients}
    for r in range(rounds):
        figures: dict[str, dict[str, float]] = {}
        for side in side_order(list(clients), r):
            result = await run_side(clients[side].call, side_specs[side], n, concurrency)
            errors[side] += result.errors
            if not result.latencies_s:
                raise BenchError(f"{side}: every request failed at concurrency {concurrency}: {result.errors[:2]}")
            figures[side] = summarize(result.latencies_s, result.wall_s)
            pooled[side] += result.latencies_s
            hits[side] += result.hits
            (server_compare if side == "api_compare" else server).extend(result.server_timings)
        ratio_p50 = figures["api"]["p50_ms"] / figures["raw_msearch"]["p50_ms"]
        ratio_p99 = figures["api"]["p99_ms"] / figures["raw_msearch"]["p99_ms"]
        per_round.append({**figures, "ratio_p50": round(ratio_p50, 3), "ratio_p99": round(ratio_p99, 3)})
        if compare is not None:
            ratio_b = figures["api_compare"]["p50_ms"] / figures["raw_msearch"]["p50_ms"]
            per_round[-1] |= {"ratio_p50_compare": round(ratio_b, 3), "ratio_p50_delta": round(ratio_p50 - ratio_b, 3)}
            _progress(f"  c={concurrency} round {r + 1}/{rounds}: compared API p50 "
                      f"{figures['api_compare']['p50_ms']:.1f} ms, ratio p50 {ratio_b:.2f} "
                      f"(delta {ratio_p50 - ratio_b:+.3f})")  # fmt: skip
        _progress(
            f"  c={concurrency} round {r + 1}/{rounds}: API p50 {figures['api']['p50_ms']:.1f} ms "
            f"p99 {figures['api']['p99_ms']:.1f} ms {figures['api']['throughput_rps']:.0f} req/s | raw _msearch "
            f"p50 {figures['raw_msearch']['p50_ms']:.1f} ms p99 {figures['raw_msearch']['p99_ms']:.1f} ms "
            f"{figures['raw_msearch']['throughput_rps']:.0f} req/s | ratio p50 {ratio_p50:.2f}"
        )
    sides: dict[str, dict[str, Any]] = {}
    for side in clients:
        rs = [pr[side] for pr in per_round]
        sides[side] = {
            "requests_per_round": n,
            "p50_ms": _median_of(rs, "p50_ms"),
            "p95_ms": _median_of(rs, "p95_ms"),
            "p99_ms": _median_of(rs, "p99_ms"),
            "mean_ms": _median_of(rs, "mean_ms"),
            "throughput_rps": _median_of(rs, "throughput_rps"),
            "errors": len(errors[side]),
            "error_examples": errors[side][:3],
            "hits_per_request_p50": statistics.median(hits[side]) if hits[side] else 0,
        }
    server_p50 = _timings_p50(server)
    compared: dict[str, Any] = {}
    if compare is not None:
        compared = {
            "compare": {
                "api": sides["api_compare"],
                "ratio_p50": round(statistics.median(pr["ratio_p50_compare"] for pr in per_round), 3),
                "ratio_p50_delta": round(statistics.median(pr["ratio_p50_delta"] for pr in per_round), 3),
                "api_server_timings_ms_p50": _timings_p50(server_compare),
            }
        }
    return {
        "concurrency": concurrency,
        "rounds": rounds,
        "api": sides["api"],
        "raw_msearch": sides["raw_msearch"],
        "ratio_p50": round(statistics.median(pr["ratio_p50"] for pr in per_round), 3),
        "ratio_p99": round(statistics.median(pr["ratio_p99"] for pr in per_round), 3),
        "ratio_mean": round(
            statistics.median(pr["api"]["mean_ms"] / pr["raw_msearch"]["mean_ms"] for pr in per_round), 3
        ),
        "ratio_throughput": round(sides["api"]["throughput_rps"] / sides["raw_msearch"]["throughput_rps"], 3),
        "api_server_timings_ms_p50": server_p50,
        "per_round": per_round,
        "latencies_ms": {side: [round(x * 1000, 3) for x in v] for side, v in pooled.items()},
        **compared,
    }


async def embedding_cost(api: ApiClient, specs: Sequence[Spec]) -> dict[str, Any]:
    """The service's embed step on a cold cache (first time a text is seen) and warm (second time).

    Runs on a freshly started server, one request at a time, before anything else has asked these texts;
    a pass with other texts first warms the server's pools and prepared statements, so the cold pass differs
    from the warm one by the embedding only."""
    firsts: dict[str, Spec] = {}
    for spec in specs:
        firsts.setdefault(spec.request.query, spec)
    others = [Spec(s.caller, {**s.body, "query": f"{s.body['query']} Aufwärmen"}, s.request) for s in specs]
    warmup = await run_side(api.call, others, len(others), 1)
    if warmup.errors:
        raise BenchError(f"warm-up requests failed: {warmup.errors[:2]}")
    cold = await run_side(api.call, list(firsts.values()), len(firsts), 1)
    warm = await run_side(api.call, list(firsts.values()), len(firsts), 1)
    if cold.errors or warm.errors:
        raise BenchError(f"embedding-cost requests failed: {(cold.errors + warm.errors)[:2]}")
    return {
        "texts": len(firsts),
        # The service embeds while the scope SQL runs; `embed` is what it still waited for after the scope.
        "service_embed_wait_ms_p50_cold": round(statistics.median(t.get("embed", 0.0) for t in cold.server_timings), 2),
        "service_embed_wait_ms_p50_warm": round(statistics.median(t.get("embed", 0.0) for t in warm.server_timings), 2),
        "request_ms_p50_cold": round(statistics.median(cold.latencies_s) * 1000, 2),
        "request_ms_p50_warm": round(statistics.median(warm.latencies_s) * 1000, 2),
        "service_timings_ms_p50_cold": _timings_p50(cold.server_timings),
        "service_timings_ms_p50_warm": _timings_p50(warm.server_timings),
    }


async def _versions(settings: Settings, engine: Engine, embedder: Embedder) -> dict[str, str]:
    client = make_client(settings)
    try:
        opensearch = (await client.info())["version"]["number"]
    finally:
        await client.close()
    with engine.connect() as conn:
        postgresql = conn.execute(text("SHOW server_version")).scalar_one()
    import opensearchpy

    return {
        "python": platform.python_version(),
        "opensearch": str(opensearch),
        "postgresql": str(postgresql),
        "opensearch_py": opensearchpy.__versionstr__,
        "aiohttp": aiohttp.__version__,
        "embedder": embedder.signature,
    }


async def run_search_bench(settings: Settings, options: BenchOptions) -> dict[str, Any]:
    """The benchmark; a corpus it generates is removed at the end (also on failure or Ctrl-C), with its rows
    in the index. A corpus it reuses (e.g. the demo's) is not its own and stays."""
    if options.requests < 1 or options.rounds < 1 or not options.concurrency or options.scale < 1:
        raise BenchError("scale, requests and rounds must be at least 1, with at least one concurrency level")
    return await with_generated_corpus_removed(
        settings, options.seed, options.scale, lambda label: _run_search_bench(settings, options, label)
    )


async def with_generated_corpus_removed(
    settings: Settings, seed: int, scale: int, bench: Callable[[str], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`bench(label)`'s result with a `cleanup` record: a demo corpus it generates (labelled `label`) is removed
    at the end, also on failure or Ctrl-C; one it reuses (e.g. the demo's) is not its own and stays."""
    new_label = run_label(seed, scale)
    try:
        result = await bench(new_label)
    finally:
        removal = remove_generated(settings, seed, scale, new_label)
    return {**result, "cleanup": removal.as_dict()}


def remove_generated(settings: Settings, seed: int, scale: int, label: str) -> Removal:
    """Remove the demo corpus labelled `label` if this run generated one: its projects and sources (with all
    that hangs off them), the aliases only it created, and its rows in the index. The rows were written
    here (backfill path) into an index no worker may be writing, so they are deleted directly."""
    run_aliases = tuple(a["alias"] for a in plan_setup(scale=scale, seed=seed, label=label).aliases)
    # The e-mail aliases are shared by every demo corpus (inserted ON CONFLICT DO NOTHING); the SIDs are the run's.
    footprint = Footprint.ending_in(NAME_SEPARATOR + label, tuple(a for a in run_aliases if a.startswith("sid:")))
    return remove_bench_rows(settings, footprint, what="bench search", worker_writes_this_index=False)


async def _run_search_bench(settings: Settings, options: BenchOptions, new_label: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    engine = make_engine(settings)
    embedder = await asyncio.to_thread(create_embedder, settings)
    versions = await _versions(settings, engine, embedder)
    corpus = await ensure_corpus(
        settings, engine, options.seed, options.scale, index_missing=options.index_missing, new_label=new_label
    )
    index = settings.retrieval.index_name

    # The service in-process, for planning the raw side's bodies (the child process serves the API side).
    async_engine = make_async_engine(settings)
    service = SearchService(settings, async_engine, make_client(settings), embedder)
    operator = mint_token(settings.api, "ki-bench", roles=["operator"], ttl_s=6 * 3600)
    server = ServeChild(options.config, options.out_dir / "search-api.log", operator, options.workers)
    other = None
    if options.compare_env or options.compare_checkout:
        checkout = _worktree(options.compare_checkout) if options.compare_checkout else REPO_ROOT
        other = ServeChild(options.config, options.out_dir / "search-api-compare.log", operator, options.workers,
                           options.compare_env, checkout=checkout)  # fmt: skip
    api = raw = compare = None
    try:
        await service.client.indices.refresh(index=index)
        # The corpus's rows, counted a terms query's allowance of versions at a time (1M chunks: 156k versions).
        version_terms, step = [str(v) for v in corpus.version_ids], settings.opensearch.max_terms_count
        chunks = 0
        for start in range(0, len(version_terms), step):
            batch = {"terms": {"document_version_id": version_terms[start : start + step]}}
            chunks += await _count(service.client, index, batch)
        total_chunks = await _count(service.client, index, {"match_all": {}})
        identifiers, doc_type = await asyncio.to_thread(_corpus_identifiers, engine, corpus.label)
        bodies = query_mix(options.seed, identifiers, doc_type)
        callers = await pick_callers(service, demo_callers(settings), options.callers, options.caller_set)
        _progress(f"bench search: planning {len(callers)} callers x {len(bodies)} queries (scope, legs, vectors)")
        specs, direct = await plan_specs(service, settings, callers, bodies)
        scopes = {c.subject: next(s.scope_documents for s in specs if s.caller is c) for c in callers}
        _progress("bench search: recall@10 of the filtered kNN leg against exact search")
        recall = await knn_recall(service.client, index, specs, settings.retrieval.vector_space_type)

        _progress(f"bench search: starting `ki serve` on port {server.port}")
        await server.start()
        api = ApiClient(server.base, max(options.concurrency))
        if other is not None:
            _progress(f"bench search: starting the compared `ki serve` ({_compared_label(options)}) "
                      f"on port {other.port}")  # fmt: skip
            await other.start()
            compare = ApiClient(other.base, max(options.concurrency))
        raw = RawClient(settings)
        _progress("bench search: embedding cost on the cold server (cache empty), then warm")
        embedding = {**await embedding_cost(api, specs), **direct}

        levels = []
        for c in options.concurrency:
            _progress(f"bench search: concurrency {c}, {options.rounds} rounds (warm-up pass first)")
            levels.append(await measure_level(api, raw, specs, c, options.rounds, options.requests, compare))

        api_scope = {
            "cache": server.metric("ki_search_scope_cache", "result"),
            "filters": server.metric("ki_search_scope_filter", "kind"),
        }
        _progress(f"bench search: scope compilation for {', '.join(map(str, options.scope_sizes))} visible documents")
        unfiltered = next((s.request for s in specs if "filters" not in s.body), specs[0].request)
        probe = (unfiltered, await service.embed_query(service.plan(unfiltered).expansion.text))
        scope_result = (
            await scope_compilation(
                settings,
                engine,
                service,
                options.scope_sizes,
                options.scope_repeats,
                probe,
                await asyncio.to_thread(_corpus_projects, engine, corpus.version_ids),
            )
            if options.scope_sizes
            else None
        )
    finally:
        server.stop()
        if other is not None:
            other.stop()
        for closer in (api, raw, compare):
            if closer is not None:
                await closer.close()
        await service.client.close()
        await async_engine.dispose()
        engine.dispose()

    at8 = next((lv for lv in levels if lv["concurrency"] == 8), None)
    return {
        "benchmark": "search",
        "command": options.command,
        "machine": machine(
            load_start, note="shared and noisy: other processes use the same cores; compare ratios, not absolute times"
        ),
        "versions": versions,
        "corpus": {
            "label": corpus.label,
            "seed": options.seed,
            "scale_versions": options.scale,
            "reused": corpus.reused,
            "documents": corpus.documents,
            "versions": len(corpus.version_ids),
            "chunks": chunks,
            "index_chunks_total": total_chunks,
            "generate_s": round(corpus.generate_s, 1),
            "index_s": round(corpus.index_s, 1),
            "versions_indexed_now": corpus.versions_indexed_now,
            "versions_not_indexed": corpus.versions_not_indexed,
            "rows_embedded_now": corpus.rows_embedded_now,
        },
        "callers": [
            {"subject": c.subject, "principals": list(c.principals), "scope_documents": scopes[c.subject]}
            for c in callers
        ],
        "caller_set": options.caller_set,
        "api_workers": options.workers,
        "compare_env": options.compare_env or None,
        "compare_checkout": _revision(options.compare_checkout) if options.compare_checkout else None,
        "api_scope": api_scope,
        "queries": {
            "texts": [b["query"] for b in bodies],
            "with_filters": sum(1 for b in bodies if "filters" in b),
            "limit": LIMIT,
            "requests_in_mix": len(specs),
        },
        "method": {
            "api": "POST /v1/search over HTTP to a `ki serve` child; response read and JSON-decoded",
            "raw_msearch": (
                "the service's own _msearch lines (SearchService.plan_legs: compiled scope filter, metadata "
                "filters, leg depth) with the query vector computed up front, sent with the same client "
                "(ki.clients.make_client) at the same concurrency; no scope SQL, no embedding, no fusion, "
                "no re-verify, no HTTP hop to the API"
            ),
            "embedding": (
                "the API's embed cache is warmed before every timed level, so neither side pays for "
                "embedding in the timed rounds; cold/warm cost reported under `embedding`"
            ),
            "rounds": "sides alternate which goes first; per-round percentiles, medians over rounds",
        },
        "embedding": embedding,
        "levels": levels,
        "goal": {
            "text": f"/v1/search p50 <= {GOAL_RATIO_P50_C8}x raw _msearch at concurrency 8",
            "ratio_p50_at_8": at8["ratio_p50"] if at8 else None,
            "met": (at8["ratio_p50"] <= GOAL_RATIO_P50_C8) if at8 else None,
        },
        "scope_compilation": scope_result,
        "knn_recall": recall,
    }


def plot(result: dict[str, Any], path: Path) -> str | None:
    """Latency CDFs per concurrency (API vs raw) and scope compile time; None if matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return "matplotlib is not installed (pip install -e '.[bench]'); no plot written"
    levels = result["levels"]
    scope = result.get("scope_compilation") or {}
    panels = len(levels) + (1 if scope.get("sizes") else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.8), squeeze=False)
    for ax, level in zip(axes[0], levels, strict=False):
        for side, label in (("api", "POST /v1/search"), ("raw_msearch", "raw _msearch")):
            values = sorted(level["latencies_ms"][side])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"concurrency {level['concurrency']}: p50 ratio {level['ratio_p50']:.2f}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    if scope.get("sizes"):
        ax = axes[0][-1]
        xs = [s["visible_documents"] for s in scope["sizes"]]
        ax.plot(xs, [s["compile_ms_p50"] for s in scope["sizes"]], marker="o", label="compile_scope (SQL)")
        ax.plot(xs, [s["msearch_ms_p50"] for s in scope["sizes"]], marker="s", label="raw _msearch with that filter")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("visible documents")
        ax.set_ylabel("ms (median)")
        ax.set_title("scope size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    corpus = result["corpus"]
    fig.suptitle(f"ki bench search: {corpus['chunks']} chunks, {result['machine']['cpus']} shared cores", fontsize=10)
    save_figure(fig, path, dpi=110)
    return None


def main(settings: Settings, options: BenchOptions) -> int:
    result = asyncio.run(run_search_bench(settings, options))
    out = options.out_dir / "search.json"
    png = options.out_dir / "search_latency.png"
    note = plot(result, png)
    result["plot"] = str(png) if note is None else None
    if note:
        result["plot_note"] = note
        _progress(f"bench search: {note}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    summary = {k: v for k, v in result.items() if k != "levels"}
    summary["levels"] = [{k: v for k, v in lv.items() if k != "latencies_ms"} for lv in result["levels"]]
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    _progress(f"bench search: results in {out}" + (f", plot in {png}" if note is None else ""))
    errors = sum(lv[side]["errors"] for lv in result["levels"] for side in ("api", "raw_msearch"))
    if errors:
        _progress(f"bench search: {errors} request(s) failed; see error_examples in {out}")
    return 1 if errors else 0

"""`ki bench consistency`: what reading and a writer's consistency token cost, through `ki serve` on this stack.

Two figures, each against a baseline measured in the same run:
* **reading**: `GET /v1/documents/{id}/versions/{version_id}/text` of a 2,000-character slice against
  `GET /v1/documents/{id}` of the same document, in interleaved pairs (p50/p99 of each, and their ratio);
* **the token's wait** under `rate` access changes per second (document grants inserted and deleted, the
  freshness bench's load): a writer commits a new document and a grant, reads `pg_current_wal_lsn()` and
  searches for the document with that `consistency_token`; each trial's latency against the same search without
  a token right after, and whether the first request found the document.

Everything is written into a project and source of the run's own and removed at the end (also on failure).
Needs a sync worker (the one running, or one started here). Progress and a table on stderr, JSON to stdout and
`<out>/consistency.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from apps.dev.bench.cleanup import Footprint, bench_label, remove_bench_rows
from apps.dev.bench.corpus import write_corpus
from apps.dev.bench.freshness import AccessLoad, wait_indexed
from apps.dev.bench.search import ServeChild
from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.worker_process import SyncWorker
from ki.clients import make_engine, make_sync_client
from ki.settings import Settings
from search.web.auth import mint_token

SLICE_CHARS = 2_000
#: About five 2,000-character pages per document: a slice is a real part of a real-sized text.
PARAGRAPH = (
    "§ {n} Kündigung. Das Mietverhältnis kann von jeder Vertragspartei mit einer Frist von drei Monaten zum Ende "
    "eines Kalendermonats schriftlich gekündigt werden. Die Kündigung bedarf der Schriftform; maßgeblich ist der "
    "Zugang beim Empfänger. "
)


@dataclass(frozen=True)
class ConsistencyOptions:
    docs: int = 40
    read_pairs: int = 400
    trials: int = 100
    rate: int = 200
    config: str | None = None
    command: str = ""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _call(base: str, token: str, method: str, path: str, body: Any = None) -> tuple[float, int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    return (time.perf_counter() - started) * 1000, status, json.loads(payload or b"null")


def _summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples, 50), 2), "p99_ms": round(percentile(samples, 99), 2), "n": len(samples)}


def _reading(base: str, token: str, documents: list[tuple[int, int]], pairs: int) -> dict[str, Any]:
    """Interleaved pairs (the order alternating), each pair on one random document."""
    rng = random.Random(11)
    metadata: list[float] = []
    slices: list[float] = []
    for i in range(pairs):
        document, version = rng.choice(documents)
        offset = rng.randrange(0, 4 * SLICE_CHARS)
        calls = [
            ("metadata", f"/v1/documents/{document}"),
            ("slice", f"/v1/documents/{document}/versions/{version}/text?offset={offset}&length={SLICE_CHARS}"),
        ]
        for kind, path in calls if i % 2 else reversed(calls):
            ms, status, body = _call(base, token, "GET", path)
            if status != 200:
                raise RuntimeError(f"{path}: {status} {body}")
            (metadata if kind == "metadata" else slices).append(ms)
        if (i + 1) % 100 == 0:
            _say(f"consistency: reading {i + 1}/{pairs} pairs")
    ratio = {q: round(percentile(slices, q) / percentile(metadata, q), 3) for q in (50, 99)}
    return {"metadata": _summary(metadata), "slice_2000": _summary(slices), "ratio_p50": ratio[50],
            "ratio_p99": ratio[99]}  # fmt: skip


def _trials(settings: Settings, base: str, token: str, corpus: Any, tag: str, trials: int) -> dict[str, Any]:
    engine = make_engine(settings)
    waited: list[float] = []
    plain: list[float] = []
    found = 0
    vectors_current = 0
    with engine.connect() as conn:  # the new documents are observed where the corpus's first one is
        observed_at = conn.execute(
            text("SELECT source_object_id FROM source_observations WHERE document_version_id = :v"),
            {"v": corpus.version_ids[0]},
        ).scalar_one()
    try:
        for i in range(trials):
            word = f"konsistenzprobe{i}x{tag}"
            with engine.begin() as conn:
                document = conn.execute(
                    text("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id"),
                    {"p": corpus.project, "t": f"Probe {i} {tag}"},
                ).scalar_one()
                version = conn.execute(
                    text("INSERT INTO document_versions (document_id, version_no, status, text)"
                         " VALUES (:d, 1, 'final', :t) RETURNING id"),
                    {"d": document, "t": f"{word} Nachtrag zum Mietvertrag."},
                ).scalar_one()  # fmt: skip
                conn.execute(
                    text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
                    {"v": version, "o": observed_at},
                )
            with engine.connect() as conn:
                lsn = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
            body = {"query": word, "mode": "lexical", "limit": 3}
            ms, status, answer = _call(base, token, "POST", "/v1/search", {**body, "consistency_token": lsn})
            if status != 200:
                raise RuntimeError(f"search with a token: {status} {answer}")
            waited.append(ms)
            found += [h["document_id"] for h in answer["hits"]] == [document]
            vectors_current += answer["consistency"]["vectors"] == "current"
            ms, status, _ = _call(base, token, "POST", "/v1/search", body)
            plain.append(ms)
            if (i + 1) % 20 == 0:
                _say(f"consistency: {i + 1}/{trials} write-then-search trials, {found} found on the first request")
    finally:
        engine.dispose()
    return {
        "trials": trials,
        "found_first_request": found,
        "vectors_current": vectors_current,
        "with_token": _summary(waited),
        "without_token": _summary(plain),
        "added_p50_ms": round(percentile(waited, 50) - percentile(plain, 50), 2),
        "added_p99_ms": round(percentile(waited, 99) - percentile(plain, 99), 2),
    }


def run_consistency_bench(settings: Settings, options: ConsistencyOptions) -> dict[str, Any]:
    label = bench_label("consistency")
    load_start = os.getloadavg()
    tag = label.rsplit(" ", 1)[1]
    engine = make_engine(settings)
    search = make_sync_client(settings, timeout_s=30)
    worker = SyncWorker(settings, REPO_ROOT / "build" / "bench-consistency-worker.log", config=options.config)
    _say("consistency: " + worker.ensure())
    result: dict[str, Any] = {"benchmark": "consistency", "command": options.command, "label": label}
    api: ServeChild | None = None
    try:
        reader = f"reader-{tag}"
        corpus = write_corpus(
            engine, label=label, docs=options.docs, principal=f"user:{reader}",
            text_of=lambda n: f"Mietvertrag {n} {tag}\n" + "".join(PARAGRAPH.format(n=k) for k in range(40)),
        )  # fmt: skip
        _say(f"consistency: {options.docs} documents written as `{label}` (removed at the end)")
        wait_indexed(search, settings.retrieval.index_name, corpus.version_ids, None, 900)
        operator = mint_token(settings.api, f"consistency-{tag}", roles=["operator"])
        api = ServeChild(options.config, REPO_ROOT / "build" / "bench-consistency-api.log", operator)
        asyncio.run(api.start())
        token = mint_token(settings.api, reader)
        documents = list(zip(corpus.document_ids, corpus.version_ids, strict=True))
        _say(f"consistency: reading, {options.read_pairs} interleaved pairs")
        result["reading"] = _reading(api.base, token, documents, options.read_pairs)
        load = AccessLoad(engine, corpus.document_ids, options.rate, tag)
        _say(f"consistency: {options.trials} write-then-search trials under {options.rate} access changes/s")
        load.start()
        try:
            result["token"] = _trials(settings, api.base, token, corpus, tag, options.trials)
        finally:
            load.stop_event.set()
            load.join(10)
        if load.error is not None:
            raise RuntimeError(f"the access load failed: {load.error}")
        result["token"]["access_changes_per_s"] = options.rate
    finally:
        if api is not None:
            api.stop()
        result["cleanup"] = remove_bench_rows(settings, Footprint.of_label(label), what="consistency").as_dict()
        worker.stop()  # only the one started here: a worker that was already running keeps running
        search.close()
        engine.dispose()
    result["machine"] = machine(load_start)
    return result


def table(result: dict[str, Any]) -> str:
    r, t = result["reading"], result["token"]
    return "\n".join([
        "| measure | p50 ms | p99 ms |",
        "| --- | ---: | ---: |",
        f"| GET /v1/documents/{{id}} | {r['metadata']['p50_ms']} | {r['metadata']['p99_ms']} |",
        f"| GET .../text, 2,000 chars | {r['slice_2000']['p50_ms']} | {r['slice_2000']['p99_ms']} |",
        f"| search, no token | {t['without_token']['p50_ms']} | {t['without_token']['p99_ms']} |",
        f"| search with a fresh token | {t['with_token']['p50_ms']} | {t['with_token']['p99_ms']} |",
        f"found on the first request: {t['found_first_request']}/{t['trials']} at "
        f"{t['access_changes_per_s']} access changes/s; slice/metadata p50 {r['ratio_p50']}, p99 {r['ratio_p99']}",
    ])  # fmt: skip


def main(settings: Settings, options: ConsistencyOptions, out: Path | None) -> int:
    result = run_consistency_bench(settings, options)
    _say(table(result))
    text_out = json.dumps(result, indent=2, ensure_ascii=False)
    print(text_out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "consistency.json").write_text(text_out + "\n")
    token = result["token"]
    return 0 if token["found_first_request"] == token["trials"] else 1

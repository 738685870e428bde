"""`ki demo` and `ki demo generate`."""

from __future__ import annotations

import os
import shlex
import sys

from ki.db.engine import make_engine
from ki.demo.generator import DEMO_TAG, demo_data_exists, generate
from ki.settings import Settings


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


def example_queries(settings: Settings) -> list[str]:
    base = f"{settings.opensearch.url}/{settings.retrieval.index_name}/_search?pretty"
    bm25 = '{"size": 3, "_source": ["title", "identifiers", "status"], "query": {"match": {"text": "fristlose Kündigung Zahlungsverzug"}}}'  # noqa: E501
    term = '{"size": 3, "_source": ["title", "identifiers"], "query": {"bool": {"filter": [{"term": {"identifiers": "§ 535 BGB"}}]}}}'  # noqa: E501
    count = f"{settings.opensearch.url}/{settings.retrieval.index_name}/_count?pretty"
    header = "-H 'Content-Type: application/json'"
    return [
        f"curl -s {shlex.quote(count)}",
        f"curl -s {shlex.quote(base)} {header} -d {shlex.quote(bm25)}",
        f"curl -s {shlex.quote(base)} {header} -d {shlex.quote(term)}",
    ]


def run_demo(settings: Settings, *, scale: int, seed: int, config: str | None = None) -> int:
    from ki.stack import manager

    print("ki demo: starting the local stack (`ki stack up`) ...", flush=True)
    code = manager.up(settings)
    if code != 0:
        return code
    engine = make_engine(settings, pooled=False)
    try:
        if demo_data_exists(engine):
            print(f"ki demo: demo data ({DEMO_TAG}-*) already in PostgreSQL; not generating more "
                  "(`ki demo generate --scale N` adds another corpus)")  # fmt: skip
        else:
            summary = generate(engine, scale=scale, seed=seed, progress=_progress)
            for line in summary.lines():
                print(line)
    finally:
        engine.dispose()
    print()
    print("ki demo: the rows are in PostgreSQL and already queued in Kafka by Debezium.")
    print("Starting the sync worker (`ki sync run`) in the foreground; Ctrl-C stops it.")
    print("Watch progress in another shell:   .venv/bin/ki sync status")
    print("Try these against OpenSearch once chunks arrive:")
    for query in example_queries(settings):
        print(f"  {query}")
    print(flush=True)
    argv = [sys.executable, "-m", "ki.cli"]
    if config:
        argv += ["--config", config]
    os.execv(sys.executable, [*argv, "sync", "run"])
    return 0  # pragma: no cover - execv does not return

"""`ki bench reuse`: how much of a corpus the vector store can share, from the rows the sync would build.

Every live version in PostgreSQL is projected as the sync projects it (`projections.rows.build_rows`, the
embedder's token window), once with the settings in effect and once per variant; per variant: rows that need
a vector, distinct embedding inputs (`embedding_key`), and the share of rows that get a stored vector instead
of an embedding (1 - distinct / rows). The variant `chunk_contextualize=false` shows what the context header
(title, type, matter) in every chunk's input costs in reuse: identical clauses of different contracts share
a key only without it. Also the live index's own figures (rows with a vector, distinct keys).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ki.clients import make_engine, make_sync_client
from ki.embedding import create_embedder
from ki.settings import Settings, with_overrides
from projections.chunking import TokenBudget
from projections.rows import AccessProjection, build_rows
from streams.replay import live_version_ids
from streams.source import PostgresSource

VARIANTS: dict[str, dict[str, Any]] = {
    "as_configured": {},
    "chunk_contextualize_off": {"chunk_contextualize": False},
}
_BATCH = 500


def _shares(settings: Settings, source: PostgresSource, version_ids: list[int], budget: TokenBudget) -> dict[str, Any]:
    keys: dict[str, list[str]] = {name: [] for name in VARIANTS}
    variants = {name: with_overrides(settings, {"retrieval": over}).retrieval for name, over in VARIANTS.items()}
    nobody = AccessProjection(allowed_principals=(), denied_principals=(), access_version=1)
    for start in range(0, len(version_ids), _BATCH):
        states, _ = source.versions(version_ids[start : start + _BATCH])
        for state in states.values():
            for name, retrieval in variants.items():
                rows = build_rows(
                    state.document, state.version, doc_type_ancestors=state.doc_type_ancestors,
                    doc_type_label=state.doc_type_label, matter_title=state.matter_title,
                    matter_reference=state.matter_reference, access=nobody, settings=retrieval, token_budget=budget,
                )  # fmt: skip
                keys[name].extend(row.content_hash for row in rows)
        print(f"bench reuse: {min(start + _BATCH, len(version_ids))}/{len(version_ids)} versions", flush=True)
    out = {}
    for name, hashes in keys.items():
        distinct = len(set(hashes))
        out[name] = {
            "rows": len(hashes),
            "distinct_inputs": distinct,
            "reusable_share": round(1 - distinct / len(hashes), 4) if hashes else None,
        }
    return out


def _index_figures(settings: Settings) -> dict[str, Any]:
    client = make_sync_client(settings)
    alias = settings.retrieval.index_name
    try:
        if not client.indices.exists_alias(name=alias):
            return {"alias": alias, "exists": False}
        body = {
            "size": 0,
            "track_total_hits": True,
            "query": {"exists": {"field": "embedding_key"}},
            # precision_threshold at its maximum: exact below 40,000 distinct keys
            "aggs": {"keys": {"cardinality": {"field": "embedding_key", "precision_threshold": 40000}}},
        }
        answer = client.search(index=alias, body=body)
        rows = int(answer["hits"]["total"]["value"])
        distinct = int(answer["aggregations"]["keys"]["value"])
        return {
            "alias": alias,
            "rows_with_key": rows,
            "distinct_keys": distinct,
            "reusable_share": round(1 - distinct / rows, 4) if rows else None,
        }
    finally:
        client.close()


def main(settings: Settings, *, out: Path, command: str) -> int:
    started = time.monotonic()
    engine = make_engine(settings, pooled=False)
    try:
        embedder = create_embedder(settings)
        budget = TokenBudget(embedder.count_tokens, embedder.max_tokens)
        version_ids = sorted(live_version_ids(engine))
        print(f"bench reuse: projecting {len(version_ids)} live versions as the sync does", flush=True)
        projected = _shares(settings, PostgresSource(engine, settings.security), version_ids, budget)
        result: dict[str, Any] = {
            "command": command,
            "database": settings.database.name,
            "versions": len(version_ids),
            "embedder": embedder.signature,
            "projected": projected,
            "index": _index_figures(settings),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        engine.dispose()
    for name, figures in projected.items():
        print(f"bench reuse: {name}: {figures['rows']} rows, {figures['distinct_inputs']} distinct inputs, "
              f"reusable share {figures['reusable_share']}")  # fmt: skip
    print(f"bench reuse: live index: {result['index']}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench reuse: wrote {out}", file=sys.stderr, flush=True)
    return 0

"""`ki bench sync`: content-sync and access-only throughput, with a raw `_bulk` baseline in the same run.

Writes a tagged corpus to PostgreSQL, then measures on the real services:
* content sync through the Projector (split + embed + bulk), versions/s and chunks/s, and the
  embedder's own rate separately;
* access-only reindex after a grant change touching every row, chunks/s;
* the raw `_bulk` partial-update rate for the same rows and fields (the baseline), and the ratio.
Prints progress and one JSON object with the figures.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

from sqlalchemy import text

from ki.db.engine import make_engine
from ki.embedding import create_embedder
from ki.settings import Settings
from streams.sync import Projector
from streams.writer import BulkOp, IndexWriter, make_client

PARAGRAPH = (
    "Absatz {i}: Der Auftragnehmer haftet für Schäden, die durch vorsätzliche oder grob fahrlässige "
    "Pflichtverletzungen entstehen. Die Haftung für leichte Fahrlässigkeit ist auf vorhersehbare, "
    "vertragstypische Schäden begrenzt; § 823 BGB bleibt unberührt."
)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_corpus(settings: Settings, versions: int, paragraphs: int) -> tuple[int, list[int]]:
    tag = uuid.uuid4().hex[:8]
    engine = make_engine(settings, pooled=False)
    body = "\n".join(PARAGRAPH.format(i=i) for i in range(paragraphs))
    with engine.begin() as conn:
        project = conn.execute(
            text("INSERT INTO projects (name) VALUES (:n) RETURNING id"), {"n": f"bench {tag}"}
        ).scalar_one()
        source = conn.execute(
            text("INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id"), {"n": f"bench {tag}"}
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO grants (scope, project_id, principal, effect)"
                " VALUES ('project', :p, 'group:bench', 'allow')"
            ),
            {"p": project},
        )
        ids = []
        for n in range(versions):
            doc = conn.execute(
                text("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id"),
                {"p": project, "t": f"Bench-Vertrag {n} {tag}"},
            ).scalar_one()
            version = conn.execute(
                text(
                    "INSERT INTO document_versions (document_id, version_no, status, text) "
                    "VALUES (:d, 1, 'draft', :t) RETURNING id"
                ),
                {"d": doc, "t": f"Vertrag Nr. {n}\n{body}"},
            ).scalar_one()
            obj = conn.execute(
                text("INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :r) RETURNING id"),
                {"s": source, "r": f"{tag}-{n}"},
            ).scalar_one()
            conn.execute(
                text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
                {"v": version, "o": obj},
            )
            ids.append(version)
    engine.dispose()
    return project, ids


async def run_sync_bench(settings: Settings, *, versions: int = 100, paragraphs: int = 12) -> dict[str, Any]:
    _progress(f"bench sync: writing {versions} versions of {paragraphs} paragraphs to PostgreSQL")
    project, version_ids = await asyncio.to_thread(_write_corpus, settings, versions, paragraphs)
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    index = f"bench-sync-{uuid.uuid4().hex[:8]}"
    writer = IndexWriter(client, settings, index=index)
    projector = Projector(settings, engine, writer, embedder)
    try:
        await writer.create_physical(index)
        _progress("bench sync: content sync (split, embed, bulk)")
        started = time.perf_counter()
        stats = None
        for i in range(0, len(version_ids), 16):
            stats_part = await projector.project_versions(version_ids[i : i + 16])
            stats = stats_part if stats is None else _merge(stats, stats_part)
            _progress(f"  {min(i + 16, len(version_ids))}/{len(version_ids)} versions")
        content_s = time.perf_counter() - started
        assert stats is not None
        await writer.refresh()
        chunks = stats.rows_written

        _progress("bench sync: access-only reindex after a grant change on every version")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO grants (scope, project_id, principal, effect)"
                    " VALUES ('project', :p, 'user:new', 'allow')"
                ),
                {"p": project},
            )
        texts_before = embedder.stats.texts
        started = time.perf_counter()
        access = await projector.project_access(version_ids)
        access_s = time.perf_counter() - started
        await writer.refresh()

        _progress("bench sync: baseline, raw _bulk partial updates of the same rows and fields")
        existing = await writer.existing_rows(version_ids)
        ops = [
            BulkOp(
                "update",
                row.doc_id,
                {
                    "allowed_principals": ["group:bench", "user:raw"],
                    "denied_principals": [],
                    "access_version": row.access_version + 1,
                },
            )
            for rows in existing.values()
            for row in rows.values()
        ]
        started = time.perf_counter()
        await writer.bulk(ops)
        raw_s = time.perf_counter() - started
        access_rate = access.access_rows_updated / access_s
        raw_rate = len(ops) / raw_s
        return {
            "corpus": {"versions": len(version_ids), "chunks": chunks},
            "content_sync": {
                "seconds": round(content_s, 2),
                "versions_per_s": round(len(version_ids) / content_s, 2),
                "chunks_per_s": round(chunks / content_s, 2),
                "embed_seconds": round(stats.seconds.get("embed", 0.0), 2),
                "embedder_chunks_per_s": round(stats.rows_embedded / max(stats.seconds.get("embed", 1e-9), 1e-9), 2),
            },
            "access_only": {
                "rows": access.access_rows_updated,
                "seconds": round(access_s, 3),
                "chunks_per_s": round(access_rate, 1),
                "texts_embedded": embedder.stats.texts - texts_before,
            },
            "raw_bulk_partial_update": {
                "rows": len(ops),
                "seconds": round(raw_s, 3),
                "chunks_per_s": round(raw_rate, 1),
            },
            "access_only_vs_raw_bulk": round(access_rate / raw_rate, 3),
        }
    finally:
        await client.indices.delete(index=index, ignore=(404,))
        await client.close()
        engine.dispose()


def _merge(a: Any, b: Any) -> Any:
    a.versions_projected += b.versions_projected
    a.rows_written += b.rows_written
    a.rows_embedded += b.rows_embedded
    for stage, seconds in b.seconds.items():
        a.seconds[stage] = a.seconds.get(stage, 0.0) + seconds
    return a


def main(settings: Settings, versions: int, paragraphs: int) -> int:
    result = asyncio.run(run_sync_bench(settings, versions=versions, paragraphs=paragraphs))
    print(json.dumps(result, indent=2))
    return 0

"""`ki bench sync`: content-sync and access-only throughput, with a raw `_bulk` baseline in the same run.

Writes a tagged corpus to PostgreSQL, then measures on the real services:
* content sync through the Projector (split + embed + bulk), versions/s and chunks/s, and the
  embedder's own rate separately;
* access-only reindex after a grant change touching every row, chunks/s;
* the raw `_bulk` partial-update rate for the same rows and fields (the baseline), and the ratio;
* the rebuild's path with unchanged inputs: the same versions projected into a fresh index that takes the
  first index's vectors by their embedding key (nothing may be embedded), against a raw `_bulk` of the
  same rows with their vectors into another fresh index, measured in the same run.
The corpus is written into a project of the run's own and removed at the end (`apps.dev.bench.cleanup`), with
the rows a running sync worker indexed from it; the private index is deleted. Prints progress and one JSON
object with the figures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from apps.dev.bench.cleanup import Footprint, bench_label, remove_bench_rows
from apps.dev.bench.corpus import write_corpus
from apps.dev.checkout import REPO_ROOT
from apps.dev.plotting import pyplot, save_figure
from ki.clients import make_client, make_engine
from ki.embedding import create_embedder
from ki.settings import Settings, with_overrides
from streams.replay import REBUILD_IN_FLIGHT, project_in_batches
from streams.sync import Projector, SyncStats
from streams.writer import BulkOp, IndexWriter

PARAGRAPH = (
    "Absatz {i}: Der Auftragnehmer haftet für Schäden, die durch vorsätzliche oder grob fahrlässige "
    "Pflichtverletzungen entstehen. Die Haftung für leichte Fahrlässigkeit ist auf vorhersehbare, "
    "vertragstypische Schäden begrenzt; § 823 BGB bleibt unberührt."
)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_corpus(settings: Settings, label: str, versions: int, paragraphs: int) -> tuple[int, list[int]]:
    body = "\n".join(PARAGRAPH.format(i=i) for i in range(paragraphs))
    engine = make_engine(settings, pooled=False)
    try:
        corpus = write_corpus(
            engine,
            label=label,
            docs=versions,
            text_of=lambda n: f"Vertrag Nr. {n}\n{body}",
            principal="group:bench",
        )
    finally:
        engine.dispose()
    return corpus.project, corpus.version_ids


async def run_sync_bench(
    settings: Settings,
    *,
    versions: int = 60,
    paragraphs: int = 40,
    rounds: int = 5,
    compare_model: str | None = None,
    compare_max_tokens: int = 256,
) -> dict[str, Any]:
    label = bench_label("sync")
    _progress(f"bench sync: writing {versions} versions of {paragraphs} paragraphs to PostgreSQL as `{label}`")
    try:
        result = await _measure(settings, label, versions, paragraphs, rounds, compare_model, compare_max_tokens)
    finally:
        # The corpus reached the shared index too if a sync worker runs (CDC); it deletes those rows.
        removal = remove_bench_rows(settings, Footprint.of_label(label), what="bench sync")
    return {**result, "cleanup": removal.as_dict()}


async def _measure(
    settings: Settings,
    label: str,
    versions: int,
    paragraphs: int,
    rounds: int,
    compare_model: str | None,
    compare_max_tokens: int,
) -> dict[str, Any]:
    project, version_ids = await asyncio.to_thread(_write_corpus, settings, label, versions, paragraphs)
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    index = f"bench-sync-{uuid.uuid4().hex[:8]}"
    writer = IndexWriter(client, settings, index=index)
    projector = Projector.on_postgres(settings, engine, writer, embedder)
    try:
        await writer.create_physical(index)
        _progress(f"bench sync: content sync (split, embed, bulk) with {embedder.signature}")
        content_s, stats = await _content_sync(projector, version_ids)
        await writer.refresh()
        chunks = stats.rows_written
        _progress("bench sync: re-projection into fresh indices with the first index's vectors (the rebuild's path)")
        reprojected = await _reprojection(settings, engine, client, embedder, index, version_ids, rounds)
        compared = None
        if compare_model:
            compared = await _compare_content_sync(
                settings, engine, client, compare_model, compare_max_tokens, version_ids
            )

        texts_before = embedder.stats.texts
        measured = []
        for r in range(rounds):
            # Alternate which side goes first, so neither always meets a warmer cache.
            order = ("ours", "raw") if r % 2 == 0 else ("raw", "ours")
            figures = {}
            for side in order:
                # Untimed: publish the other side's writes, so neither side starts from a stale read.
                await writer.refresh()
                if side == "ours":
                    figures[side] = await _access_round(engine, projector, project, version_ids, r)
                else:
                    figures[side] = await _raw_round(writer, version_ids, r)
            measured.append(figures)
            _progress(
                f"  access round {r + 1}/{rounds}: ours {figures['ours'][1] / figures['ours'][0]:.0f} chunks/s,"
                f" raw _bulk {figures['raw'][1] / figures['raw'][0]:.0f} chunks/s"
            )
        ours_rates = [m["ours"][1] / m["ours"][0] for m in measured]
        raw_rates = [m["raw"][1] / m["raw"][0] for m in measured]
        ratios = [o / r for o, r in zip(ours_rates, raw_rates, strict=True)]
        return {
            "corpus": {"versions": len(version_ids), "chunks": chunks, "paragraphs_per_version": paragraphs},
            "content_sync": _content_figures(embedder.signature, content_s, stats, len(version_ids)),
            "content_sync_compared": compared,
            "reprojection_with_reuse": reprojected,
            "access_only": {
                "rounds": rounds,
                "rows_per_round": measured[0]["ours"][1],
                "median_chunks_per_s": round(statistics.median(ours_rates), 1),
                "texts_embedded": embedder.stats.texts - texts_before,
            },
            "raw_bulk_partial_update": {
                "rows_per_round": measured[0]["raw"][1],
                "median_chunks_per_s": round(statistics.median(raw_rates), 1),
            },
            "access_only_vs_raw_bulk": {
                "median": round(statistics.median(ratios), 3),
                "per_round": [round(x, 3) for x in ratios],
            },
            "per_round_chunks_per_s": {
                "access_only": [round(x, 1) for x in ours_rates],
                "raw_bulk": [round(x, 1) for x in raw_rates],
            },
        }
    finally:
        await client.indices.delete(index=index, ignore=(404,))
        await client.close()
        engine.dispose()


async def _content_sync(
    projector: Projector, version_ids: list[int], batch: int = 16, in_flight: int = 1
) -> tuple[float, SyncStats]:
    """Every version through split + embed + bulk, `batch` at a time (as `ki rebuild` does with 64 and 2
    in flight): (seconds, stats)."""

    def progress(unit: str, done: int, total: int) -> None:
        if done:
            _progress(f"  {done}/{total} {unit}")

    started = time.perf_counter()
    stats = await project_in_batches(projector, set(version_ids), progress, batch, in_flight)
    return time.perf_counter() - started, stats


def _content_figures(signature: str, seconds: float, stats: Any, versions: int) -> dict[str, Any]:
    embed_s = stats.seconds.get("embed", 0.0)
    return {
        "embedder": signature,
        "seconds": round(seconds, 2),
        "versions_per_s": round(versions / seconds, 2),
        "chunks": stats.rows_written,
        "chunks_per_s": round(stats.rows_written / seconds, 2),
        "embed_seconds": round(embed_s, 2),
        "embedder_chunks_per_s": round(stats.rows_embedded / max(embed_s, 1e-9), 2),
    }


async def _reprojection(
    settings: Settings,
    engine: Any,
    client: Any,
    embedder: Any,
    source_index: str,
    version_ids: list[int],
    rounds: int,
    in_flight: int = REBUILD_IN_FLIGHT,
) -> dict[str, Any]:
    """What `ki rebuild` does when the embedder and the inputs did not change: project every version into a
    fresh index (64 versions per batch, `in_flight` batches at once, as the rebuild) taking the vectors of
    `source_index`; the baseline is a raw `_bulk` of the resulting rows, vectors included, into another
    fresh index. `rounds` of both, taking turns; medians reported."""
    measured: list[tuple[float, float, SyncStats, int]] = []  # ours seconds, raw seconds, stats, raw rows
    for r in range(rounds):
        ours_index, raw_index = (f"bench-sync-{uuid.uuid4().hex[:8]}" for _ in range(2))
        writer = IndexWriter(client, settings, index=ours_index, vector_sources=[source_index])
        try:
            for name in (ours_index, raw_index):
                await writer.create_physical(name, embedder.signature)
            projector = Projector.on_postgres(settings, engine, writer, embedder)
            seconds, stats = await _content_sync(projector, version_ids, 64, in_flight)
            await writer.refresh()
            rows = await writer.existing_rows(version_ids, with_source=("*",))
            ids = [row.doc_id for by_id in rows.values() for row in by_id.values()]
            vectors = await writer.vectors(ids)
            ops = [
                BulkOp("index", row.doc_id, {**row.source, "embedding": vectors[row.doc_id]})
                for by_id in rows.values()
                for row in by_id.values()
            ]
            started = time.perf_counter()
            await IndexWriter(client, settings, index=raw_index).bulk(ops)
            measured.append((seconds, time.perf_counter() - started, stats, len(ops)))
        finally:
            for name in (ours_index, raw_index):
                await client.indices.delete(index=name, ignore=(404,))
        ours_s, raw_s, stats, raw_rows = measured[-1]
        _progress(f"  re-projection round {r + 1}/{rounds}: {stats.rows_written / ours_s:.0f} rows/s "
                  f"({stats.rows_embedded} embedded), raw _bulk {raw_rows / raw_s:.0f} rows/s")  # fmt: skip
    ratios = [(stats.rows_written / ours_s) / (raw_rows / raw_s) for ours_s, raw_s, stats, raw_rows in measured]
    ours_s, raw_s, stats, raw_rows = sorted(measured, key=lambda m: m[0])[len(measured) // 2]
    return {
        "rounds": rounds,
        "versions_per_batch": 64,
        "batches_in_flight": in_flight,
        "rows": stats.rows_written,
        "rows_embedded": max(m[2].rows_embedded for m in measured),
        "rows_reused": stats.rows_reused,
        "median_seconds": round(statistics.median(m[0] for m in measured), 3),
        "median_rows_per_s": round(statistics.median(m[2].rows_written / m[0] for m in measured), 1),
        "raw_bulk_rows": raw_rows,
        "median_raw_bulk_seconds": round(statistics.median(m[1] for m in measured), 3),
        "median_raw_bulk_rows_per_s": round(statistics.median(m[3] / m[1] for m in measured), 1),
        "vs_raw_bulk": round(statistics.median(ratios), 3),
        "vs_raw_bulk_per_round": [round(x, 3) for x in ratios],
        "seconds_by_stage_median_round": {stage: round(s, 3) for stage, s in sorted(stats.seconds.items())},
    }


async def _compare_content_sync(
    settings: Settings, engine: Any, client: Any, model: str, max_tokens: int, version_ids: list[int]
) -> dict[str, Any]:
    """The same versions through the content sync with another local model, into a scratch index of its own
    (its chunks follow that model's token window, so the chunk counts may differ)."""
    other = with_overrides(settings, {"embedding": {"model": model, "max_tokens": max_tokens}})
    embedder = create_embedder(other)
    index = f"bench-sync-{uuid.uuid4().hex[:8]}"
    writer = IndexWriter(client, other, index=index)
    try:
        await writer.create_physical(index)
        _progress(f"bench sync: content sync with {embedder.signature}, for comparison")
        seconds, stats = await _content_sync(Projector.on_postgres(other, engine, writer, embedder), version_ids)
        return _content_figures(embedder.signature, seconds, stats, len(version_ids))
    finally:
        await client.indices.delete(index=index, ignore=(404,))


async def _access_round(
    engine: Any, projector: Projector, project: int, version_ids: list[int], round_no: int
) -> tuple[float, int]:
    """A project grant for a new principal, then the access-only path over every version: (seconds, rows)."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :who, 'allow')"),
            {"p": project, "who": f"user:round-{round_no}"},
        )
    started = time.perf_counter()
    access = await projector.project_access(version_ids)
    return time.perf_counter() - started, access.access_rows_updated


async def _raw_round(writer: IndexWriter, version_ids: list[int], round_no: int) -> tuple[float, int]:
    """The baseline: `_bulk` partial updates of the same rows and fields, ids and values known up front."""
    existing = await writer.existing_rows(version_ids)
    ops = [
        BulkOp(
            "update",
            row.doc_id,
            {
                "allowed_principals": ["group:bench", f"user:raw-{round_no}"],
                "denied_principals": [],
                "access_version": row.access_version + 1,
            },
        )
        for rows in existing.values()
        for row in rows.values()
    ]
    started = time.perf_counter()
    await writer.bulk(ops)
    return time.perf_counter() - started, len(ops)


def _plot(result: dict[str, Any], path: Path) -> Path | None:
    """Access-only vs raw `_bulk` rate per round, with the medians."""
    plt = pyplot()
    if plt is None:
        return None
    ours = result["per_round_chunks_per_s"]["access_only"]
    raw = result["per_round_chunks_per_s"]["raw_bulk"]
    rounds = range(1, len(ours) + 1)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.4
    ax.bar([r - width / 2 for r in rounds], ours, width, label="access-only reindex (ours)")
    ax.bar([r + width / 2 for r in rounds], raw, width, label="raw _bulk partial update")
    ratio = result["access_only_vs_raw_bulk"]["median"]
    ax.set(xlabel="round", ylabel="chunks/s", title=f"Access-only reindex vs raw _bulk (median ratio {ratio})")
    ax.legend()
    return save_figure(fig, path)


def main(
    settings: Settings,
    versions: int,
    paragraphs: int,
    rounds: int = 5,
    compare_model: str | None = None,
    compare_max_tokens: int = 256,
) -> int:
    result = asyncio.run(
        run_sync_bench(
            settings,
            versions=versions,
            paragraphs=paragraphs,
            rounds=rounds,
            compare_model=compare_model,
            compare_max_tokens=compare_max_tokens,
        )
    )
    out = REPO_ROOT / "build" / "bench" / "sync.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    chart = _plot(result, out.with_suffix(".png"))
    _progress(f"bench sync: results in {out}" + (f", chart in {chart}" if chart else " (no matplotlib: no chart)"))
    return 0

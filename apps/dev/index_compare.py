"""The live index against a clean rebuild from PostgreSQL, for a set of documents: what the fault tests assert
(`tests/integration/sync_harness.assert_index_equals_rebuild`) and what `ki bench soak` counts as lost.

A rebuild is made exactly as `ki rebuild` makes one (replay the CDC topics, resolve the dirty keys, project from
PostgreSQL into a fresh physical index), restricted to the given documents so its cost does not grow with
whatever else the stack holds; the fresh index is deleted afterwards."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from ki.clients import make_client
from ki.embedding import create_embedder
from ki.errors import PermanentError
from ki.settings import Settings
from streams.replay import read_topics
from streams.sync import Projector
from streams.writer import IndexWriter


def dump(search: OpenSearch, index: str, document_ids: Iterable[int]) -> dict[str, dict]:
    """Every row of these documents: id -> all fields (vectors rounded, so float noise can't differ; a row
    written text first has none yet)."""
    search.indices.refresh(index=index)
    response = search.search(
        index=index,
        body={"query": {"terms": {"document_id": sorted(str(d) for d in document_ids)}}, "size": 10_000},
    )
    out = {}
    for hit in response["hits"]["hits"]:
        source = hit["_source"]
        if "embedding" in source:
            source["embedding"] = [round(x, 5) for x in source["embedding"]]
        out[hit["_id"]] = source
    return out


def without_history(rows: Mapping[str, dict]) -> dict[str, dict]:
    """Rows without `access_version`: it counts how often a row's projection changed, so the live index
    (which saw every change) and a rebuild (which projects once) legitimately differ there. Rows carry
    no timestamps; every other field must be equal."""
    return {row_id: {k: v for k, v in row.items() if k != "access_version"} for row_id, row in rows.items()}


class MissingFromTopics(PermanentError):
    """Versions of the compared documents that the CDC topics never carried: no rebuild can be compared."""


def rebuilt_rows(settings: Settings, engine: Engine, search: OpenSearch, document_ids: set[int]) -> dict[str, dict]:
    """A clean rebuild of these documents' rows (see the module docstring)."""
    index = f"ki-fault-rebuild-{uuid.uuid4().hex[:10]}"
    with engine.connect() as conn:
        ours = {
            row.id
            for row in conn.execute(
                text("SELECT id FROM document_versions WHERE document_id = ANY(:d)"), {"d": sorted(document_ids)}
            )
        }

    async def rebuild() -> None:
        client = make_client(settings)
        try:
            writer = IndexWriter(client, settings, index=index)
            await writer.create_physical(index)
            keys, *_ = await asyncio.to_thread(read_topics, settings, progress=lambda _line: None)
            projector = Projector.on_postgres(settings, engine, writer, create_embedder(settings))
            content, access = await projector.resolve(keys)
            replayed = (content | access) & ours
            if replayed != ours:
                raise MissingFromTopics(f"versions missing from the CDC topics: {sorted(ours - replayed)[:10]}")
            await projector.project_versions(sorted(replayed))
        finally:
            await client.close()

    try:
        asyncio.run(rebuild())
        return dump(search, index, document_ids)
    finally:
        search.indices.delete(index=index, ignore=[404])


@dataclass(frozen=True)
class RowComparison:
    """Live rows against rebuilt ones (both without `access_version`): row ids only the rebuild has
    (missing: lost), only the live index has (extra), and on both with different fields (stale)."""

    live: int
    rebuilt: int
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.differing)


def compare_rows(live: Mapping[str, dict], rebuilt: Mapping[str, dict]) -> RowComparison:
    live_cmp, rebuilt_cmp = without_history(live), without_history(rebuilt)
    both = sorted(live_cmp.keys() & rebuilt_cmp.keys())
    return RowComparison(
        live=len(live),
        rebuilt=len(rebuilt),
        missing=sorted(rebuilt.keys() - live.keys()),
        extra=sorted(live.keys() - rebuilt.keys()),
        differing=[row_id for row_id in both if live_cmp[row_id] != rebuilt_cmp[row_id]],
    )


def field_diff(live: dict, rebuilt: dict, prefix: str = "") -> str:
    parts = []
    for name in sorted(k for k in live.keys() | rebuilt.keys() if live.get(k) != rebuilt.get(k)):
        a, b = live.get(name), rebuilt.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            parts.append(field_diff(a, b, f"{prefix}{name}."))
        else:
            parts.append(f"{prefix}{name}: live {str(a)[:80]!r} != rebuilt {str(b)[:80]!r}")
    return "; ".join(parts)

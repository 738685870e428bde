"""Benchmarks leave no trace: what a benchmark wrote to PostgreSQL, and what reached the index from it, is
removed when it ends — also when it fails or is interrupted (the callers remove in `finally`).

A benchmark names everything it writes with a label of its own (`bench_label`): its projects and sources
carry it, so they can be found again without the ids, even after a crash between a commit and the line that
kept the ids. Removing the projects and sources removes, by cascade, their documents, versions, matters,
observations, source objects, grants and group memberships. The sync worker sees those deletes through CDC
and deletes the index rows; `remove_bench_rows` waits (with a deadline, printing progress) until no row of
the removed projects is left in the index, and deletes what is left directly when no worker answers or the
deadline passes (the worker never brings such rows back: a version missing in PostgreSQL has no rows).

`ki bench clean` removes what runs killed outright (SIGKILL, power loss) left behind.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.demo.generator import NAME_SEPARATOR
from apps.dev.worker_process import SyncWorker
from ki.clients import make_engine, make_sync_client
from ki.settings import Settings

#: Every benchmark label starts with this; `ki bench clean` removes what carries it.
LABEL_PREFIX = "ki-bench"
#: Labels of runs before benchmarks cleaned up after themselves (`freshness 1a2b3c4d`, `bench 1a2b3c4d`).
LEGACY_LABEL = r"^(freshness|bench) [0-9a-f]{8}$"
#: The index aliases `ki bench authz-timing` creates for itself (physical indices `<alias>--...`).
AUTHZ_INDEX_PREFIX = "ki-bench-authz-timing-"


def bench_label(kind: str) -> str:
    """A fresh label for one run of benchmark `kind`, e.g. `ki-bench freshness 1a2b3c4d`."""
    return f"{LABEL_PREFIX} {kind} {uuid.uuid4().hex[:8]}"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Footprint:
    """How to find what one benchmark run wrote: projects and sources whose name matches `name_regex`
    (PostgreSQL regular expression), and the principal aliases only this run created."""

    name_regex: str
    aliases: tuple[str, ...] = ()

    @classmethod
    def of_label(cls, label: str) -> Footprint:
        return cls(f"^{re.escape(label)}$")

    @classmethod
    def ending_in(cls, suffix: str, aliases: tuple[str, ...] = ()) -> Footprint:
        return cls(f"{re.escape(suffix)}$", aliases)


@dataclass
class Removal:
    """What was removed, for the benchmark's JSON."""

    projects: list[int] = field(default_factory=list)
    sources: int = 0
    documents: int = 0
    versions: int = 0
    aliases: int = 0
    index_rows_at_start: int = 0
    index_rows_removed_by_worker: int = 0
    index_rows_removed_directly: int = 0
    index_rows_left: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_COUNT_OWNED = text(
    """
    SELECT count(DISTINCT d.id) AS documents, count(dv.id) AS versions
    FROM documents d LEFT JOIN document_versions dv ON dv.document_id = d.id
    WHERE d.project_id = ANY(:projects)
    """
)


def delete_from_postgres(engine: Engine, footprint: Footprint) -> Removal:
    """Delete the footprint's projects and sources (and by cascade all that hangs off them) in one transaction."""
    removal = Removal()
    with engine.begin() as conn:
        projects = [
            int(i)
            for i in conn.execute(
                text("SELECT id FROM projects WHERE name ~ :r ORDER BY id FOR UPDATE"), {"r": footprint.name_regex}
            ).scalars()
        ]
        if projects:
            owned = conn.execute(_COUNT_OWNED, {"projects": projects}).one()
            removal.documents, removal.versions = int(owned.documents), int(owned.versions)
            conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": projects})
        removal.projects = projects
        removal.sources = conn.execute(
            text("DELETE FROM sources WHERE name ~ :r"), {"r": footprint.name_regex}
        ).rowcount
        if footprint.aliases:
            removal.aliases = conn.execute(
                text("DELETE FROM principal_aliases WHERE alias = ANY(:a)"), {"a": list(footprint.aliases)}
            ).rowcount
    return removal


def index_rows(search: OpenSearch, index: str, projects: list[int]) -> int:
    """Rows of these projects in `index` as search sees them now (after the last refresh)."""
    if not projects or not search.indices.exists(index=index):
        return 0
    query = {"terms": {"project_id": [str(p) for p in projects]}}
    return int(search.count(index=index, body={"query": query})["count"])


def _delete_rows(search: OpenSearch, index: str, projects: list[int]) -> int:
    """Delete these projects' rows by id with `_bulk` (`_delete_by_query` needs the reindex module, which a
    minimal OpenSearch lacks), refreshing so that each pass sees what the last one deleted."""
    deleted = 0
    query = {"terms": {"project_id": [str(p) for p in projects]}}
    while True:
        hits = search.search(index=index, body={"size": 5000, "_source": False, "query": query})["hits"]["hits"]
        if not hits:
            return deleted
        body = [{"delete": {"_index": hit["_index"], "_id": hit["_id"]}} for hit in hits]
        search.bulk(body=body, refresh=True)
        deleted += len(hits)


def remove_bench_rows(
    settings: Settings,
    footprint: Footprint,
    *,
    what: str,
    wait_s: float = 300,
    worker_writes_this_index: bool = True,
    progress: Callable[[str], None] = _say,
) -> Removal:
    """Delete the footprint from PostgreSQL, then make sure none of its rows is left in the index.

    With a sync worker answering (and writing `settings.retrieval.index_name`), wait for it to delete the
    rows through CDC, polling with a deadline; what is left then (no worker, deadline passed, or rows the
    benchmark wrote itself into an index no worker writes) is deleted directly."""
    started = time.monotonic()
    engine = make_engine(settings, pooled=False)
    try:
        removal = delete_from_postgres(engine, footprint)
    finally:
        engine.dispose()
    search = make_sync_client(settings, timeout_s=30)
    index = settings.retrieval.index_name
    try:
        left = removal.index_rows_at_start = index_rows(search, index, removal.projects)
        progress(
            f"{what}: removed its {len(removal.projects)} project(s), {removal.documents} document(s),"
            f" {removal.versions} version(s) and {removal.sources} source(s) from PostgreSQL;"
            f" {left} of its row(s) in the index"
        )
        worker = worker_writes_this_index and left > 0 and SyncWorker(settings, Path(os.devnull)).answers()
        if worker:
            progress(f"{what}: waiting up to {wait_s:.0f} s for the sync worker to delete them (CDC)")
            deadline = time.monotonic() + wait_s
            last = time.monotonic()
            while left > 0 and time.monotonic() < deadline:
                time.sleep(0.5)
                left = index_rows(search, index, removal.projects)
                if time.monotonic() - last >= 5:
                    progress(f"  {left} row(s) still in the index ({time.monotonic() - started:.0f} s)")
                    last = time.monotonic()
            removal.index_rows_removed_by_worker = removal.index_rows_at_start - left
        if left > 0:
            why = "the sync worker did not remove them in time" if worker else "no sync worker removes them"
            progress(f"{what}: deleting {left} row(s) from the index directly ({why})")
            removal.index_rows_removed_directly = _delete_rows(search, index, removal.projects)
            left = index_rows(search, index, removal.projects)
        removal.index_rows_left = left
        removal.seconds = round(time.monotonic() - started, 2)
        if left:
            progress(f"{what}: {left} row(s) could not be removed from {index}; `ki bench clean` retries")
        else:
            progress(f"{what}: no trace left — nothing of it in PostgreSQL or the index ({removal.seconds:.1f} s)")
        return removal
    finally:
        search.close()


def clean(settings: Settings) -> int:
    """`ki bench clean`: remove what any benchmark run left behind (current and earlier labels)."""
    total = 0
    # A name is the label (most benchmarks), ends in it (`ki bench first-load`'s demo projects: `<name> · <label>`),
    # or is a label of the runs before.
    labelled = (Footprint(f"^{re.escape(LABEL_PREFIX)} "), Footprint(f"{re.escape(NAME_SEPARATOR + LABEL_PREFIX)} "))
    for footprint in (*labelled, Footprint(LEGACY_LABEL)):
        removal = remove_bench_rows(settings, footprint, what="bench clean")
        total += removal.index_rows_left
    search = make_sync_client(settings, timeout_s=30)
    try:  # the indices of a benchmark's own alias (never the configured one)
        own = search.indices.get(index=f"{AUTHZ_INDEX_PREFIX}*--*", ignore_unavailable=True)
        for index in [i for i in own if not i.startswith(f"{settings.retrieval.index_name}--")]:
            search.indices.delete(index=index, ignore_unavailable=True)
            _say(f"bench clean: removed the index {index}")
    finally:
        search.close()
    return 1 if total else 0

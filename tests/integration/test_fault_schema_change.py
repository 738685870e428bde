"""Faults: upstream schema changes while the sync runs (issue 51, item 6).

An upstream system adds a column to `documents` and to `document_versions` and widens `document_versions.version_no`
from integer to bigint while `ki sync run` streams changes. Debezium then emits events with a field the sync has never
seen and a wider type; nothing may stop, nothing may go to the dead-letter topic, and the index must equal a clean
rebuild afterwards. The schema is put back at the end (the faults lane's later tests share the database).
"""

from __future__ import annotations

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from ki.settings import Settings
from tests.integration.change_stream import ChangeStream, make_fault_world
from tests.integration.sync_harness import Worker, assert_index_equals_rebuild, wait_until_synced

pytestmark = [pytest.mark.stack, pytest.mark.faults]

CHANGES = (
    "ALTER TABLE documents ADD COLUMN upstream_note text",
    "ALTER TABLE document_versions ADD COLUMN upstream_reviewed boolean NOT NULL DEFAULT false",
    "ALTER TABLE document_versions ALTER COLUMN version_no TYPE bigint",
)
UNDO = (
    "ALTER TABLE documents DROP COLUMN IF EXISTS upstream_note",
    "ALTER TABLE document_versions DROP COLUMN IF EXISTS upstream_reviewed",
    "ALTER TABLE document_versions ALTER COLUMN version_no TYPE integer",
)


def test_columns_added_and_a_type_widened_during_the_sync_lose_nothing(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    world = make_fault_world(engine, documents=8)
    worker = Worker(settings, name="fault-schema-worker")
    worker.start()
    try:
        wait_until_synced(settings, engine)
        stream = ChangeStream(engine, world, rate=10, seed=516).start()
        try:
            stream.wait_for_more(10)
            # Each statement in its own transaction, as migration tools run them: one transaction locking documents
            # and then document_versions deadlocks with the sync's reads, which lock them in the other order.
            for statement in CHANGES:
                with engine.begin() as conn:
                    conn.execute(text(statement))
            # Rows that carry the new columns, written by the upstream system.
            with engine.begin() as conn:
                conn.execute(text("UPDATE documents SET upstream_note = 'geprüft', title = title || ' (geprüft)'"
                                  " WHERE id = ANY(:d)"), {"d": list(world.versions)})  # fmt: skip
                conn.execute(text("UPDATE document_versions SET upstream_reviewed = true, text = text || ' Geprüft.'"
                                  " WHERE id = ANY(:v)"), {"v": list(world.versions.values())})  # fmt: skip
            stream.wait_for_more(30)  # changes after the schema change keep coming through
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert worker.alive, worker.log_tail()
        assert worker.counter("ki_sync_dlq_events_total") == 0, worker.log_tail()
    finally:
        worker.stop()
        for statement in UNDO:
            with engine.begin() as conn:
                conn.execute(text(statement))
    print(f"{sum(counts.values())} row changes {dict(counts)} around the schema change")
    live = assert_index_equals_rebuild(settings, engine, search, set(world.versions))
    # The edits written with the new columns reached the rows (and equal the rebuild's, above).
    assert any("Geprüft." in str(row.get("text", "")) for row in live.values()), "the text edited after the change"

"""Replication slot health: the WAL the Debezium slot retains is reported, and the
heartbeat keeps the slot moving while no captured table changes.

Observed: `ki sync status` prints the retained bytes, the worker's /metrics carries
`ki_sync_replication_slot_retained_bytes`, and on an idle database the slot's confirmed_flush_lsn advances
(Debezium's `heartbeat.action.query` writes the heartbeat table every `connect.heartbeat_interval_ms`, and
Connect flushes its offsets every 5 s) while the end offsets of every CDC topic stay where they were —
the proof that no user table changed meanwhile. Takes ~25 s (not a `faults` test: it runs with the
others).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings
from tests.conftest import wait_for
from tests.integration.sync_harness import Worker, current_wal_lsn, end_offsets, slot_confirmed_past

pytestmark = pytest.mark.stack


def confirmed_flush_lsn(engine: Engine, slot: str) -> str:
    with engine.connect() as conn:
        lsn = conn.execute(
            text("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}
        ).scalar()
    assert lsn is not None, f"replication slot {slot} is missing"
    return str(lsn)


def test_retained_wal_is_reported_by_sync_status_and_metrics(settings: Settings) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "apps.cli", "sync", "status"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    slot = re.escape(settings.connect.slot_name)
    assert re.search(rf"^replication slot {slot}: \d+ bytes of WAL retained$", result.stdout, re.M), result.stdout

    worker = Worker(settings, name="slot-health-worker")
    worker.start()

    def slot_lines() -> list[str] | None:
        # The gauge is read while a scrape is served; a scrape that meets another one still reading (the
        # readiness probe's, say) answers the old value, so poll until a reading has landed.
        lines = [ln for ln in worker.metrics_text().splitlines() if ln.startswith("ki_sync_replication_slot")]
        return lines if lines and float(lines[0].rsplit(" ", 1)[1]) > 0 else None

    try:
        lines = wait_for(slot_lines, timeout=60, interval=1.0, what="the retained WAL on /metrics")
    finally:
        worker.stop()
    assert [ln.split(" ")[0] for ln in lines] == ["ki_sync_replication_slot_retained_bytes"]
    assert float(lines[0].rsplit(" ", 1)[1]) > 0  # a live slot always holds back some WAL


def test_the_heartbeat_moves_the_slot_on_an_idle_database(engine: Engine, settings: Settings) -> None:
    slot = settings.connect.slot_name
    # Start from a quiet point: whatever earlier tests wrote has been published.
    lsn = current_wal_lsn(engine)
    wait_for(lambda: slot_confirmed_past(engine, slot, lsn), timeout=60, interval=1.0, what="Debezium caught up")
    ends_before = end_offsets(settings)
    confirmed_before = confirmed_flush_lsn(engine, slot)
    with engine.connect() as conn:
        beat_before = conn.execute(text("SELECT max(ts) FROM debezium_heartbeat")).scalar()

    deadline_s = settings.connect.heartbeat_interval_ms / 1000 * 3 + 15  # a few heartbeats + offset flushes
    wait_for(
        lambda: slot_confirmed_past(engine, slot, confirmed_before)
        and confirmed_flush_lsn(engine, slot) != confirmed_before,
        timeout=deadline_s,
        interval=1.0,
        what=f"the slot's confirmed_flush_lsn to move past {confirmed_before} with no user table changing",
    )
    assert end_offsets(settings) == ends_before, "a captured table changed meanwhile: the database was not idle"
    with engine.connect() as conn:
        beat_after = conn.execute(text("SELECT max(ts) FROM debezium_heartbeat")).scalar()
    assert beat_after is not None and (beat_before is None or beat_after > beat_before)

"""What the sync, rebuild and fault tests share: the worker as a child process, index dumps, a clean
rebuild of a test's documents to compare the live index with, consumer-group offsets, and "wait until
everything committed in PostgreSQL has been applied"."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Mapping

from confluent_kafka import ConsumerGroupState
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT
from apps.dev.index_compare import compare_rows, dump, field_diff, rebuilt_rows, without_history
from apps.dev.stack.manager import start_service, stop_service
from apps.dev.stack.ports import lane_port_env
from apps.dev.worker_process import lane_pid
from apps.runtime.processes import Child, free_port
from ki import exposition
from ki.clients import make_kafka_admin
from ki.settings import Settings
from streams.status import PartitionLag, consumer_lag
from streams.topics import LANES, Lane
from tests.conftest import wait_for

Offsets = dict[tuple[Lane, str, int], int]


class Worker:
    """`ki sync run` (both lanes, each a process of its own) as a real child process. Several can run side
    by side (one consumer group per lane): each gets free ports for its lanes' /metrics unless given (a
    worker another module just stopped may still hold the configured port, and the new one would exit on
    the bind). `lane` runs one lane only (`ki sync run --lane`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str = "sync-worker",
        web_port: int | None = None,
        access_web_port: int | None = None,
        lane: Lane | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.web_port = web_port or free_port()
        self.access_web_port = access_web_port or free_port()
        self.ports: dict[Lane, int] = {"content": self.web_port, "access": self.access_web_port,
                                       "principals": free_port()}  # fmt: skip
        self.lanes: tuple[Lane, ...] = (lane,) if lane else LANES
        self.log_path = REPO_ROOT / "build" / f"{name}.log"
        self.child = Child(
            [sys.executable, "-m", "apps.cli", "sync", "run", *(["--lane", lane] if lane else [])],
            self.log_path,
            cwd=REPO_ROOT,
            env={
                "PYTHONUNBUFFERED": "1",
                **lane_port_env(self.ports),
                **(env or {}),
            },
        )

    def spawn(self) -> None:
        """Start the process without waiting for it to be ready."""
        self.child.start()

    def wait_ready(self, timeout: float = 120) -> None:
        why = self.child.wait_ready(self._metrics_ready, timeout)
        assert why is None, f"the sync worker's /metrics did not answer: {why}; see {self.log_path}"

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    @property
    def alive(self) -> bool:
        return self.child.alive

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the worker's log, for a failure message (CI keeps no build/ directory)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(no log: {error})"

    @property
    def returncode(self) -> int | None:
        return self.child.returncode

    def _metrics_url(self, lane: Lane) -> str:
        return f"http://127.0.0.1:{self.ports[lane]}/metrics"

    def _metrics_ready(self) -> bool:
        return all(exposition.answers(self._metrics_url(lane), "ki_sync_events_total") for lane in self.lanes)

    def metrics_text(self, lane: Lane = "content") -> str:
        with urllib.request.urlopen(self._metrics_url(lane), timeout=10) as response:
            return response.read().decode()

    def counter(self, name: str) -> float:
        """A counter summed over its labels and the worker's lanes."""
        # A generous timeout: two stacks share two cores here, and what is under test is that nothing is lost.
        return sum(
            exposition.total(exposition.scrape(self._metrics_url(lane), timeout_s=30), name) for lane in self.lanes
        )

    def lane_pid(self, lane: Lane) -> int | None:
        """The process of one lane under `ki sync run`'s supervisor (None: none runs now)."""
        return lane_pid(self.child.pid, lane)

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no offset commit for the batch in flight."""
        self.child.kill()

    def stop(self) -> None:
        self.child.stop()


# -- stack services ----------------------------------------------------------------------------------


def stop(settings: Settings, service: str) -> None:
    assert stop_service(settings, service) == 0, f"`ki stack stop {service}` failed"


def start(settings: Settings, service: str) -> None:
    assert start_service(settings, service) == 0, f"`ki stack start {service}` failed"


# -- index contents ---------------------------------------------------------------------------------


def assert_index_equals_rebuild(
    settings: Settings, engine: Engine, search: OpenSearch, document_ids: set[int]
) -> dict[str, dict]:
    """The live rows of these documents equal a clean rebuild's: same ids (nothing lost, nothing extra,
    no duplicates) and the same fields. Returns the live rows."""
    live = dump(search, settings.retrieval.index_name, document_ids)
    rebuilt = rebuilt_rows(settings, engine, search, document_ids)
    assert rebuilt, "the rebuild produced no rows for the test's documents"
    compared = compare_rows(live, rebuilt)
    missing, extra, differing = compared.missing, compared.extra, compared.differing
    assert not missing and not extra, f"rows missing from the live index: {missing[:10]}, extra: {extra[:10]}"
    assert not differing, (
        f"{len(differing)} row(s) differ from the rebuild, e.g. {differing[0]}: "
        f"{field_diff(without_history(live)[differing[0]], without_history(rebuilt)[differing[0]])}"
    )
    return live


# -- Kafka and the replication slot -----------------------------------------------------------------


def worker_lag(settings: Settings) -> dict[tuple[Lane, str, int], PartitionLag]:
    """Both lanes' groups, each over its lane's topics: (lane, topic, partition) -> lag."""
    return {(lane, p.topic, p.partition): p for lane in LANES for p in consumer_lag(settings, lane)}


def committed_offsets(settings: Settings) -> Offsets:
    """Each lane group's committed offset per partition of its topics (-1: none yet)."""
    return {key: p.committed for key, p in worker_lag(settings).items()}


def end_offsets(settings: Settings) -> Offsets:
    return {key: p.end for key, p in worker_lag(settings).items()}


class GroupWatch:
    """The worker group as the broker's group coordinator sees it (one admin client, for fast polling)."""

    def __init__(self, settings: Settings) -> None:
        self.group = settings.streams.app_id
        self.admin = make_kafka_admin(settings)

    def state(self) -> tuple[ConsumerGroupState, int]:
        """(group state, number of members)."""
        described = self.admin.describe_consumer_groups([self.group], request_timeout=10)[self.group].result()
        return described.state, len(described.members)


def current_wal_lsn(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def slot_confirmed_past(engine: Engine, slot: str, lsn: str) -> bool:
    """Debezium has confirmed (published to Kafka and flushed its offsets) everything up to `lsn`."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT confirmed_flush_lsn >= CAST(:lsn AS pg_lsn) FROM pg_replication_slots "
                    "WHERE slot_name = :slot"
                ),
                {"lsn": lsn, "slot": slot},
            ).scalar()
        )


def wait_until_synced(settings: Settings, engine: Engine, *, timeout: float = 240) -> None:
    """Everything committed in PostgreSQL so far is in Kafka (the slot confirmed past the current WAL
    position) and the worker group has committed every CDC partition up to its end."""
    lsn = current_wal_lsn(engine)
    wait_for(
        lambda: slot_confirmed_past(engine, settings.connect.slot_name, lsn),
        timeout=timeout,
        interval=1.0,
        what=f"Debezium to confirm WAL up to {lsn}",
    )

    behind: list[str] = ["no partition seen yet"]

    def drained() -> list | None:
        lags = list(worker_lag(settings).values())
        behind[:] = [f"{p.topic}[{p.partition}] {p.committed}/{p.end}" for p in lags if p.end > 0 and p.lag]
        if not lags:
            behind[:] = ["no partition seen: the groups have no committed offsets or the lag probe failed"]
        return None if behind else lags

    # Which partitions were still behind (committed/end) goes into the failure: a stuck group and a slow one
    # read differently.
    wait_for(
        drained,
        timeout=timeout,
        interval=1.0,
        what=lambda: f"both lanes' groups to commit every CDC partition to its end (behind: {', '.join(behind)})",
    )

"""An eval's own world on the shared stack: database, connector, topics, consumer group, index, worker.

One database and one connector mean every worker sees every event, so a separate project inside the
main database is not isolation (the main worker indexed the eval's documents, and the eval index held
the main rows, sharing their BM25 statistics). Each eval key therefore gets, on the same servers:

* PostgreSQL database `ki_eval_<key>` (created if missing; the project's Alembic migrations applied,
  which create its own publication `ki_eval_<key>_pub`);
* Debezium connector `ki_eval_<key>` with its own replication slot `ki_eval_<key>` and topic prefix
  `ki_eval_<key>` (so topics `ki_eval_<key>.public.<table>`), DLQ topic `ki_eval_<key>.dlq`;
* per index settings hash `<h>` (analyzer, embedder, chunking): index alias and Faust app id /
  consumer group `ki-eval-<key>-<h>`. A changed analyzer gets a new alias and a new consumer group,
  which replays the compacted CDC topics from the start into the new index: an index built with
  other settings is never reused, and the old one is left as it was;
* its own `ki sync run` child, given exactly these settings through a config file (`KI_CONFIG`).

The key is the data set's name plus a short hash of the documents loaded (corpus files and, for a
subset run, the chosen ids), so a re-run with the same data resumes: rows already in the database are
not written again, the connector, its slot and offsets, the consumer group's offsets and the index are
reused, and indexing continues where it stopped. `drop()` removes all of it (a replication slot left
behind retains WAL forever).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from apps.dev.stack.settings import stack_settings
from apps.runtime.processes import Child, pid_alive, stop_pid
from ki import exposition
from ki.clients import make_kafka_admin, make_sync_client
from ki.errors import PermanentError
from ki.settings import Settings, with_overrides
from search.ranking.mode_gate import analyzer_definition

Progress = Callable[[str], None]

DB_PREFIX = "ki_eval_"  # database, slot, connector, topic prefix
INDEX_PREFIX = "ki-eval-"  # index alias and Faust app id (consumer group)
#: The retrieval settings that change what the index holds for the same rows.
INDEX_FIELDS: tuple[str, ...] = (
    "chunk_chars",
    "chunk_overlap_chars",
    "chunk_contextualize",
    "profile_embeddings",
    "clause_embeddings",
    "embedding_dimensions",
)


class IsolationError(PermanentError):
    """The eval's own database, connector or worker cannot be set up; one readable line."""


def index_settings_hash(settings: Settings, embedding_signature: str) -> str:
    """8 hex over what an index is built with: the analyzer definition (analyzer, custom analysis,
    text normalisation version), the embedding signature and window (chunks are cut to it), chunking."""
    retrieval = settings.retrieval.model_dump(mode="json")
    basis = {
        "analyzer": analyzer_definition(settings.retrieval),
        "embedding_signature": embedding_signature,
        "embedding_max_tokens": settings.embedding.max_tokens,
        "chunking": {name: retrieval[name] for name in INDEX_FIELDS if name in retrieval},
    }
    canonical = json.dumps(basis, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


@dataclass(frozen=True)
class EvalTarget:
    """Names of one eval's world and the settings its worker and searches run with."""

    key: str  # [a-z0-9_]
    index_hash: str
    settings: Settings  # the eval's settings (own database, connector, topics, app id, alias)
    base: Settings  # the main settings (for the server connections)

    @property
    def database(self) -> str:
        return self.settings.database.name

    @property
    def alias(self) -> str:
        return self.settings.retrieval.index_name

    @property
    def group_prefix(self) -> str:
        """Every settings variant's alias and consumer group start with this."""
        return f"{INDEX_PREFIX}{self.key}-"

    @property
    def state_dir(self) -> Path:
        return Path(stack_settings(self.base).home).expanduser() / "eval" / self.key


def make_target(
    base: Settings,
    key: str,
    *,
    analyzer: str,
    embedding_signature: str,
    web_port: int | None = None,
    access_web_port: int | None = None,
    principals_web_port: int | None = None,
) -> EvalTarget:
    """The eval's settings derived from `base` (validated like a config file)."""
    name = f"{DB_PREFIX}{key}"
    with_analyzer = with_overrides(base, {"retrieval": {"text_analyzer": analyzer}})
    digest = index_settings_hash(with_analyzer, embedding_signature)
    settings = with_overrides(
        with_analyzer,
        {
            "database": {"name": name},
            "kafka": {"topic_prefix": name},
            "connect": {"connector_name": name, "slot_name": name, "publication_name": f"{name}_pub"},
            "retrieval": {"index_name": f"{INDEX_PREFIX}{key}-{digest}"},
            "streams": {
                "app_id": f"{INDEX_PREFIX}{key}-{digest}",
                "dlq_topic": f"{name}.dlq",
                "web_port": web_port or base.streams.web_port + 3,  # +1, +2: the main access, principals lanes'
                # None: web_port + 1 and + 2, never the main worker's
                "access_web_port": access_web_port,
                "principals_web_port": principals_web_port,
                # Worlds share vectors, never rows: a string another eval index (same embedder) embedded
                # is taken from there, e.g. every row of an analyzer variant of the same data set.
                "vector_sources": [f"{INDEX_PREFIX}*"],
            },
        },
    )
    return EvalTarget(key=key, index_hash=digest, settings=settings, base=base)


# --- PostgreSQL, topics, connector --------------------------------------------------------------


def _server_engine(base: Settings) -> Any:
    """AUTOCOMMIT connections to the main database's server (CREATE/DROP DATABASE need them)."""
    return create_engine(base.database.url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


def ensure_database(target: EvalTarget) -> bool:
    """Create the eval database if missing; True if created."""
    engine = _server_engine(target.base)
    try:
        with engine.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": target.database}).scalar():
                return False
            conn.exec_driver_sql(f'CREATE DATABASE "{target.database}"')
            return True
    finally:
        engine.dispose()


def ensure_world(target: EvalTarget, progress: Progress) -> None:
    """Database (migrated), CDC topics and DLQ, connector RUNNING: idempotent, so a re-run resumes."""
    from apps.dev.stack.connector import Connector
    from apps.dev.stack.errors import StackError
    from ki.db.migrate import upgrade
    from streams.topics import ensure_topics

    created = ensure_database(target)
    upgrade(target.settings)
    progress(f"eval: database {target.database}: {'created' if created else 'exists'}, migrated")
    ensure_topics(target.settings)
    connector = Connector(target.settings)
    try:
        what = connector.register()
        settle_s = 3.0 if what != "unchanged" else 0.0
        connector.wait_running(stack_settings(target.base).start_timeout_s, settle_s=settle_s)
    except (StackError, OSError) as exc:
        raise IsolationError(f"eval connector {connector.name}: {exc}") from None
    progress(f"eval: connector {connector.name} ({what}; slot {target.settings.connect.slot_name}, "
             f"topics {target.settings.kafka.topic_prefix}.*) RUNNING")  # fmt: skip


# --- the worker ----------------------------------------------------------------------------------


def child_env(config_path: Path) -> dict[str, str]:
    """The parent's environment without its `KI_*` settings overrides (already folded into the config
    file; left in, they would override the eval's own names) plus `KI_CONFIG`."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("KI_") and "__" in k) and k != "KI_CONFIG"}
    return {**env, "KI_CONFIG": str(config_path), "PYTHONUNBUFFERED": "1"}


def write_config(settings: Settings, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(settings.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o600)  # it holds the database password and the API secret
    tmp.replace(path)
    return path


#: SIGTERM lets Faust commit its offsets on the way out; SIGKILL after this long.
STOP_TIMEOUT_S = 60.0


class EvalWorker:
    """`ki --config <eval config> sync run` as a child; its pid file lets a later run find a worker
    whose parent was killed, and adopt it (same settings) or stop it (other settings)."""

    def __init__(self, target: EvalTarget, log_path: Path) -> None:
        self.target = target
        self.settings = target.settings
        self.log_path = log_path
        self.config_path = target.state_dir / "worker-config.json"
        self.pid_path = target.state_dir / "worker.json"
        self.child: Child | None = None
        self.adopted: int | None = None  # pid of an earlier run's worker this run took over
        self.port = self.settings.streams.web_port

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def answering(self) -> bool:
        return exposition.answers(self.metrics_url, "ki_sync_events_total")

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "apps.cli",
            "--config",
            str(self.config_path),
            "sync",
            "run",
            "--loglevel",
            "error",
        ]

    def _recorded(self) -> dict[str, Any] | None:
        try:
            record = json.loads(self.pid_path.read_text())
        except (OSError, json.JSONDecodeError, ValueError):
            return None
        return record if isinstance(record, dict) and pid_alive(int(record.get("pid", 0))) else None

    def adopt(self) -> int | None:
        """Take over an earlier run's worker of this eval if it runs with these settings and answers."""
        record = self._recorded()
        if record is None or record.get("app_id") != self.settings.streams.app_id:
            return None
        port, self.port = self.port, int(record.get("port", 0))
        if not self.answering():
            self.port = port
            return None
        self.adopted = int(record["pid"])
        return self.adopted

    def stop_orphan(self) -> int | None:
        """An earlier run's worker of this eval key still running (its parent was killed): stop it."""
        record = self._recorded()
        if record is None:
            self.pid_path.unlink(missing_ok=True)
            return None
        pid = int(record["pid"])
        stop_pid(pid, timeout_s=STOP_TIMEOUT_S)
        self.pid_path.unlink(missing_ok=True)
        return pid

    def start(self, timeout_s: float = 180.0) -> None:
        write_config(self.settings, self.config_path)
        workdir = self.target.state_dir / "worker"
        workdir.mkdir(parents=True, exist_ok=True)
        env = child_env(self.config_path)  # without our KI_* overrides: not merged into ours
        self.child = Child(self.command(), self.log_path, cwd=workdir, env=env, inherit_env=False).start()
        self.pid_path.write_text(
            json.dumps({"pid": self.child.pid, "app_id": self.settings.streams.app_id, "port": self.port})
        )
        why = self.child.wait_ready(self.answering, timeout_s, interval_s=0.5)
        if why is not None:
            self.stop()
            raise IsolationError(f"the eval sync worker did not come up ({why}); see {self.log_path}")

    def check_alive(self) -> None:
        if self.child is not None and not self.child.alive:
            code = self.child.returncode
            raise IsolationError(f"the eval sync worker exited with code {code}; see {self.log_path}")
        if self.adopted is not None and not pid_alive(self.adopted):
            raise IsolationError(f"the adopted eval sync worker (pid {self.adopted}) exited; see {self.log_path}")

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(STOP_TIMEOUT_S)  # SIGTERM: Faust commits its offsets on the way out
        if self.adopted is not None:
            stop_pid(self.adopted, timeout_s=STOP_TIMEOUT_S)
        self.pid_path.unlink(missing_ok=True)


# --- drop ----------------------------------------------------------------------------------------


def drop(target: EvalTarget, progress: Progress) -> list[str]:
    """Remove the eval's worker, connector (and its stored offsets), slot, database, topics, consumer
    groups and indexes (every settings variant). Returns what was removed; missing parts are skipped."""
    removed: list[str] = []
    orphan = EvalWorker(target, target.state_dir / "worker.log").stop_orphan()
    if orphan:
        removed.append(f"worker pid {orphan}")
    removed += _drop_connector(target)
    removed += _drop_postgres(target)
    removed += _drop_kafka(target)
    removed += _drop_indexes(target)
    removed += _drop_local_state(target)
    for line in removed:
        progress(f"eval: dropped {line}")
    if not removed:
        progress(f"eval: nothing to drop for {target.key}")
    return removed


def _drop_connector(target: EvalTarget) -> list[str]:
    from apps.dev.stack.http import request_json

    name = target.settings.connect.connector_name
    base = f"{target.settings.connect.url.rstrip('/')}/connectors/{name}"
    status, _ = request_json("GET", f"{base}/status")
    if status != 200:
        return []
    # Connect keeps a connector's source offsets after the connector is deleted; a later connector of
    # the same name would resume from them against a fresh slot. Stop, clear the offsets, delete.
    request_json("PUT", f"{base}/stop", timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = request_json("GET", f"{base}/status")
        if isinstance(body, dict) and body.get("connector", {}).get("state") == "STOPPED":
            break
        time.sleep(0.5)
    offsets, _ = request_json("DELETE", f"{base}/offsets", timeout=60)
    request_json("DELETE", base, timeout=30)
    return [f"connector {name}" + ("" if offsets == 200 else f" (its offsets not cleared: {offsets})")]


def _drop_postgres(target: EvalTarget) -> list[str]:
    removed: list[str] = []
    slot = target.settings.connect.slot_name
    engine = _server_engine(target.base)
    try:
        with engine.connect() as conn:
            deadline = time.monotonic() + 30
            while True:
                active = conn.execute(
                    text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}
                ).scalar()
                if active is None:
                    break
                if not active:
                    conn.execute(text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
                    removed.append(f"replication slot {slot}")
                    break
                if time.monotonic() > deadline:
                    raise IsolationError(f"replication slot {slot} is still in use; is connector {slot} gone?")
                time.sleep(0.5)
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": target.database}).scalar():
                conn.exec_driver_sql(f'DROP DATABASE "{target.database}" WITH (FORCE)')
                removed.append(f"database {target.database}")
    finally:
        engine.dispose()
    return removed


def _drop_kafka(target: EvalTarget) -> list[str]:
    admin = make_kafka_admin(target.base)
    prefix = target.settings.kafka.topic_prefix
    topics = [
        t
        for t in admin.list_topics(timeout=30).topics
        if t.startswith(f"{prefix}.") or t == f"__debezium-heartbeat.{prefix}"
    ]
    removed: list[str] = []
    if topics:
        for name, future in admin.delete_topics(sorted(topics), request_timeout=30).items():
            with contextlib.suppress(Exception):
                future.result()
                removed.append(f"topic {name}")
    groups = [
        g.group_id
        for g in admin.list_consumer_groups(request_timeout=30).result().valid
        if g.group_id.startswith(target.group_prefix)
    ]
    if groups:
        for name, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
            with contextlib.suppress(Exception):
                future.result()
                removed.append(f"consumer group {name}")
    return removed


def _drop_local_state(target: EvalTarget) -> list[str]:
    """The worker's config file (it holds secrets), pid file and working folder, and Faust's data folders."""
    removed: list[str] = []
    faust = Path(stack_settings(target.base).home).expanduser() / "faust"
    folders = [target.state_dir, *(faust.glob(f"{target.group_prefix}*") if faust.is_dir() else [])]
    for folder in folders:
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(f"folder {folder}")
    return removed


def _drop_indexes(target: EvalTarget) -> list[str]:
    client = make_sync_client(target.base, timeout_s=60)
    removed: list[str] = []
    try:
        found = client.indices.get(index=f"{target.group_prefix}*", allow_no_indices=True, ignore_unavailable=True)
        aliased = client.indices.get_alias(name=f"{target.group_prefix}*", ignore=[404])
        names = set(found) | {i for i in aliased if isinstance(aliased.get(i), dict) and "aliases" in aliased[i]}
        for name in sorted(names):
            client.indices.delete(index=name, ignore=[404])
            removed.append(f"index {name}")
    finally:
        client.close()
    return removed

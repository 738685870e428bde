"""A world of small documents for the fault tests, and a background stream of row changes against it.

The changes are mostly access changes (grants, group memberships, source observations: cheap to sync,
nothing is embedded) with a few content edits (each re-embeds a chunk and the profile row), one row
change per transaction, paced at a fixed rate. Every change reaches an indexed version — groups hold a
project grant, grants target the world's project or documents — so none of them can be applied
without OpenSearch. A change whose transaction fails because PostgreSQL is away is retried until it
commits: the test compares the index with PostgreSQL, so what matters is only that it ends up there.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from tests.integration.world import World


def version_text(n: int, revision: int) -> str:
    return (
        f"Mahnung Nr. {n}, Fassung {revision}: Der Schuldner wird aufgefordert, den offenen Betrag von "
        f"{100 + n} Euro binnen 14 Tagen zu zahlen. Andernfalls wird Klage erhoben."
    )


@dataclass
class FaultWorld:
    tag: str
    project: int
    versions: dict[int, int]  # document id -> its version id
    groups: list[str]
    users: list[str]
    revisions: dict[int, int] = field(default_factory=dict)  # version id -> text revision
    grants: list[int] = field(default_factory=list)  # grants the stream added and may revoke
    memberships: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, user) -> id, added by the stream

    @property
    def documents(self) -> set[int]:
        return set(self.versions)


def make_fault_world(engine: Engine, documents: int = 24) -> FaultWorld:
    with engine.begin() as conn:
        w = World(conn)
        project, source = w.project("Störfall"), w.source("local_fs")
        groups = [f"group:team{i}-{w.tag}" for i in range(4)]
        users = [f"user:u{i}-{w.tag}" for i in range(16)]
        for group in groups:
            w.grant("project", project, group)  # a membership change always reaches every version
        versions: dict[int, int] = {}
        for n in range(documents):
            doc = w.document(project, f"Mahnung {n} {w.tag}")
            versions[doc] = w.version(doc, version_text(n, 0))
            w.observe(versions[doc], w.source_object(source))
        return FaultWorld(w.tag, project, versions, groups, users)


Change = Callable[[Connection], object]


class ChangeStream:
    """Writes random changes to a `FaultWorld` from a background thread at `rate` changes/s until
    `stop()` (or `limit` changes). `counts` says how many of each kind committed."""

    def __init__(self, engine: Engine, world: FaultWorld, *, rate: float = 25.0, seed: int = 6, limit: int = 0):
        self.engine = engine
        self.world = world
        self.rate = rate
        self.limit = limit
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.failed_attempts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="change-stream", daemon=True)
        self.error: BaseException | None = None

    @property
    def committed(self) -> int:
        return sum(self.counts.values())

    def start(self) -> ChangeStream:
        self._thread.start()
        return self

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the change stream did not stop"
        if self.error is not None:
            raise AssertionError(f"the change stream failed: {self.error!r}") from self.error
        return self.counts

    def stop_when_done(self, timeout: float = 60) -> Counter[str]:
        """For a stream with a `limit`: wait until all its changes committed, then stop."""
        self._thread.join(timeout)
        return self.stop()

    def wait_for_more(self, changes: int, timeout: float = 120) -> None:
        """Block until `changes` more changes have committed (e.g. after a service came back)."""
        target = self.committed + changes
        deadline = time.monotonic() + timeout
        while self.committed < target:
            assert self._thread.is_alive(), f"the change stream ended early: {self.error!r}"
            assert time.monotonic() < deadline, f"only {self.committed}/{target} changes after {timeout:.0f}s"
            self._stop.wait(0.2)  # polling interval of a deadline loop

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            next_at = time.monotonic()
            while not self._stop.is_set() and (not self.limit or self.committed < self.limit):
                kind, change = self._pick()
                while not self._stop.is_set():
                    try:
                        with self.engine.begin() as conn:
                            change(conn)
                        self.counts[kind] += 1
                        break
                    except DBAPIError as exc:
                        if not exc.connection_invalidated and "connection" not in str(exc).lower():
                            raise
                        self.failed_attempts += 1  # PostgreSQL is restarting: try the same change again
                        self._stop.wait(0.5)
                next_at += 1 / self.rate
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def _pick(self) -> tuple[str, Change]:
        w, r = self.world, self.random
        roll = r.random()
        if roll < 0.03:
            doc = r.choice(sorted(w.versions))
            return "content edit", lambda conn: self._edit(conn, doc)
        if roll < 0.33 or (roll < 0.55 and not w.grants):
            scope, target = ("project", w.project) if r.random() < 0.2 else ("document", r.choice(sorted(w.versions)))
            principal, effect = r.choice(w.users), "deny" if r.random() < 0.2 else "allow"
            return "grant added", lambda conn: self._grant(conn, scope, target, principal, effect)
        if roll < 0.55:
            grant = w.grants.pop(r.randrange(len(w.grants)))
            return "grant revoked", lambda conn: conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": grant})
        outside = [(g, u) for g in w.groups for u in w.users if (g, u) not in w.memberships]  # unique pairs
        if (roll < 0.75 and outside) or (roll < 0.9 and not w.memberships):
            group, user = r.choice(outside)
            return "member joined", lambda conn: self._join(conn, group, user)
        if roll < 0.9:
            membership = w.memberships.pop(r.choice(sorted(w.memberships)))
            sql = "DELETE FROM group_memberships WHERE id = :m"
            return "member left", lambda conn: conn.execute(text(sql), {"m": membership})
        version = w.versions[r.choice(sorted(w.versions))]
        sql = (
            "UPDATE source_observations SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END "
            "WHERE document_version_id = :v"
        )
        return "observation toggled", lambda conn: conn.execute(text(sql), {"v": version})

    def _edit(self, conn: Connection, doc: int) -> None:
        version = self.world.versions[doc]
        revision = self.world.revisions.get(version, 0) + 1
        n = sorted(self.world.versions).index(doc)
        conn.execute(
            text("UPDATE document_versions SET text = :t WHERE id = :v"), {"t": version_text(n, revision), "v": version}
        )
        self.world.revisions[version] = revision

    def _grant(self, conn: Connection, scope: str, target: int, principal: str, effect: str) -> None:
        self.world.grants.append(World(conn, self.world.tag).grant(scope, target, principal, effect))

    def _join(self, conn: Connection, group: str, user: str) -> None:
        # Idempotent: a retry after a commit whose answer was lost to a PostgreSQL restart finds the row.
        conn.execute(
            text(
                "INSERT INTO group_memberships (group_principal, member_principal) VALUES (:g, :u) "
                "ON CONFLICT ON CONSTRAINT uq_group_memberships_source_group_member DO NOTHING"
            ),
            {"g": group, "u": user},
        )
        self.world.memberships[(group, user)] = conn.execute(
            text("SELECT id FROM group_memberships WHERE group_principal = :g AND member_principal = :u"),
            {"g": group, "u": user},
        ).scalar_one()

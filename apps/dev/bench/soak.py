"""`ki bench soak`: a mixed soak by hand (issue 51) — content and access changes at `rate` per second, one fault
every `fault_every` seconds in rotation, searches throughout — and what it cost: lost rows, leaked hits, 5xx
answers and the recovery time of each fault.

* **World**: a project, a source and `documents` small documents of the run's own (its label: removed at the end,
  also on failure, Ctrl-C or SIGTERM), groups holding a project grant, users, and one probe user with a project
  grant the changes never touch.
* **Changes** (one row change per transaction, paced against the start): grants added and revoked, group
  memberships joined and left, observations toggled, and ~`content_share` content edits (re-chunked, re-embedded).
  A change whose transaction fails because PostgreSQL is away is retried until it commits.
* **Searches** through `ki serve` as the world's users, lexical and hybrid. **Leaked**: a hit on a version the
  caller could not see in SQL (`ki.acl.visible_versions`) read just before *and* just after the request — a change
  committed while the request ran may legitimately show either way, so only both-times-invisible counts. Each such
  hit is kept with the changes that touched it inside the window; one with fewer than two (it cannot have turned
  visible and back) is **unexplained**, and fails the run.
* **Faults** (`FAULTS`): a lane stopped (SIGSTOP past the session timeout, then SIGCONT), a lane killed (SIGKILL:
  `ki sync run` then stops its other lane and exits, and the soak starts it again as a process manager would),
  the Kafka broker, Kafka Connect or PostgreSQL restarted (`ki stack stop/start`),
  OpenSearch refusing writes (`index.blocks.write` on the index behind the alias, lifted after `block_s`).
  **Recovery**: from the fault's end until a probe document committed right then is found by a search and both
  lanes have committed every offset that was in Kafka by then (their lag from the fault back to 0).
* **Lost**: at the end, once the lanes have caught up, the world's index rows against a clean rebuild from
  PostgreSQL (`apps.dev.index_compare`): rows missing, extra or stale. Must be 0.

Progress lines on stderr while it runs, a table at the end, the JSON to `out`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from apps.dev.bench.cleanup import Footprint, bench_label, remove_bench_rows
from apps.dev.bench.search import ServeChild
from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.index_compare import compare_rows, dump, rebuilt_rows
from apps.dev.stack.manager import start_service, stop_service
from apps.dev.worker_process import SyncWorker, lane_pid
from ki.acl import resolve_caller, visible_versions
from ki.clients import make_engine, make_sync_client
from ki.errors import PermanentError
from ki.settings import Settings
from search.web.auth import mint_token
from streams.status import LagProbe
from streams.topics import LANES, Lane

#: The faults, in the order of their rotation.
FAULTS = ("kill", "opensearch-block", "kafka", "stall", "connect", "postgres")
SERVICE_FAULTS = {"kafka": "kafka", "connect": "connect", "postgres": "postgres"}
#: The tables the soak writes: the lag judged after a fault is on their topics (a lane's other topics carry nothing
#: of the soak; their readings during a rebalance were seen to report a log end of 1000 never committed).
SOAK_TABLES = ("documents", "document_versions", "source_objects", "source_observations", "grants",
               "group_memberships")  # fmt: skip
RECOVERY_TIMEOUT_S = 600.0
CATCH_UP_TIMEOUT_S = 900.0


class SoakError(PermanentError):
    """The soak cannot run or go on (its message is the CLI's one line)."""


# -- pure parts ----------------------------------------------------------------------------------------------


def parse_faults(value: str) -> tuple[str, ...]:
    """`all`, `none` or a comma list of `FAULTS` (kept in the order given); ValueError names what is unknown."""
    if value.strip() == "all":
        return FAULTS
    if value.strip() in ("", "none"):
        return ()
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise ValueError(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(FAULTS)}, all, none)")
    return names


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # seconds after the soak's start
    kind: str


def fault_schedule(duration_s: float, every_s: float, faults: Sequence[str]) -> list[PlannedFault]:
    """One fault every `every_s` seconds (the first after `every_s`, none at or past the end), the kinds in
    rotation."""
    if not faults or every_s <= 0:
        return []
    planned, n = [], 1
    while n * every_s < duration_s:
        planned.append(PlannedFault(n * every_s, faults[(n - 1) % len(faults)]))
        n += 1
    return planned


def leaked_hits(hit_versions: Sequence[int], visible_before: set[int], visible_after: set[int]) -> list[int]:
    """The hits the caller could see neither just before nor just after the request: leaked. A version that
    was visible at either moment may have been answered legitimately (a change committed during the request)."""
    return [v for v in hit_versions if v not in visible_before and v not in visible_after]


def unexplained_leaks(leaks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flagged hits no race explains: invisible before and after but visible in between takes a change each way,
    so a hit with fewer than two changes touching it (its version, document or caller) inside its request's window
    cannot have been visible at the request's moment."""
    return [leak for leak in leaks if len(leak["changes_in_window"]) < 2]


def latency_summary(samples: Sequence[float]) -> dict[str, float | int | None]:
    if not samples:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    return {"n": len(samples), "p50_ms": round(percentile(samples, 50), 1), "p99_ms": round(percentile(samples, 99), 1)}


def in_any_window(at: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= at <= end for start, end in windows)


def summarize(
    *,
    duration_s: float,
    changes: Counter[str],
    retried_changes: int,
    searches: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    lost: dict[str, Any] | None,
) -> dict[str, Any]:
    """The figures of a run from its records (searches: `at_s`, `status`, `ms`, `leaked`, `judged`; faults:
    `start_s`, `recovered_s` ...)."""
    committed = sum(changes.values())
    windows = [(f["start_s"], f.get("recovered_s") or f["end_s"]) for f in faults]
    statuses = Counter(str(s["status"]) for s in searches)
    server_errors = [s for s in searches if isinstance(s["status"], int) and s["status"] >= 500]
    recoveries = [f["recovery_s"] for f in faults if f.get("recovery_s") is not None]
    return {
        "changes": {
            "committed": committed,
            "per_kind": dict(sorted(changes.items())),
            "achieved_per_s": round(committed / duration_s, 2) if duration_s > 0 else 0.0,
            "retried_attempts": retried_changes,
        },
        "searches": {
            "sent": len(searches),
            "status_counts": dict(sorted(statuses.items())),
            "5xx": len(server_errors),
            "5xx_during_faults": sum(in_any_window(s["at_s"], windows) for s in server_errors),
            "judged": sum(bool(s["judged"]) for s in searches),
            "hits_judged": sum(s.get("hits", 0) for s in searches if s["judged"]),
            "leaked": sum(s["leaked"] for s in searches),
            "latency_200": latency_summary([s["ms"] for s in searches if s["status"] == 200]),
        },
        "faults": list(faults),
        "recovery_s_max": max(recoveries) if recoveries else None,
        "faults_not_recovered": sum(f.get("recovery_s") is None for f in faults),
        "lost": lost,
    }


def table(result: dict[str, Any]) -> str:
    s, c, lost = result["searches"], result["changes"], result["lost"] or {}
    lines = [
        f"soak {result['minutes']} min: {c['committed']} changes ({c['achieved_per_s']}/s of {result['rate']}/s asked)"
        f" {c['per_kind']}; {s['sent']} searches {s['status_counts']}, p50 {s['latency_200']['p50_ms']} ms,"
        f" p99 {s['latency_200']['p99_ms']} ms",
        f"lost {lost.get('lost', '?')} (missing {len(lost.get('missing', []))}, extra {len(lost.get('extra', []))},"
        f" stale {len(lost.get('differing', []))} of {lost.get('rebuilt', '?')} rows), leaked {s['leaked']}"
        f" ({s.get('leaked_unexplained', '?')} without two changes in the request's window; of {s['hits_judged']}"
        f" hits judged), 5xx {s['5xx']} ({s['5xx_during_faults']} during faults)",
        "| # | fault | start s | end s | recovery s | probe found s | lag 0 s | lane restarted |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for n, f in enumerate(result["faults"], 1):
        lines.append(
            f"| {n} | {f['kind']} | {f['start_s']} | {f['end_s']} | {f.get('recovery_s')} | {f.get('probe_found_s')}"
            f" | {f.get('lag_zero_s')} | {f.get('lane_restarted')} |"
        )
    return "\n".join(lines)


# -- the world and its changes -------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def version_text(n: int, revision: int) -> str:
    return (
        f"Mahnung Nr. {n}, Fassung {revision}: Der Schuldner wird aufgefordert, den offenen Betrag von "
        f"{100 + n} Euro binnen 14 Tagen zu zahlen. Andernfalls wird Klage erhoben."
    )


@dataclass
class SoakWorld:
    label: str
    tag: str
    project: int
    source: int
    versions: dict[int, int]  # document id -> version id
    groups: list[str]
    users: list[str]
    probe_user: str
    revisions: dict[int, int] = field(default_factory=dict)
    grants: list[int] = field(default_factory=list)
    memberships: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # the probes add documents beside the changes

    def documents(self) -> set[int]:
        with self.lock:
            return set(self.versions)


def _one(conn: Connection, sql: str, **params: object) -> int:
    return int(conn.execute(text(sql), params).scalar_one())


def _add_document(conn: Connection, world: SoakWorld, title: str, body: str) -> tuple[int, int]:
    doc = _one(conn, "INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id", p=world.project, t=title)
    version = _one(
        conn,
        "INSERT INTO document_versions (document_id, version_no, status, text)"
        " VALUES (:d, 1, 'final', :t) RETURNING id",
        d=doc,
        t=body,
    )
    conn.execute(text("UPDATE documents SET latest_final_version_id = :v WHERE id = :d"), {"v": version, "d": doc})
    obj = _one(
        conn,
        "INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :r) RETURNING id",
        s=world.source,
        r=f"{world.label}-{doc}",
    )
    conn.execute(
        text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
        {"v": version, "o": obj},
    )
    return doc, version


def make_world(engine: Engine, label: str, documents: int, users: int) -> SoakWorld:
    tag = label.rsplit(" ", 1)[1]
    with engine.begin() as conn:
        project = _one(conn, "INSERT INTO projects (name) VALUES (:n) RETURNING id", n=label)
        source = _one(conn, "INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id", n=label)
        world = SoakWorld(
            label, tag, project, source, {}, [f"group:soak{i}-{tag}" for i in range(4)],
            [f"user:soak{i}-{tag}" for i in range(users)], f"user:soakprobe-{tag}",
        )  # fmt: skip
        for principal in [*world.groups, world.probe_user]:
            conn.execute(
                text("INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :w, 'allow')"),
                {"p": project, "w": principal},
            )
        for n in range(documents):
            doc, version = _add_document(conn, world, f"Mahnung {n} {tag}", version_text(n, 0))
            world.versions[doc] = version
    return world


def _pg_away(exc: DBAPIError) -> bool:
    return bool(exc.connection_invalidated) or "connection" in str(exc).lower() or "shutting down" in str(exc).lower()


def commit_retrying(engine: Engine, change: Callable[[Connection], object], stop: threading.Event) -> int:
    """Commit `change` in a transaction of its own, retried while PostgreSQL is away; answers the failed attempts
    (raises what is not PostgreSQL being away)."""
    failed = 0
    while not stop.is_set():
        try:
            with engine.begin() as conn:
                change(conn)
            return failed
        except DBAPIError as exc:
            if not _pg_away(exc):
                raise
            failed += 1
            stop.wait(0.5)
    return failed


@dataclass(frozen=True)
class Touched:
    """What one change touched: principals it names, documents and versions it reaches (an effect for grants)."""

    principals: tuple[str, ...] = ()
    documents: tuple[int, ...] = ()
    versions: tuple[int, ...] = ()
    effect: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"principals": list(self.principals)}
        if len(self.documents) <= 3:
            out["documents"] = list(self.documents)
        else:
            out["documents"] = "the project"
        if self.versions:
            out["versions"] = list(self.versions)
        if self.effect:
            out["effect"] = self.effect
        return out


class Changes(threading.Thread):
    """Random row changes against the world at `rate` per second, paced against the start time."""

    def __init__(self, engine: Engine, world: SoakWorld, rate: float, seed: int, content_share: float) -> None:
        super().__init__(name="soak-changes", daemon=True)
        self.engine, self.world, self.rate, self.content_share = engine, world, rate, content_share
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.retried = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        # (committed at, monotonic; kind; what it touched): a flagged hit is shown beside the changes that may
        # have made it visible while its request ran.
        self.log: deque[tuple[float, str, Touched]] = deque(maxlen=20_000)
        self.grant_targets: dict[int, Touched] = {}

    def touching(self, since: float, until: float, user: str, version: int, document: int) -> list[dict[str, Any]]:
        """The changes committed in [since, until] that name `user`, or touch the version (or its document)
        for everybody (an observation, a content edit)."""
        return [
            {"at": round(at - since, 3), "kind": kind, **touched.as_dict()}
            for at, kind, touched in list(self.log)
            if since <= at <= until
            and (user in touched.principals
                 or (not touched.principals and (version in touched.versions or document in touched.documents)))
        ]  # fmt: skip

    def run(self) -> None:
        try:
            started, n = time.monotonic(), 0
            while not self.stop_event.is_set():
                kind, change, touched = self._pick()
                self.retried += commit_retrying(self.engine, change, self.stop_event)
                if self.stop_event.is_set():
                    break
                self.counts[kind] += 1
                self.log.append((time.monotonic(), kind, touched))
                n += 1
                self.stop_event.wait(max(0.0, started + n / self.rate - time.monotonic()))
        except BaseException as exc:  # reported by the soak: a dead load thread must not look like a quiet soak
            self.error = exc

    def _pick(self) -> tuple[str, Callable[[Connection], object], Touched]:
        w, r = self.world, self.random
        with w.lock:
            docs = sorted(w.versions)
        roll = r.random()
        if roll < self.content_share:
            doc = r.choice(docs)
            return "content edit", lambda conn: self._edit(conn, doc), Touched(documents=(doc,))
        roll = r.random()
        if roll < 0.3 or (roll < 0.55 and not w.grants):
            scope, target = ("project", w.project) if r.random() < 0.2 else ("document", r.choice(docs))
            principal, effect = r.choice(w.users), "deny" if r.random() < 0.2 else "allow"
            touched = Touched((principal,), (target,) if scope == "document" else tuple(docs), (), effect)
            return "grant added", lambda conn: self._grant(conn, scope, target, principal, effect, touched), touched
        if roll < 0.55:
            grant = w.grants.pop(r.randrange(len(w.grants)))
            sql = "DELETE FROM grants WHERE id = :g"
            return "grant revoked", lambda conn: conn.execute(text(sql), {"g": grant}), self.grant_targets.pop(grant)
        outside = [(g, u) for g in w.groups for u in w.users if (g, u) not in w.memberships]
        if (roll < 0.75 and outside) or (roll < 0.9 and not w.memberships):
            group, user = r.choice(outside)
            return "member joined", lambda conn: self._join(conn, group, user), Touched((user, group))
        if roll < 0.9:
            pair = r.choice(sorted(w.memberships))
            membership = w.memberships.pop(pair)
            sql = "DELETE FROM group_memberships WHERE id = :m"
            return "member left", lambda conn: conn.execute(text(sql), {"m": membership}), Touched((pair[1], pair[0]))
        version = w.versions[r.choice(docs)]
        sql = (
            "UPDATE source_observations SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END "
            "WHERE document_version_id = :v"
        )
        return "observation toggled", lambda conn: conn.execute(text(sql), {"v": version}), Touched(versions=(version,))

    def _edit(self, conn: Connection, doc: int) -> None:
        version = self.world.versions[doc]
        revision = self.world.revisions.get(version, 0) + 1
        conn.execute(
            text("UPDATE document_versions SET text = :t WHERE id = :v"),
            {"t": version_text(doc % 1000, revision), "v": version},
        )
        self.world.revisions[version] = revision

    def _grant(self, conn: Connection, scope: str, target: int, principal: str, effect: str, touched: Touched) -> None:
        column = {"project": "project_id", "document": "document_id"}[scope]
        grant = _one(
            conn,
            f"INSERT INTO grants (scope, {column}, principal, effect) VALUES (:s, :t, :p, :e) RETURNING id",
            s=scope, t=target, p=principal, e=effect,
        )  # fmt: skip
        self.world.grants.append(grant)
        self.grant_targets[grant] = touched

    def _join(self, conn: Connection, group: str, user: str) -> None:
        # Idempotent: a retry after a commit whose answer was lost to a PostgreSQL restart finds the row.
        params = {"s": self.world.source, "g": group, "u": user}
        conn.execute(
            text(
                "INSERT INTO group_memberships (source_id, group_principal, member_principal) VALUES (:s, :g, :u) "
                "ON CONFLICT ON CONSTRAINT uq_group_memberships_source_group_member DO NOTHING"
            ),
            params,
        )
        self.world.memberships[(group, user)] = _one(
            conn,
            "SELECT id FROM group_memberships WHERE source_id = :s AND group_principal = :g AND member_principal = :u",
            **params,
        )


# -- searches ------------------------------------------------------------------------------------------------


def call_api(base: str, token: str, body: dict[str, Any], timeout: float = 60) -> tuple[float, int | str, Any]:
    """(ms, status or the connection error's name, answer)."""
    request = urllib.request.Request(
        base + "/v1/search", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status: int | str = response.status
            payload = response.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    except OSError as exc:  # the API did not answer at all
        return (time.perf_counter() - started) * 1000, type(exc).__name__, None
    try:
        answer = json.loads(payload or b"null")
    except ValueError:
        answer = None
    return (time.perf_counter() - started) * 1000, status, answer


QUERIES = ("Mahnung", "Schuldner Betrag", "Klage erhoben", "offenen Betrag zahlen", "Fassung")


class Searches(threading.Thread):
    """Searches as the world's users, one after another (`interval_s` apart), each judged against SQL."""

    def __init__(
        self, settings: Settings, engine: Engine, world: SoakWorld, base: str, started: float, interval_s: float,
        seed: int, changes: Changes,
    ) -> None:  # fmt: skip
        super().__init__(name="soak-searches", daemon=True)
        self.changes = changes
        self.settings, self.engine, self.world, self.base = settings, engine, world, base
        self.started, self.interval_s = started, interval_s
        self.random = random.Random(seed + 1)
        self.tokens = {user: mint_token(settings.api, user.split(":", 1)[1], ttl_s=6 * 3600) for user in world.users}
        self.records: list[dict[str, Any]] = []
        self.leaks: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def visible(self, user: str) -> set[int] | None:
        """The world's versions `user` may see now (None: PostgreSQL did not answer)."""
        try:
            with self.engine.connect() as conn:
                caller = resolve_caller(conn, [user], self.settings.security)
                rows = visible_versions(conn, caller, self.settings.security, project_ids=[self.world.project])
            return {row.version_id for row in rows}
        except DBAPIError:
            return None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop_event.is_set():
                self.once(n)
                n += 1
                self.stop_event.wait(self.interval_s)
        except BaseException as exc:
            self.error = exc

    def once(self, n: int) -> None:
        user = self.random.choice(self.world.users)
        body: dict[str, Any] = {"query": self.random.choice(QUERIES), "limit": 20}
        if n % 4:  # three in four lexical (cheap on two shared cores), every fourth the default (hybrid) plan
            body["mode"] = "lexical"
        window_start = time.monotonic()
        before = self.visible(user)
        at = time.monotonic() - self.started
        ms, status, answer = call_api(self.base, self.tokens[user], body)
        after = self.visible(user)
        window_end = time.monotonic()
        returned = (answer or {}).get("hits", []) if status == 200 else []
        hits = [int(h["version_id"]) for h in returned]
        judged = before is not None and after is not None
        leaked = leaked_hits(hits, before or set(), after or set()) if judged else []
        for version in leaked:
            document = next(int(h["document_id"]) for h in returned if int(h["version_id"]) == version)
            touching = self.changes.touching(window_start, window_end, user, version, document)
            self.leaks.append({
                "at_s": round(at, 2), "user": user, "query": body["query"], "mode": body.get("mode"),
                "version": version, "document": document, "window_s": round(window_end - window_start, 3),
                "changes_in_window": touching,
            })  # fmt: skip
        self.records.append({"at_s": at, "status": status, "ms": ms, "hits": len(hits), "judged": judged,
                             "leaked": len(leaked)})  # fmt: skip


# -- faults --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakOptions:
    minutes: float = 60.0
    rate: float = 50.0
    fault_every_s: float = 300.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 51
    out: Path = Path("benchmarks/soak.json")
    documents: int = 40
    users: int = 16
    content_share: float = 0.02  # ~1 content edit/s at 50/s: each is re-chunked and re-embedded on shared cores
    search_interval_s: float = 0.25
    stall_s: float = 25.0  # SIGSTOP this long: past the session timeout (10 s by default), so the group drops it
    block_s: float = 45.0  # OpenSearch refuses writes this long
    config: str | None = None
    command: str = ""


class Soak:
    """One run: the world, the threads, the faults and their recovery probes."""

    def __init__(self, settings: Settings, options: SoakOptions) -> None:
        self.settings, self.options = settings, options
        self.label = bench_label("soak")
        self.engine = make_engine(settings)
        self.search = make_sync_client(settings, timeout_s=30)
        self.worker = SyncWorker(settings, REPO_ROOT / "build" / "bench-soak-worker.log", config=options.config)
        self.api: ServeChild | None = None
        self.world: SoakWorld | None = None
        self.started = 0.0
        self.undo: list[Callable[[], None]] = []  # what puts an injected fault back, if the run stops mid-fault
        self.probes = 0

    def now(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def lanes(self) -> dict[Lane, int | None]:
        supervisor = self.worker.child.pid if self.worker.child is not None else None
        return {lane: lane_pid(supervisor, lane) for lane in LANES}

    # Each fault blocks while it lasts and answers what the record needs (the lane it hit, if any).

    def _signal_lane(self, lane: Lane, sig: signal.Signals) -> int:
        pid = self.lanes()[lane]
        if pid is None:
            raise SoakError(f"no {lane} lane process to signal (is the worker this soak started still up?)")
        os.kill(pid, sig)
        return pid

    def inject(self, kind: str, n: int) -> dict[str, Any]:
        lane: Lane = LANES[n % len(LANES)]
        if kind == "kill":
            pid = self._signal_lane(lane, signal.SIGKILL)
            killed_s = self.now()  # the fault ends with the kill: bringing the worker back is part of recovery
            return {"lane": lane, "pid": pid, "end_s": killed_s, **self._restart_worker()}
        if kind == "stall":
            pid = self._signal_lane(lane, signal.SIGSTOP)
            resume = lambda: self._continue(pid)  # noqa: E731 - an undo entry
            self.undo.append(resume)
            time.sleep(self.options.stall_s)  # the fault's length, not a wait for a result
            resume()
            self.undo.remove(resume)
            return {"lane": lane, "pid": pid, "stopped_s": self.options.stall_s}
        if kind in SERVICE_FAULTS:
            service = SERVICE_FAULTS[kind]
            back = lambda: self._start(service)  # noqa: E731
            self.undo.append(back)
            if stop_service(self.settings, service) != 0:
                raise SoakError(f"`ki stack stop {service}` failed")
            back()
            self.undo.remove(back)
            return {"service": service}
        if kind == "opensearch-block":
            indices = sorted(self.search.indices.get_alias(name=self.settings.retrieval.index_name))
            lift = lambda: self._write_block(indices, False)  # noqa: E731
            self.undo.append(lift)
            self._write_block(indices, True)
            time.sleep(self.options.block_s)  # the fault's length
            lift()
            self.undo.remove(lift)
            return {"indices": indices, "blocked_s": self.options.block_s}
        raise SoakError(f"unknown fault {kind}")

    def _restart_worker(self) -> dict[str, Any]:
        """A lane that exits takes `ki sync run` down with it (its supervisor stops the other lane; restarting is
        the process manager's job): the soak plays the process manager and starts a new worker at once."""
        child = self.worker.child
        assert child is not None
        deadline = time.monotonic() + 90
        while child.alive and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the supervisor's exit, with a deadline
        if child.alive:
            raise SoakError("`ki sync run` did not exit after one of its lanes was killed")
        exited_s = self.now()
        self.worker.child = None
        _say("soak: " + self.worker.ensure())
        return {"worker_exited_s": exited_s, "worker_restarted_by": "the soak (as a process manager would)"}

    def _continue(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # the supervisor replaced it meanwhile
            os.kill(pid, signal.SIGCONT)

    def _start(self, service: str) -> None:
        if start_service(self.settings, service) != 0:
            raise SoakError(f"`ki stack start {service}` failed")

    def _write_block(self, indices: list[str], on: bool) -> None:
        for index in indices:
            self.search.indices.put_settings(index=index, body={"index.blocks.write": True if on else None})

    def recover(self, lag: LagProbe, stop: threading.Event) -> dict[str, Any]:
        """Commit a probe document now; the seconds until a search finds it, and until both lanes have
        committed every offset Kafka held when it was found."""
        world, api = self.world, self.api
        assert world is not None and api is not None
        began = time.monotonic()
        self.probes += 1
        word = f"soakprobe{self.probes}x{world.tag}"
        added: list[tuple[int, int]] = []

        def add(conn: Connection) -> None:
            added[:] = [_add_document(conn, world, f"Probe {self.probes} {world.tag}", f"{word} Vermerk.")]

        commit_retrying(self.engine, add, stop)
        if not added:
            return {}
        with world.lock:
            world.versions[added[0][0]] = added[0][1]
        token = mint_token(self.settings.api, world.probe_user.split(":", 1)[1])
        deadline = began + RECOVERY_TIMEOUT_S
        found_s = None
        said = time.monotonic()
        while found_s is None and time.monotonic() < deadline and not stop.is_set():
            if time.monotonic() - said >= 30:
                said = time.monotonic()
                _say(f"  probe {self.probes} not found yet ({time.monotonic() - began:.0f} s)")
            _ms, status, answer = call_api(api.base, token, {"query": word, "mode": "lexical", "limit": 3}, 30)
            if status == 200 and [h["document_id"] for h in answer["hits"]] == [added[0][0]]:
                found_s = round(time.monotonic() - began, 1)
            else:
                stop.wait(0.5)
        if found_s is None:
            return {"probe_found_s": None, "lag_zero_s": None, "recovery_s": None}
        target = self._ends(lag)
        lag_zero_s = None
        while lag_zero_s is None and time.monotonic() < deadline and not stop.is_set():
            try:
                committed = {(lane_, p.topic, p.partition): p.committed
                             for lane_ in LANES for p in lag.read(lane_).partitions}  # fmt: skip
            except Exception:  # noqa: BLE001 - the broker may still be settling: read again
                committed = {}
            behind = {tp: end - committed.get(tp, -1) for tp, end in target.items() if committed.get(tp, -1) < end}
            if committed and not behind:
                lag_zero_s = round(time.monotonic() - began, 1)
            else:
                if time.monotonic() - said >= 30:
                    said = time.monotonic()
                    _say(
                        f"  lanes {sum(behind.values())} event(s) behind the log end at the probe's finding"
                        f" ({time.monotonic() - began:.0f} s): {dict(sorted(behind.items()))}"
                    )
                stop.wait(1.0)
        recovery = max(found_s, lag_zero_s) if lag_zero_s is not None else None
        return {"probe_found_s": found_s, "lag_zero_s": lag_zero_s, "recovery_s": recovery}

    @staticmethod
    def _ends(lag: LagProbe) -> dict[tuple[Lane, str, int], int]:
        """Each lane's log end per partition (both lanes read some topics, each at its own offsets)."""
        for _attempt in range(30):
            try:
                return {(lane, p.topic, p.partition): p.end for lane in LANES for p in lag.read(lane).partitions
                        if p.topic.rsplit(".", 1)[-1] in SOAK_TABLES}  # fmt: skip
            except Exception:  # noqa: BLE001 - the broker may still be settling
                time.sleep(1.0)
        raise SoakError("the Kafka lag could not be read for 30 s after a fault")

    def wait_caught_up(self, lag: LagProbe, timeout: float) -> float:
        """Until Debezium has confirmed the WAL written so far and both lanes have committed every offset."""
        began = time.monotonic()
        with self.engine.connect() as conn:
            lsn = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
        sql = text(
            "SELECT confirmed_flush_lsn >= CAST(:lsn AS pg_lsn) FROM pg_replication_slots WHERE slot_name = :slot"
        )
        while time.monotonic() - began < timeout:
            with self.engine.connect() as conn:
                confirmed = conn.execute(sql, {"lsn": lsn, "slot": self.settings.connect.slot_name}).scalar()
            if confirmed and all(lag.read(lane).caught_up for lane in LANES):
                return round(time.monotonic() - began, 1)
            time.sleep(1.0)
        raise SoakError(f"the lanes did not catch up within {timeout:.0f} s after the soak")

    def run(self) -> dict[str, Any]:
        o = self.options
        load_start = os.getloadavg()
        result: dict[str, Any] = {
            "benchmark": "soak", "command": o.command, "label": self.label, "minutes": o.minutes, "rate": o.rate,
            "fault_every_s": o.fault_every_s, "faults_asked": list(o.faults), "seed": o.seed,
            "stall_s": o.stall_s, "block_s": o.block_s, "documents": o.documents, "users": o.users,
        }  # fmt: skip
        if any(kind in ("kill", "stall") for kind in o.faults) and self.worker.answers():
            raise SoakError("a sync worker already runs on this stack: the lane faults need the one the soak starts")
        _say("soak: " + self.worker.ensure())
        changes: Changes | None = None
        searches: Searches | None = None
        lag = LagProbe(self.settings)
        stop = threading.Event()
        faults: list[dict[str, Any]] = []
        try:
            self.world = make_world(self.engine, self.label, o.documents, o.users)
            _say(f"soak: world `{self.label}`: {o.documents} documents, {o.users} users (removed at the end)")
            operator = mint_token(self.settings.api, f"soak-{self.world.tag}", roles=["operator"])
            self.api = ServeChild(o.config, REPO_ROOT / "build" / "bench-soak-api.log", operator)
            asyncio.run(self.api.start())
            self.wait_caught_up(lag, CATCH_UP_TIMEOUT_S)
            duration = o.minutes * 60
            schedule = fault_schedule(duration, o.fault_every_s, o.faults)
            _say(f"soak: {o.minutes} min at {o.rate} changes/s, faults at "
                 + (", ".join(f"{p.at_s:.0f} s {p.kind}" for p in schedule) or "none"))  # fmt: skip
            self.started = time.monotonic()
            changes = Changes(self.engine, self.world, o.rate, o.seed, o.content_share)
            searches = Searches(self.settings, self.engine, self.world, self.api.base, self.started,
                                o.search_interval_s, o.seed, changes)  # fmt: skip
            changes.start()
            searches.start()
            for n, planned in enumerate(schedule):
                self._idle_until(planned.at_s, changes, searches)
                before = self.lanes()
                record: dict[str, Any] = {"kind": planned.kind, "planned_s": planned.at_s, "start_s": self.now()}
                _say(f"soak: {record['start_s']:.0f} s fault {n + 1}/{len(schedule)}: {planned.kind}")
                record.update(self.inject(planned.kind, n))
                record.setdefault("end_s", self.now())  # a kill ends with the kill itself
                record.update(self.recover(lag, stop))
                after = self.lanes()
                record["lane_restarted"] = any(before[lane] != after[lane] for lane in LANES)
                record["lanes_after"] = {lane: pid is not None for lane, pid in after.items()}
                record["recovered_s"] = self.now()
                faults.append(record)
                _say(f"soak: {planned.kind} ended at {record['end_s']:.0f} s, recovered in {record.get('recovery_s')} s"
                     f" (probe found {record.get('probe_found_s')} s, lag 0 {record.get('lag_zero_s')} s),"
                     f" lane restarted: {record['lane_restarted']}")  # fmt: skip
            self._idle_until(duration, changes, searches)
            elapsed = time.monotonic() - self.started
            changes.stop_event.set()
            searches.stop_event.set()
            changes.join(60)
            searches.join(90)
            self._raise_thread_errors(changes, searches)
            _say(f"soak: load stopped after {elapsed:.0f} s; waiting for the lanes to catch up")
            caught_up_s = self.wait_caught_up(lag, CATCH_UP_TIMEOUT_S)
            _say(f"soak: caught up in {caught_up_s} s; comparing the world's rows with a rebuild from PostgreSQL")
            documents = self.world.documents()
            live = dump(self.search, self.settings.retrieval.index_name, documents)
            compared = compare_rows(live, rebuilt_rows(self.settings, self.engine, self.search, documents))
            lost = {"lost": compared.lost, "live": compared.live, "rebuilt": compared.rebuilt,
                    "missing": compared.missing[:20], "extra": compared.extra[:20],
                    "differing": compared.differing[:20], "caught_up_after_s": caught_up_s}  # fmt: skip
            result.update(summarize(duration_s=elapsed, changes=changes.counts, retried_changes=changes.retried,
                                    searches=searches.records, faults=faults, lost=lost))  # fmt: skip
            result["searches"]["leaked_unexplained"] = len(unexplained_leaks(searches.leaks))
            result["leaks"] = searches.leaks[:50]
            result["elapsed_s"] = round(elapsed, 1)
        finally:
            stop.set()
            for thread in (changes, searches):
                if thread is not None:
                    thread.stop_event.set()
                    thread.join(90)
            for undo in reversed(self.undo):
                with contextlib.suppress(Exception):
                    undo()
            if self.api is not None:
                self.api.stop()
            lag.close()
            result["cleanup"] = remove_bench_rows(self.settings, Footprint.of_label(self.label), what="soak").as_dict()
            self.worker.stop()
            self.search.close()
            self.engine.dispose()
        result["machine"] = machine(load_start)
        return result

    def _idle_until(self, at_s: float, changes: Changes, searches: Searches) -> None:
        """Wait for the next moment of the plan, with a progress line every 30 s; a failed thread ends the run."""
        last = time.monotonic()
        while time.monotonic() - self.started < at_s:
            self._raise_thread_errors(changes, searches)
            time.sleep(min(1.0, max(0.0, at_s - (time.monotonic() - self.started))))
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                records = list(searches.records)
                errors = sum(isinstance(r["status"], int) and r["status"] >= 500 for r in records)
                committed = sum(changes.counts.values())
                _say(f"soak: {self.now():.0f} s: {committed} changes ({committed / max(1.0, self.now()):.1f}/s),"
                     f" {len(records)} searches, 5xx {errors}, leaked {sum(r['leaked'] for r in records)},"
                     f" load {os.getloadavg()[0]:.1f}")  # fmt: skip

    @staticmethod
    def _raise_thread_errors(changes: Changes, searches: Searches) -> None:
        for thread in (changes, searches):
            if thread.error is not None:
                raise SoakError(f"the {thread.name} thread failed: {thread.error!r}") from thread.error


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C: the `finally` puts back a fault and removes the world."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(settings: Settings, options: SoakOptions) -> int:
    with _sigterm_as_interrupt():
        result = Soak(settings, options).run()
    _say(table(result))
    out = json.dumps(result, indent=2, ensure_ascii=False, default=str)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(out + "\n")
    _say(f"soak: written to {options.out}")
    lost = (result.get("lost") or {}).get("lost")
    unexplained = result["searches"]["leaked_unexplained"]
    return 0 if lost == 0 and unexplained == 0 and not result["faults_not_recovered"] else 1

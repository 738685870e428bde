"""`ki stack up | down | status | logs | wipe`: the local stack as a whole; `ki stack stop | start <service>`:
one service.

`up` resolves the pinned artifacts, starts PostgreSQL, Kafka and OpenSearch together, then Connect
(skipping any that already run healthy), waits on each one's real health check, applies the schema
migrations and registers the Debezium connector. A service that cannot start is named with its log
file, and whatever this `up` started is stopped again. `down` stops in reverse order. `wipe` deletes
the state of a stopped stack wherever it lives (see paths.py), keeping the artifact cache.
`stop` / `start` act on a single service and nothing else (no migration, no connector registration),
so a fault test or an operator can take one component away and bring it back exactly as `up` would.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg

from apps.dev.stack.artifacts import resolve_artifacts
from apps.dev.stack.cluster import env_file as cluster_env_file
from apps.dev.stack.cluster import node_count
from apps.dev.stack.connect import Connect
from apps.dev.stack.errors import StackError
from apps.dev.stack.java import find_java
from apps.dev.stack.kafka import Kafka
from apps.dev.stack.keycloak import Keycloak
from apps.dev.stack.opensearch import OpenSearch
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.ports import reserve as reserve_ports
from apps.dev.stack.postgres import Postgres
from apps.dev.stack.secure import SecureMaterial, read_env_file
from apps.dev.stack.service import Runtime, Service
from apps.dev.stack.settings import stack_settings
from apps.runtime.processes import Child
from ki.settings import Settings, load_settings
from streams.topics import LANES, lane_web_port

#: Start order; `down` walks it backwards.
SERVICE_TYPES: tuple[type[Service], ...] = (Postgres, Kafka, OpenSearch, Connect)
#: Kinds that need none of the others: launched together, then each waited on, so the JVMs' start-ups overlap
#: (on two cores Kafka's and OpenSearch's took 46 + 60 s one after the other). The rest follow one kind at a
#: time: Connect needs Kafka and PostgreSQL.
INDEPENDENT_TYPES: tuple[type[Service], ...] = (Postgres, Kafka, OpenSearch)
#: Started only on demand (`up --idp`, `start keycloak`); `down`, `wipe` and `status` know them too.
OPTIONAL_TYPES: tuple[type[Service], ...] = (Keycloak,)
STOP_TIMEOUT_S = 30.0
#: How long a freshly (re)started connector must stay RUNNING before `up` trusts it.
CONNECTOR_SETTLE_S = 3.0
MIB = 1024 * 1024


#: Kinds that run as several nodes in the cluster profile (cluster.py).
CLUSTERED_TYPES: tuple[type[Service], ...] = (Kafka, OpenSearch)


def build_services(settings: Settings, paths: StackPaths, *, optional: bool = False) -> list[Service]:
    """Every service in start order: a clustered kind's nodes one after the other."""
    nodes = node_count(settings)
    return [
        kind(settings, paths, node)
        for kind in SERVICE_TYPES + (OPTIONAL_TYPES if optional else ())
        for node in range(1, (nodes if kind in CLUSTERED_TYPES else 1) + 1)
    ]


def service_names(settings: Settings) -> list[str]:
    return [svc.name for svc in build_services(settings, StackPaths.from_settings(settings), optional=True)]


def _say(text: str = "", end: str = "\n") -> None:
    print(text, end=end, flush=True)


def _fail(text: str) -> None:
    print(f"ki stack: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _exclusive(paths: StackPaths) -> Iterator[None]:
    """One `up` / `down` at a time per stack home."""
    paths.run.mkdir(parents=True, exist_ok=True)
    with open(paths.lock_file, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say("ki stack: waiting for another `ki stack` command to finish…")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- up -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _naming(svc: Service) -> Iterator[None]:
    """A service's failure names the service and its log (several start at once)."""
    try:
        yield
    except StackError as exc:
        raise StackError(f"{svc.name} failed: {exc} (log: {svc.log_file})") from None


def _bring_up(nodes: list[Service], runtime: Runtime, timeout_s: float, label: str, launched: list[Service]) -> None:
    """Make one service healthy -- or every node of a clustered kind: all are started before any is waited
    on, since none is healthy before a majority runs. Appends each to `launched` as soon as it is started."""
    began = time.monotonic()
    waiting: list[tuple[Service, int, Child | None]] = []
    end = "\n" if len(nodes) > 1 else ""  # one node: "ready" completes its line
    for svc in nodes:
        pid = svc.running_pid()
        if pid is not None and svc.runs_elsewhere(pid):
            raise StackError(
                f"{svc.name} already running (pid {pid}) with its state outside {svc.state_dir}: "
                "stop it with `ki stack down`, then run `ki stack up` again"
            )
        if pid is not None and svc.probe() is None:
            svc.after_healthy()
            _say(f"{label} {svc.name}: already running (pid {pid}, port {svc.port})")
            continue
        if pid is not None:
            _say(f"{label} {svc.name}: running (pid {pid}), waiting until healthy… ", end=end)
            waiting.append((svc, pid, None))
        else:
            _say(f"{label} {svc.name}: starting… ", end=end)
            with _naming(svc):
                child = svc.start(runtime)
            launched.append(svc)
            waiting.append((svc, child.pid, child))
    for svc, pid, started in waiting:
        with _naming(svc):
            svc.wait_healthy(pid, svc.start_timeout_s(timeout_s), started)
            svc.after_healthy()
        name = f"{label} {svc.name}: " if len(nodes) > 1 else ""
        _say(f"{name}ready in {time.monotonic() - began:.1f}s (pid {pid}, port {svc.port})")


def _by_kind_reversed(services: list[Service]) -> list[list[Service]]:
    """The services in stop order, a clustered kind's nodes together."""
    kinds = list(dict.fromkeys(type(svc) for svc in services))
    return [[svc for svc in services if type(svc) is kind] for kind in reversed(kinds)]


def _stop_nodes(nodes: list[Service]) -> list[tuple[int, bool] | None | OSError]:
    """Stop every node of a kind at once: a KRaft controller or a cluster manager left without its quorum
    waits for it instead of shutting down, so stopping them one after the other would hang on the last."""

    def stop(svc: Service) -> tuple[int, bool] | None | OSError:
        try:
            return svc.stop(STOP_TIMEOUT_S)
        except OSError as exc:
            return exc

    if len(nodes) <= 1:
        return [stop(svc) for svc in nodes]
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(stop, nodes))


def _stop_all(services: list[Service]) -> None:
    for nodes in _by_kind_reversed(services):
        _stop_nodes(nodes)


def _start_waves(services: list[Service]) -> list[list[Service]]:
    """The services grouped as they start: the independent kinds together, then every other kind alone."""
    first = [svc for svc in services if type(svc) in INDEPENDENT_TYPES]
    rest = list(dict.fromkeys(type(svc) for svc in services if type(svc) not in INDEPENDENT_TYPES))
    return [wave for wave in [first, *([svc for svc in services if type(svc) is kind] for kind in rest)] if wave]


def _start_services(settings: Settings, paths: StackPaths, services: list[Service]) -> list[Service] | None:
    """Bring every service up; returns those this call started, None after a failure."""
    try:
        java = find_java(settings)
        keycloak = any(isinstance(s, Keycloak) for s in services)
        artifacts = resolve_artifacts(paths, java, _say, keycloak=keycloak, secure=stack_settings(settings).secure)
    except StackError as exc:
        _fail(str(exc))
        return None
    runtime = Runtime(java=java, artifacts=artifacts)
    # The services' ports and the sync lanes' web ports (workers restart often; each must get its port back).
    lanes = [lane_web_port(settings, lane) for lane in LANES]
    reserve_ports([*(port for svc in services for port in svc.ports), *lanes])
    launched: list[Service] = []
    for index, nodes in enumerate(waves := _start_waves(services), 1):
        try:
            _bring_up(nodes, runtime, stack_settings(settings).start_timeout_s, f"[{index}/{len(waves)}]", launched)
        except StackError as exc:
            _say()
            _fail(str(exc))
            _stop_all(launched)
            if launched:
                _say(f"ki stack: stopped what this run started: {', '.join(s.name for s in launched)}")
            return None
        except BaseException:
            _stop_all(launched)
            raise
    return launched


def connect(settings: Settings, fresh: bool = True) -> int:
    """Apply the schema migrations and register the Debezium connector (services must be up).
    `fresh=False` (nothing was started or changed) trusts a single RUNNING answer."""
    from apps.dev.stack.connector import Connector
    from ki.db.migrate import upgrade

    started = time.monotonic()
    _say("schema: migrating… ", end="")
    try:
        upgrade(settings)
    except Exception as exc:  # any migration failure: one readable line
        _say()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(f"schema migration failed: {first}")
        return 1
    _say(f"done in {time.monotonic() - started:.1f}s")
    if stack_settings(settings).secure:
        try:
            Postgres(settings, StackPaths.from_settings(settings)).apply_roles()
        except (psycopg.Error, OSError) as exc:
            _fail(f"least-privilege roles (deploy/postgres/roles.sql) failed: {str(exc).strip().splitlines()[0]}")
            return 1
        _say("roles: ki_api, ki_worker, ki_debezium can log in")
    started = time.monotonic()
    connector = Connector(settings)
    _say(f"connector {connector.name}: ", end="")
    try:
        what = connector.register()
        _say(f"{what}, waiting for RUNNING… ", end="")
        settle = CONNECTOR_SETTLE_S if fresh or what != "unchanged" else 0.0
        connector.wait_running(stack_settings(settings).start_timeout_s, settle_s=settle)
    except (StackError, OSError) as exc:
        _say()
        log = StackPaths.from_settings(settings).log_file("connect")
        _fail(f"{exc} (log: {log})")
        return 1
    _say(f"RUNNING in {time.monotonic() - started:.1f}s")
    return 0


def secured(settings: Settings) -> Settings:
    """The settings of the secured profile: its material generated where missing, then the operator's
    client environment (`<home>/secure/operator.env`) applied over the process environment."""
    material = SecureMaterial.of(settings)
    if material.ensure(settings):
        _say(f"secure: generated a CA, certificates and passwords in {material.root}")
    environ = {**os.environ, **read_env_file(material.env_file("operator"))}
    return load_settings(environ=environ)


def up(settings: Settings, *, idp: bool = False, secure: bool = False) -> int:
    """`idp`: Keycloak too (after the others: a failure of the optional provider stops only itself).
    `secure`: the secured profile (secure.py); also when `stack.secure` is set."""
    began = time.monotonic()
    if (secure or stack_settings(settings).secure) and stack_settings(settings).cluster:
        _fail("the cluster profile is not secured yet: run `ki stack up --cluster` without --secure")
        return 2
    if secure or stack_settings(settings).secure:
        settings = secured(settings)
    paths = StackPaths.from_settings(settings)
    services = build_services(settings, paths, optional=idp)
    with _exclusive(paths):
        launched = _start_services(settings, paths, services)
        if launched is None:
            return 1
        if connect(settings, fresh=bool(launched)) != 0:
            _say("ki stack: the services are left running; fix the problem and run `ki stack up` again")
            return 1
    _say(f"stack is up in {time.monotonic() - began:.1f}s; logs in {paths.logs}/<service>.log "
         "(`ki stack logs <service>`)")  # fmt: skip
    if stack_settings(settings).secure:
        env = SecureMaterial.of(settings).env_file("operator")
        _say(f"secured: point ki at it with `set -a; . {env}; set +a` (worker.env, api.env beside it)")
    if stack_settings(settings).cluster:
        _say(f"cluster: point ki at it with `set -a; . {cluster_env_file(settings)}; set +a`")
    return 0


# -- one service -------------------------------------------------------------------------------


def _one_service(settings: Settings, paths: StackPaths, name: str | None, action: str) -> Service | None:
    for svc in build_services(settings, paths, optional=True):
        if svc.name == name:
            return svc
    names = ", ".join(service_names(settings))
    _fail(f"{action}: name one of {names}" + (f" (not {name!r})" if name else ""))
    return None


def _report_stop(svc: Service, result: tuple[int, bool] | None, began: float) -> None:
    if result is None:
        _say(f"{svc.name}: not running")
        return
    pid, clean = result
    how = "stopped" if clean else f"killed (no exit {STOP_TIMEOUT_S:.0f}s after {svc.stop_signal.name})"
    _say(f"{svc.name}: {how} (pid {pid}) in {time.monotonic() - began:.1f}s")


def stop_service(settings: Settings, name: str | None) -> int:
    """Stop one service the way `down` would (its stop signal, SIGKILL after the deadline)."""
    paths = StackPaths.from_settings(settings)
    svc = _one_service(settings, paths, name, "stop")
    if svc is None:
        return 2
    with _exclusive(paths):
        began = time.monotonic()
        try:
            result = svc.stop(STOP_TIMEOUT_S)
        except OSError as exc:
            _fail(f"{svc.name}: cannot stop: {exc}")
            return 1
        _report_stop(svc, result, began)
    return 0


def start_service(settings: Settings, name: str | None) -> int:
    """Start one service (if it is not running) and wait until it is healthy, as `up` would."""
    paths = StackPaths.from_settings(settings)
    svc = _one_service(settings, paths, name, "start")
    if svc is None:
        return 2
    with _exclusive(paths):
        try:
            java = find_java(settings)
            keycloak = isinstance(svc, Keycloak)
            artifacts = resolve_artifacts(paths, java, _say, keycloak=keycloak, secure=stack_settings(settings).secure)
            runtime = Runtime(java=java, artifacts=artifacts)
        except StackError as exc:
            _fail(str(exc))
            return 1
        reserve_ports(svc.ports)
        launched: list[Service] = []
        try:
            _bring_up([svc], runtime, stack_settings(settings).start_timeout_s, f"[{svc.name}]", launched)
        except StackError as exc:
            _say()
            _fail(str(exc))
            _stop_all(launched)
            return 1
        except BaseException:
            _stop_all(launched)
            raise
    return 0


# -- down, status, logs ---------------------------------------------------------------------------


def down(settings: Settings) -> int:
    paths = StackPaths.from_settings(settings)
    code = 0
    with _exclusive(paths):
        services = build_services(settings, paths, optional=True)
        for nodes in _by_kind_reversed(services):
            nodes = [svc for svc in nodes if not (isinstance(svc, OPTIONAL_TYPES) and svc.running_pid() is None)]
            began = time.monotonic()  # optional ones never started are left out: nothing to say
            for svc, result in zip(nodes, _stop_nodes(nodes), strict=True):
                if isinstance(result, OSError):
                    _fail(f"{svc.name}: cannot stop: {result}")
                    code = 1
                else:
                    _report_stop(svc, result, began)
    return code


def wipe(settings: Settings) -> int:
    """Delete this stack's state: every service's data wherever it lives (the home, or the system
    directory of services run as another account), logs and pid files. The artifact cache stays.
    Refuses while any service runs."""
    paths = StackPaths.from_settings(settings)
    services = build_services(settings, paths, optional=True)
    with _exclusive(paths):
        running = [svc.name for svc in services if svc.running_pid() is not None]
        if running:
            _fail(f"wipe: {', '.join(running)} still running; stop the stack first (`ki stack down`)")
            return 1
        doomed = [d for svc in services for d in paths.state_dirs(svc.name)] + [paths.home / "data", paths.logs]
        doomed.append(SecureMaterial.of(settings).root)  # the secured profile's CA and passwords
        doomed.append(cluster_env_file(settings))  # the home forgets it was a cluster
        doomed += [paths.pid_file(svc.name) for svc in services]
        for path in doomed:
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
                else:
                    continue
            except OSError as exc:
                _fail(f"wipe: cannot remove {path}: {exc.strerror}")
                return 1
            _say(f"removed {path}")
    return 0


def status(settings: Settings) -> int:
    paths = StackPaths.from_settings(settings)
    healthy = True
    for svc in build_services(settings, paths, optional=True):
        pid = svc.running_pid()
        if pid is None and isinstance(svc, OPTIONAL_TYPES):
            continue  # on demand only: not running is no fault
        if pid is None:
            healthy = False
            _say(f"{svc.name:<13} stopped                 port {svc.port}")
            continue
        reason = svc.probe()
        healthy &= reason is None
        rss = svc.rss_bytes(pid) / MIB
        _say(f"{svc.name:<13} running  pid {pid:<8} port {svc.port:<6} rss {rss:7.1f} MiB  "
             f"{'healthy' if reason is None else 'unhealthy: ' + reason}")  # fmt: skip
    if healthy and stack_settings(settings).cluster:
        healthy = _cluster_status(settings)
    if healthy:
        healthy = _connector_status(settings)
    return 0 if healthy else 1


def _cluster_status(settings: Settings) -> bool:
    """The cluster profile as a whole: every broker in the metadata and every partition fully in sync; every
    OpenSearch node joined and every shard assigned (green)."""
    from apps.dev.stack.http import HttpError, request_json
    from streams.status import LagProbe

    probe = LagProbe(settings)
    try:
        brokers = len(probe.brokers())
        lagging = probe.under_replicated()
    except Exception as exc:  # noqa: BLE001 - reported as the line's state
        brokers, lagging = 0, -1
        _say(f"{'kafka':<13} cluster unreachable: {exc}")
    finally:
        probe.close()
    nodes = node_count(settings)
    kafka_ok = brokers == nodes and lagging == 0
    _say(f"{'kafka':<13} cluster  {brokers}/{nodes} brokers, {max(lagging, 0)} under-replicated partition(s)")
    opensearch = OpenSearch(settings, StackPaths.from_settings(settings))
    try:
        _, health = request_json("GET", f"{opensearch.url}/_cluster/health", timeout=5, auth=opensearch.admin_auth())
    except HttpError as exc:
        health = {"status": f"unreachable ({exc})"}
    health = health if isinstance(health, dict) else {}
    _say(f"{'opensearch':<13} cluster  {health.get('status')}, {health.get('number_of_nodes', 0)}/{nodes} nodes, "
         f"{health.get('unassigned_shards', '?')} unassigned shard(s)")  # fmt: skip
    return kafka_ok and health.get("status") == "green" and health.get("number_of_nodes") == nodes


def _connector_status(settings: Settings) -> bool:
    from apps.dev.stack.connector import Connector

    connector = Connector(settings)
    try:
        state, tasks, trace = connector.state()
    except OSError as exc:
        state, tasks, trace = "UNREACHABLE", [], str(exc)
    running = state == "RUNNING" and bool(tasks) and all(t == "RUNNING" for t in tasks)
    detail = f"tasks {','.join(tasks) or 'none'}" + (f"  {trace.strip().splitlines()[0]}" if trace else "")
    _say(f"{'connector':<13} {state.lower() if state != 'UNKNOWN' else 'not registered'}  {connector.name}  {detail}")
    return running


def logs(settings: Settings, service: str | None = None, lines: int = 50) -> int:
    paths = StackPaths.from_settings(settings)
    names = service_names(settings) + ["artifacts"]
    if service not in names:
        _fail(f"logs: name one of {', '.join(names)}" + (f" (not {service!r})" if service else ""))
        return 2
    log_file = paths.log_file(service)
    if not log_file.is_file():
        _fail(f"logs: no log yet at {log_file}")
        return 1
    with open(log_file, errors="replace") as fh:
        tail = deque(fh, maxlen=max(lines, 0))
    sys.stdout.writelines(tail)
    sys.stdout.flush()
    return 0

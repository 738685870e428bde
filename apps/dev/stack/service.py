"""The one Service abstraction. A concrete service says how to prepare and launch itself, which ports it
owns, how to tell its process apart and how to probe its health; starting, waiting, stopping and
reporting are the same for all four.

A service that refuses root runs as the service account when `ki` runs as root, with its state
directory outside the user's home (see paths.py and users.py); everything it reads is checked to be
reachable for that account before it starts, and no permission outside the stack's own directories is
changed."""

from __future__ import annotations

import os
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from apps.dev.stack import process
from apps.dev.stack.artifacts import Artifacts
from apps.dev.stack.errors import StackError
from apps.dev.stack.java import JavaRuntime
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.process import Launch
from apps.dev.stack.users import ServiceUser, current_user, unprivileged_user
from apps.runtime.processes import Child, wait_until
from ki.settings import Settings


@dataclass(frozen=True)
class Runtime:
    """What launching needs beyond the settings: the Java runtime and the resolved artifacts."""

    java: JavaRuntime
    artifacts: Artifacts


class Service(ABC):
    #: The kind's name; a cluster's further nodes are `<name>-<node>` (state, logs and pid file of their own).
    name: str
    #: Signal for an orderly shutdown; SIGKILL follows after the stop deadline.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    #: PostgreSQL and OpenSearch refuse to run as root (see users.py).
    refuses_root: ClassVar[bool] = False

    def __init__(self, settings: Settings, paths: StackPaths, node: int = 1) -> None:
        self.settings = settings
        self.paths = paths
        self.node = node
        if node > 1:
            self.name = f"{type(self).name}-{node}"

    # -- what each service defines --------------------------------------------------------------------

    @property
    @abstractmethod
    def ports(self) -> tuple[int, ...]:
        """Every port it listens on; the first one is its main port."""

    @abstractmethod
    def command_marker(self, state_dir: Path) -> str:
        """A string only this service's process, run on `state_dir`, carries in its command line."""

    @abstractmethod
    def prepare(self, runtime: Runtime) -> Launch:
        """Write configuration, initialise data once, and say how to start (idempotent)."""

    @abstractmethod
    def probe(self) -> str | None:
        """None when healthy, else a short reason."""

    def after_healthy(self) -> None:
        """One-time work once healthy (e.g. PostgreSQL roles); raises StackError on failure."""
        return None

    # -- shared behaviour ------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def runs_as_invoker(self) -> bool:
        """Everything but a root-refusing service under root runs as the user who runs `ki`."""
        return not (self.refuses_root and os.geteuid() == 0)

    @property
    def state_dir(self) -> Path:
        return self.paths.state_dir(self.name, runs_as_invoker=self.runs_as_invoker)

    @property
    def log_file(self) -> Path:
        return self.paths.log_file(self.name)

    @property
    def pid_file(self) -> Path:
        return self.paths.pid_file(self.name)

    @cached_property
    def user(self) -> ServiceUser:
        return unprivileged_user() if self.refuses_root else current_user()

    @property
    def process_tokens(self) -> tuple[str, ...]:
        """The markers of its process wherever its state is, so a stack started by another user (or
        by an older `ki` that kept every state in the home) is still found and stopped."""
        return tuple(dict.fromkeys(self.command_marker(d) for d in self.paths.state_dirs(self.name)))

    def running_pid(self) -> int | None:
        return process.find_process(self.pid_file, self.process_tokens)

    def runs_elsewhere(self, pid: int) -> bool:
        """The running process uses another state directory than this `ki` would (started by another
        user, or by an older `ki` that kept every state in the home): stop it, never adopt it."""
        return self.command_marker(self.state_dir) not in process.cmdline(pid)

    def check_ports_free(self) -> None:
        for port in self.ports:
            if process.port_in_use(self.host, port):
                owner = process.port_owner(port) or "another process"
                raise StackError(f"port {port} is already in use by {owner}")

    def claim_state_dir(self) -> None:
        """Create the state directory, owned by the service's user (outside the home when that is
        another account: see paths.py)."""
        if not self.runs_as_invoker:
            self.paths.make_system_dir()
        self.user.make_dir(self.state_dir)
        self.user.check_can_reach(self.state_dir, "the state directory")

    def start(self, runtime: Runtime) -> Child:
        self.check_ports_free()
        self.claim_state_dir()
        launch = self.prepare(runtime)
        for path in (Path(launch.argv[0]), *launch.reads):
            self.user.check_can_reach(path, f"{self.name} needs")
        return process.spawn(launch, self.log_file, self.pid_file, self.user)

    def start_timeout_s(self, stack_default_s: float) -> float:
        """How long a start may take before it counts as failed: the stack's `start_timeout_s` unless the
        service knows it is slower."""
        return stack_default_s

    def wait_healthy(self, pid: int, timeout_s: float, child: Child | None = None) -> None:
        """Poll `probe` until healthy; fail early when the process dies, or at the deadline."""
        reason: str | None = "not probed yet"

        def healthy() -> bool:
            nonlocal reason
            reason = self.probe()
            return reason is None

        def alive() -> bool:
            return (child is None or child.alive) and process.pid_alive(pid)

        outcome = wait_until(healthy, alive=alive, timeout_s=timeout_s)
        if outcome == "exited":
            code = child.returncode if child is not None else None
            last = process.last_error_line(self.log_file)
            how = "exited" if code is None else f"exited with code {code}"
            raise StackError(f"{how} while starting" + (f": {last}" if last else ""))
        if outcome == "timed out":
            raise StackError(f"not healthy after {timeout_s:.0f}s: {reason}")

    def stop(self, timeout_s: float) -> tuple[int, bool] | None:
        """Stop the running process; returns (pid, stopped cleanly) or None when it was not running."""
        pid = self.running_pid()
        stopped = None if pid is None else (pid, process.stop(pid, self.stop_signal, timeout_s))
        self.pid_file.unlink(missing_ok=True)
        return stopped

    def rss_bytes(self, pid: int) -> int:
        return process.group_rss_bytes(pid)

    def write_config(self, path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.user.write(path, text)
        return path


def java_properties(values: dict[str, object]) -> str:
    """A Java .properties file (values are simple: no newlines; backslashes escaped)."""
    lines = ["# Written by `ki stack up` from the settings; edits are overwritten."]
    for key, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"{key}={text.replace(chr(92), chr(92) * 2)}")
    return "\n".join(lines) + "\n"

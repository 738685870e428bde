"""Child processes, started, awaited and stopped one way for every application that runs one (the demo's
and benchmarks' sync worker, `ki serve` for benchmarks, the eval worker, the local stack's services, the
integration tests' workers and servers).

`Child` is a process this one starts and holds: its output appended to a log file (after a marker line
naming the command), extra environment on top of ours (or an environment of its own), optionally
detached into its own session.
`wait_ready` polls a readiness probe until it answers, failing early when the child exits and at a
deadline. `stop` sends a signal (SIGTERM: Faust commits its offsets, PostgreSQL shuts down fast),
waits, then SIGKILLs. `stop_pid` does the same for a process known only by its pid (a stack service an
earlier `ki` started, an eval worker whose parent was killed).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

#: Starts each run's block in a log (readers such as `last_error_line` look at the latest block only).
START_MARKER = "==== ki:"
POLL_INTERVAL_S = 0.25
Outcome = Literal["ready", "exited", "timed out"]


# Below the kernel's ephemeral range (Linux: 32768-60999): a port handed out by `bind(0)` is one of those, and any
# outgoing connection (a Kafka or OpenSearch client's) may take it before the child binds it (a CI run's sync
# worker exited on "address already in use" that way). Ports here only collide with another free_port().
_CHOSEN_PORTS = (20000, 32767)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (for a child's web or API port), chosen at random below the
    ephemeral range so that no outgoing connection takes it meanwhile; the kernel's choice if none is free."""
    for _ in range(50):
        port = random.randint(*_CHOSEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, …); None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, is not)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def wait_until(
    ready: Callable[[], bool], *, alive: Callable[[], bool], timeout_s: float, interval_s: float = POLL_INTERVAL_S
) -> Outcome:
    """Poll `ready` until it is true, the process is no longer `alive`, or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not alive():
            return "exited"
        if ready():
            return "ready"
        if time.monotonic() >= deadline:
            return "timed out"
        time.sleep(interval_s)  # polling interval of a deadline loop


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_pid(pid: int, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0, *, group: bool = False) -> bool:
    """Send `sig` to `pid` (to its whole process group with `group`), SIGKILL after `timeout_s`.
    Returns True when it exited on `sig`, False when it had to be killed."""
    send = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError):
        send(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.1)  # polling interval of a deadline loop
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGKILL)
    while pid_alive(pid):
        _reap(pid)
        time.sleep(0.05)  # SIGKILL cannot be ignored: this ends as soon as the kernel has reaped it
    return False


class Child:
    """One child process: `start`, `wait_ready`, `stop` (see the module docstring)."""

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = True,
        cwd: Path | None = None,
        detach: bool = False,
        popen_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.argv = argv
        self.log_path = log_path
        #: On top of our environment at `start`, or (`inherit_env=False`) the whole of it.
        self.env = dict(env or {})
        self.inherit_env = inherit_env
        self.cwd = cwd
        #: Own session: a Ctrl-C of the parent does not reach it, and `stop(group=True)` reaches its children.
        self.detach = detach
        self.popen_kwargs = dict(popen_kwargs or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        """Start it; output appended to `log_path`. Raises OSError when the command cannot be started."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # The wall-clock time: how long the child took to come up can be read from its own log lines.
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            log.write(f"\n{START_MARKER} {when} starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**(os.environ if self.inherit_env else {}), **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.detach,
                **self.popen_kwargs,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait_ready(
        self, ready: Callable[[], bool], timeout_s: float, interval_s: float = POLL_INTERVAL_S
    ) -> str | None:
        """None once `ready()` is true; else why not ("exited with code 1", "not ready after 120s"),
        with the child stopped."""
        outcome = wait_until(ready, alive=lambda: self.alive, timeout_s=timeout_s, interval_s=interval_s)
        if outcome == "ready":
            return None
        self.stop()
        if outcome == "exited":
            return f"exited with code {self.returncode}"
        return f"not ready after {timeout_s:.0f}s"

    def stop(self, timeout_s: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> bool:
        """`sig`, up to `timeout_s` to exit, then SIGKILL. True when it exited on `sig` (or had already)."""
        if self.process is None or self.process.poll() is not None:
            return True
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks (a worker commits no offsets for the batch in flight)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()

"""Several processes of one command, held together: `ki sync run` (its lanes) and `ki serve --workers N`.

The supervisor starts each child, forwards SIGTERM/SIGINT to them (each stops cleanly), and when one
exits on its own stops the others and exits with the first non-zero code (a sync lane that finds the
index incompatible exits with 3; that code reaches the operator). Children die with the supervisor
(SIGKILL by the kernel, like the supervisor itself): nothing outlives a killed parent. Restarting a child
that exited is the process manager's job (systemd, Kubernetes), as it is for a single process.

A child with a liveness URL (the sync lanes' `/healthz`, `streams.liveness`) is asked every `interval_s`; one
that answers "stalled" (503), or that answered once and then gave no answer for `stall_after_s` (stopped,
hung), is killed and started again in its place: alive is not enough, it must make progress.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType

_PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 60.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGKILL this process when its parent dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def ki_command(*args: str, config: str | None) -> list[str]:
    """`ki [--config FILE] ARGS...` run by this interpreter."""
    return [sys.executable, "-m", "apps.cli", *(["--config", config] if config else []), *args]


@dataclass(frozen=True)
class Liveness:
    """Where each child answers whether it makes progress, and how patient to be."""

    urls: Mapping[str, str]  # child name -> its liveness URL
    interval_s: float
    stall_after_s: float


def ask(url: str, timeout_s: float) -> str | None:
    """A liveness URL's verdict: None (healthy), the reason it is not, or "no answer"."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(Exception):
            return f"{exc.code}: {json.loads(exc.read())}"
        return f"{exc.code}"
    except (OSError, ValueError):
        return "no answer"


class Watch:
    """When each child last answered healthy, and which ones to restart now."""

    def __init__(self, liveness: Liveness, started: float) -> None:
        self.liveness = liveness
        self.next_check = started + liveness.interval_s
        self.healthy_at: dict[str, float] = {}  # only children that answered once

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def to_restart(self, now: float) -> dict[str, str]:
        """Ask every child once; the ones to restart, with why."""
        self.next_check = now + self.liveness.interval_s
        out: dict[str, str] = {}
        for name, url in self.liveness.urls.items():
            why = ask(url, timeout_s=min(5.0, self.liveness.interval_s))
            if why is None:
                self.healthy_at[name] = now
            elif why != "no answer":
                out[name] = why  # it answered: stalled
            elif name in self.healthy_at and now - self.healthy_at[name] > self.liveness.stall_after_s:
                out[name] = f"no answer for {now - self.healthy_at[name]:.0f} s"
        return out

    def restarted(self, name: str, now: float) -> None:
        self.healthy_at.pop(name, None)  # its successor is judged once it answered


def supervise(
    commands: Mapping[str, list[str]],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    on_exit: Callable[[int], None] | None = None,
    liveness: Liveness | None = None,
) -> int:
    """Run every command as a child until one exits or we are asked to stop; returns the exit code.
    `what` names the children in messages ("lane", "worker"); `on_exit(pid)` runs for each child that ended;
    `liveness`: children restarted when they stall (module doc)."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop_all(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def start(name: str) -> None:
        children[name] = subprocess.Popen(
            commands[name], preexec_fn=_die_with_parent, env=None if env is None else dict(env)
        )

    def restart(name: str, why: str) -> None:
        old = children[name]
        print(f"ki: the {name} {what} (pid {old.pid}) made no progress ({why}); restarting it",
              file=sys.stderr, flush=True)  # fmt: skip
        old.kill()  # a stopped or hung process does not act on SIGTERM
        old.wait()
        if on_exit is not None:
            on_exit(old.pid)
        start(name)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for name in commands:
            start(name)
        watch = Watch(liveness, time.monotonic()) if liveness is not None else None
        first = _wait_any(children, watch, restart)
        if not stopping:
            print(f"ki: the {first} {what} exited with code {children[first].returncode}; stopping the others",
                  file=sys.stderr, flush=True)  # fmt: skip
            stop_all(signal.SIGTERM, None)
        codes = {name: _wait(child) for name, child in children.items()}
        if on_exit is not None:
            for child in children.values():
                on_exit(child.pid)
        for name in (first, *(other for other in children if other != first)):
            if codes[name]:
                return codes[name] if codes[name] > 0 else 128 - codes[name]  # killed by a signal: 128 + signum
        return 0 if stopping else 1  # a child that ends by itself, even with 0, has stopped the service
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_any(
    children: Mapping[str, subprocess.Popen[bytes]],
    watch: Watch | None = None,
    restart: Callable[[str, str], None] | None = None,
) -> str:
    while True:
        for name, child in children.items():
            if child.poll() is not None:
                return name
        now = time.monotonic()
        if watch is not None and restart is not None and watch.due(now):
            for name, why in watch.to_restart(now).items():
                restart(name, why)
                watch.restarted(name, now)
        time.sleep(0.2)  # polling interval: a child's exit is noticed within 0.2 s


def _wait(child: subprocess.Popen[bytes]) -> int:
    try:
        return child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()

"""Several processes of one command, held together: `ki sync run` (its lanes) and `ki serve --workers N`.

The supervisor starts each child, forwards SIGTERM/SIGINT to them (each stops cleanly), and when one
exits on its own stops the others and exits with the first non-zero code (a sync lane that finds the
index incompatible exits with 3; that code reaches the operator). Children die with the supervisor
(SIGKILL by the kernel, like the supervisor itself): nothing outlives a killed parent. Restarting is the
process manager's job (systemd, Kubernetes), as it is for a single process.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
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


def supervise(
    commands: Mapping[str, list[str]],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    on_exit: Callable[[int], None] | None = None,
) -> int:
    """Run every command as a child until one exits or we are asked to stop; returns the exit code.
    `what` names the children in messages ("lane", "worker"); `on_exit(pid)` runs for each child that ended."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop_all(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for name, command in commands.items():
            children[name] = subprocess.Popen(
                command, preexec_fn=_die_with_parent, env=None if env is None else dict(env)
            )
        first = _wait_any(children)
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


def _wait_any(children: Mapping[str, subprocess.Popen[bytes]]) -> str:
    while True:
        for name, child in children.items():
            if child.poll() is not None:
                return name
        time.sleep(0.2)  # polling interval: a child's exit is noticed within 0.2 s


def _wait(child: subprocess.Popen[bytes]) -> int:
    try:
        return child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()

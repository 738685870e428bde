"""`ki sync run`: the sync's two lanes (`streams.topics.LANES`), each a process of its own, held together.

Why processes: the content lane spends its time embedding (CPU in onnxruntime and the tokenizer, which
also holds the GIL at times); in one process the access lane's event loop would stall behind it. As
separate processes the operating system schedules them, and the content lane runs at a lower priority
(`streams.content_nice`), so an access change is written within the freshness bound however much text
is queued for embedding.

The supervisor starts one `ki sync run --lane L` per lane, forwards SIGTERM/SIGINT to them (each commits
its offsets and stops), and when one lane exits stops the other and exits with the first non-zero code
(a lane that finds the index incompatible exits with 3; that code reaches the operator). The lanes die
with the supervisor (SIGKILL by the kernel, like the supervisor itself): nothing outlives a killed worker.
To scale out, run `ki sync run` on N machines (each lane's partitions are shared among its group's
members), or run the lanes apart with `--lane access` / `--lane content` where the CPU is.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from types import FrameType

from streams.topics import LANES, Lane

_PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 60.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGKILL this process when its parent dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def lane_command(lane: Lane, *, config: str | None, loglevel: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "apps.cli",
        *(["--config", config] if config else []),
        "sync",
        "run",
        "--lane",
        lane,
        "--loglevel",
        loglevel,
    ]


def run_lanes(*, config: str | None, loglevel: str) -> int:
    """Run every lane as a child until one exits or we are asked to stop; returns the exit code."""
    children: dict[Lane, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop_all(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for lane in LANES:
            children[lane] = subprocess.Popen(
                lane_command(lane, config=config, loglevel=loglevel), preexec_fn=_die_with_parent
            )
        first = _wait_any(children)
        if not stopping:
            print(f"ki sync: the {first} lane exited with code {children[first].returncode}; stopping the others",
                  file=sys.stderr, flush=True)  # fmt: skip
            stop_all(signal.SIGTERM, None)
        codes = {lane: _wait(child) for lane, child in children.items()}
        for lane in (first, *(other for other in children if other != first)):
            if codes[lane]:
                return codes[lane] if codes[lane] > 0 else 128 - codes[lane]  # killed by a signal: 128 + signum
        return 0 if stopping else 1  # a lane that ends by itself, even with 0, has stopped the sync
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_any(children: dict[Lane, subprocess.Popen[bytes]]) -> Lane:
    while True:
        for lane, child in children.items():
            if child.poll() is not None:
                return lane
        time.sleep(0.2)  # polling interval: a lane's exit is noticed within 0.2 s


def _wait(child: subprocess.Popen[bytes]) -> int:
    try:
        return child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()

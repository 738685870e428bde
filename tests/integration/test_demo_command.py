"""`ki demo` end to end: the main job of the README, run as a real child process against the real stack.

It must bring the stack up (already up here: idempotent), find or write a corpus, start a sync worker,
wait until CDC is drained, serve the API and prove with real requests that they return hits — then stop
API and worker on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from apps.dev.checkout import REPO_ROOT
from apps.runtime.processes import free_port
from ki.settings import Settings
from tests.conftest import wait_for

pytestmark = pytest.mark.stack


def _worker_answers(settings: Settings) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.streams.web_port}/metrics", timeout=2):
            return True
    except OSError:
        return False


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_demo_serves_example_requests_with_hits_and_stops_cleanly(settings: Settings) -> None:
    # The demo's worker takes the configured lane ports; a worker an earlier module stopped may still be releasing
    # one (a lane that cannot bind its port exits, and the demo with it).
    lanes = (settings.streams.lane_web_port("content"), settings.streams.lane_web_port("access"))
    wait_for(lambda: all(_bindable(p) for p in lanes), timeout=120, what=f"the lane ports {lanes} to be free")
    assert not _worker_answers(settings), "another sync worker is running; the demo would reuse it"
    port = free_port()
    log_path = REPO_ROOT / "build" / "demo-command.log"
    log_path.parent.mkdir(exist_ok=True)
    with log_path.open("wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "apps.cli", "demo", "--scale", "12"],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "KI_API__PORT": str(port)},
        )
        try:

            def serving() -> str | None:
                assert demo.poll() is None, f"ki demo exited early; see {log_path}"
                text = log_path.read_text()
                return text if "ki demo: serving on" in text else None

            output = wait_for(serving, timeout=900, what="ki demo to sync and serve")
            answers = re.findall(r"-> HTTP (\d+), (\d+) hit\(s\)", output)
            assert len(answers) == 3, output[-2000:]
            assert all(status == "200" and int(hits) > 0 for status, hits in answers), answers
            assert "Bearer ey" in output  # the printed requests carry a minted token
            # Not a terminal: plain progress lines with count/total, rate and the lag per lane.
            # Two phases, each with its own count, rate and ETA: versions keyword-searchable, then rows vectored.
            progress = re.findall(
                r"^ki demo: keyword-searchable: \d+/\d+ versions \(\d+%\), .*; Kafka lag: (.*)$", output, re.M
            )
            assert progress and all("content " in lag and "access " in lag for lag in progress), output[-2000:]
            vectors = re.findall(r"^ki demo: vectors: (\d+)/(\d+) rows", output, re.M)
            assert vectors and output.index("ki demo: vectors:") > output.index("ki demo: keyword-searchable:")
            assert int(vectors[-1][0]) <= int(vectors[-1][1])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                assert response.status == 200
            # Polled: a lane on a loaded machine (the content lane runs niced) may take longer than one probe's 2 s.
            wait_for(lambda: _worker_answers(settings), timeout=60, what="the demo's sync worker to answer /metrics")
        finally:
            demo.send_signal(signal.SIGTERM)
            demo.wait(60)
    assert demo.returncode == 0
    wait_for(lambda: not _worker_answers(settings), timeout=60, what="the demo's sync worker to stop with it")

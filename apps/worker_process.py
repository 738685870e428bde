"""The sync worker as a child process, for commands that need one running (demo, benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ki.settings import REPO_ROOT, Settings


class SyncWorker:
    """The sync worker of this stack: reuse the running one, or run `ki sync run` as a child until `stop()`."""

    def __init__(self, settings: Settings, log_path: Path, *, config: str | None = None) -> None:
        self.url = f"http://127.0.0.1:{settings.streams.web_port}/metrics"
        self.log_path = log_path
        self.config = config  # the --config the parent was given, passed on as $KI_CONFIG
        self.process: subprocess.Popen[bytes] | None = None

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def ensure(self, timeout: float = 120) -> str:
        """Make sure a worker answers; returns what was done, for the caller's progress line."""
        if self.answers():
            return "using the sync worker already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apps.cli", "sync", "run"],
            cwd=REPO_ROOT,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **({"KI_CONFIG": self.config} if self.config else {})},
        )
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the sync worker did not come up; see {self.log_path}")
            time.sleep(0.5)
        return f"started a sync worker (pid {self.process.pid}, log {self.log_path})"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()

"""The sync worker as a child process, for commands that need one running (demo, benchmarks)."""

from __future__ import annotations

import sys
from pathlib import Path

from apps.runtime.processes import Child
from ki import exposition
from ki.settings import REPO_ROOT, Settings
from streams.topics import LANES, lane_web_port


class SyncWorker:
    """The sync worker of this stack: reuse the running one, or run `ki sync run` as a child until `stop()`."""

    def __init__(self, settings: Settings, log_path: Path, *, config: str | None = None) -> None:
        # Both lanes' /metrics: the worker is ready when each lane answers.
        self.urls = [f"http://127.0.0.1:{lane_web_port(settings, lane)}/metrics" for lane in LANES]
        self.log_path = log_path
        self.config = config  # the --config the parent was given, passed on as $KI_CONFIG
        self.child: Child | None = None

    def answers(self) -> bool:
        return all(exposition.answers(url, timeout_s=2) for url in self.urls)

    def ensure(self, timeout: float = 120) -> str:
        """Make sure a worker answers; returns what was done, for the caller's progress line."""
        if self.answers():
            return "using the sync worker already running"
        self.child = Child(
            [sys.executable, "-m", "apps.cli", "sync", "run"],
            self.log_path,
            cwd=REPO_ROOT,
            env={"PYTHONUNBUFFERED": "1", **({"KI_CONFIG": self.config} if self.config else {})},
        ).start()
        why = self.child.wait_ready(self.answers, timeout, interval_s=0.5)
        if why is not None:
            raise RuntimeError(f"the sync worker did not come up ({why}); see {self.log_path}")
        return f"started a sync worker (pid {self.child.pid}, log {self.log_path})"

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

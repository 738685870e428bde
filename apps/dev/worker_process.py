"""The sync worker as a child process, for commands that need one running (demo, benchmarks)."""

from __future__ import annotations

import sys
from pathlib import Path

from apps.runtime.processes import Child
from ki import exposition
from ki.settings import Settings, find_config
from streams.topics import LANES, Lane, lane_web_port


def lane_pid(supervisor_pid: int | None, lane: Lane) -> int | None:
    """The process of one lane under the `ki sync run` supervisor `supervisor_pid` (None: none runs now)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == supervisor_pid and b"--lane" in command and lane.encode() in command:
            return int(stat.parent.name)
    return None


#: Each lane imports its libraries and joins its consumer group before it answers; the content lane also loads
#: the embedding model. That takes 30-40 s on two idle cores, and has taken over 120 s beside a busy test lane.
READY_TIMEOUT_S = 300.0


class SyncWorker:
    """The sync worker of this stack: reuse the running one, or run `ki sync run` as a child until `stop()`."""

    def __init__(self, settings: Settings, log_path: Path, *, config: str | None = None) -> None:
        # Both lanes' /metrics: the worker is ready when each lane answers.
        self.urls = [f"http://127.0.0.1:{lane_web_port(settings, lane)}/metrics" for lane in LANES]
        self.log_path = log_path
        # The parent's config file (its --config, $KI_CONFIG or the one found on the search path), passed on as
        # $KI_CONFIG: the child reads the same one wherever it runs.
        found = find_config(config)
        self.config = str(found.absolute()) if found is not None else None
        self.child: Child | None = None

    def answers(self) -> bool:
        return not self.silent()

    def silent(self) -> list[str]:
        """The lanes whose /metrics does not answer now."""
        return [lane for lane, url in zip(LANES, self.urls, strict=True) if not exposition.answers(url, timeout_s=2)]

    def ensure(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Make sure a worker answers; returns what was done, for the caller's progress line."""
        if self.answers():
            return "using the sync worker already running"
        self.child = Child(
            [sys.executable, "-m", "apps.cli", "sync", "run"],
            self.log_path,
            env={"PYTHONUNBUFFERED": "1", **({"KI_CONFIG": self.config} if self.config else {})},
        ).start()
        silent: list[str] = []

        def ready() -> bool:
            silent[:] = self.silent()
            return not silent

        why = self.child.wait_ready(ready, timeout, interval_s=0.5)
        if why is not None:
            lanes = f"; silent: {', '.join(silent)} lane" if silent else ""
            raise RuntimeError(f"the sync worker did not come up ({why}{lanes}); see {self.log_path}")
        return f"started a sync worker (pid {self.child.pid}, log {self.log_path})"

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

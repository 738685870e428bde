"""Where the local stack keeps things: one home (settings.stack.home) for the artifact cache and the
state, log and pid file of every service."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ki.settings import Settings


@dataclass(frozen=True)
class StackPaths:
    home: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> StackPaths:
        return cls(Path(settings.stack.home).expanduser().resolve())

    @property
    def artifacts(self) -> Path:
        return self.home / "artifacts"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def lock_file(self) -> Path:
        return self.run / "stack.lock"

    def state_dir(self, service: str) -> Path:
        """Configuration and data of one service."""
        return self.home / "data" / service

    def log_file(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"

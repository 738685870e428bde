"""Where the local stack keeps things.

One home (settings.stack.home, default `~/.cache/ki-sidecar`) holds the artifact cache, every log and
pid file, and the state of the services that run as the invoking user. A service that runs as another
account (PostgreSQL and OpenSearch refuse root, so under root they run as `postgres`, see users.py) keeps
its state in a directory of this stack under `/var/lib/ki-sidecar/` instead, owned by that account: the
home belongs to the user and may be private (`/root` is 0700), and the stack never changes the
permissions of a directory it did not create. `state_dir` is that decision as a pure function.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from apps.dev.stack.settings import stack_settings
from ki.settings import Settings

#: Parent of the per-stack directories of services that run as another account (created by root).
SYSTEM_STATE_ROOT = Path("/var/lib/ki-sidecar")


def system_state_dir(home: Path, root: Path = SYSTEM_STATE_ROOT) -> Path:
    """The directory of one stack home under `root`: the home's name for the reader, a hash of its
    full path so that two homes (the demo stack, the test stack) never share one."""
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:10]
    return root / f"{home.name or 'root'}-{digest}"


@dataclass(frozen=True)
class StackPaths:
    home: Path
    system_root: Path = SYSTEM_STATE_ROOT

    @classmethod
    def from_settings(cls, settings: Settings) -> StackPaths:
        return cls(Path(stack_settings(settings).home).expanduser().resolve())

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

    @property
    def system_dir(self) -> Path:
        """This stack's directory for services that run as another account."""
        return system_state_dir(self.home, self.system_root)

    def make_system_dir(self) -> Path:
        """Create `system_dir` (and its root) for the invoking user, searchable by all: the service
        accounts own only their own directories inside it. Existing directories are left as they are."""
        for directory in (self.system_root, self.system_dir):
            if not directory.is_dir():
                directory.mkdir(parents=True, exist_ok=True)
                directory.chmod(0o755)  # whatever the umask: the service accounts must pass through
        return self.system_dir

    def state_dir(self, service: str, *, runs_as_invoker: bool = True) -> Path:
        """Configuration and data of one service: in the home when the service runs as the invoking
        user, else in `system_dir`, owned by the service's account."""
        return (self.home / "data" if runs_as_invoker else self.system_dir) / service

    def state_dirs(self, service: str) -> tuple[Path, Path]:
        """Both places a service's state can be (to find its process or wipe it, whoever runs `ki`)."""
        return self.state_dir(service), self.state_dir(service, runs_as_invoker=False)

    def log_file(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"

"""Dropping root: PostgreSQL (initdb) and OpenSearch refuse to run as root. When `ki` runs as root they
run as the unprivileged `postgres` account that Debian's PostgreSQL packages create; their state
directories are owned by it. Run as any other user, every service simply runs as that user."""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.stack.errors import StackError

SERVICE_ACCOUNT = "postgres"


@dataclass(frozen=True)
class ServiceUser:
    name: str
    uid: int
    gid: int
    home: str

    @property
    def is_current(self) -> bool:
        return self.uid == os.geteuid()

    def popen_kwargs(self) -> dict[str, Any]:
        """subprocess arguments that start a child as this user."""
        if self.is_current:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def chown(self, *paths: Path) -> None:
        if not self.is_current:
            for path in paths:
                os.chown(path, self.uid, self.gid)

    def make_dir(self, path: Path, mode: int = 0o755) -> Path:
        """Create `path` (and parents) and hand the leaf to this user."""
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
        self.chown(path)
        return path

    def write(self, path: Path, text: str, mode: int = 0o644) -> None:
        path.write_text(text, encoding="utf-8")
        path.chmod(mode)
        self.chown(path)

    def ensure_can_reach(self, path: Path) -> list[Path]:
        """Give `others` the search (x) bit on every ancestor of `path` this user could not traverse
        (e.g. /root is 0700). Search only: nobody can list or read those directories. Returns what changed."""
        changed: list[Path] = []
        if self.is_current:
            return changed
        for parent in reversed(path.parents):
            info = parent.stat()
            if info.st_uid == self.uid:
                continue
            if info.st_mode & stat.S_IXOTH:
                continue
            if info.st_gid == self.gid and info.st_mode & stat.S_IXGRP:
                continue
            parent.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)
            changed.append(parent)
        return changed


def _user(entry: pwd.struct_passwd) -> ServiceUser:
    return ServiceUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def current_user() -> ServiceUser:
    return _user(pwd.getpwuid(os.geteuid()))


def unprivileged_user() -> ServiceUser:
    """Who runs the services that refuse root: the current user, or the service account under root."""
    if os.geteuid() != 0:
        return current_user()
    try:
        entry = pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        raise StackError(
            f"running as root, but there is no {SERVICE_ACCOUNT!r} account to run PostgreSQL and "
            "OpenSearch as (install the postgresql package, or run `ki` as an ordinary user)"
        ) from None
    return _user(entry)

"""Dropping root: PostgreSQL (initdb) and OpenSearch refuse to run as root. When `ki` runs as root they
run as the unprivileged `postgres` account that Debian's PostgreSQL packages create, with their state in
a directory that account owns outside the user's home (see paths.py). Run as any other user, every
service simply runs as that user, with its state in the home.

Nothing here changes the permissions of a directory the stack did not create: `unreachable` only says
which directory would stop the account, and the caller fails with that name."""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.dev.stack.errors import StackError

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

    def can_traverse(self, info: os.stat_result) -> bool:
        """Whether this user may pass through a directory with this `stat` (the search bit that applies)."""
        if self.uid == 0:
            return True
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == self.gid:  # children start without supplementary groups (popen_kwargs)
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)

    def unreachable(self, path: Path) -> Path | None:
        """The first directory on the way to `path` this user cannot pass through, or None."""
        if self.is_current:
            return None
        path = path.resolve()
        for directory in [*reversed(path.parents), *([path] if path.is_dir() else [])]:
            try:
                info = directory.stat()
            except FileNotFoundError:
                return None  # made later, by whoever prepares it
            if not self.can_traverse(info):
                return directory
        return None

    def check_can_reach(self, path: Path, what: str) -> None:
        blocked = self.unreachable(path)
        if blocked is not None:
            raise StackError(
                f"{what} {path} is not reachable for user {self.name!r} ({blocked} is closed to it); "
                "ki does not change permissions it does not own: move it somewhere that account can read"
            )


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

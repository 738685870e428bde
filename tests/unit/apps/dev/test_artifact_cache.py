"""The artifact cache shared by several stacks (apps.dev.stack.artifacts.Resolver._ensure): built once, even when
two stacks start at the same time, and rebuilt when its digest changes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from apps.dev.stack.artifacts import Resolver
from apps.dev.stack.paths import StackPaths
from tests.conftest import wait_for


def _resolver(home: Path) -> Resolver:
    return Resolver(StackPaths(home), java=None, report=lambda line: None)  # type: ignore[arg-type]


def _waiting_for_lock(path: Path) -> bool:
    """Whether a process waits to lock `path` (Linux: a blocked flock is listed in /proc/locks with "->")."""
    inode = f":{path.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_two_stacks_resolving_at_once_build_an_artifact_once(tmp_path: Path):
    builds: list[int] = []
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(_resolver(tmp_path)._ensure("kafka-x", build))) for _ in range(2)
    ]

    def build(staging: Path) -> None:
        builds.append(1)
        if len(builds) == 1:  # the second stack arrives while the first builds, and waits for it
            threads[1].start()
            wait_for(lambda: _waiting_for_lock(tmp_path / "artifacts" / ".resolve.lock"), timeout=30,
                     what="the second resolver to wait for the lock")  # fmt: skip
        (staging / "lib.jar").write_text("jar")

    threads[0].start()
    threads[0].join()
    threads[1].join()
    assert len(builds) == 1
    assert results == [tmp_path / "artifacts" / "kafka-x"] * 2
    assert (tmp_path / "artifacts" / "kafka-x" / "lib.jar").read_text() == "jar"


def test_a_changed_digest_rebuilds_and_a_failed_build_leaves_nothing(tmp_path: Path):
    resolver = _resolver(tmp_path)
    resolver._ensure("kafka-x", lambda staging: (staging / "v").write_text("1"))
    resolver.digest = "another manifest"
    resolver._ensure("kafka-x", lambda staging: (staging / "v").write_text("2"))
    assert (tmp_path / "artifacts" / "kafka-x" / "v").read_text() == "2"

    def broken(staging: Path) -> None:
        raise RuntimeError("maven failed")

    with pytest.raises(RuntimeError, match="maven failed"):
        resolver._ensure("opensearch-x", broken)
    assert not (tmp_path / "artifacts" / "opensearch-x").exists()
    assert not (tmp_path / "artifacts" / "opensearch-x.partial").exists()

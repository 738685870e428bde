"""The artifact cache shared by several stacks (apps.dev.stack.artifacts.Resolver._ensure): built once, even when
two stacks start at the same time, and rebuilt when its digest changes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from apps.dev.stack.artifacts import Resolver
from apps.dev.stack.paths import StackPaths


def _resolver(home: Path) -> Resolver:
    return Resolver(StackPaths(home), java=None, report=lambda line: None)  # type: ignore[arg-type]


def test_two_stacks_resolving_at_once_build_an_artifact_once(tmp_path: Path):
    builds: list[int] = []

    def slow_build(staging: Path) -> None:
        builds.append(1)
        time.sleep(0.2)  # long enough that the second resolver arrives while the first is building
        (staging / "lib.jar").write_text("jar")

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(_resolver(tmp_path)._ensure("kafka-x", slow_build)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
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

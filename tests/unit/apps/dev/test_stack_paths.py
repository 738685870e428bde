"""Where the local stack keeps state, and that it never needs to open a directory it does not own: a
service run as another account keeps its state outside the home; what that account cannot reach is
named, not chmodded."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.dev.stack.artifacts import MARKER, copy_resolved
from apps.dev.stack.errors import StackError
from apps.dev.stack.opensearch import OpenSearch
from apps.dev.stack.paths import StackPaths, system_state_dir
from apps.dev.stack.postgres import Postgres
from apps.dev.stack.users import ServiceUser
from ki.settings import Settings

STRANGER = ServiceUser("stranger", uid=os.geteuid() + 4242, gid=os.getegid() + 4242, home="/nonexistent")


def test_each_stack_home_gets_its_own_system_directory() -> None:
    main, test = Path("/root/.cache/ki-sidecar"), Path("/root/.cache/ki-sidecar-test")
    root = Path("/var/lib/ki-sidecar")
    assert system_state_dir(main) != system_state_dir(test)
    assert system_state_dir(main) == system_state_dir(main)  # stable: the next `up` finds the same data
    assert system_state_dir(main).parent == root and system_state_dir(main).name.startswith("ki-sidecar-")
    assert system_state_dir(test).name.startswith("ki-sidecar-test-")


def test_a_service_run_as_another_account_keeps_its_state_outside_the_home(tmp_path: Path) -> None:
    paths = StackPaths(tmp_path / "home", system_root=tmp_path / "system")
    assert paths.state_dir("kafka") == tmp_path / "home" / "data" / "kafka"
    outside = paths.state_dir("postgres", runs_as_invoker=False)
    assert outside.parent == paths.system_dir and paths.system_dir.parent == tmp_path / "system"
    assert not outside.is_relative_to(paths.home)
    assert paths.state_dirs("postgres") == (paths.home / "data" / "postgres", outside)


def test_a_service_is_found_by_its_state_in_either_place(tmp_path: Path) -> None:
    """`down` finds a PostgreSQL started with its state in the home (by an ordinary user, or by an
    older `ki`) as well as one started from the system directory."""
    paths = StackPaths(tmp_path / "home", system_root=tmp_path / "system")
    tokens = Postgres(Settings(), paths).process_tokens
    for state_dir in paths.state_dirs("postgres"):
        assert f"-D {state_dir / 'pgdata'}" in tokens
    assert {f"-Dopensearch.path.conf={d / 'config'}" for d in paths.state_dirs("opensearch")} <= set(
        OpenSearch(Settings(), paths).process_tokens
    )


def test_make_system_dir_opens_only_what_it_creates(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a private umask must not leave the directories closed to the service account
    try:
        paths = StackPaths(tmp_path / "home", system_root=tmp_path / "system")
        made = paths.make_system_dir()
    finally:
        os.umask(old)
    assert made.stat().st_mode & 0o777 == 0o755 and (tmp_path / "system").stat().st_mode & 0o777 == 0o755
    made.chmod(0o750)  # an administrator's choice is left alone on the next `up`
    paths.make_system_dir()
    assert made.stat().st_mode & 0o777 == 0o750


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory every user can pass through (pytest's tmp_path sits below a private 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="ki-stack-paths-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_unreachable_path_is_named_and_nothing_is_chmodded(open_tmp: Path) -> None:
    private = open_tmp / "home"
    target = private / ".cache" / "artifacts"
    target.mkdir(parents=True)
    private.chmod(0o700)
    assert STRANGER.unreachable(target) == private
    with pytest.raises(StackError, match=f"{private} is closed to it"):
        STRANGER.check_can_reach(target, "the artifact cache")
    assert private.stat().st_mode & 0o777 == 0o700  # the check never opens it
    private.chmod(0o701)  # searchable by others: reachable
    assert STRANGER.unreachable(target) is None


def test_traversal_follows_owner_group_and_other_bits() -> None:
    def st(uid: int, gid: int, mode: int) -> os.stat_result:
        return os.stat_result((0o040000 | mode, 0, 0, 2, uid, gid, 0, 0, 0, 0))

    assert STRANGER.can_traverse(st(STRANGER.uid, 0, 0o700))
    assert not STRANGER.can_traverse(st(STRANGER.uid, 0, 0o077))  # owner bits apply to the owner
    assert STRANGER.can_traverse(st(0, STRANGER.gid, 0o710))
    assert not STRANGER.can_traverse(st(0, 0, 0o770))
    assert STRANGER.can_traverse(st(0, 0, 0o701))


def test_the_service_copy_of_a_resolved_component_follows_its_marker(tmp_path: Path) -> None:
    source = tmp_path / "artifacts" / "opensearch-1.0"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "opensearch").write_text("#!/bin/sh\n")
    (source / "bin" / "opensearch").chmod(0o755)
    (source / MARKER).write_text("digest-1\n")
    copy = copy_resolved(source, tmp_path / "system" / "artifacts")
    assert copy == tmp_path / "system" / "artifacts" / "opensearch-1.0"
    assert (copy / "bin" / "opensearch").stat().st_mode & 0o777 == 0o755
    (copy / "bin" / "extra").write_text("kept while the marker matches")
    assert copy_resolved(source, tmp_path / "system" / "artifacts") == copy
    assert (copy / "bin" / "extra").exists()
    (source / MARKER).write_text("digest-2\n")  # re-resolved: the copy is replaced
    copy_resolved(source, tmp_path / "system" / "artifacts")
    assert not (copy / "bin" / "extra").exists() and (copy / MARKER).read_text() == "digest-2\n"

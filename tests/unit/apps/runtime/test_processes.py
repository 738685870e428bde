"""apps/runtime/processes.py, on real child processes: start with a log and extra environment, wait until a
probe answers (or the child exits, or the deadline passes), stop with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from apps.runtime.processes import START_MARKER, Child, free_port, pid_alive, stop_pid

# Writes $GREETING to stdout, touches its ready file, then sleeps until signalled.
_SERVE = """
import os, sys, time, pathlib
print(os.environ["GREETING"], flush=True)
pathlib.Path(sys.argv[1]).touch()
time.sleep(600)
"""
# Like _SERVE, but ignores SIGTERM.
_STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + _SERVE


def test_a_child_logs_with_its_environment_becomes_ready_and_stops_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    log = tmp_path / "logs" / "child.log"
    child = Child([sys.executable, "-c", _SERVE, str(ready)], log, env={"GREETING": "hello"}).start()
    assert child.wait_ready(ready.exists, timeout_s=30) is None
    assert child.alive and pid_alive(child.pid)
    assert child.stop(timeout_s=10) is True
    assert not child.alive and child.returncode == -signal.SIGTERM
    text = log.read_text()
    assert text.index(START_MARKER) < text.index("hello")


def test_a_child_that_exits_while_starting_is_reported_with_its_code(tmp_path: Path) -> None:
    child = Child([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "child.log").start()
    assert child.wait_ready(lambda: False, timeout_s=30) == "exited with code 3"


def test_a_child_that_never_gets_ready_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    child = Child([sys.executable, "-c", _SERVE, str(tmp_path / "ready")], tmp_path / "c.log", env={"GREETING": "x"})
    assert child.start().wait_ready(lambda: False, timeout_s=0.5) == "not ready after 0s"
    assert not child.alive


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = Child([sys.executable, "-c", _STUBBORN, str(ready)], tmp_path / "c.log", env={"GREETING": "x"}).start()
    assert child.wait_ready(ready.exists, timeout_s=30) is None
    assert child.stop(timeout_s=0.5) is False
    assert child.returncode == -signal.SIGKILL


def test_stop_pid_stops_a_detached_process_group_known_only_by_pid(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = Child(
        [sys.executable, "-c", _STUBBORN, str(ready)], tmp_path / "c.log", env={"GREETING": "x"}, detach=True
    ).start()
    assert child.wait_ready(ready.exists, timeout_s=30) is None
    assert stop_pid(child.pid, signal.SIGTERM, timeout_s=0.5, group=True) is False  # ignored: killed
    assert not pid_alive(child.pid)
    assert stop_pid(child.pid, timeout_s=0.5) is True  # already gone: nothing to do


def test_a_child_can_get_an_environment_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eval worker must not see the parent's KI_* overrides: `inherit_env=False` passes `env` only."""
    for name in [n for n in os.environ if n.startswith("KI_")]:
        monkeypatch.delenv(name)  # e.g. the test stack's KI_STACK__HOME
    monkeypatch.setenv("KI_API__PORT", "1234")
    probe = "import os; print(sorted(k for k in os.environ if k.startswith('KI_')))"
    for inherit, expected in ((True, "['KI_API__PORT', 'KI_CONFIG']"), (False, "['KI_CONFIG']")):
        log = tmp_path / f"{inherit}.log"
        env = {"KI_CONFIG": "x.json", "PATH": "/usr/bin:/bin"}
        child = Child([sys.executable, "-c", probe], log, env=env, inherit_env=inherit).start()
        assert child.wait_ready(lambda: False, timeout_s=30) == "exited with code 0"
        assert log.read_text().splitlines()[-1] == expected


def test_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    """Outgoing connections take their local ports from the kernel's ephemeral range; a port chosen there could be
    taken before the child binds it."""
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p <= 32767 for p in ports) and len(ports) > 1  # Linux's range starts at 32768
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))

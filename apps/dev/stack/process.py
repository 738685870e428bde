"""Process plumbing shared by every service: spawn detached with a log file and a pid file, recognise a
running service by pid + command line, stop it, measure its memory. Starting and stopping themselves are
the applications' one way (apps/runtime/processes.py): a service is a detached `Child` as its account, stopped
by process group with `stop_pid`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from apps.dev.stack.errors import StackError
from apps.dev.stack.users import ServiceUser
from apps.runtime.processes import START_MARKER, Child, pid_alive, proc_stat, stop_pid

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_ERROR_WORDS = re.compile(r"\b(error|fatal|panic)\b|exception", re.IGNORECASE)
_NOISE = re.compile(r"^(at |\.\.\. \d+ more|warning:|error:$)")


@dataclass(frozen=True)
class Launch:
    """How to start one service process."""

    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    #: What it reads outside its state directory; checked to be reachable for its account before start.
    reads: tuple[Path, ...] = ()


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def find_process(pid_file: Path, tokens: Iterable[str]) -> int | None:
    """The live process of a service: the pid file's pid if its command line still carries one of
    `tokens` (guards against pid reuse), else any process whose command line carries one (lost pid file)."""
    tokens = tuple(tokens)
    pid = read_pid(pid_file)
    if pid is not None and pid_alive(pid) and any(token in cmdline(pid) for token in tokens):
        return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            candidate = int(entry.name)
            line = cmdline(candidate)
            if any(token in line for token in tokens) and pid_alive(candidate):
                return candidate
    return None


def spawn(launch: Launch, log_file: Path, pid_file: Path, user: ServiceUser) -> Child:
    """Start detached (own session, so a Ctrl-C of `ki` does not reach it) as `user`, output appended
    to `log_file`, pid written to `pid_file`."""
    child = Child(launch.argv, log_file, env=launch.env, cwd=launch.cwd, detach=True, popen_kwargs=user.popen_kwargs())
    try:
        child.start()
    except OSError as exc:
        raise StackError(f"cannot start {launch.argv[0]}: {exc.strerror}") from None
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{child.pid}\n")
    return child


def run_once(launch: Launch, log_file: Path, user: ServiceUser, what: str) -> None:
    """A one-shot helper command (initdb, storage format): output to the log, failure raises."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        log.write(f"\n{START_MARKER} {what}: {' '.join(launch.argv)}\n".encode())
        log.flush()
        result = subprocess.run(
            launch.argv,
            cwd=launch.cwd,
            env={**os.environ, **launch.env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            **user.popen_kwargs(),
        )
    if result.returncode != 0:
        last = last_error_line(log_file)
        raise StackError(f"{what} failed with exit code {result.returncode}" + (f": {last}" if last else ""))


def last_error_line(log_file: Path) -> str:
    """The most telling line of the latest run in a log (after our last start marker): the JVM's own
    start-up failure, else the root `Caused by:`, else the last error-looking line, else the last line."""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - 64 * 1024, 0))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    block = text.rsplit(START_MARKER, 1)[-1].splitlines()[1:]
    lines = [ln.strip() for ln in block if ln.strip() and not _NOISE.match(ln.strip())]
    for index, line in enumerate(lines[:-1]):
        if line.startswith("Error occurred during initialization of VM"):
            return f"{line}: {lines[index + 1]}"[:240]
    causes = [ln for ln in lines if ln.startswith("Caused by:")]
    errors = [ln for ln in lines if _ERROR_WORDS.search(ln)]
    return (causes or errors or lines or [""])[-1][:240]


def stop(pid: int, sig: signal.Signals, timeout_s: float) -> bool:
    """Send `sig` to the process group of `pid`; SIGKILL the group after `timeout_s`.
    Returns True when it stopped on `sig`, False when it had to be killed."""
    return stop_pid(pid, sig, timeout_s, group=True)


def group_rss_bytes(pid: int) -> int:
    """Resident memory of the whole process group (PostgreSQL runs one process per connection)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is not None and len(stat) > 21 and stat[2] == str(pid):
            total += int(stat[21]) * PAGE_SIZE
    return total


def port_owner(port: int) -> str | None:
    """Who listens on `port` (e.g. "pid 123 (python3)"), as far as /proc lets us see."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return f"pid {entry.name} ({(entry / 'comm').read_text().strip()})"
    return None


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0

"""Process plumbing shared by every service: spawn detached with a log file and a pid file, recognise a
running service by pid + command line, stop it (signal, deadline, SIGKILL), measure its memory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from apps.stack.errors import StackError
from apps.stack.users import ServiceUser

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
START_MARKER = "==== ki stack:"
_ERROR_WORDS = re.compile(r"\b(error|fatal|panic)\b|exception", re.IGNORECASE)
_NOISE = re.compile(r"^(at |\.\.\. \d+ more|warning:|error:$)")


@dataclass(frozen=True)
class Launch:
    """How to start one service process."""

    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, …)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def is_alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def find_process(pid_file: Path, token: str) -> int | None:
    """The live process of a service: the pid file's pid if its command line still carries `token`
    (guards against pid reuse), else any process whose command line carries it (lost pid file)."""
    pid = read_pid(pid_file)
    if pid is not None and is_alive(pid) and token in cmdline(pid):
        return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            candidate = int(entry.name)
            if token in cmdline(candidate) and is_alive(candidate):
                return candidate
    return None


def spawn(launch: Launch, log_file: Path, pid_file: Path, user: ServiceUser) -> subprocess.Popen[bytes]:
    """Start detached (own session, so a Ctrl-C of `ki` does not reach it), output appended to
    `log_file`, pid written to `pid_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **launch.env}
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        log.write(f"\n{START_MARKER} starting {' '.join(launch.argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                launch.argv,
                cwd=launch.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **user.popen_kwargs(),
            )
        except OSError as exc:
            raise StackError(f"cannot start {launch.argv[0]}: {exc.strerror}") from None
    pid_file.write_text(f"{proc.pid}\n")
    return proc


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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    while is_alive(pid):
        time.sleep(0.05)
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our own child (started by this `ki` process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def group_rss_bytes(pid: int) -> int:
    """Resident memory of the whole process group (PostgreSQL runs one process per connection)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
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

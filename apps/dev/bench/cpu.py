"""Where the CPU goes while a benchmark step runs: CPU seconds per component (each stack service, the sync
worker, the search API, the benchmark itself) and of the whole machine, read from /proc at a step's start
and end. A process counts for the nearest component at or above it in the process tree (PostgreSQL's
backends for PostgreSQL, the lane processes for the sync worker); a process that exited meanwhile counts
through its parent's reaped-children time."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from apps.dev.stack.manager import build_services
from apps.dev.stack.paths import StackPaths
from apps.runtime.processes import proc_stat
from ki.settings import Settings

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# /proc/<pid>/stat fields as `proc_stat` returns them (from the state on): ppid, utime, stime, cutime, cstime.
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # monotonic
    seconds: dict[str, float]  # component -> CPU seconds so far
    machine_busy_s: float  # every CPU's non-idle time so far


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and the children it reaped)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None and len(stat) > _CSTIME:
            ticks = sum(int(stat[i]) for i in (_UTIME, _STIME, _CUTIME, _CSTIME))
            found[int(entry.name)] = (int(stat[_PPID]), ticks / TICKS_PER_S)
    return found


def _machine_busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS_PER_S  # user .. steal (guest time is already in user)


def sample(roots: Mapping[str, int]) -> CpuSample:
    """CPU seconds so far of each component, given by the pid at the top of its process tree."""
    owner = {pid: name for name, pid in roots.items()}
    processes = _processes()
    seconds = dict.fromkeys(roots, 0.0)
    for pid, (_, cpu) in processes.items():
        at, hops = pid, 0
        while at not in owner and at in processes and hops < 64:
            at, hops = processes[at][0], hops + 1
        if at in owner:
            seconds[owner[at]] += cpu
    return CpuSample(time.monotonic(), seconds, _machine_busy_s())


def cores_used(start: CpuSample, end: CpuSample) -> dict[str, float]:
    """Average cores each component kept busy between two samples, and `machine` (all of it)."""
    wall = max(end.wall_s - start.wall_s, 1e-9)
    used = {name: round(max(end.seconds[name] - start.seconds.get(name, 0.0), 0.0) / wall, 3) for name in end.seconds}
    used["machine"] = round((end.machine_busy_s - start.machine_busy_s) / wall, 3)
    return used


def find_pid(marker: str) -> int | None:
    """The topmost process whose command line holds `marker` (e.g. a sync worker this benchmark did not start)."""
    matching = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                matching.append(int(entry.name))
    processes = _processes()
    top = [p for p in matching if processes.get(p, (0, 0.0))[0] not in matching]
    return min(top) if top else None


def stack_processes(settings: Settings) -> dict[str, int]:
    """The top pid of each running service of the stack `settings` names, and `benchmark` (this process)."""
    found = {"benchmark": os.getpid()}
    for svc in build_services(settings, StackPaths.from_settings(settings)):
        pid = svc.running_pid()
        if pid is not None:
            found[svc.name] = pid
    return found

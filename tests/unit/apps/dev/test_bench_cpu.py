"""CPU per component for the benchmarks (`apps.dev.bench.cpu`), read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from apps.dev.bench import cpu
from tests.conftest import wait_for

BUSY = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_a_busy_child_counts_for_its_own_component_not_its_parents() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        busy = subprocess.Popen([sys.executable, "-c", BUSY])  # also ours: counts for "benchmark"
        roots = {"benchmark": os.getpid(), "sleeper": child.pid}
        start = cpu.sample(roots)
        busy.wait(30)
        end = cpu.sample(roots)
    finally:
        child.kill()
        child.wait()
    used = cpu.cores_used(start, end)
    # The busy child exited and was reaped: its time counts through its parent, the benchmark.
    assert end.seconds["benchmark"] - start.seconds["benchmark"] >= 0.5
    assert end.seconds["sleeper"] - start.seconds["sleeper"] < 0.2
    assert used["machine"] > 0 and set(used) == {"benchmark", "sleeper", "machine"}


def test_cores_used_is_cpu_seconds_over_wall_seconds() -> None:
    start = cpu.CpuSample(10.0, {"a": 1.0, "b": 5.0}, 100.0)
    end = cpu.CpuSample(12.0, {"a": 2.0, "b": 5.5}, 103.0)
    assert cpu.cores_used(start, end) == {"a": 0.5, "b": 0.25, "machine": 1.5}


def test_find_pid_names_the_topmost_matching_process() -> None:
    marker = f"ki-cpu-test-{os.getpid()}-{time.time_ns()}"
    outer = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
         f"'import time; time.sleep(10)', '{marker}'])", marker]
    )  # fmt: skip
    try:
        assert wait_for(lambda: cpu.find_pid(marker), timeout=10, interval=0.05, what="the test process") == outer.pid
    finally:
        outer.kill()
        outer.wait()
    assert cpu.find_pid(f"{marker}-nobody") is None


def test_a_phase_clock_times_each_phase_and_its_cores() -> None:
    from apps.dev.bench.large_corpus import PhaseClock

    clock = PhaseClock({"benchmark": os.getpid()})
    clock.start("busy")
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    clock.stop()
    assert clock.seconds["busy_s"] >= 0.3
    assert set(clock.cores["busy"]) == {"benchmark", "machine"}
    # At least the 0.3 s of CPU it burnt over the phase's wall time (a busy machine stretches the wall time, so
    # no fixed share holds; 0.02 s: the kernel's accounting ticks).
    assert clock.cores["busy"]["benchmark"] >= (0.3 - 0.02) / clock.seconds["busy_s"]

"""`ki serve --workers N`: N API processes on one port.

Each worker is a plain `ki serve` bound with SO_REUSEPORT, so the kernel spreads connections across them
(no proxy in between, no shared state: each has its own connection pools, embedding model, scope cache
and CDC invalidation feed). The supervisor (`apps.runtime.supervisor`) holds them together.

Metrics: the workers run prometheus_client in multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, a fresh
directory per run), so whichever worker answers `GET /metrics` reports every worker's counters and
histograms summed, and gauges per their `multiprocess_mode` (`search.telemetry.metrics`). A worker's files are
marked dead when it exits; the directory is removed at the end.

Several machines: run `ki serve` (with or without `--workers`) on each behind any HTTP load balancer
(round robin is fine: requests carry their own bearer token, nothing is sticky), health-checked on
`GET /readyz`; scrape each machine's `/metrics`. Each process invalidates its own scope cache from Kafka.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from apps.runtime.supervisor import ki_command, supervise

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run_workers(workers: int, *, config: str | None) -> int:
    metrics_dir = tempfile.mkdtemp(prefix="ki-serve-metrics-")
    env = {**os.environ, MULTIPROC_ENV: metrics_dir}
    commands = {f"{n + 1}": ki_command("serve", "--reuse-port", config=config) for n in range(workers)}

    def mark_dead(pid: int) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, metrics_dir)

    try:
        return supervise(commands, what="API worker", env=env, on_exit=mark_dead)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)

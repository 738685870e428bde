"""`ki serve --workers 2`: two API processes on one port, metrics from every worker at any
worker's `/metrics`, and supervision (a worker killed -> the others stop, the command exits non-zero)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.runtime.processes import proc_stat
from ki.settings import Settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server

pytestmark = pytest.mark.stack

REQUESTS = 40


class Workers(Server):
    def __init__(self) -> None:
        super().__init__("serve-workers")
        self.process.argv = [*self.process.argv, "--workers", "2"]


def worker_pids(parent: int) -> list[int]:
    """The supervisor's children (the workers), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat[1] == str(parent):
                pids.append(int(entry.name))
    return sorted(pids)


@pytest.fixture
def workers() -> Iterator[Workers]:
    w = Workers()
    w.start()
    try:
        yield w
    finally:
        w.stop()


def test_two_workers_share_the_port_and_report_metrics_together(workers: Workers, settings: Settings) -> None:
    pids = wait_for(lambda: len(p := worker_pids(workers.process.pid)) == 2 and p, timeout=60, what="two workers")
    token = mint_token(settings.api, "nobody-serve-workers")
    for _ in range(REQUESTS):  # a new connection each: the kernel spreads them over the workers
        status, body = workers.call("/v1/search/filter", {"limit": 5}, token=token)
        assert status == 200 and body["hits"] == [], body
    assert (
        workers.metric("ki_api_requests_total", route="/v1/search/filter") == REQUESTS
    )  # whichever worker answered /metrics
    # A worker killed: the supervisor stops the other and exits non-zero; nothing is left behind.
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: not workers.process.alive, timeout=90, what="the supervisor to stop")
    assert workers.process.returncode not in (0, None)
    assert not any(proc_stat(pid) for pid in pids), "a worker outlived its supervisor"

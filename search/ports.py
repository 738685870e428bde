"""The narrow ports a search's stages and reads work through, besides the scoped index reader
(search.ranking.scoped.ScopedIndex), the embedder (ki.embedding.Embedder) and the reranker
(search.ranking.rerank.Reranker): PostgreSQL for reading (`SqlReader`), the mode gate's current decision
(`ModeGateReader`) and work that runs after the answer has left (`Background`).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from ki.clients import database_errors
from ki.errors import ConnectionLost
from ki.settings import Settings
from search.access.reverify import VerifiedVersion, reverify
from search.access.scope import CompiledScope
from search.after_answer import start_after_answer
from search.ranking.mode_gate import GateDecision, SelfEvidence, Trust, decide, load_reports
from search.ranking.sql_reads import load_self_evidence

log = logging.getLogger(__name__)

# How long before a grid point a release stops sleeping and yields until the point (`on_the_grid`): more than
# the poll's whole-millisecond rounding.
GRID_SPIN_S = 0.002

T = TypeVar("T")


class SqlReader:
    """PostgreSQL for reading: `read` on the service's connections, `verified_read` (and `reverify`) on the
    re-verify's (`ki.clients.make_async_engine(generic_plans=True)` in the API). What PostgreSQL or the pool
    raise comes out as `ki.errors` (`ki.clients.database_errors`): the stages never see SQLAlchemy's errors."""

    def __init__(self, settings: Settings, engine: AsyncEngine, verify_engine: AsyncEngine) -> None:
        self.settings, self.engine, self.verify_engine = settings, engine, verify_engine

    async def read(self, work: Callable[[Connection], T]) -> T:
        """`work` on one of the service's connections."""
        with database_errors():
            async with self.engine.connect() as conn:
                return await conn.run_sync(work)

    async def verified_read(self, work: Callable[[Connection], T]) -> T:
        """`work` (reads only) on a re-verify connection. The pool lends connections without a ping (a round
        trip on every search); one that PostgreSQL dropped meanwhile (a restart, an idle timeout) fails
        once, the pool replaces it, and the read runs again on a fresh connection."""
        try:
            with database_errors():
                async with self.verify_engine.connect() as conn:
                    return await conn.run_sync(work)
        except ConnectionLost as exc:
            log.info("a re-verify connection was gone (%s); reading again on a fresh one", exc)
        with database_errors():
            async with self.verify_engine.connect() as conn:
                return await conn.run_sync(work)

    async def reverify(
        self,
        principals: Sequence[str],
        version_ids: Sequence[int],
        scope: CompiledScope,
        as_of: dt.date | None = None,
        compare_with: dt.date | str | None = None,
    ) -> dict[int, VerifiedVersion]:
        """`reverify` on the re-verify's connections: with `as_of` only the versions in force that day; the
        caller's groups walked as the scope found cheaper; `compare_with`: a comparison's earlier side."""
        walk = scope.reverify_walk
        return await self.verified_read(
            lambda c: reverify(c, principals, self.settings, version_ids, as_of, walk, compare_with)
        )

    async def on_the_grid(self, work: Awaitable[T], quantum_ms: float | None = None) -> T:
        """`work`'s answer (or its error), released at the next multiple of `quantum_ms` (default
        `api.limits.release_quantum_ms`) from now: what PostgreSQL does below the same statements and rows (probes
        finding a hidden row, then refusing it) cannot show in when the answer leaves (a quantum the work exceeds
        rounds up to the next)."""
        quantum = (self.settings.api.limits.release_quantum_ms if quantum_ms is None else quantum_ms) / 1000
        started = time.perf_counter()

        async def released() -> None:
            if quantum <= 0:
                return
            elapsed = time.perf_counter() - started
            release = started + quantum * max(1, math.ceil(elapsed / quantum))
            # The event loop's poll sleeps whole milliseconds counted from when it went to sleep, so a timer
            # alone would release at the grid point plus the work's own sub-millisecond remainder: sleep to
            # just before the point, then yield until it.
            coarse = release - time.perf_counter() - GRID_SPIN_S
            if coarse > 0:
                await asyncio.sleep(coarse)
            while time.perf_counter() < release:
                await asyncio.sleep(0)

        try:
            answer = await work
        except Exception:
            await released()
            raise
        await released()
        return answer


class Background:
    """Work that runs apart from the request that started it, once its answer has left (search.after_answer;
    a context of its own: nothing the request carries, such as a trace, follows it), kept referenced until
    done."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        loop = asyncio.get_running_loop()

        def start() -> None:
            task = loop.create_task(work, context=contextvars.Context())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        start_after_answer(start)  # not beside the request: its time would tell that something changed

    async def settled(self) -> None:
        """Until the work started so far is done (tests, benchmarks)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


class ModeGateReader:
    """The mode gate's current decision (search.ranking.mode_gate): decided from the evaluation reports at
    start-up, then again whenever the deployment's own newest self-eval report changes (`refresh_forever`
    re-reads it every retrieval.mode_gate.self_eval_refresh_s). A request reads it once, into its plan."""

    def __init__(self, settings: Settings, engine: AsyncEngine, signature: Callable[[], str]) -> None:
        self.settings, self.engine, self.signature = settings, engine, signature
        self.trust = Trust.of(settings)  # which reports count: pinned or signed by a trusted key, within the bounds
        self.reports = load_reports(settings.retrieval.mode_gate.reports_dir, self.trust)
        self.own_evidence: SelfEvidence | None = None
        self.decision = decide(self.reports, settings, signature())

    async def refresh(self) -> GateDecision:
        """Re-read the newest self-eval report and decide the default mode again."""
        self.own_evidence = await load_self_evidence(self.engine, self.trust)
        gate = decide(self.reports, self.settings, self.signature(), self.own_evidence)
        if gate != self.decision:
            log.info("default search mode now: %s (%s)", gate.default_mode, gate.reason)
        self.decision = gate
        return gate

    async def refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep the last decision; PostgreSQL may be back next time
                log.warning("evidence: could not read the self-eval report: %s", exc)
            await asyncio.sleep(self.settings.retrieval.mode_gate.self_eval_refresh_s)

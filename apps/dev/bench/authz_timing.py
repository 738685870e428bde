"""`ki bench authz-timing`: can a caller tell, by how long the API takes, that something they may not see
exists? (a timing oracle: 11.2 vs 6.8 ms before constant-shape authorisation.)

A world of its own (`apps.dev.bench.authz_world`; labelled, removed at the end) and a `ki serve` child on it
(`api.limits.max_scope_filter_bytes` at its 256-byte minimum), asked over real HTTP, one kept-alive
connection per caller, one request at a time. Each case compares a "hidden" side (something the caller may
not see exists) with a "missing" side (it does not, or nothing hidden is involved); a pair runs both sides
back to back in random order, and their answers must be equal (status and body; the search cases: status,
hit count and the rest of the body) or the run fails.

Cases (`CASES`):

* `documents`, `read`, `related`, `traverse`, `decisions` -- a hidden document's id (`read`: and its version's)
  vs an id that does not exist (decisions: the hidden decision's word vs a word found nowhere);
* `traverse-batch` -- `start` with 100 hidden ids vs 100 ids that do not exist;
* `related-incoming` -- incoming relations of a visible document whose only edge comes from a hidden one vs
  of a visible document without edges; `related-kinds` -- `kinds=references` vs `kinds=thread` on a visible
  document whose one `references` edge leads to or from a hidden document;
* `names-cache` -- caller B searches `Übernahme Zielfirma <word> Holding` (lexical), a query colleague A (who
  may see another project) searched just before, vs a fresh one nobody searched (A searched another fresh
  one first); `names-hidden` -- B names the title of a document only A may see vs a title nobody carries (a
  fresh title per pair: a document each, so at most `--pairs` + `--block` pairs);
* `superset` -- caller E, whose exact scope filter is over the budget and one of whose groups has an alias
  leading out of E's principals, searches a word found only in documents E may not see vs a word found
  nowhere;
* `expired` -- a document of C's own project (granted, observed) whose expiry has passed vs an id that does
  not exist;
* `compare` -- B's comparison with the previous version (`<word> vorherige Fassung`) of B's document whose
  first version is hidden from everyone vs of B's document that has no first version (both shown: the second);
* `invalidation` -- B's search right after a new version of a document B may not see has reached the API's
  invalidation feed (`ki_search_scope_feed_events_total` polled on `/metrics`, with a deadline) vs after the
  same polling without a change; the background refresh it starts is let finish (polled too) before the next
  request. Slow per pair: its own pair counts (`--slow-pairs`, `--slow-max-pairs`).

The search cases need the index: the world's searchable versions are projected into an index alias of the
run's own (backfill path, straight from PostgreSQL), removed at the end.

The statistic (`apps.dev.bench.pair_stats`): per case P(hidden slower) over the pairs (ties 1/2) with its
95 % Wilson interval; the goal is an interval within [0.45, 0.55]. A case takes `--pairs` pairs, then blocks
of `--block` until the goal is met, the interval lies wholly beyond the goal (unless `--run-to-max`), or
`--max-pairs` is reached; the cases of a phase take their blocks interleaved, pair by pair. Also reported:
both medians and their difference. Writes `benchmarks/authz-timing.json`.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Engine

from apps.dev.bench.authz_world import (
    BATCH,
    COMMON_QUERY,
    IndexWorld,
    SqlWorld,
    Words,
    add_hidden_version,
    named_query,
    write_index_world,
    write_sql_world,
)
from apps.dev.bench.cleanup import AUTHZ_INDEX_PREFIX, Footprint, bench_label, remove_bench_rows
from apps.dev.bench.pair_stats import GOAL, PairPlan, PairSeries
from apps.dev.bench.search import BenchError, ServeChild
from apps.dev.bench.stats import machine
from apps.dev.checkout import REPO_ROOT
from ki import exposition
from ki.clients import make_engine, make_sync_client
from ki.settings import Settings, with_overrides
from search.web.auth import mint_token

Side = Literal["hidden", "missing"]
SQL_CASES = (
    "documents", "read", "chunk", "related", "traverse", "decisions", "traverse-batch", "related-incoming",
    "related-kinds", "expired",
)  # fmt: skip
SEARCH_CASES = ("names-cache", "names-hidden", "superset", "compare")
SLOW_CASES = ("invalidation",)
CASES = SQL_CASES + SEARCH_CASES + SLOW_CASES
#: Cases whose every pair needs a document of its own (names-hidden: a fresh title per pair, since a caller's
#: name cache keeps what it looked up): at most one block over the minimum, to keep the world small.
FEW_CASES = ("names-hidden",)
#: The smallest scope filter budget there is: every caller of more than a handful of documents is over it.
FILTER_BUDGET_BYTES = 256
#: How often the invalidation case polls `/metrics`, and how long it waits at most.
POLL_S = 0.05
FEED_DEADLINE_S = 60.0
SETTLE_DEADLINE_S = 30.0
TOKEN_TTL_S = 24 * 3600


@dataclass(frozen=True)
class AuthzOptions:
    pairs: int = 1000
    max_pairs: int = 4000
    block: int = 500
    slow_pairs: int = 500
    slow_max_pairs: int = 1000
    warmup: int = 20
    stop_outside: bool = True
    cases: tuple[str, ...] = CASES
    seed: int = 7
    out: Path | None = None
    raw: Path | None = None  # every pair's two timings per case, for a closer look
    config: str | None = None
    command: str = "ki bench authz-timing"

    def plan(self, case: str) -> PairPlan:
        if case in SLOW_CASES:
            return PairPlan(self.slow_pairs, self.slow_max_pairs, self.block, self.stop_outside)
        if case in FEW_CASES:
            return PairPlan(self.pairs, min(self.max_pairs, self.pairs + self.block), self.block, self.stop_outside)
        return PairPlan(self.pairs, self.max_pairs, self.block, self.stop_outside)

    def pairs_written(self, cases: tuple[str, ...]) -> int:
        """Pairs a world must have data for (warm-up included)."""
        return self.warmup + max((self.plan(c).max_pairs for c in cases), default=0)


class BenchFailure(BenchError):
    """The two sides of a pair answered differently, or the service misbehaved: the run is void."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------


class Client:
    """One kept-alive HTTP connection of one caller: no connection set-up in the timed part."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def raw(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[float, int, bytes]:
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            try:
                started = time.perf_counter()
                self.connection.request(method, path, body=payload, headers=self.headers)
                response = self.connection.getresponse()
                raw = response.read()
                return (time.perf_counter() - started) * 1000, response.status, raw
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed a connection idle for longer than its keep-alive timeout: once more on a
                # new one (the time of the failed attempt is not counted).
                self.connection.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def timed(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[float, int, Any]:
        ms, status, raw = self.raw(method, path, body)
        try:
            return ms, status, json.loads(raw)
        except ValueError:
            raise BenchFailure(f"{method} {path} -> {status}, not JSON: {raw[:300]!r}") from None

    def search(self, query: str) -> tuple[float, int, Any]:
        return self.timed("POST", "/v1/search", {"query": query, "mode": "lexical"})

    def metrics(self) -> list[exposition.Sample]:
        _, status, raw = self.raw("GET", "/metrics", None)
        if status != 200:
            raise BenchFailure(f"/metrics -> {status}: {raw[:300]!r}")
        return exposition.parse(raw.decode())

    def close(self) -> None:
        self.connection.close()


def _counter(samples: list[exposition.Sample], family: str, label: str) -> dict[str, float]:
    return exposition.by_label(samples, f"{family}_total", label)


def _search_key(status: int, body: Any) -> Any:
    """What two searches of different words must share: status, hit count, and the rest of the answer."""
    if status != 200 or not isinstance(body, dict):
        return status, body
    return status, len(body.get("hits", [])), {k: v for k, v in body.items() if k != "hits"}


def _hits_key(status: int, body: Any) -> Any:
    """Two searches of the same words: status and the documents and chunks found (scores left out)."""
    if status != 200 or not isinstance(body, dict):
        return status, body
    hits = sorted((str(h.get("document_id")), str(h.get("chunk_id"))) for h in body.get("hits", []))
    return status, hits, {k: v for k, v in body.items() if k != "hits"}


# --------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    ms: float
    key: Any  # what must be equal on both sides


class Case:
    name: str = ""
    what: str = ""

    def run(self, side: Side, i: int) -> Answer:
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        """Case-specific figures for the JSON."""
        return {}


Request = tuple[str, str, dict[str, Any] | None]


class RequestCase(Case):
    """One request per side; `normalise(status, body, request)` takes out what names the id asked about."""

    def __init__(
        self,
        name: str,
        what: str,
        client: Client,
        hidden: Callable[[int], Request],
        missing: Callable[[int], Request],
        normalise: Callable[[int, Any, Request], Any] = lambda status, body, _: (status, body),
    ) -> None:
        self.name, self.what, self.client = name, what, client
        self.requests = {"hidden": hidden, "missing": missing}
        self.normalise = normalise

    def run(self, side: Side, i: int) -> Answer:
        request = self.requests[side](i)
        ms, status, body = self.client.timed(*request)
        return Answer(ms, self.normalise(status, body, request))


def _without_not_found(status: int, body: Any, request: Request) -> Any:
    """A traversal names the start ids it does not show: those asked, in order (checked, then taken out)."""
    asked = list(dict.fromkeys((request[2] or {}).get("start", [])))
    if status == 200 and isinstance(body, dict):
        if body.get("not_found") != asked:
            raise BenchFailure(f"traverse: not_found {str(body.get('not_found'))[:200]} is not the ids asked")
        return status, {**body, "not_found": None}
    return status, body


def _without_document_id(status: int, body: Any, request: Request) -> Any:
    if status == 200 and isinstance(body, dict):
        return status, {**body, "document_id": None}
    return status, body


def sql_cases(world: SqlWorld, client: Client, seed: int) -> dict[str, Case]:
    def batch(i: int) -> list[int]:
        return random.Random(seed * 1_000_003 + i).sample(world.hidden_pool, BATCH)

    def gone(i: int) -> int:
        return world.first_missing + i

    def at(pool: list[Any], i: int) -> Any:  # pair i's entry of a pool
        return pool[i % len(pool)]

    def related(doc: int, query: str = "") -> Request:
        return "GET", f"/v1/documents/{doc}/related{query}", None

    def traverse_batch(ids: list[int]) -> Request:
        return "POST", "/v1/traverse", {"start": ids, "direction": "both", "depth": 2}

    cases = [
        RequestCase("documents", "GET /v1/documents/{id}: a hidden id vs one that does not exist", client,
                    lambda i: ("GET", f"/v1/documents/{at(world.hidden, i)}", None),
                    lambda i: ("GET", f"/v1/documents/{gone(i)}", None)),
        RequestCase("read", "GET /v1/documents/{id}/versions/{version_id}/text: a hidden document's version vs "
                    "ids that do not exist", client,
                    lambda i: ("GET", f"/v1/documents/{at(world.hidden, i)}/versions/"
                               f"{at(world.hidden_versions, i)}/text", None),
                    lambda i: ("GET", f"/v1/documents/{gone(i)}/versions/{world.first_missing_version + i}/text",
                               None)),
        RequestCase("chunk", "GET /v1/chunks/{chunk_id}: a hidden version's first chunk vs a version that does not "
                    "exist", client,
                    lambda i: ("GET", f"/v1/chunks/{at(world.hidden_versions, i)}:chunk:0", None),
                    lambda i: ("GET", f"/v1/chunks/{world.first_missing_version + i}:chunk:0", None)),
        RequestCase("related", "GET /v1/documents/{id}/related: a hidden id vs one that does not exist", client,
                    lambda i: related(at(world.hidden, i)), lambda i: related(gone(i))),
        RequestCase("traverse", "POST /v1/traverse from one id: hidden vs does not exist", client,
                    lambda i: ("POST", "/v1/traverse", {"start": [at(world.hidden, i)]}),
                    lambda i: ("POST", "/v1/traverse", {"start": [gone(i)]}), _without_not_found),
        RequestCase("decisions", "POST /v1/decisions/search: a hidden decision's word vs a word found nowhere",
                    client, lambda i: ("POST", "/v1/decisions/search", {"query": at(world.words, i)}),
                    lambda i: ("POST", "/v1/decisions/search", {"query": f"nirgendwort{i}x{world.tag}"})),
        RequestCase("traverse-batch", "POST /v1/traverse from 100 ids (both ways, depth 2): hidden vs do not exist",
                    client, lambda i: traverse_batch(batch(i)),
                    lambda i: traverse_batch([world.batch_missing + BATCH * i + k for k in range(BATCH)]),
                    _without_not_found),
        RequestCase("related-incoming", "incoming related of a visible document whose only edge is from a hidden "
                    "one vs of one without edges", client,
                    lambda i: related(at(world.incoming_only, i), "?direction=incoming"),
                    lambda i: related(at(world.no_edges, i), "?direction=incoming"), _without_document_id),
        RequestCase("related-kinds", "related kinds=references vs kinds=thread of a visible document whose one "
                    "references edge leads to or from a hidden one", client,
                    lambda i: related(at(world.hidden_edge, i), "?direction=both&kinds=references"),
                    lambda i: related(at(world.hidden_edge, i), "?direction=both&kinds=thread")),
        RequestCase("expired", "GET /v1/documents/{id}: a document of the caller's own project whose expiry has "
                    "passed vs an id that does not exist", client,
                    lambda i: ("GET", f"/v1/documents/{at(world.expired, i)}", None),
                    lambda i: ("GET", f"/v1/documents/{gone(i)}", None)),
    ]  # fmt: skip
    return {case.name: case for case in cases}


class NamesCacheCase(Case):
    """B asks what A asked just before (a name cache shared across callers would answer B from A's entry) vs
    a query nobody asked (A asked another fresh one first, so both sides follow a search of A's)."""

    name = "names-cache"
    what = "B's search naming `Zielfirma <w> Holding` that A searched just before vs a fresh one"

    def __init__(self, a: Client, b: Client, words: Words) -> None:
        self.a, self.b, self.words = a, b, words

    def run(self, side: Side, i: int) -> Answer:
        query = named_query(self.words.fresh())
        before = query if side == "hidden" else named_query(self.words.fresh())
        status, body = self.a.search(before)[1:]
        if status != 200:
            raise BenchFailure(f"{self.name}: A's search -> {status}: {str(body)[:300]}")
        ms, status, body = self.b.search(query)
        return Answer(ms, _search_key(status, body))


class NamesHiddenCase(Case):
    name = "names-hidden"
    what = "B's search naming the title of a document only A may see vs a title nobody carries"

    def __init__(self, b: Client, world: IndexWorld, words: Words) -> None:
        self.b, self.world, self.words = b, world, words

    def run(self, side: Side, i: int) -> Answer:
        company = self.world.named_companies[i] if side == "hidden" else self.words.fresh()
        ms, status, body = self.b.search(named_query(company))
        return Answer(ms, _search_key(status, body))


class SupersetCase(Case):
    name = "superset"
    what = "E (exact filter over the 256-byte budget, an alias out of its principals) searches a word only " \
           "documents E may not see carry vs a word found nowhere"  # fmt: skip

    def __init__(self, e: Client, world: IndexWorld, words: Words, scope: dict[str, Any]) -> None:
        self.e, self.world, self.words, self.scope = e, world, words, scope

    def report(self) -> dict[str, Any]:
        return {"caller_scope": self.scope}

    def run(self, side: Side, i: int) -> Answer:
        word = self.world.secret_words[i] if side == "hidden" else self.words.fresh("nir")
        ms, status, body = self.e.search(word)
        return Answer(ms, _search_key(status, body))


class CompareCase(Case):
    name = "compare"
    what = "B compares with the previous version of its document whose first version is hidden vs of one " \
           "that has no first version"  # fmt: skip

    def __init__(self, b: Client, world: IndexWorld) -> None:
        self.b, self.world = b, world

    def run(self, side: Side, i: int) -> Answer:
        words = self.world.compare_hidden_words if side == "hidden" else self.world.compare_missing_words
        ms, status, body = self.b.search(f"{words[i % len(words)]} vorherige Fassung")
        return Answer(ms, _compare_key(status, body))


def _compare_key(status: int, body: Any) -> Any:
    """A comparison's answer: the search's key plus what each hit says about its earlier side (none on both)."""
    hits = body.get("hits", []) if isinstance(body, dict) else []
    return _search_key(status, body), [h.get("compare", {}).get("earlier") for h in hits if isinstance(h, dict)]


@dataclass
class InvalidationCase(Case):
    """B's search after a change B cannot see has reached the API's invalidation feed vs after no change.

    Both sides poll `/metrics` (operator) every `POLL_S`: the hidden side from before its change until the
    feed's `document_versions` event count moved, the missing side as many times (the hidden side's last
    count). After the timed search, both search again untimed until the scope cache answers `hit` (the
    background refresh a stale entry starts is done), so nothing of one side runs into the next request."""

    b: Client
    operator: Client
    engine: Engine
    target: int
    name: str = "invalidation"
    what: str = "B's search right after a new version of a document B may not see reached the API's " \
                "invalidation feed vs after the same wait without a change"  # fmt: skip
    polls: int = 10
    poll_history: list[int] = field(default_factory=list)
    wait_ms: list[float] = field(default_factory=list)
    results: dict[str, dict[str, int]] = field(default_factory=lambda: {"hidden": {}, "missing": {}})
    settle_searches: dict[str, int] = field(default_factory=lambda: {"hidden": 0, "missing": 0})

    def _scrape(self) -> tuple[float, dict[str, float]]:
        samples = self.operator.metrics()
        feed = _counter(samples, "ki_search_scope_feed_events", "table").get("document_versions", 0.0)
        return feed, _counter(samples, "ki_search_scope_cache", "result")

    def _wait_for_feed(self) -> dict[str, float]:
        started = time.monotonic()
        before, scope = self._scrape()
        add_hidden_version(self.engine, self.target)
        polls = 0
        while True:
            time.sleep(POLL_S)
            polls += 1
            feed, scope = self._scrape()
            if feed > before:
                break
            if time.monotonic() - started > FEED_DEADLINE_S:
                raise BenchFailure(f"{self.name}: the API's invalidation feed did not apply a new version in "
                                   f"{FEED_DEADLINE_S:.0f} s")  # fmt: skip
        self.polls = polls
        self.poll_history.append(polls)
        self.wait_ms.append((time.monotonic() - started) * 1000)
        return scope

    def _wait_as_long(self) -> dict[str, float]:
        _, scope = self._scrape()
        for _ in range(self.polls):
            time.sleep(POLL_S)
            _, scope = self._scrape()
        return scope

    def _settle(self, side: Side) -> None:
        deadline = time.monotonic() + SETTLE_DEADLINE_S
        _, before = self._scrape()
        while True:
            status = self.b.search(COMMON_QUERY)[1]
            self.settle_searches[side] += 1
            _, after = self._scrape()
            moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            if status != 200:
                raise BenchFailure(f"{self.name}: settling search -> {status}")
            if moved.get("hit", 0) >= 1 and not any(v for k, v in moved.items() if k != "hit"):
                return
            if time.monotonic() > deadline:
                raise BenchFailure(f"{self.name}: the scope cache did not settle in {SETTLE_DEADLINE_S:.0f} s")
            before = after
            time.sleep(POLL_S)

    def run(self, side: Side, i: int) -> Answer:
        before = self._wait_for_feed() if side == "hidden" else self._wait_as_long()
        ms, status, body = self.b.search(COMMON_QUERY)
        _, after = self._scrape()
        counts = self.results[side]
        for result, value in after.items():
            if value > before.get(result, 0.0):
                counts[result] = counts.get(result, 0) + int(value - before.get(result, 0.0))
        self._settle(side)
        return Answer(ms, _hits_key(status, body))

    def report(self) -> dict[str, Any]:
        polls = sorted(self.poll_history)
        waits = sorted(self.wait_ms)
        return {
            "poll_interval_s": POLL_S,
            "feed_polls_p50": polls[len(polls) // 2] if polls else None,
            "feed_wait_ms_p50": round(waits[len(waits) // 2], 1) if waits else None,
            # How the scope cache answered the timed searches (warm-up included): the hidden side's should
            # be `stale` (the change had reached the cache), the missing side's `hit`.
            "scope_cache_results": self.results,
            "settling_searches": self.settle_searches,
        }


# --------------------------------------------------------------------------------------------------
# Running pairs
# --------------------------------------------------------------------------------------------------


@dataclass
class Runner:
    rng: random.Random
    warmup: int
    started: float = field(default_factory=time.monotonic)
    series: dict[str, PairSeries] = field(default_factory=dict)
    next_index: dict[str, int] = field(default_factory=dict)

    def pair(self, case: Case) -> tuple[float, float]:
        i = self.next_index.get(case.name, 0)
        self.next_index[case.name] = i + 1
        sides: list[Side] = ["hidden", "missing"]
        self.rng.shuffle(sides)
        answers = {side: case.run(side, i) for side in sides}
        if answers["hidden"].key != answers["missing"].key:
            raise BenchFailure(f"{case.name} (pair {i}): the answers differ: hidden {str(answers['hidden'].key)[:600]}"
                               f" vs missing {str(answers['missing'].key)[:600]}")  # fmt: skip
        return answers["hidden"].ms, answers["missing"].ms

    def phase(self, cases: list[Case], plans: dict[str, PairPlan]) -> None:
        """Warm up, then rounds: each case not done takes its next block, the cases' pairs interleaved."""
        if not cases:
            return
        names = ", ".join(c.name for c in cases)
        _say(f"authz-timing: warming up ({self.warmup} pairs each: {names})")
        for _ in range(self.warmup):
            for case in cases:
                self.pair(case)
        for case in cases:
            self.series[case.name] = PairSeries()
        round_no = 0
        while True:
            blocks = {c.name: plans[c.name].next_block(self.series[c.name]) for c in cases}
            active = [c for c in cases if blocks[c.name] > 0]
            if not active:
                return
            round_no += 1
            total, done, last = sum(blocks.values()), 0, time.monotonic()
            _say(f"authz-timing: round {round_no}: {total} pairs ("
                 + ", ".join(f"{c.name} {blocks[c.name]}" for c in active) + ")")  # fmt: skip
            for k in range(max(blocks.values())):
                for case in active:
                    if k < blocks[case.name]:
                        self.series[case.name].add(*self.pair(case))
                        done += 1
                if time.monotonic() - last >= 15:
                    last = time.monotonic()
                    _say(f"  {done}/{total} pairs of round {round_no} ({time.monotonic() - self.started:.0f} s)")
            for case in active:
                s = self.series[case.name]
                lo, hi = s.interval()
                stopped = plans[case.name].stopped(s)
                state = "more" if stopped is None else "ok" if stopped == "met" else f"OVER ({stopped})"
                _say(f"  {case.name:17} {s.pairs:5} pairs  P(hidden slower) {s.p_hidden_slower:.3f} "
                     f"[{lo:.3f}, {hi:.3f}]  {state}")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------------------------------


def index_versions(settings: Settings, versions: list[int]) -> float:
    """Project `versions` into `settings`' index (backfill path), then wait until search sees every one of
    them (refresh), with progress; the seconds it took."""
    from apps.runtime.progress import StepReport
    from streams.replay import backfill

    started = time.monotonic()
    _say(f"authz-timing: indexing {len(versions)} version(s) into {settings.retrieval.index_name} (backfill path)")
    with StepReport("  backfill") as steps:
        asyncio.run(backfill(settings, on_progress=steps.advance, version_ids=versions))
    client = make_sync_client(settings, timeout_s=30)
    index, ids = settings.retrieval.index_name, [str(v) for v in versions]
    body = {"size": 0, "query": {"terms": {"document_version_id": ids}},
            "aggs": {"v": {"cardinality": {"field": "document_version_id", "precision_threshold": 40000}}}}  # fmt: skip
    try:
        deadline, last = time.monotonic() + 300, 0.0
        while True:
            client.indices.refresh(index=index)
            found = int(client.search(index=index, body=body)["aggregations"]["v"]["value"])
            if found >= len(ids):
                break
            if time.monotonic() > deadline:
                raise BenchFailure(f"only {found} of {len(ids)} versions reached {index} in 300 s")
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                _say(f"  {found}/{len(ids)} versions searchable")
            time.sleep(0.5)
    finally:
        client.close()
    _say(f"authz-timing: all {len(ids)} versions searchable ({time.monotonic() - started:.1f} s)")
    return time.monotonic() - started


def drop_index(settings: Settings, alias: str) -> None:
    client = make_sync_client(settings, timeout_s=30)
    try:
        client.indices.delete(index=f"{alias}--*", ignore_unavailable=True)
        _say(f"authz-timing: removed the index {alias}")
    finally:
        client.close()


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def describe_scope(engine: Engine, settings: Settings, principal: str, budget: int) -> dict[str, Any]:
    """Caller `principal`'s compiled scope as the API compiles it, and the filter it is sent within `budget`
    (and would be sent as an administrator of the same scope: a superset)."""
    from dataclasses import replace

    from ki.acl import resolve_caller
    from search.access.scope import compile_scope

    with engine.connect() as conn:
        caller = resolve_caller(conn, [principal], settings.security)
        scope = compile_scope(conn, caller, settings.security)
    chosen = scope.bounded_filter(budget)
    return {
        "documents": len(scope.document_ids),
        "projects": len(scope.project_ids),
        "hidden_versions_listed": len(scope.hidden_version_ids),
        "principal_projection_usable": scope.projection,
        "exact_filter_bytes": len(json.dumps(scope.opensearch_filter())),
        "budget_bytes": budget,
        "filter_sent": chosen.kind,
        "filter_an_administrator_would_get": replace(scope, administrator=True).bounded_filter(budget).kind,
    }


def _table(cases: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'case':17} {'pairs':>5}  {'P(hidden slower) [95 %]':25} {'hidden p50':>11} {'missing p50':>12}  goal"]
    for name, c in cases.items():
        if not c.get("pairs"):
            continue
        lo, hi = c["interval_95"]
        p = f"{c['p_hidden_slower']:.3f} [{lo:.3f}, {hi:.3f}]"
        goal = "ok" if c["met"] else f"OVER ({c.get('stopped')})"
        lines.append(f"{name:17} {c['pairs']:5}  {p:25} {c['hidden_ms_p50']:8.2f} ms {c['missing_ms_p50']:9.2f} ms  "
                     f"{goal}")  # fmt: skip
    return lines


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(settings: Settings, options: AuthzOptions) -> int:
    """Run the benchmark (SIGTERM ends it like Ctrl-C: the world and the index are removed)."""
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        return _main(settings, options)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(settings: Settings, options: AuthzOptions) -> int:
    load_start = os.getloadavg()
    cases_asked = tuple(c for c in CASES if c in options.cases)
    needs_index = any(c in SEARCH_CASES + SLOW_CASES for c in cases_asked)
    engine = make_engine(settings)
    label = bench_label("authz-timing")
    tag = label.rsplit(" ", 1)[-1]
    alias = f"{AUTHZ_INDEX_PREFIX}{tag}"
    operator_token = mint_token(settings.api, "ki-bench", roles=["operator"], ttl_s=TOKEN_TTL_S)
    env = {"KI_API__LIMITS__MAX_SCOPE_FILTER_BYTES": str(FILTER_BUDGET_BYTES)}
    if needs_index:
        env["KI_RETRIEVAL__INDEX_NAME"] = alias
    server = ServeChild(options.config, REPO_ROOT / "build" / "bench" / "authz-timing-api.log", operator_token,
                        extra_env=env, needs_index=needs_index)  # fmt: skip
    rng = random.Random(options.seed)
    words = Words(random.Random(options.seed + 2))
    n = options.pairs_written(cases_asked)
    footprint = Footprint.of_label(label)
    clients: list[Client] = []
    setup: dict[str, Any] = {}
    try:
        _say(f"authz-timing: writing the world for {n} pairs per case ({label})")
        started = time.monotonic()
        sql_world = write_sql_world(engine, label, n)
        index_world = None
        if needs_index:
            titles = options.pairs_written(tuple(c for c in cases_asked if c in FEW_CASES))
            index_world = write_index_world(engine, label, titles, n, words)
            footprint = Footprint(footprint.name_regex, (index_world.alias,))
        setup["write_s"] = round(time.monotonic() - started, 1)
        if index_world is not None:
            indexed = with_overrides(settings, {"retrieval": {"index_name": alias}})
            setup["index_s"] = round(index_versions(indexed, index_world.index_versions), 1)
            setup["index_versions"] = len(index_world.index_versions)
            setup["index_alias"] = alias
        _say(f"authz-timing: starting `ki serve` (max_scope_filter_bytes {FILTER_BUDGET_BYTES})")
        asyncio.run(server.start())

        def client(subject: str) -> Client:
            clients.append(Client(server.port, mint_token(settings.api, subject, ttl_s=TOKEN_TTL_S)))
            return clients[-1]

        operator = Client(server.port, operator_token)
        clients.append(operator)
        available: dict[str, Case] = dict(sql_cases(sql_world, client(sql_world.caller), options.seed))
        if index_world is not None:
            b = client(index_world.searcher)
            available["names-cache"] = NamesCacheCase(client(index_world.colleague), b, words)
            available["names-hidden"] = NamesHiddenCase(b, index_world, words)
            scope = describe_scope(engine, settings, f"user:{index_world.superset}", FILTER_BUDGET_BYTES)
            if scope["filter_sent"] != "exact" or scope["exact_filter_bytes"] <= FILTER_BUDGET_BYTES:
                raise BenchFailure(f"superset: caller E is not over the filter budget as meant: {scope}")
            available["superset"] = SupersetCase(client(index_world.superset), index_world, words, scope)
            available["compare"] = CompareCase(b, index_world)
            available["invalidation"] = InvalidationCase(b, operator, engine, index_world.change_target)
        runner = Runner(rng, options.warmup)
        plans = {name: options.plan(name) for name in cases_asked}
        filters_before = _counter(operator.metrics(), "ki_search_scope_filter", "kind")
        runner.phase([available[c] for c in cases_asked if c not in SLOW_CASES], plans)
        filters_after = _counter(operator.metrics(), "ki_search_scope_filter", "kind")
        runner.phase([available[c] for c in cases_asked if c in SLOW_CASES], plans)
        summaries: dict[str, dict[str, Any]] = {}
        for name in cases_asked:
            plan = plans[name]
            summaries[name] = {
                "what": available[name].what,
                **runner.series[name].summary(),
                # met: the interval within the goal; outside: wholly beyond it; max_pairs: neither at the maximum
                "stopped": plan.stopped(runner.series[name]),
                "min_pairs": plan.min_pairs,
                "max_pairs": plan.max_pairs,
                **available[name].report(),
            }
            if name in SLOW_CASES and plan.max_pairs < options.max_pairs:
                summaries[name]["fewer_pairs"] = (
                    f"slow per pair (a change and the feed's delivery each): {plan.min_pairs} to {plan.max_pairs} "
                    f"pairs (--slow-pairs, --slow-max-pairs), not {options.pairs} to {options.max_pairs}"
                )
            if name in FEW_CASES and plan.max_pairs < options.max_pairs:
                summaries[name]["fewer_pairs"] = (
                    f"a document of its own per pair (a fresh title): at most {plan.max_pairs} pairs "
                    f"(--pairs + --block), not {options.max_pairs}"
                )
        result = {
            "command": options.command,
            "seed": options.seed,
            "warmup_pairs": options.warmup,
            "goal": {"p_hidden_slower_interval_within": list(GOAL), "confidence": 0.95, "interval": "Wilson score"},
            "pairs": {
                "min": options.pairs,
                "max": options.max_pairs,
                "block": options.block,
                "slow_min": options.slow_pairs,
                "slow_max": options.slow_max_pairs,
            },
            "api": {
                "max_scope_filter_bytes": FILTER_BUDGET_BYTES,
                "release_quantum_ms": settings.api.limits.release_quantum_ms,
                "search_release_quantum_ms": settings.api.limits.search_release_quantum_ms,
            },
            # The filters the searches of the first phase were sent with: exact kinds only (exact, principals,
            # none), never a superset (projects, open), which is for administrators.
            "scope_filter_kinds": {
                k: int(filters_after.get(k, 0) - filters_before.get(k, 0))
                for k in filters_after
                if filters_after.get(k, 0) - filters_before.get(k, 0)
            },
            "setup": setup,
            "seconds": round(time.monotonic() - runner.started, 1),
            "cases": summaries,
            "met": all(s.get("met", False) for s in summaries.values()),
            "machine": machine(load_start),
        }
    finally:
        for c in clients:
            c.close()
        server.stop()
        removal = remove_bench_rows(settings, footprint, what="authz-timing")
        if needs_index:
            drop_index(settings, alias)
        engine.dispose()
    result["cleanup"] = removal.as_dict()
    print()
    for line in _table(summaries):
        print(line)
    for name, summary in summaries.items():
        if "fewer_pairs" in summary:
            print(f"{name}: {summary['fewer_pairs']}")
    if options.raw is not None:
        timings = {
            name: {
                "hidden_ms": [round(x, 3) for x in series.hidden_ms],
                "missing_ms": [round(x, 3) for x in series.missing_ms],
            }
            for name, series in runner.series.items()
        }
        options.raw.parent.mkdir(parents=True, exist_ok=True)
        options.raw.write_text(json.dumps(timings) + "\n")
        print(f"authz-timing: wrote every pair's timings to {options.raw}")
    target = options.out or REPO_ROOT / "benchmarks" / "authz-timing.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"authz-timing: wrote {target}")
    return 0 if result["met"] else 1

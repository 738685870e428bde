"""Running queries through the search service for `ki eval` and `ki eval --self` (`run`, `self_check`).

Shared by both, so that neither imports the other for it: `run` calls `self_check.self_evaluate`, and
`self_check` runs its pseudo-queries with `run_queries` from here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opensearchpy import AsyncOpenSearch

from ki.errors import PermanentError

Progress = Callable[[str], None]
Mode = Literal["lexical", "semantic", "hybrid"]


class EvalError(PermanentError):
    """`ki eval` cannot go on; the message is one readable line."""


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class MemoClient:
    """Answers a repeated identical `_msearch` from memory and passes everything else through.

    The tuning grid re-ranks the same leg results many times: only fusion changes between grid
    points, so each distinct request goes to OpenSearch once."""

    def __init__(self, client: AsyncOpenSearch) -> None:
        self._client = client
        self._memo: dict[str, Any] = {}

    async def msearch(self, body: Any, **kwargs: Any) -> Any:
        key = hashlib.sha256(json.dumps([body, kwargs], sort_keys=True).encode()).hexdigest()
        if key not in self._memo:
            self._memo[key] = await self._client.msearch(body=body, **kwargs)
        return self._memo[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class ModeRun:
    run: dict[str, list[str]] = field(default_factory=dict)  # query id -> corpus ids, best first
    legs: dict[str, int] = field(default_factory=dict)  # leg -> hits it contributed to
    seconds: float = 0.0
    # A versioned set: query id -> {corpus id of a hit: corpus id of its `compare.earlier` version (None: the
    # label names none, or names a version not in the data set)}, for the hits that carry a `compare` label.
    compared: dict[str, dict[str, str | None]] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # each query's search, as the service answered it

    def latency(self) -> dict[str, float | None]:
        """p50 and p99 of the queries' search times (ms), what a signed report binds (ki.evidence_keys)."""
        ordered = sorted(self.latencies_ms)

        def at(q: float) -> float | None:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else None

        return {"p50": at(0.5), "p99": at(0.99)}


def hit_corpus_ids(
    hits: Sequence[dict[str, Any]], documents: dict[int, str] | None, versions: dict[int, str] | None = None
) -> list[str]:
    """The hits' corpus ids, best first: by `version_id` through `versions` (a versioned set), else by
    `document_id` through `documents`, else the document id itself; hits outside the mapping are left out."""
    if versions is not None:
        return [versions[h["version_id"]] for h in hits if h.get("version_id") in versions]
    ids = [h["document_id"] for h in hits]
    return [str(i) for i in ids] if documents is None else [documents[i] for i in ids if i in documents]


def compare_labels(hits: Sequence[dict[str, Any]], versions: dict[int, str]) -> dict[str, str | None]:
    """Corpus id of each hit with a `compare` label -> corpus id of the earlier version it names (None: none)."""
    out: dict[str, str | None] = {}
    for hit in hits:
        compare = hit.get("compare")
        if compare is None or hit.get("version_id") not in versions:
            continue
        earlier = (compare.get("earlier") or {}).get("version_id")
        out.setdefault(versions[hit["version_id"]], versions.get(earlier) if earlier is not None else None)
    return out


async def run_queries(
    service: Any,
    principals: list[str],
    queries: Sequence[tuple[str, str]],
    *,
    project_id: int | None,
    documents: dict[int, str] | None,
    limit: int,
    versions: dict[int, str] | None = None,
    concurrency: int,
    scope: Any = None,
    label: str = "",
    mode: Mode | None = None,
    progress: Progress | None = print_progress,
) -> ModeRun:
    """Each query through the search service; ranked corpus ids per query (`hit_corpus_ids`: `versions` maps
    version ids to them for a versioned set, else `documents` document ids; None: the document id itself) and
    which legs contributed."""
    from ki.errors import RequestInvalid
    from search.request import parse_search_request

    out = ModeRun()
    gate = asyncio.Semaphore(concurrency)
    done = 0
    started = time.monotonic()

    async def one(qid: str, query: str) -> None:
        nonlocal done
        body: dict[str, Any] = {"query": query, "limit": limit, "explain": True}
        if project_id is not None:
            body["filters"] = {"project_id": [project_id]}
        if mode is not None:
            body["mode"] = mode  # explicit: the service's evidence-gated default must not pick the legs
        try:
            request = parse_search_request(body, service.settings.api)
        except RequestInvalid as exc:
            raise EvalError(f"query {qid}: {exc}") from None
        async with gate:
            began = time.perf_counter()
            if scope is None:
                result = await service.search(principals, request)
            else:
                result = await service.search_in_scope(principals, request, scope)
            out.latencies_ms.append((time.perf_counter() - began) * 1000)
        out.run[qid] = hit_corpus_ids(result.hits, documents, versions)
        if versions is not None:
            out.compared[qid] = compare_labels(result.hits, versions)
        for hit in result.hits:
            for leg in hit.get("explain", {}).get("ranks", {}):
                out.legs[leg] = out.legs.get(leg, 0) + 1
        done += 1
        if progress and (done % 100 == 0 or done == len(queries)):
            progress(f"eval: {label}: {done}/{len(queries)} queries ({done / (time.monotonic() - started):.1f}/s)")

    await asyncio.gather(*(one(qid, q) for qid, q in queries))
    out.seconds = time.monotonic() - started
    return out

"""Retrieval statistics: what each ranked query found and where from, kept to see where the index fails
its users -- persisted to PostgreSQL (`ki_search_stats`, migration 0006), counted in Prometheus, and
aggregated by `GET /v1/stats` (administrators only).

Per query: the legs' hit sources among the page (lexical only, semantic only, both; the identifier leg
counts as lexical), the legs' top scores, the identity outcome, the empty-answer reason, fallbacks taken
(the scope cache bypassed, a superset scope filter that ran out of rounds, a named document outside the
filters), and the query text only with `api.stats.store_query_text`. Recording never slows or fails a
search: rows are buffered (bounded) and written in batches by a background task; a failed write is
logged, counted and dropped. Retention: rows older than `api.stats.retention_days` and beyond
`api.stats.max_rows` are deleted as rows are written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ki.settings import ApiSettings
from search.ranking.fusion import Candidate
from search.ranking.legs import LegHit
from search.telemetry.batches import BatchWriter, batch_limits

log = logging.getLogger(__name__)

LEXICAL_SIDE = ("lexical", "identifier")


@dataclass(frozen=True)
class QueryStats:
    mode: str
    hits: int  # on the page
    lexical_only: int
    semantic_only: int
    both: int
    top_lexical: float | None  # the legs' best raw scores (BM25 / cosine-based kNN score)
    top_semantic: float | None
    top_fused: float | None
    identity: str
    reason: str | None
    fallbacks: tuple[str, ...]
    took_ms: float
    query: str | None = None

    @property
    def zero_result(self) -> bool:
        return self.hits == 0


def query_stats(
    *,
    mode: str,
    page: Sequence[Candidate],
    legs: Mapping[str, Sequence[LegHit]],
    identity: str,
    reason: str | None,
    fallbacks: Iterable[str],
    took_ms: float,
    query: str | None,
) -> QueryStats:
    """The statistics of one ranked answer (pure)."""
    lexical = semantic = both = 0
    for c in page:
        lex, sem = any(leg in c.ranks for leg in LEXICAL_SIDE), "semantic" in c.ranks
        both += lex and sem
        lexical += lex and not sem
        semantic += sem and not lex

    def top(names: Sequence[str]) -> float | None:
        scores = [legs[n][0].score for n in names if legs.get(n)]
        return max(scores) if scores else None

    return QueryStats(
        mode=mode,
        hits=len(page),
        lexical_only=lexical,
        semantic_only=semantic,
        both=both,
        top_lexical=top(["lexical"]),
        top_semantic=top(["semantic"]),
        top_fused=page[0].score if page else None,
        identity=identity,
        reason=reason,
        fallbacks=tuple(sorted(set(fallbacks))),
        took_ms=round(took_ms, 3),
        query=query,
    )


_INSERT = text(
    """
    INSERT INTO ki_search_stats (mode, hit_count, lexical_only, semantic_only, both_legs, top_lexical, top_semantic,
                                 top_fused, identity, reason, fallbacks, took_ms, query)
    VALUES (:mode, :hits, :lexical_only, :semantic_only, :both, :top_lexical, :top_semantic,
            :top_fused, :identity, :reason, CAST(:fallbacks AS text[]), :took_ms, :query)
    """
)
_EXPIRE = text(
    """
    DELETE FROM ki_search_stats
    WHERE at < now() - make_interval(days => :days)
       OR id <= (SELECT max(id) FROM ki_search_stats) - :max_rows
    """
)


class StatsRecorder(BatchWriter[QueryStats]):
    """Buffers `QueryStats` and writes them in batches (see the module doc)."""

    def __init__(self, engine: AsyncEngine, api: ApiSettings, on_dropped: Any = None) -> None:
        async def write(conn: AsyncConnection, rows: list[QueryStats]) -> None:
            await conn.execute(_INSERT, [{**asdict(r), "fallbacks": list(r.fallbacks)} for r in rows])
            await conn.execute(_EXPIRE, {"days": api.stats.retention_days, "max_rows": api.stats.max_rows})

        super().__init__(engine, "search statistics", write, **batch_limits(api), on_dropped=on_dropped)


_SUMMARY = text(
    """
    SELECT count(*) AS queries,
           count(*) FILTER (WHERE hit_count = 0) AS zero_result,
           coalesce(sum(lexical_only), 0) AS lexical_only,
           coalesce(sum(semantic_only), 0) AS semantic_only,
           coalesce(sum(both_legs), 0) AS both_legs,
           avg(top_fused) AS mean_top_fused,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY took_ms) AS p50_took_ms,
           min(at) AS first_at, max(at) AS last_at
    FROM ki_search_stats WHERE at >= now() - make_interval(hours => :hours)
    """
)
_GROUPED = {
    name: text(
        f"SELECT {column} AS key, count(*) AS n FROM ki_search_stats "
        f"WHERE at >= now() - make_interval(hours => :hours) {extra} GROUP BY 1 ORDER BY 2 DESC, 1"
    )
    for name, column, extra in (
        ("mode", "mode", ""),
        ("identity", "identity", ""),
        ("reason", "reason", "AND reason IS NOT NULL"),
        ("fallbacks", "unnest(fallbacks)", ""),
    )
}
_ZERO_QUERIES = text(
    "SELECT query, count(*) AS n FROM ki_search_stats WHERE at >= now() - make_interval(hours => :hours) "
    "AND hit_count = 0 AND query IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 20"
)


def summary(conn: Connection, hours: int) -> dict[str, Any]:
    """`GET /v1/stats`: the last `hours` of statistics, aggregated."""
    params = {"hours": hours}
    row = conn.execute(_SUMMARY, params).one()
    out: dict[str, Any] = {
        "hours": hours,
        "queries": row.queries,
        "zero_result": row.zero_result,
        "hit_sources": {"lexical_only": row.lexical_only, "semantic_only": row.semantic_only, "both": row.both_legs},
        "mean_top_fused": None if row.mean_top_fused is None else float(row.mean_top_fused),
        "p50_took_ms": None if row.p50_took_ms is None else float(row.p50_took_ms),
        "first_at": row.first_at.isoformat() if row.first_at else None,
        "last_at": row.last_at.isoformat() if row.last_at else None,
    }
    for name, statement in _GROUPED.items():
        out[name] = {str(r.key): r.n for r in conn.execute(statement, params)}
    out["top_zero_result_queries"] = [{"query": r.query, "count": r.n} for r in conn.execute(_ZERO_QUERIES, params)]
    return out

"""The stages of a ranked search, composed once per service on its ports (search.ports, the scoped index reader,
the embedder's stage, the reranker)."""

from __future__ import annotations

from collections.abc import Callable

from ki.settings import Settings
from search.access.invalidation import InvalidationFeed
from search.names.cache import NameCache
from search.ports import Background, SqlReader
from search.ranking.rerank import Reranker
from search.ranking.scoped import ScopedIndex
from search.stages.answer import answer_stages
from search.stages.augment import GraphAugmenter
from search.stages.authoritative import AuthoritativeFinder
from search.stages.coverage import AnswerCoverageStage
from search.stages.embed import EmbedStage
from search.stages.identity import Identities, IdentityWait
from search.stages.legs import LegsStage
from search.stages.rank import RankStage
from search.stages.ranked import RankedSearch, post_ranking_stages
from search.stages.rerank import RerankGateway
from search.stages.reverify import ReverifyStage
from search.stages.scope import ScopeStage
from search.telemetry.metrics import SearchMetrics
from search.telemetry.stats import StatsRecorder


def ranked_search(
    settings: Settings,
    *,
    sql: SqlReader,
    scoped: ScopedIndex,
    embedding: EmbedStage,
    scope: ScopeStage,
    legs: LegsStage,
    signature: Callable[[], str],
    reranker: Reranker | None,
    metrics: SearchMetrics,
    stats: StatsRecorder | None,
    background: Background,
    name_cache: NameCache | None,
    feed: InvalidationFeed | None,
) -> RankedSearch:
    r = settings.retrieval
    identities = Identities(settings, sql, scoped, metrics, background, name_cache, feed)
    rerank = RerankGateway(reranker, metrics, scoped.page_rows).rerank if reranker is not None else None
    post_ranking = post_ranking_stages(
        r,
        metrics,
        augment=GraphAugmenter(r, scoped, sql).augment,
        authoritative=AuthoritativeFinder(r, scoped, sql).authoritative_hit,
        rerank=rerank,
        identity_hit=identities.identity_hit,
    )
    return RankedSearch(
        settings,
        scoped,
        identities,
        metrics,
        stats,
        head=[embedding, legs, IdentityWait()],
        ranking=[
            RankStage(r, signature, metrics),
            ReverifyStage(sql.reverify, r, rerank=reranker is not None),
            AnswerCoverageStage(r, signature, scoped.page_rows),
        ],
        post_ranking=post_ranking,
        answer=answer_stages(settings, scoped),
        compile_scope=scope.compile,
        embed=embedding.embed,
    )

"""The stages of a search, one module each, every one implementing `search.pipeline.Stage` over the request's
`QueryContext` and working through narrow ports (search.ports, the scoped index reader
search.ranking.scoped.ScopedIndex, the embedder, the reranker), never through the service:

scope (the caller's scope, cached) -> embed -> legs -> rank (floor, fusion, boost, decay) -> reverify
(re-verify in SQL and collapse) -> augment -> authoritative -> rerank -> identity (the named document first)
-> answer (neighbours, the evidence budget, the injection marks). `ranked` runs them for one request.
"""

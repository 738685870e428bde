"""The search API: SQL-scoped hybrid retrieval over the chunk index.

Request parsing (`filters`), callers (`auth`), the access scope compiled in SQL (`scope`), the legs of one
`_msearch` (`legs`), weighted RRF (`fusion`), the evidence gate for the default mode (`evidence`),
re-verification and collapse (`service`), rerank (`rerank`), admission control, metrics, OpenAPI and the
aiohttp app (`api`). Imports `ki` and `projections`; never `streams` or `apps`.
"""

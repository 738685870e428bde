"""Ranking: the legs, fusion, the semantic floor, the mode gate, rerank, budget, augmentation, neighbours, synonyms.

Pure modules (logic over values; an import contract in pyproject.toml keeps them so) beside three I/O modules:
`scoped` (OpenSearch, through the caller's scope), `rerank` (the rerank gateway over HTTP) and `sql_reads`
(PostgreSQL). Each I/O module raises `ki.errors` types only."""

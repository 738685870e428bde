"""Pure sync logic: what a change in PostgreSQL means for the chunk index.

Debezium decoding (`cdc`), dirty keys (`dirty`), text normalisation (`text`), chunking (`chunking`), index
rows and the decisions the worker makes about them (`rows`), the index mapping (`mapping`). No I/O: the
worker in `streams` reads, embeds and writes; these functions decide. Imports `ki`'s settings and pure
helpers only (checked by import-linter).
"""

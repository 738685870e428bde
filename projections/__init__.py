"""Pure sync logic: what a change in PostgreSQL means for the chunk index.

Debezium decoding (`cdc`), dirty keys (`dirty`), text normalisation (`text`), chunking (`chunking`), index
rows (`rows`), the decisions the worker makes about them (`plan`: content vs access-only path, the write
per row, the access_version rule), the index mapping (`mapping`). No I/O: the
worker in `streams` reads, embeds and writes; these functions decide. Imports `ki`'s settings and pure
helpers only (checked by import-linter).
"""

"""The sync worker: CDC topics in, index writes out.

The Faust app (`app`), the projector that reads PostgreSQL and embeds (`sync`), the single `_bulk` writer
(`writer`), topics and DLQ (`topics`), replay, rebuild, backfill and reconcile (`replay`), lag and status
(`status`), worker metrics (`metrics`). Imports `ki` and `projections`; never `search` or `apps`.
"""

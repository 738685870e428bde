"""The floor of ki-sidecar: what every other package stands on.

One settings object (`settings`), the one place clients of the services are built (`clients`), the
structured layer's models and migrations (`db`, `migrations`), the one ACL semantics (`acl`), embedding
providers (`embedding`) and text-analysis settings (`analysis`). Imports third-party libraries only —
never `projections`, `streams`, `search` or `apps` (checked by import-linter).
"""

"""The identity preflight: documents a query names (keys, SQL, cache)."""

"""Who may see what: the caller's compiled scope, its cache, the invalidation feed, the caller's view of versions."""

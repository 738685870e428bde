"""The HTTP boundary: routes, error table, authentication, OpenAPI, admission and rate limits, the console."""

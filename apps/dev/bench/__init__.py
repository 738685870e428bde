"""Benchmarks that print figures as ratios against a baseline measured in the same run: search latency
(`search`), sync throughput (`sync`), commit-to-visible freshness (`freshness`); shared corpus writer and
statistics (`corpus`, `stats`)."""

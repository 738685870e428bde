"""Benchmarks that print figures as ratios against a baseline measured in the same run: search latency
(`search`), sync throughput (`sync`), commit-to-visible freshness (`freshness`), the local embedder
(`embedder`); the share of a corpus the vector store can share (`reuse`); shared corpus writer and
statistics (`corpus`, `stats`)."""

"""Developer and operator tooling: the native local stack, benchmarks, `ki eval`, the demo corpus, charts.

The runtime (`apps.runtime`) never imports it; `apps.cli` composes both.
"""

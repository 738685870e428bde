"""Demo data: a deterministic German legal corpus written to PostgreSQL (so it flows through CDC)."""

from apps.dev.demo.generator import DEMO_TAG, GenerationSummary, demo_data_exists, generate

__all__ = ["DEMO_TAG", "GenerationSummary", "demo_data_exists", "generate"]

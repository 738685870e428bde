"""Charts for benchmark and evaluation results: optional (extra `bench` installs matplotlib)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    """matplotlib's pyplot drawing to files only, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt

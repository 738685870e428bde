"""The source checkout the dev tools work in: the benchmarks (`ki bench`), the retrieval evaluation (`ki eval`
on a labelled data set) and the secured stack's PostgreSQL roles read files of the repository (test data,
`deploy/`, the shared data folder beside it) and write under its `build/` and `benchmarks/`.

Only these dev tools (apps/dev/) and the tests use `REPO_ROOT`; the runtime (ki, projections, streams, search,
apps.runtime, the CLI's runtime commands) never reads a path of the repository: its files are package data
(`importlib.resources`) or settings (tests/unit/test_package_paths.py checks it). An installed `ki` is no
checkout: a dev tool that needs one stops with one line (`require_checkout`).
"""

from __future__ import annotations

from pathlib import Path

from ki.errors import PermanentError

#: The repository root when this module runs from a checkout (an installed package: its site-packages folder).
REPO_ROOT = Path(__file__).resolve().parents[2]


class NotACheckout(PermanentError):
    """A dev tool that reads or writes the repository's files, run from an installed package."""


def in_checkout() -> bool:
    """Whether the code runs from a source checkout (its pyproject.toml and benchmarks/ beside the packages)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "benchmarks").is_dir()


def require_checkout(what: str) -> Path:
    """The repository root; NotACheckout (one line) when the code runs from an installed package."""
    if not in_checkout():
        raise NotACheckout(
            f"{what} works in a source checkout of ki-sidecar only (this ki is installed in {REPO_ROOT}): "
            "run it from a clone of the repository"
        )
    return REPO_ROOT

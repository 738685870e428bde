"""The package runs anywhere: the runtime reads no path of the repository, the wheel carries every file the
runtime reads (package data, through importlib.resources), and the mode gate's reports travel with it.

The runtime: ki, projections, streams, search, apps.runtime and the CLI. The dev tools (apps/dev/: stack,
demo, benchmarks, eval) may read the checkout through `apps.dev.checkout`, and stop with one line where there
is none."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest

from apps.dev import checkout
from apps.dev.checkout import REPO_ROOT, NotACheckout, require_checkout
from search.ranking.mode_gate import SHIPPED_REPORTS, Trust, load_reports, parse_reports, resolve_dir

RUNTIME = ("ki", "projections", "streams", "search", "apps/runtime", "apps/cli.py", "apps/__init__.py")
PACKAGES = ("ki", "projections", "streams", "search", "apps")

#: What finds a file by the source tree's layout instead of the package's (importlib.resources) or a setting.
REPO_RELATIVE = {
    "REPO_ROOT": re.compile(r"\bREPO_ROOT\b"),
    "__file__": re.compile(r"\b__file__\b"),
    ".parent.parent": re.compile(r"\.parent\s*\.\s*parent\b"),
    ".parents[": re.compile(r"\.parents\s*\["),
}


def repo_relative_uses(source: str) -> list[str]:
    """`line: what` for every line of `source` that reaches a file through the source tree's layout."""
    return [
        f"{number}: {what}"
        for number, line in enumerate(source.splitlines(), 1)
        for what, pattern in REPO_RELATIVE.items()
        if pattern.search(line.split("#", 1)[0])
    ]


def runtime_modules() -> list[Path]:
    found: list[Path] = []
    for entry in RUNTIME:
        path = REPO_ROOT / entry
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def test_the_check_finds_a_repository_relative_path() -> None:
    bad = (
        "from ki.settings import REPO_ROOT\n"
        "STATIC = Path(__file__).resolve().parent.parent / 'static'\n"
        "DATA = Path(x).parents[2]\n"
        "ok = files(__package__) / 'static'  # REPO_ROOT in a comment is fine\n"
    )
    assert repo_relative_uses(bad) == ["1: REPO_ROOT", "2: __file__", "2: .parent.parent", "3: .parents["]


def test_the_runtime_reads_no_path_of_the_repository() -> None:
    modules = runtime_modules()
    assert len(modules) > 100 and REPO_ROOT / "apps" / "cli.py" in modules
    uses = {
        str(module.relative_to(REPO_ROOT)): found
        for module in modules
        if (found := repo_relative_uses(module.read_text(encoding="utf-8")))
    }
    assert uses == {}, "package data through importlib.resources, or a setting; the repository only in apps/dev"


def _package_data() -> dict[str, list[str]]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["tool"]["setuptools"]["package-data"]


def test_every_file_beside_the_code_is_package_data() -> None:
    """A file the wheel would leave out (not *.py, not in a package-data pattern) is a file an installed
    `ki` cannot find."""
    globs = _package_data()
    missing = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*")):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            inside = path.relative_to(REPO_ROOT / package).as_posix()
            if not any(fnmatch.fnmatch(inside, pattern) for pattern in globs.get(package, [])):
                missing.append(path.relative_to(REPO_ROOT).as_posix())
    assert missing == [], "add them to [tool.setuptools.package-data] in pyproject.toml"


def test_the_shipped_reports_are_the_committed_ones_the_gate_reads() -> None:
    """The package's reports are copies of exactly those in benchmarks/ the gate can use: a report
    re-measured there is copied here too (and one the gate cannot read is not shipped)."""
    shipped = resolve_dir(None)
    assert shipped.name == SHIPPED_REPORTS and shipped.is_relative_to(REPO_ROOT / "search")
    usable = sorted(
        path.name
        for path in (REPO_ROOT / "benchmarks").glob("*.json")
        if parse_reports(str(path), json.loads(path.read_text(encoding="utf-8")))
    )
    assert sorted(path.name for path in shipped.glob("*")) == usable
    for name in usable:
        assert (shipped / name).read_bytes() == (REPO_ROOT / "benchmarks" / name).read_bytes(), name
    found = {report.dataset.split(" (")[0] for report in load_reports(None, Trust())}  # pinned: they count
    assert found >= {"gesetze-headings-dev", "xquad-de"}


def test_a_relative_reports_dir_starts_at_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_dir("reports") == Path("reports")
    assert resolve_dir("~/reports") == Path.home() / "reports"


def test_a_dev_tool_outside_a_checkout_stops_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert require_checkout("ki bench search") == REPO_ROOT  # here: a checkout
    monkeypatch.setattr(checkout, "REPO_ROOT", tmp_path / "site-packages")
    with pytest.raises(NotACheckout, match=r"^ki bench search works in a source checkout of ki-sidecar only"):
        require_checkout("ki bench search")

    from apps.cli import main

    monkeypatch.chdir(REPO_ROOT)
    assert main(["bench", "injection"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ki: ki bench injection works in a source checkout of ki-sidecar only")
    assert err.count("\n") == 1

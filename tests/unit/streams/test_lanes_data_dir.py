"""The lanes' own files go where `streams.data_dir` says; deployments that placed them with `stack.home` (the
image, the systemd units) keep them where they were; the runtime reads nothing else of the dev stack's settings."""

from __future__ import annotations

import ast
from pathlib import Path

import streams.app
from ki.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[3]


def test_streams_data_dir_places_faust_files(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {"streams": {"data_dir": str(tmp_path / "lanes")}, "stack": {"home": "/nowhere"}}
    )
    app = streams.app.create_app(settings, "content")
    assert Path(app.conf.datadir).parent == tmp_path / "lanes" / "faust"


def test_without_it_the_files_stay_under_stack_home_as_before(tmp_path: Path) -> None:
    settings = load_settings(environ={"KI_STACK__HOME": str(tmp_path)})
    assert settings.lanes_data_dir() == tmp_path
    app = streams.app.create_app(settings, "access")
    assert Path(app.conf.datadir).parent == tmp_path / "faust"
    assert Settings().lanes_data_dir() == Path("~/.cache/ki-sidecar").expanduser()  # the default home's, as before


def test_the_runtime_reads_no_stack_setting() -> None:
    runtime = [ROOT / "streams", ROOT / "search", ROOT / "projections", ROOT / "apps" / "runtime"]
    reads = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for folder in runtime
        for path in sorted(folder.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "stack"
    ]
    assert reads == []

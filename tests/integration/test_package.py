"""The package runs anywhere: the wheel built from this tree, installed into a fresh virtual environment
outside the checkout, started from a working folder outside it, migrates, serves and syncs against the test
stack, and one document written to PostgreSQL is found by a search.

The environment: `python -m venv` (no pip of its own) outside the checkout, the wheel installed into it with
`pip --python … install --no-deps --no-index`, and the third-party dependencies taken from the test run's own
environment by one path line in a `.pth` file (installing them from the package index would take minutes,
resolving the same pinned versions). A path line adds that folder to `sys.path` after the new environment's
own site-packages, without running the `.pth` files inside it, so the editable install of the checkout
(an import hook of the test environment) stays out: the test asserts that ki, search, streams, projections and
apps are imported from the new environment and read their package data from there. The environment variables
of the test stack point the installed `ki` at its services, as they point the tests' own children."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, SyncWorker, isolated, remove_world, wait_until_indexed
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.second_lane]

#: What the wheel is built from: the project's metadata and its packages (no tests, benchmarks, build/).
SOURCES = ("pyproject.toml", "README.md", "ki", "projections", "streams", "search", "apps")
PACKAGES = ("ki", "projections", "streams", "search", "apps")


@dataclass(frozen=True)
class Installed:
    venv: Path
    work: Path  # a working folder outside the checkout, with a copy of the repository's config.json
    empty: Path  # one without any config file

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def ki(self) -> list[str]:
        return [str(self.venv / "bin" / "ki")]

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.ki, *args], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout
        )


def child_env() -> dict[str, str]:
    """This run's environment (the test stack's KI_* variables) without what would point at the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KI_CONFIG", "VIRTUAL_ENV")}


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("package")
    assert not root.is_relative_to(REPO_ROOT)
    # A copy of the tree, so the build's own build/ and egg-info never land in (or come from) the checkout.
    source = root / "ki-sidecar"
    source.mkdir()
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "wheels"), str(source)], root)
    (wheel,) = (root / "wheels").glob("ki_sidecar-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
          "--no-index", str(wheel)], root)  # fmt: skip
    site = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     root).strip())  # fmt: skip
    dependencies = Path(sysconfig.get_paths()["purelib"]).resolve()
    (site / "zz_test_dependencies.pth").write_text(f"{dependencies}\n", encoding="utf-8")
    work, empty = root / "work", root / "empty"
    work.mkdir()
    empty.mkdir()
    shutil.copy2(REPO_ROOT / "config.json", work / "config.json")
    return Installed(venv, work, empty)


def test_the_installed_package_imports_and_reads_its_data_from_its_own_environment(installed: Installed) -> None:
    probe = (
        "import json, sys, ki, apps, search, streams, projections\n"
        "from ki.db.migrate import MIGRATIONS_DIR\n"
        "from search.ranking.mode_gate import Trust, load_reports, resolve_dir\n"
        "from search.web.console import STATIC\n"
        "print(json.dumps({'modules': [m.__file__ for m in (ki, apps, search, streams, projections)],"
        " 'data': [str(MIGRATIONS_DIR), str(resolve_dir(None)), str(STATIC)],"
        " 'reports': sorted({r.dataset.split(' (')[0] for r in load_reports(None, Trust())}),"
        " 'hooks': [type(f).__module__ for f in sys.meta_path]}))"
    )
    seen = json.loads(_run([str(installed.python), "-c", probe], installed.work))
    site = str(installed.venv)
    for path in seen["modules"] + seen["data"]:
        assert path.startswith(site), f"{path}: not from the installed package"
    assert not any("editable" in hook for hook in seen["hooks"]), seen["hooks"]
    assert {"gesetze-headings-dev", "xquad-de"} <= set(seen["reports"])
    assert (Path(seen["data"][0]) / "versions" / "0001_reference_schema.py").is_file()
    assert (Path(seen["data"][2]) / "index.html").is_file()


def test_config_check_outside_the_checkout(installed: Installed) -> None:
    done = installed.run("config", "check", cwd=installed.empty)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("config file: none (the built-in defaults)\nconfig ok: ")
    done = installed.run("config", "check", cwd=installed.work)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"config file: {installed.work / 'config.json'}\nconfig ok: ")
    assert "retrieval.embedding_dimensions" in done.stdout
    done = installed.run("--config", "absent.json", "config", "check", cwd=installed.work)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "ki: config error: absent.json: file not found\n")
    done = installed.run("bench", "sync", cwd=installed.work)  # a dev tool: the checkout's data and folders
    assert done.returncode == 2 and "works in a source checkout of ki-sidecar only" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


def test_migrate_serve_and_sync_find_a_new_document_without_a_config_file(
    installed: Installed, settings: Settings, engine: Engine
) -> None:
    done = installed.run("migrate", cwd=installed.empty)
    assert done.returncode == 0 and done.stdout.startswith("schema: "), done.stderr[-3000:]
    with isolated(settings, prefix="ki-package-test") as env:
        worker = SyncWorker(env, command=installed.ki, cwd=installed.empty)
        lanes = worker.lane_env
        server = Server("package-api", command=installed.ki, cwd=installed.empty, **env, **lanes)
        with engine.begin() as conn:
            w = World(conn)
            project, source = w.project("Paket"), w.source("local_fs")
            word = f"paketprobe{w.tag}"
            document = w.searchable(project, "Mietvertrag Paket", f"Der Mietvertrag nennt {word}.",
                                    w.source_object(source), "paket")  # fmt: skip
            w.grant("project", project, f"user:anna-{w.tag}")
        try:
            worker.start()
            server.start()
            wait_until_indexed(server, settings, [project], {document}, "the installed worker's document")
            token = mint_token(settings.api, f"anna-{w.tag}")
            status, body = server.call("/v1/search", {"query": word}, token)
            assert status == 200, body
            assert [hit["document_id"] for hit in body["hits"]][:1] == [document]
            # No config file: the built-in tuned defaults, which the shipped reports match ("no report matches"
            # would have made it lexical); the stack's addresses come from the environment, as in a container.
            assert body["mode"]["used"] == "hybrid", body["mode"]
        finally:
            server.stop()
            worker.stop()
            remove_world(engine, [project], [source])

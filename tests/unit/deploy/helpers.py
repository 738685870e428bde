"""What the deployment files' tests share: the image's name and version, and `ki`'s own command line."""

from __future__ import annotations

import re
import tomllib
from contextlib import redirect_stderr
from io import StringIO

from apps.cli import build_parser
from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.settings import StackSettings
from ki.settings import Settings

IMAGE_NAME = "ki-sidecar"
PROBE = ["python", "-m", "apps.runtime.probe"]


def project_version() -> str:
    return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])


def dockerfile_version() -> str:
    found = re.search(r"^ARG KI_VERSION=(\S+)$", (REPO_ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert found, "Dockerfile: no ARG KI_VERSION"
    return found[1]


def image() -> str:
    """The image every deployment file runs: the Dockerfile's version, which is pyproject.toml's."""
    assert dockerfile_version() == project_version()
    return f"{IMAGE_NAME}:{project_version()}"


def ki_commands() -> set[str]:
    """The subcommands `ki --help` lists."""
    return set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def assert_ki_command(args: list[str], where: str) -> None:
    """`ki <args>` is a command line `ki` accepts (its parser, not a guess: a renamed flag fails here)."""
    assert args and args[0] in ki_commands(), f"{where}: `ki {' '.join(args)}` is no ki command"
    stderr = StringIO()
    try:
        with redirect_stderr(stderr):
            build_parser().parse_args(args)
    except SystemExit:
        raise AssertionError(f"{where}: `ki {' '.join(args)}` is refused: {stderr.getvalue().strip()}") from None


def setting_exists(variable: str) -> bool:
    """`KI_<SECTION>__<FIELD>` names a setting of ki/settings.py (of apps/dev/stack/settings.py for `stack`)."""
    target: object = Settings()
    parts = variable.removeprefix("KI_").lower().split("__")
    if parts[0] == "stack":
        target, parts = StackSettings(), parts[1:]
    for part in parts:
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return variable.startswith("KI_")

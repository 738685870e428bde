"""Finding the Java runtime the JVM services run on (Kafka 4 needs 17+, OpenSearch 2.19 runs on 17+)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from apps.dev.stack.errors import StackError
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings

MIN_JAVA = 17


@dataclass(frozen=True)
class JavaRuntime:
    home: Path
    version: int

    @property
    def java(self) -> Path:
        return self.home / "bin" / "java"


def _feature_version(home: Path) -> int | None:
    """The feature release (17, 21, …) from `<home>/release`; None when it is not a JDK/JRE home."""
    try:
        release = (home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, re.MULTILINE)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def _candidates(settings: Settings) -> list[tuple[str, Path]]:
    if stack_settings(settings).java_home:
        return [("stack.java_home", Path(stack_settings(settings).java_home).expanduser())]
    found: list[tuple[str, Path]] = []
    if os.environ.get("JAVA_HOME"):
        found.append(("JAVA_HOME", Path(os.environ["JAVA_HOME"])))
    on_path = shutil.which("java")
    if on_path:
        found.append(("java on PATH", Path(on_path).resolve().parent.parent))
    return found


def find_java(settings: Settings) -> JavaRuntime:
    """settings.stack.java_home if set, else $JAVA_HOME, else the `java` on PATH; must be Java 17+."""
    candidates = _candidates(settings)
    if not candidates:
        raise StackError(f"Java is missing: install a Java {MIN_JAVA}+ runtime or set stack.java_home / JAVA_HOME")
    problems = []
    for origin, home in candidates:
        version = _feature_version(home)
        if version is None or not (home / "bin" / "java").is_file():
            problems.append(f"{origin} {home} is not a Java installation")
        elif version < MIN_JAVA:
            problems.append(f"{origin} {home} is Java {version}, need {MIN_JAVA}+")
        else:
            return JavaRuntime(home=home, version=version)
    raise StackError("no usable Java: " + "; ".join(problems))


JVM_DIR = Path("/usr/lib/jvm")


def find_java_at_least(minimum: int, configured: str = "", setting: str = "") -> JavaRuntime:
    """A Java `minimum`+ for a service that needs a newer one than the rest: `configured` if set, else
    the newest such installation under /usr/lib/jvm."""
    if configured:
        home = Path(configured).expanduser()
        version = _feature_version(home)
        if version is None or version < minimum or not (home / "bin" / "java").is_file():
            raise StackError(f"{setting} {home} is not a Java {minimum}+ installation")
        return JavaRuntime(home=home, version=version)
    found = []
    for home in sorted(JVM_DIR.glob("*")) if JVM_DIR.is_dir() else []:
        version = _feature_version(home)
        if version is not None and version >= minimum and (home / "bin" / "java").is_file() and not home.is_symlink():
            found.append(JavaRuntime(home=home, version=version))
    if not found:
        raise StackError(f"no Java {minimum}+ under {JVM_DIR}: install one or set {setting}")
    return max(found, key=lambda j: j.version)

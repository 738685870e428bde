"""Resolving the pinned artifacts of `artifacts.xml` with Maven into the stack cache.

Each component is built into `<home>/artifacts/<name>-<version>.partial`, stamped with a marker that
carries the manifest digest, and renamed into place: a half-finished run never looks resolved, and a
fully cached run only reads three marker files (no Maven).

OpenSearch is assembled, because no complete distribution is served as a Maven artifact: the
integ-test-zip (server + transport module only), the `lang-painless` and `analysis-common` modules
dropped into `modules/<name>/` with the plugin descriptor we write, the `ki-analysis-icu` module
(ICU analysis: OpenSearch's `analysis-icu` plugin is not served as a Maven artifact, so a small plugin
of ours, `icu/KiIcuAnalysisPlugin.java`, is compiled against Lucene's ICU module and ICU4J), and the
k-NN plugin zip unpacked into `plugins/opensearch-knn/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apps.dev.stack.errors import StackError
from apps.dev.stack.java import JavaRuntime
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.process import START_MARKER

MANIFEST = Path(__file__).with_name("artifacts.xml")
ICU_SOURCE = Path(__file__).with_name("icu") / "KiIcuAnalysisPlugin.java"
MARKER = ".ki-resolved"
#: Bump when the assembly below changes in a way the manifest digest cannot see.
ASSEMBLY_REVISION = "1"

Report = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class OpenSearchModule:
    """A module jar set from one manifest profile, made loadable by a descriptor we write."""

    name: str
    profile: str
    classname: str
    extended_plugins: tuple[str, ...] = ()
    security_policy: str = ""
    #: Java source compiled (against the server's lib/ and the profile's jars) into `<name>.jar`.
    source: Path | None = None


OPENSEARCH_MODULES: tuple[OpenSearchModule, ...] = (
    OpenSearchModule(
        name="lang-painless",
        profile="opensearch-lang-painless",
        classname="org.opensearch.painless.PainlessPlugin",
        # Painless compiles scripts to classes at run time.
        security_policy=(
            "grant {\n"
            '  permission java.lang.RuntimePermission "createClassLoader";\n'
            '  permission java.lang.RuntimePermission "getClassLoader";\n'
            "};\n"
        ),
    ),
    OpenSearchModule(
        name="analysis-common",
        profile="opensearch-analysis-common",
        classname="org.opensearch.analysis.common.CommonAnalysisPlugin",
        extended_plugins=("lang-painless",),
    ),
    OpenSearchModule(
        name="ki-analysis-icu",
        profile="opensearch-analysis-icu",
        classname="ki.analysis.icu.KiIcuAnalysisPlugin",
        source=ICU_SOURCE,
    ),
)
KNN_PLUGIN = "opensearch-knn"
SECURITY_PLUGIN = "opensearch-security"
#: Beside the secured assembly's plugins/: the security plugin's default configuration files.
SECURITY_DEFAULTS = "security-config"


@dataclass(frozen=True)
class Artifacts:
    versions: dict[str, str]
    kafka_libs: Path
    debezium_plugin_path: Path
    opensearch_home: Path
    #: The Keycloak distribution's zip, resolved only when asked for (`ki stack up --idp`).
    keycloak_archive: Path | None = None

    @property
    def kafka_classpath(self) -> str:
        return f"{self.kafka_libs}/*"


def pinned_versions(manifest: Path | None = None) -> dict[str, str]:
    """The `<properties>` of the manifest: `{"kafka.version": "4.1.1", …}`."""
    manifest = manifest or MANIFEST
    props = ET.parse(manifest).getroot().find("properties")
    if props is None:
        raise StackError(f"{manifest}: no <properties>")
    return {child.tag: (child.text or "").strip() for child in props}


def extract(archive: Path, target: Path, strip_top: bool) -> None:
    """Unzip keeping the Unix modes (bin/ scripts stay executable); optionally drop the top folder."""
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            name = info.filename
            if strip_top:
                name = name.split("/", 1)[1] if "/" in name else ""
            if not name:
                continue
            out = target / name
            if not out.resolve().is_relative_to(target.resolve()):
                raise StackError(f"{archive.name}: unsafe path {info.filename!r}")
            if info.is_dir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            out.chmod((mode or 0o644) | 0o444)


def _readable_by_all(root: Path) -> None:
    """The assembled OpenSearch is read by the unprivileged service account (see users.py), from a copy
    outside the user's home (`copy_resolved`)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            p = Path(dirpath, name)
            p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o555)
        for name in filenames:
            p = Path(dirpath, name)
            p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o444)
    root.chmod(stat.S_IMODE(root.stat().st_mode) | 0o555)


def _jar_has_class(directory: Path, classname: str) -> bool:
    entry = classname.replace(".", "/") + ".class"
    for jar in directory.glob("*.jar"):
        with zipfile.ZipFile(jar) as zf:
            if entry in zf.namelist():
                return True
    return False


class Resolver:
    def __init__(self, paths: StackPaths, java: JavaRuntime, report: Report) -> None:
        self.paths = paths
        self.java = java
        self.report = report
        self.versions = pinned_versions()
        self.digest = hashlib.sha256(
            MANIFEST.read_bytes() + ASSEMBLY_REVISION.encode() + ICU_SOURCE.read_bytes()
        ).hexdigest()
        self.log_file = paths.log_file("artifacts")

    def resolve(self, *, keycloak: bool = False, secure: bool = False) -> Artifacts:
        v = self.versions
        kafka = self._ensure(f"kafka-{v['kafka.version']}", self._build_kafka)
        debezium = self._ensure(f"debezium-{v['debezium.version']}", self._build_debezium)
        opensearch = self._ensure(f"opensearch-{v['opensearch.version']}", self._build_opensearch)
        if secure:
            plain = opensearch
            opensearch = self._ensure(
                f"opensearch-secure-{v['opensearch.version']}", lambda staging: self._build_secure(staging, plain)
            )
        archive = None
        if keycloak:
            name = f"keycloak-quarkus-dist-{v['keycloak.version']}.zip"
            archive = self._ensure(f"keycloak-{v['keycloak.version']}", self._build_keycloak) / name
        return Artifacts(
            versions=dict(v),
            kafka_libs=kafka / "libs",
            debezium_plugin_path=debezium,
            opensearch_home=opensearch,
            keycloak_archive=archive,
        )

    # -- caching ------------------------------------------------------------------------------------

    def _ensure(self, name: str, build: Callable[[Path], None]) -> Path:
        dest = self.paths.artifacts / name
        if self._is_current(dest):
            return dest
        # Two stacks starting at once (the test lanes) share this cache: one resolves, the other waits
        # for it and then finds the artifact ready.
        self.paths.artifacts.mkdir(parents=True, exist_ok=True)
        with open(self.paths.artifacts / ".resolve.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._is_current(dest):
                return dest
            return self._build(name, dest, build)

    def _is_current(self, dest: Path) -> bool:
        marker = dest / MARKER
        return marker.is_file() and marker.read_text().strip() == self.digest

    def _build(self, name: str, dest: Path, build: Callable[[Path], None]) -> Path:
        started = time.monotonic()
        self.report(f"artifacts: resolving {name} with Maven (first run only)…")
        staging = dest.with_name(name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            build(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        (staging / MARKER).write_text(self.digest + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        self.report(f"artifacts: {name} ready in {time.monotonic() - started:.1f}s")
        return dest

    def _mvn_copy(self, profile: str, out: Path, transitive: bool = True) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("Maven (mvn) is missing: install it (scripts/bootstrap.sh does)")
        plugin = f"org.apache.maven.plugins:maven-dependency-plugin:{self.versions['dependency-plugin.version']}"
        argv = [
            mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(MANIFEST), "-P", profile,
            f"{plugin}:copy-dependencies", f"-DoutputDirectory={out}", "-DincludeScope=runtime",
            f"-DexcludeTransitive={'false' if transitive else 'true'}",
        ]  # fmt: skip
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            log.write(f"\n{START_MARKER} {' '.join(argv)}\n".encode())
            log.flush()
            result = subprocess.run(
                argv,
                env={**os.environ, "JAVA_HOME": str(self.java.home)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            raise StackError(
                f"artifacts: Maven could not resolve profile {profile!r} of {MANIFEST.name}"
                f"{self._first_error()} (log: {self.log_file})"
            )

    def _first_error(self) -> str:
        tail = _ANSI.sub("", self.log_file.read_text(errors="replace")).splitlines()[-200:]
        errors = [line.removeprefix("[ERROR]").strip() for line in tail if line.startswith("[ERROR]")]
        errors = [e for e in errors if e]
        return f": {errors[0][:400]}" if errors else ""

    # -- components -----------------------------------------------------------------------------

    def _build_kafka(self, staging: Path) -> None:
        self._mvn_copy("kafka", staging / "libs")

    def _build_debezium(self, staging: Path) -> None:
        # plugin.path is `staging`; each sub-directory is one isolated Connect plugin.
        self._mvn_copy("debezium", staging / "debezium-connector-postgres")

    def _build_opensearch(self, staging: Path) -> None:
        v = self.versions
        download = staging.with_name(staging.name + "-download")
        shutil.rmtree(download, ignore_errors=True)
        try:
            self._mvn_copy("opensearch-dist", download, transitive=False)
            extract(download / f"opensearch-{v['opensearch.version']}.zip", staging, strip_top=True)
            extract(
                download / f"{KNN_PLUGIN}-{v['opensearch-knn.version']}.zip",
                staging / "plugins" / KNN_PLUGIN,
                strip_top=False,
            )
        finally:
            shutil.rmtree(download, ignore_errors=True)
        lucene = staging / "lib" / f"lucene-core-{v['lucene.version']}.jar"
        if not lucene.is_file():
            found = sorted(p.name for p in (staging / "lib").glob("lucene-core-*.jar"))
            raise StackError(f"artifacts: lucene.version {v['lucene.version']} is not the server's Lucene ({found})")
        for module in OPENSEARCH_MODULES:
            self._install_module(module, staging / "modules" / module.name, staging / "lib")
        _readable_by_all(staging)

    def _build_secure(self, staging: Path, plain: Path) -> None:
        """The assembled OpenSearch (hard links, no copy) plus the security plugin; its default
        configuration files go beside plugins/ (a plugin directory holds no config)."""
        shutil.copytree(
            plain, staging, dirs_exist_ok=True, copy_function=os.link, ignore=shutil.ignore_patterns(MARKER)
        )
        download = staging.with_name(staging.name + "-download")
        shutil.rmtree(download, ignore_errors=True)
        try:
            self._mvn_copy("opensearch-security", download, transitive=False)
            plugin = staging / "plugins" / SECURITY_PLUGIN
            extract(download / f"{SECURITY_PLUGIN}-{self.versions['opensearch-security.version']}.zip", plugin,
                    strip_top=False)  # fmt: skip
            (plugin / "config").rename(staging / SECURITY_DEFAULTS)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        _readable_by_all(staging)

    def _build_keycloak(self, staging: Path) -> None:
        # Only the zip is kept here: each stack unpacks it into its own state (apps/dev/stack/keycloak.py).
        self._mvn_copy("keycloak", staging, transitive=False)

    def _javac(self) -> str:
        javac = self.java.home / "bin" / "javac"
        if javac.is_file():
            return str(javac)
        found = shutil.which("javac")
        if found is None:
            raise StackError(f"artifacts: no javac in {self.java.home} or on PATH (ki-analysis-icu is compiled)")
        return found

    def _compile(self, module: OpenSearchModule, target: Path, server_lib: Path) -> None:
        assert module.source is not None
        classes = target.with_name(target.name + ".classes")
        shutil.rmtree(classes, ignore_errors=True)
        argv = [self._javac(), "--release", "11", "-Xlint:-options", "-nowarn", "-d", str(classes),
                "-cp", f"{server_lib}/*{os.pathsep}{target}/*", str(module.source)]  # fmt: skip
        with open(self.log_file, "ab") as log:
            log.write(f"\n{START_MARKER} {' '.join(argv)}\n".encode())
            log.flush()
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False)
        try:
            if result.returncode != 0:
                raise StackError(f"artifacts: compiling {module.source.name} failed (log: {self.log_file})")
            with zipfile.ZipFile(target / f"{module.name}.jar", "w", zipfile.ZIP_DEFLATED) as jar:
                for path in sorted(classes.rglob("*.class")):
                    jar.write(path, path.relative_to(classes).as_posix())
        finally:
            shutil.rmtree(classes, ignore_errors=True)

    def _install_module(self, module: OpenSearchModule, target: Path, server_lib: Path) -> None:
        self._mvn_copy(module.profile, target)
        if module.source is not None:
            self._compile(module, target, server_lib)
        if not _jar_has_class(target, module.classname):
            raise StackError(f"artifacts: {module.name}: class {module.classname} not found in its jars")
        version = self.versions["opensearch.version"]
        descriptor = {
            "description": f"{module.name} module, assembled by ki stack",
            "version": version,
            "name": module.name,
            "classname": module.classname,
            "java.version": "11",
            "opensearch.version": version,
            "extended.plugins": ",".join(module.extended_plugins),
            "has.native.controller": "false",
        }
        (target / "plugin-descriptor.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in descriptor.items())
        )
        if module.security_policy:
            (target / "plugin-security.policy").write_text(module.security_policy)


def copy_resolved(source: Path, parent: Path) -> Path:
    """A copy of the resolved component `source` in `parent` (made if missing or stale: the markers
    differ), for a service account that cannot read the artifact cache in the user's home. The copy
    keeps the modes, which `_readable_by_all` opened for every user."""
    if not parent.is_dir():
        parent.mkdir(parents=True)
        parent.chmod(0o755)  # whatever the umask: the service account must pass through
    target = parent / source.name
    wanted = (source / MARKER).read_text()
    with contextlib.suppress(OSError):
        if (target / MARKER).read_text() == wanted:
            return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=True)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def resolve_artifacts(
    paths: StackPaths, java: JavaRuntime, report: Report, *, keycloak: bool = False, secure: bool = False
) -> Artifacts:
    return Resolver(paths, java, report).resolve(keycloak=keycloak, secure=secure)

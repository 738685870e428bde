"""Keycloak, the local identity provider: started only on demand (`ki stack up --idp`, `ki stack start
keycloak`), for trying OIDC callers and for the provider tests (tests/idp/).

It runs in dev mode (its own file database in the state directory) from a copy of the distribution
unpacked there, on loopback, with the realm `ki` of apps/dev/stack/keycloak/ki-realm.json imported at the
first start: users anna (group mietrecht), ben (group arbeitsrecht) and root (realm role admin), password
`<name>-demo-password`; clients ki-search (RS256), ki-search-es256, ki-search-short (2 s tokens) and
ki-other (no ki-search audience). The bootstrap administrator's password is generated at the first start
into `<state>/admin-password` (readable by the invoking user only). Keycloak 26 needs Java 21+: the first
such JDK under /usr/lib/jvm unless `stack.keycloak_java_home` names one.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from apps.dev.stack.artifacts import MARKER, extract
from apps.dev.stack.errors import StackError
from apps.dev.stack.http import HttpError, request_json
from apps.dev.stack.java import JavaRuntime, find_java_at_least
from apps.dev.stack.process import Launch
from apps.dev.stack.service import Runtime, Service
from apps.dev.stack.settings import stack_settings

REALM_FILE = Path(__file__).with_name("keycloak") / "ki-realm.json"
REALM = "ki"
ADMIN_USER = "admin"
MIN_JAVA = 21


class Keycloak(Service):
    name = "keycloak"

    @property
    def ports(self) -> tuple[int, ...]:
        return (stack_settings(self.settings).keycloak_port,)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.base_url}/realms/{REALM}"

    @property
    def dist(self) -> Path:
        return self.state_dir / "dist"

    @property
    def admin_password_file(self) -> Path:
        return self.state_dir / "admin-password"

    def command_marker(self, state_dir: Path) -> str:
        return f"-Dkc.home.dir={state_dir / 'dist'}/bin/.."

    def start_timeout_s(self, stack_default_s: float) -> float:
        return stack_settings(self.settings).keycloak_start_timeout_s

    def java(self, runtime: Runtime) -> JavaRuntime:
        if runtime.java.version >= MIN_JAVA and not stack_settings(self.settings).keycloak_java_home:
            return runtime.java
        own_java = stack_settings(self.settings).keycloak_java_home
        return find_java_at_least(MIN_JAVA, own_java, "stack.keycloak_java_home")

    def _unpack(self, archive: Path) -> None:
        """The distribution unpacked into the state directory once (Keycloak writes its build and its
        database below its home, so it never runs from the shared artifact cache)."""
        marker = self.dist / MARKER
        if marker.is_file() and marker.read_text().strip() == archive.name:
            return
        staging = self.dist.with_name("dist.partial")
        shutil.rmtree(staging, ignore_errors=True)
        extract(archive, staging, strip_top=True)
        (staging / MARKER).write_text(archive.name + "\n")
        shutil.rmtree(self.dist, ignore_errors=True)
        staging.rename(self.dist)

    def _admin_password(self) -> str:
        if not self.admin_password_file.is_file():
            self.admin_password_file.write_text(secrets.token_urlsafe(18) + "\n")
            self.admin_password_file.chmod(0o600)
        return self.admin_password_file.read_text().strip()

    def prepare(self, runtime: Runtime) -> Launch:
        if runtime.artifacts.keycloak_archive is None:
            raise StackError("the Keycloak distribution was not resolved (start it with `ki stack up --idp`)")
        self._unpack(runtime.artifacts.keycloak_archive)
        imports = self.dist / "data" / "import"
        imports.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REALM_FILE, imports / REALM_FILE.name)  # imported at the first start only
        java = self.java(runtime)
        env = {
            "JAVA_HOME": str(java.home),
            "JAVA_OPTS_KC_HEAP": "-Xms128m -Xmx512m",
            **({"JAVA_OPTS_APPEND": "-XX:TieredStopAtLevel=1"} if stack_settings(self.settings).quick_jit else {}),
            "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN_USER,
            "KC_BOOTSTRAP_ADMIN_PASSWORD": self._admin_password(),
            "HOME": str(self.state_dir),
        }
        argv = [str(self.dist / "bin" / "kc.sh"), "start-dev", f"--http-host={self.host}",
                f"--http-port={self.port}", "--import-realm"]  # fmt: skip
        return Launch(argv, cwd=self.state_dir, env=env, reads=(self.dist, java.home))

    def probe(self) -> str | None:
        url = f"{self.issuer}/.well-known/openid-configuration"
        try:
            status, document = request_json("GET", url, timeout=3)
        except HttpError as exc:
            return str(exc)
        if status != 200 or not isinstance(document, dict):
            return f"GET {url} answered {status}"
        if document.get("issuer") != self.issuer:
            return f"realm {REALM} names the issuer {document.get('issuer')!r}"
        return None

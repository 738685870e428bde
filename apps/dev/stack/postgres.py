"""PostgreSQL from the Debian server packages, with logical decoding on for Debezium (pgoutput).

The cluster has a password-less superuser reachable only through the private Unix socket directory;
the application role (settings.database.user: LOGIN REPLICATION for Debezium, CREATEDB so tests can
make scratch databases) and its database are (re)asserted on every `up`, so a password changed in the
settings takes effect on the next `up`.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import psycopg
from psycopg import sql

from apps.dev.checkout import REPO_ROOT, require_checkout
from apps.dev.stack import process
from apps.dev.stack.errors import StackError
from apps.dev.stack.process import Launch
from apps.dev.stack.secure import POSTGRES_ROLES, SecureMaterial
from apps.dev.stack.service import Runtime, Service
from apps.dev.stack.settings import stack_settings

SUPERUSER = "postgres"
BIN_GLOB = "/usr/lib/postgresql/*/bin"  # Debian / Ubuntu layout
REPLICATION_SLOTS = 10
ROLES_SQL = REPO_ROOT / "deploy" / "postgres" / "roles.sql"


def find_bin_dir() -> Path:
    """The directory with `postgres` and `initdb`: on PATH, else the newest Debian install."""
    on_path = shutil.which("postgres")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted(
        Path("/").glob(BIN_GLOB.lstrip("/")), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )[::-1]
    for directory in candidates:
        if (directory / "postgres").is_file() and (directory / "initdb").is_file():
            return directory
    raise StackError("PostgreSQL server binaries not found (install postgresql-15; scripts/bootstrap.sh does)")


class Postgres(Service):
    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: disconnect clients, checkpoint, exit
    refuses_root = True

    @property
    def host(self) -> str:
        return self.settings.database.host

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.settings.database.port,)

    @property
    def pgdata(self) -> Path:
        return self.state_dir / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.state_dir / "socket"

    def command_marker(self, state_dir: Path) -> str:
        return f"-D {state_dir / 'pgdata'}"

    def prepare(self, runtime: Runtime) -> Launch:
        bin_dir = find_bin_dir()
        self.user.make_dir(self.socket_dir, 0o700)
        if not (self.pgdata / "PG_VERSION").is_file():
            shutil.rmtree(self.pgdata, ignore_errors=True)  # an interrupted initdb
            initdb = [
                str(bin_dir / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER,
                "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-locale",
            ]  # fmt: skip
            process.run_once(Launch(initdb, cwd=self.state_dir), self.log_file, self.user, "initdb")
        self.user.write(self.pgdata / "pg_hba.conf", self._hba(stack_settings(self.settings).secure), mode=0o600)
        options = {
            "listen_addresses": self.host,
            "port": self.port,
            "unix_socket_directories": self.socket_dir,
            "unix_socket_permissions": "0700",
            "wal_level": "logical",
            "max_replication_slots": REPLICATION_SLOTS,
            "max_wal_senders": REPLICATION_SLOTS,
            "logging_collector": "off",
            "log_line_prefix": "%m [%p] %q%u@%d ",
        }
        if stack_settings(self.settings).secure:
            options.update(self._tls_files())
        argv = [str(bin_dir / "postgres"), "-D", str(self.pgdata)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        return Launch(argv, cwd=self.state_dir, reads=(bin_dir,))

    def _tls_files(self) -> dict[str, object]:
        """The secured profile's server certificate and key, copied where only the service account reads
        the key (PostgreSQL refuses a key others can read)."""
        material = SecureMaterial.of(self.settings)
        cert, key = self.state_dir / "server.pem", self.state_dir / "server-key.pem"
        self.user.write(cert, material.server_cert.read_text(), mode=0o644)
        self.user.write(key, material.server_key.read_text(), mode=0o600)
        return {"ssl": "on", "ssl_cert_file": cert, "ssl_key_file": key, "ssl_min_protocol_version": "TLSv1.2"}

    @staticmethod
    def _hba(secure: bool = False) -> str:
        # Secured: TCP only over TLS ("hostssl"); a plaintext connection finds no entry and is refused.
        host = "hostssl" if secure else "host"
        return (
            "# Written by `ki stack up`; edits are overwritten.\n"
            "# The socket directory is private to the service account: trust there only.\n"
            "local    all          all                  trust\n"
            f"{host:<8} all          all   127.0.0.1/32   scram-sha-256\n"
            f"{host:<8} all          all   ::1/128        scram-sha-256\n"
            f"{host:<8} replication  all   127.0.0.1/32   scram-sha-256\n"
            f"{host:<8} replication  all   ::1/128        scram-sha-256\n"
        )

    def apply_roles(self) -> None:
        """The least-privilege roles (deploy/postgres/roles.sql, after the migrations) with the secured
        profile's passwords as logins."""
        require_checkout("`ki stack up --secure` (its roles are the repository's deploy/postgres/roles.sql)")
        material = SecureMaterial.of(self.settings)
        with self.superuser(self.settings.database.name) as conn:
            conn.execute(ROLES_SQL.read_text())
            for role in POSTGRES_ROLES:
                password = sql.Literal(material.password("postgres", role))
                conn.execute(sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), password))

    def superuser(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """The cluster's superuser over the private socket (the stack's own administration, and tests)."""
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user=SUPERUSER, dbname=dbname,
            connect_timeout=3, autocommit=True,
        )  # fmt: skip

    def probe(self) -> str | None:
        try:
            with self.superuser() as conn:
                conn.execute("select 1")
        except psycopg.Error as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None

    def after_healthy(self) -> None:
        """Assert the application role (password from the settings) and its database."""
        db = self.settings.database
        role, password = sql.Identifier(db.user), sql.Literal(db.password)
        with self.superuser() as conn:
            exists = conn.execute("select 1 from pg_roles where rolname = %s", (db.user,)).fetchone()
            verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
            conn.execute(sql.SQL("{} ROLE {} LOGIN REPLICATION CREATEDB PASSWORD {}").format(verb, role, password))
            if not conn.execute("select 1 from pg_database where datname = %s", (db.name,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db.name), role))
        try:
            with psycopg.connect(db.dsn, connect_timeout=3) as conn:
                conn.execute("select 1")
        except psycopg.Error as exc:
            raise StackError(f"cannot log in as {db.user!r} over TCP: {str(exc).strip()}") from None

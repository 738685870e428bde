"""The secured profile of the local stack (`ki stack up --secure`): TLS and credentials on every service.

Generated once per stack home into `<home>/secure/` (kept until `ki stack wipe`):
* a CA and one server certificate (for 127.0.0.1 and localhost) shared by PostgreSQL, Kafka, Connect's
  REST API and OpenSearch, plus OpenSearch's administrator certificate (the security plugin's admin DN);
* one password per login, each in a file readable by the invoking user only;
* Connect's REST login (`operator`), checked by Kafka's basic-authentication REST extension;
* three client environments (`operator.env`, `worker.env`, `api.env`): the `KI_*` settings of each role,
  naming files for every secret (nothing secret is written into an env file), so

      set -a; . ~/.cache/ki-sidecar/secure/operator.env; set +a

  points every `ki` command at the secured stack. `up --secure` loads `operator.env` itself.

`python -m apps.dev.stack.secure` generates the same material without starting anything, plus what
docker-compose.secure.yml mounts besides it (`write_compose_files`), and prints the directory.

The logins follow deploy/postgres/roles.sql and the OpenSearch roles below: the operator owns the schema
and the index (migrations, `ki rebuild`), the worker writes the ki indices, the API reads them, Debezium
replicates. Kafka's controller listener stays plaintext on loopback (broker-internal); the clients' listener
is SASL_SSL (PLAIN over TLS).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, load_settings

ORGANISATION = "ki-sidecar local stack"
NODE_CN = "ki-node"
ADMIN_CN = "ki-admin"
VALID_DAYS = 825
#: Logins per service. PostgreSQL's operator is `database.user` (the schema's owner). Kafka: one per role, each
#: allowed only its own topics and groups (kafka_acls.py); `broker` the only super user.
KAFKA_SUPER_USER = "broker"
KAFKA_ROLE_LOGINS = {"operator": "ki_operator", "worker": "ki_worker", "api": "ki_api"}
KAFKA_USERS = (KAFKA_SUPER_USER, "connect", *KAFKA_ROLE_LOGINS.values())
OPENSEARCH_USERS = ("admin", "ki_operator", "ki_worker", "ki_api")
POSTGRES_ROLES = ("ki_api", "ki_worker", "ki_debezium")
#: Connect's REST API: only the operator registers and inspects the connector.
CONNECT_REST_USER = "operator"
ROLES = ("operator", "worker", "api")


def distinguished_name(common_name: str) -> str:
    """The DN as OpenSearch's security plugin writes it (RFC 2253, most specific first)."""
    return _name(common_name).rfc4514_string()


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8, unencrypted: the one form PostgreSQL, Kafka's PEM keystore and OpenSearch all read.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issue_certificate(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A P-256 key and its certificate: self-signed CA when `issuer` is None, else signed by it."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    issuer_name, signer = issuer if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes | str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data.encode() if isinstance(data, str) else data)
    partial.chmod(mode)
    partial.rename(path)


@dataclass(frozen=True)
class SecureMaterial:
    """The files of `<home>/secure/`."""

    root: Path

    @classmethod
    def of(cls, settings: Settings) -> SecureMaterial:
        return cls(Path(stack_settings(settings).home).expanduser() / "secure")

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca-key.pem"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server-key.pem"

    @property
    def server_bundle(self) -> Path:
        """Key and certificate in one file (Kafka's and Connect's PEM keystore)."""
        return self.root / "server-bundle.pem"

    @property
    def admin_cert(self) -> Path:
        return self.root / "admin.pem"

    @property
    def admin_key(self) -> Path:
        return self.root / "admin-key.pem"

    def password_file(self, service: str, user: str) -> Path:
        return self.root / "passwords" / f"{service}-{user}"

    def password(self, service: str, user: str) -> str:
        return self.password_file(service, user).read_text().strip()

    def env_file(self, role: str) -> Path:
        return self.root / f"{role}.env"

    @property
    def complete(self) -> bool:
        return all(self.env_file(role).is_file() for role in ROLES)

    # -- generation ----------------------------------------------------------------------------------

    def ensure(self, settings: Settings) -> bool:
        """Generate whatever is missing (certificates and passwords once; env files every time, from
        the settings). Returns True when certificates were made now."""
        made = False
        if not (self.ca_cert.is_file() and self.server_bundle.is_file() and self.admin_key.is_file()):
            self._certificates()
            made = True
        logins = [("postgres", settings.database.user), *(("postgres", r) for r in POSTGRES_ROLES)]
        logins += [("kafka", u) for u in KAFKA_USERS] + [("opensearch", u) for u in OPENSEARCH_USERS]
        logins.append(("connect", CONNECT_REST_USER))
        for service, user in logins:
            if not self.password_file(service, user).is_file():
                _write(self.password_file(service, user), secrets.token_urlsafe(24) + "\n")
        for role in ROLES:
            lines = [f"{key}={value}" for key, value in client_env(settings, self, role).items()]
            _write(self.env_file(role), "# Written by `ki stack up --secure`; no secret in here, only file names.\n"
                   + "\n".join(lines) + "\n", mode=0o644)  # fmt: skip
        return made

    def _certificates(self) -> None:
        ca_key, ca = issue_certificate("ki-local-ca", None)
        issuer = (ca.subject, ca_key)
        server_key, server = issue_certificate(NODE_CN, issuer, server=True)
        admin_key, admin = issue_certificate(ADMIN_CN, issuer)
        _write(self.ca_key, _pem_key(ca_key))
        _write(self.server_key, _pem_key(server_key))
        _write(self.server_bundle, _pem_key(server_key) + pem_cert(server))
        _write(self.admin_key, _pem_key(admin_key))
        _write(self.server_cert, pem_cert(server), mode=0o644)
        _write(self.admin_cert, pem_cert(admin), mode=0o644)
        _write(self.ca_cert, pem_cert(ca), mode=0o644)  # last: its presence means "done"


def client_env(settings: Settings, material: SecureMaterial, role: str) -> dict[str, str]:
    """The `KI_*` settings of one role against the secured stack (secrets as `*_FILE` names)."""
    if role not in ROLES:
        raise ValueError(f"role: one of {', '.join(ROLES)}, not {role!r}")
    host_port = settings.opensearch.url.split("://", 1)[-1].rstrip("/")
    connect_host_port = settings.connect.url.split("://", 1)[-1].rstrip("/")
    db_user = {"operator": settings.database.user, "worker": "ki_worker", "api": "ki_api"}[role]
    os_user = {"operator": "ki_operator", "worker": "ki_worker", "api": "ki_api"}[role]
    ca = str(material.ca_cert)
    rest_login = {  # only the operator talks to Connect's REST API
        "KI_CONNECT__USERNAME": CONNECT_REST_USER,
        "KI_CONNECT__PASSWORD_FILE": str(material.password_file("connect", CONNECT_REST_USER)),
    }
    return {
        "KI_STACK__SECURE": "true",
        "KI_STACK__HOME": str(Path(stack_settings(settings).home).expanduser()),
        "KI_DATABASE__USER": db_user,
        "KI_DATABASE__PASSWORD_FILE": str(material.password_file("postgres", db_user)),
        "KI_DATABASE__SSLMODE": "verify-full",
        "KI_DATABASE__SSLROOTCERT": ca,
        "KI_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "KI_KAFKA__SASL_MECHANISM": "PLAIN",
        "KI_KAFKA__SASL_USERNAME": KAFKA_ROLE_LOGINS[role],
        "KI_KAFKA__SASL_PASSWORD_FILE": str(material.password_file("kafka", KAFKA_ROLE_LOGINS[role])),
        "KI_KAFKA__SSL_CA_FILE": ca,
        "KI_OPENSEARCH__URL": f"https://{host_port}",
        "KI_OPENSEARCH__USERNAME": os_user,
        "KI_OPENSEARCH__PASSWORD_FILE": str(material.password_file("opensearch", os_user)),
        "KI_OPENSEARCH__CA_FILE": ca,
        "KI_CONNECT__URL": f"https://{connect_host_port}",
        "KI_CONNECT__CA_FILE": ca,
        "KI_CONNECT__DATABASE_USER": "ki_debezium",
        "KI_CONNECT__DATABASE_PASSWORD_FILE": str(material.password_file("postgres", "ki_debezium")),
        **(rest_login if role == "operator" else {}),
    }


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines (comments and blanks skipped), as `set -a; . file` would export them."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def opensearch_security_files(settings: Settings, material: SecureMaterial) -> dict[str, str]:
    """The security plugin's users, roles and their mapping (YAML as JSON, which YAML reads), loaded into
    its index at the first start (`allow_default_init_securityindex`)."""

    def hashed(user: str) -> str:
        return bcrypt.hashpw(material.password("opensearch", user).encode(), bcrypt.gensalt(12)).decode()

    ki_indices = [f"{settings.retrieval.index_name}*"]
    users = {
        "_meta": {"type": "internalusers", "config_version": 2},
        **{user: {"hash": hashed(user), "reserved": user == "admin", "description": f"ki-sidecar {user}"}
           for user in OPENSEARCH_USERS},
    }  # fmt: skip
    writer = {
        "cluster_permissions": ["cluster_monitor", "cluster_composite_ops", "indices:admin/aliases"],
        "index_permissions": [{"index_patterns": ki_indices, "allowed_actions": ["indices_all"]}],
    }
    roles = {
        "_meta": {"type": "roles", "config_version": 2},
        # The sync worker (and `ki backfill`): writes the ki indices, creates one and swaps the alias.
        "ki_worker": writer,
        # The operator (`ki rebuild`, index lifecycle): the same on the ki indices, nothing else.
        "ki_operator": writer,
        # The search API: reads the ki indices and their statistics, and refreshes them for a consistency token
        # (search.consistency: what the lanes acknowledged, searchable at once; a refresh changes no data).
        "ki_api": {
            "cluster_permissions": ["cluster_monitor", "cluster_composite_ops_ro"],
            "index_permissions": [
                {
                    "index_patterns": ki_indices,
                    "allowed_actions": [
                        "read",
                        "indices_monitor",
                        "indices:admin/get",
                        "indices:admin/aliases/get",
                        "indices:admin/refresh",
                    ],
                }
            ],
        },  # fmt: skip
    }
    mapping = {
        "_meta": {"type": "rolesmapping", "config_version": 2},
        "all_access": {"reserved": False, "users": ["admin"]},
        **{role: {"users": [role]} for role in ("ki_worker", "ki_operator", "ki_api")},
    }
    return {
        "internal_users.yml": json.dumps(users, indent=1),
        "roles.yml": json.dumps(roles, indent=1),
        "roles_mapping.yml": json.dumps(mapping, indent=1),
    }


def connect_rest_keystore(material: SecureMaterial) -> bytes:
    """Connect's REST server (Jetty) reads a PKCS#12 keystore, not PEM: the server key and certificate in one,
    under the `connect` login's password."""
    key = serialization.load_pem_private_key(material.server_key.read_bytes(), None)
    cert = x509.load_pem_x509_certificate(material.server_cert.read_bytes())
    encryption = serialization.BestAvailableEncryption(material.password("kafka", "connect").encode())
    return pkcs12.serialize_key_and_certificates(b"ki-connect", key, cert, None, encryption)  # type: ignore[arg-type]


# -- docker-compose.secure.yml ------------------------------------------------------------------------

#: Beside the material: OpenSearch's users and roles, Connect's REST keystore, the Kafka ACLs.
COMPOSE_SECURITY_DIR = "opensearch-security"
COMPOSE_REST_KEYSTORE = "connect-rest.p12"
COMPOSE_ACL_ARGUMENTS = "kafka-acls.args"


def write_compose_files(settings: Settings, material: SecureMaterial) -> None:
    """What docker-compose.secure.yml mounts besides the material, made by the code the native profile
    runs: OpenSearch's security files, Connect's REST keystore (PKCS#12, as connect.py makes it: Jetty reads
    no PEM) and every role's ACLs as `kafka-acls.sh` arguments (kafka_acls.py)."""
    from apps.dev.stack.kafka_acls import acl_arguments

    for name, text in opensearch_security_files(settings, material).items():
        _write(material.root / COMPOSE_SECURITY_DIR / name, text)
    _write(material.root / COMPOSE_REST_KEYSTORE, connect_rest_keystore(material))
    _write(material.root / COMPOSE_ACL_ARGUMENTS, "".join(f"{line}\n" for line in acl_arguments(settings)), 0o644)


def main(argv: list[str] | None = None) -> int:
    """`python -m apps.dev.stack.secure`: the secured profile's material in <stack.home>/secure, generated
    where missing as `ki stack up --secure` does, and the files docker-compose.secure.yml mounts; prints the
    directory (the compose file's KI_SECURE_DIR)."""
    parser = argparse.ArgumentParser(prog="python -m apps.dev.stack.secure", description=main.__doc__)
    parser.parse_args(argv)
    settings = load_settings()
    material = SecureMaterial.of(settings)
    if material.ensure(settings):
        print(f"secure: generated a CA, certificates and passwords in {material.root}", file=sys.stderr)
    write_compose_files(settings, material)
    print(material.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

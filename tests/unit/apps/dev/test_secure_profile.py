"""The secured profile's pure parts (apps/dev/stack/secure.py and the services' secured configuration):
certificates that verify against the generated CA for the stack's host names, secrets only in files of
the invoking user, env files naming files and never a secret, roles that confine each login."""

from __future__ import annotations

import ipaddress
import json
import stat
from pathlib import Path

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from apps.dev.stack.kafka import Kafka
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.postgres import Postgres
from apps.dev.stack.secure import ROLES, SecureMaterial, opensearch_security_files, read_env_file
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, load_settings


def secured(tmp_path: Path) -> tuple[Settings, SecureMaterial]:
    settings = load_settings(environ={"KI_STACK__HOME": str(tmp_path), "KI_STACK__SECURE": "true"})
    material = SecureMaterial.of(settings)
    assert material.ensure(settings) is True
    return settings, material


def test_the_server_certificate_is_signed_by_the_ca_for_the_stack_hosts(tmp_path: Path) -> None:
    _, material = secured(tmp_path)
    ca = x509.load_pem_x509_certificate(material.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(material.server_cert.read_bytes())
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_secrets_live_in_files_of_the_invoking_user_and_no_env_file_holds_one(tmp_path: Path) -> None:
    settings, material = secured(tmp_path)
    secret_files = [material.ca_key, material.server_key, material.server_bundle, material.admin_key,
                    *(material.root / "passwords").iterdir()]  # fmt: skip
    assert len(secret_files) > 10
    for path in secret_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    passwords = {p.read_text().strip() for p in (material.root / "passwords").iterdir()}
    assert len(passwords) == len(list((material.root / "passwords").iterdir())), "every login has its own password"
    for role in ROLES:
        text = material.env_file(role).read_text()
        assert not any(password in text for password in passwords), role
        env = read_env_file(material.env_file(role))
        for key, value in env.items():
            if key.endswith("_FILE"):
                assert Path(value).is_file(), (role, key)
        secured_settings = load_settings(environ=env)
        assert stack_settings(secured_settings).secure
        assert secured_settings.database.sslmode == "verify-full"
        assert secured_settings.kafka.security_protocol == "SASL_SSL"
        assert secured_settings.opensearch.url.startswith("https://")
        assert secured_settings.database.password in passwords  # read from its file


def test_a_second_ensure_keeps_the_ca_and_the_passwords(tmp_path: Path) -> None:
    settings, material = secured(tmp_path)
    ca, password = material.ca_cert.read_bytes(), material.password("opensearch", "ki_worker")
    assert material.ensure(settings) is False
    assert material.ca_cert.read_bytes() == ca and material.password("opensearch", "ki_worker") == password


def test_roles_confine_each_opensearch_login_to_the_ki_indices(tmp_path: Path) -> None:
    settings, material = secured(tmp_path)
    files = {name: json.loads(text) for name, text in opensearch_security_files(settings, material).items()}
    users = files["internal_users.yml"]
    for user in ("admin", "ki_operator", "ki_worker", "ki_api"):
        assert bcrypt.checkpw(material.password("opensearch", user).encode(), users[user]["hash"].encode())
    roles = files["roles.yml"]
    pattern = f"{settings.retrieval.index_name}*"
    for role in ("ki_worker", "ki_operator", "ki_api"):
        assert [p["index_patterns"] for p in roles[role]["index_permissions"]] == [[pattern]]
    assert "indices_all" not in json.dumps(roles["ki_api"]), "the API only reads"
    mapping = files["roles_mapping.yml"]
    assert mapping["all_access"]["users"] == ["admin"]
    assert {role: mapping[role]["users"] for role in ("ki_worker", "ki_api")} == {
        "ki_worker": ["ki_worker"],
        "ki_api": ["ki_api"],
    }


def test_secured_services_accept_only_tls_clients(tmp_path: Path) -> None:
    settings, material = secured(tmp_path)
    hba = Postgres._hba(secure=True)
    assert "hostssl" in hba and "\nhost " not in hba and "trust" in hba.split("\n")[2]  # trust only on the socket
    kafka = Kafka(settings, StackPaths.from_settings(settings)).secure_config()
    assert kafka["sasl.enabled.mechanisms"] == "PLAIN"
    jaas = str(kafka["listener.name.sasl_ssl.plain.sasl.jaas.config"])
    for user in ("broker", "connect", "ki_operator", "ki_worker", "ki_api"):
        assert f'user_{user}="{material.password("kafka", user)}"' in jaas
    # No ACL, no access; the broker alone is a super user, and the controller listener authenticates it too.
    assert kafka["authorizer.class.name"].endswith("StandardAuthorizer") and kafka["super.users"] == "User:broker"
    assert kafka["allow.everyone.if.no.acl.found"] is False
    assert "CONTROLLER:SASL_PLAINTEXT" in str(kafka["listener.security.protocol.map"])
    assert kafka["ssl.truststore.location"] == material.ca_cert

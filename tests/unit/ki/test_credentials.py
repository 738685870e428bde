"""TLS and credentials to every service, from the settings: secrets from files, never in a repr, redacted;
each client's options built from them (PostgreSQL, OpenSearch, Kafka for librdkafka and Faust, Connect's
REST API, Debezium's connection to PostgreSQL)."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import faust
import pytest

from apps.dev.stack.connector import connect_auth, connector_config
from apps.dev.stack.http import request_json
from ki.clients import LIBRDKAFKA_LOG, _connect_args, kafka_config, opensearch_options
from ki.errors import SettingsError
from ki.settings import Settings, load_settings
from streams.app import broker_credentials

SASL = {"KI_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "KI_KAFKA__SASL_USERNAME": "ki-worker",
        "KI_KAFKA__SASL_PASSWORD": "kafka-pass-123"}  # fmt: skip


def settings(**env: str) -> Settings:
    return load_settings(environ=env)


def test_a_secret_is_read_from_its_file_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "db-password"
    secret.write_text("from-a-file-0815\n")
    assert settings(KI_DATABASE__PASSWORD_FILE=str(secret)).database.password == "from-a-file-0815"
    key = tmp_path / "jwt"
    key.write_text("a-jwt-secret-of-32-characters-xx")
    assert settings(KI_API__JWT__SECRET_FILE=str(key)).api.jwt.secret == "a-jwt-secret-of-32-characters-xx"
    with pytest.raises(SettingsError) as err:
        settings(KI_OPENSEARCH__PASSWORD_FILE=str(tmp_path / "missing"))
    assert str(err.value) == f"config error: opensearch.password_file: cannot read {tmp_path / 'missing'}: " \
        "No such file or directory"  # fmt: skip


def test_secrets_never_appear_in_a_repr_and_are_redacted() -> None:
    s = settings(KI_DATABASE__PASSWORD="pg-secret-4711", KI_OPENSEARCH__USERNAME="ki",
                 KI_OPENSEARCH__PASSWORD="os-secret-4712", **SASL)  # fmt: skip
    shown = repr(s) + str(s.database) + str(s.kafka) + str(s.opensearch)
    for secret in ("pg-secret-4711", "os-secret-4712", "kafka-pass-123", s.api.jwt.secret):
        assert secret not in shown
    line = "connection to postgresql://ki:pg-secret-4711@db failed; sasl kafka-pass-123"
    assert s.redact(line) == "connection to postgresql://ki:***@db failed; sasl ***"
    assert settings().redact("ki-sidecar on ki") == "ki-sidecar on ki"  # the 2-letter local password stays


def test_sasl_without_credentials_is_refused() -> None:
    with pytest.raises(SettingsError, match="kafka.sasl_username: SASL_SSL needs sasl_username and sasl_password"):
        settings(KI_KAFKA__SECURITY_PROTOCOL="SASL_SSL")


def test_kafka_clients_get_tls_and_sasl() -> None:
    assert kafka_config(settings()) == {"bootstrap.servers": "127.0.0.1:59092", "logger": LIBRDKAFKA_LOG}
    config = kafka_config(settings(**SASL, KI_KAFKA__SSL_CA_FILE="/etc/ki/ca.pem"), **{"group.id": "g"})
    assert config == {
        "bootstrap.servers": "127.0.0.1:59092", "logger": LIBRDKAFKA_LOG, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ki-worker", "sasl.password": "kafka-pass-123", "ssl.ca.location": "/etc/ki/ca.pem",
        "group.id": "g",
    }  # fmt: skip
    assert broker_credentials(settings()) is None
    sasl = broker_credentials(settings(**SASL))
    assert isinstance(sasl, faust.SASLCredentials) and sasl.protocol.value == "SASL_SSL"
    assert sasl.mechanism.value == "SCRAM-SHA-512" and sasl.username == "ki-worker"
    assert isinstance(broker_credentials(settings(KI_KAFKA__SECURITY_PROTOCOL="SSL")), faust.SSLCredentials)
    plain = broker_credentials(settings(**{**SASL, "KI_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT"}))
    assert isinstance(plain, faust.SASLCredentials) and plain.protocol.value == "SASL_PLAINTEXT"


def test_opensearch_clients_get_credentials_and_tls_by_the_urls_scheme() -> None:
    assert opensearch_options(settings()) == {"hosts": ["http://127.0.0.1:59200"]}
    secured = settings(KI_OPENSEARCH__URL="https://127.0.0.1:59200", KI_OPENSEARCH__USERNAME="ki_search",
                       KI_OPENSEARCH__PASSWORD="os-secret-4712", KI_OPENSEARCH__CA_FILE="/etc/ki/ca.pem")  # fmt: skip
    assert opensearch_options(secured) == {
        "hosts": ["https://127.0.0.1:59200"], "http_auth": ("ki_search", "os-secret-4712"), "use_ssl": True,
        "verify_certs": True, "ssl_show_warn": True, "ca_certs": "/etc/ki/ca.pem",
    }  # fmt: skip


def test_postgresql_and_debezium_get_the_tls_parameters() -> None:
    s = settings(KI_DATABASE__SSLMODE="verify-full", KI_DATABASE__SSLROOTCERT="/etc/ki/ca.pem")
    assert _connect_args(s, {"options": "-c jit=off"}, None) == {
        "options": "-c jit=off", "sslmode": "verify-full", "sslrootcert": "/etc/ki/ca.pem"
    }  # fmt: skip
    assert "sslrootcert=/etc/ki/ca.pem" in s.database.dsn
    config = connector_config(s)
    assert config["database.sslmode"] == "verify-full" and config["database.sslrootcert"] == "/etc/ki/ca.pem"
    assert not any(key.startswith("database.ssl") for key in connector_config(settings()))  # unchanged default


class _Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = json.dumps({"authorization": self.headers.get("Authorization", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_connects_rest_api_gets_basic_credentials(echo: str) -> None:
    auth = connect_auth(settings(KI_CONNECT__USERNAME="ki-operator", KI_CONNECT__PASSWORD="connect-pass-9"))
    assert "connect-pass-9" not in repr(auth)
    status, body = request_json("GET", f"{echo}/connectors", auth=auth)
    expected = "Basic " + base64.b64encode(b"ki-operator:connect-pass-9").decode()
    assert status == 200 and body["authorization"] == expected
    assert request_json("GET", f"{echo}/connectors")[1]["authorization"] == ""


def test_debezium_keeps_skipping_truncates_and_emits_only_the_truncate_markers() -> None:
    # Its truncate event has no key; the compacted CDC topics reject a record without one (the task would fail).
    config = connector_config(settings())
    assert "t" in config["skipped.operations"].split(",")
    assert config["message.prefix.include.list"] == r"ki\.truncate\..+"

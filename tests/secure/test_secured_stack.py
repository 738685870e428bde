"""The secured profile (`ki stack up --secure`, apps/dev/stack/secure.py) end to end: every service refuses
plaintext and anonymous callers; the sync worker, the API and a rebuild run over TLS as their own
least-privileged logins; the worker's OpenSearch user cannot touch another index; a wrong password or an
untrusted certificate fails with one line naming the service.

Run by `KI_TEST_SECURE=1 scripts/test.sh tests/secure`, which starts the secured stack and exports the
operator's settings (`<stack.home>/secure/operator.env`) before pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.http import Auth, HttpError, request_json
from apps.dev.stack.kafka import kafka_metadata_probe
from apps.dev.stack.secure import SecureMaterial, issue_certificate, pem_cert, read_env_file
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, SyncWorker, isolated, remove_world, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def material(settings: Settings) -> SecureMaterial:
    assert stack_settings(settings).secure, "run with the secured stack's operator settings (scripts/test.sh does)"
    return SecureMaterial.of(settings)


def role_env(material: SecureMaterial, role: str) -> dict[str, str]:
    return read_env_file(material.env_file(role))


def opensearch_as(material: SecureMaterial, user: str) -> Auth:
    return Auth(user, material.password("opensearch", user), str(material.ca_cert))


def test_every_service_refuses_plaintext_and_anonymous_callers(settings: Settings, material: SecureMaterial) -> None:
    db = settings.database
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(host=db.host, port=db.port, dbname=db.name, user=db.user, password=db.password,
                        sslmode="disable", connect_timeout=5)  # fmt: skip
    with psycopg.connect(db.dsn, connect_timeout=5) as conn:  # the operator's settings: verify-full
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)

    https = settings.opensearch.url
    with pytest.raises(HttpError):
        request_json("GET", https.replace("https://", "http://"), timeout=5)
    status, _ = request_json("GET", f"{https}/_cluster/health", timeout=5, auth=Auth(ca_file=str(material.ca_cert)))
    assert status == 401
    status, _ = request_json("GET", f"{https}/_cluster/health", timeout=5, auth=opensearch_as(material, "ki_api"))
    assert status == 200

    plaintext = kafka_metadata_probe({"bootstrap.servers": settings.kafka.bootstrap_servers}, timeout_s=3)
    assert plaintext is not None, "the broker answered a plaintext client"
    assert kafka_metadata_probe({"bootstrap.servers": settings.kafka.bootstrap_servers, "security.protocol": "SSL",
                                 "ssl.ca.location": str(material.ca_cert)}, timeout_s=3) is not None  # fmt: skip

    connectors = f"{settings.connect.url}/connectors"
    with pytest.raises(HttpError):
        request_json("GET", connectors.replace("https://", "http://"), timeout=5)
    assert request_json("GET", connectors, timeout=5, auth=Auth(ca_file=str(material.ca_cert)))[0] == 401
    operator = Auth(settings.connect.username, settings.connect.password, str(material.ca_cert))
    assert request_json("GET", connectors, timeout=5, auth=operator) == (200, [settings.connect.connector_name])


def test_the_worker_the_api_and_a_rebuild_run_end_to_end_as_their_logins(
    settings: Settings, material: SecureMaterial, engine: Engine
) -> None:
    # The index name must fall under the roles' index pattern (`<retrieval.index_name>*`), the consumer group
    # under the worker's Kafka ACL (`<streams.app_id>*`).
    secure = "secure"
    with isolated(settings, f"{settings.retrieval.index_name}-{secure}", f"{settings.streams.app_id}-{secure}") as env:
        worker = SyncWorker({**role_env(material, "worker"), **env})
        server = Server("secure-api", **{**role_env(material, "api"), **env})
        worker.start()
        server.start()
        with engine.begin() as conn:  # written by the owner, as an upstream system would
            w = World(conn)
            project, source = w.project("Sicher"), w.source("local_fs")
            doc = w.searchable(project, "Mietvertrag", f"tlswort{w.tag} Der Mietvertrag endet mit Ablauf.",
                               w.source_object(source), "mv")  # fmt: skip
            w.grant("project", project, f"user:anna-{w.tag}")
        try:
            wait_until_indexed(server, settings, [project], {doc}, "a document synced over the secured stack")
            anna = mint_token(settings.api, f"anna-{w.tag}")
            query = {"query": f"tlswort{w.tag}", "mode": "hybrid"}
            status, body = server.call("/v1/search", query, anna)
            assert status == 200 and [h["document_id"] for h in body["hits"]] == [doc], body
            assert server.call("/v1/search", query, mint_token(settings.api, f"ben-{w.tag}"))[1]["hits"] == []

            worker.stop()  # a rebuild replays the topics into a fresh index and swaps the alias: the operator's
            rebuilt = subprocess.run([sys.executable, "-m", "apps.cli", "rebuild"], cwd=REPO_ROOT, env=_env(env),
                                     capture_output=True, text=True, timeout=600)  # fmt: skip
            assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-2000:]
            status, body = server.call("/v1/search", query, anna)
            assert status == 200 and [h["document_id"] for h in body["hits"]] == [doc], body
        finally:
            server.stop()
            worker.stop()
            remove_world(engine, [project], [source])


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **extra}


def test_the_worker_login_cannot_touch_another_index_nor_the_api_write(
    settings: Settings, material: SecureMaterial
) -> None:
    base = settings.opensearch.url
    admin, worker, api = (opensearch_as(material, u) for u in ("admin", "ki_worker", "ki_api"))
    assert request_json("PUT", f"{base}/unrelated-records", {}, auth=admin)[0] in (200, 400)  # 400: exists already
    try:
        assert request_json("PUT", f"{base}/unrelated-records/_doc/1", {"a": 1}, auth=worker)[0] == 403
        assert request_json("GET", f"{base}/unrelated-records/_search", auth=worker)[0] == 403
        assert request_json("DELETE", f"{base}/unrelated-records", auth=worker)[0] == 403
        assert request_json("PUT", f"{base}/another-index", {}, auth=worker)[0] == 403

        own = f"{settings.retrieval.index_name}-secure-probe"
        assert request_json("PUT", f"{base}/{own}", {}, auth=worker)[0] == 200  # its own indices: yes
        assert request_json("PUT", f"{base}/{own}/_doc/1", {"a": 1}, auth=api)[0] == 403  # the API reads only
        assert request_json("GET", f"{base}/{own}/_search", auth=api)[0] == 200
        assert request_json("DELETE", f"{base}/{own}", auth=worker)[0] == 200
    finally:
        request_json("DELETE", f"{base}/unrelated-records", auth=admin)


def ki(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], cwd=REPO_ROOT, env=_env(env),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def one_line_error(**env: str) -> str:
    """`ki sync status` with `env` over the operator's settings: it must fail with exactly one line (lowercased)."""
    result = ki(["sync", "status"], **env)
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0].lower()


def test_a_wrong_password_fails_with_one_line_naming_the_service(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password-0815\n")
    assert "postgres" in one_line_error(KI_DATABASE__PASSWORD_FILE=str(wrong))
    assert "opensearch" in one_line_error(KI_OPENSEARCH__PASSWORD_FILE=str(wrong))
    assert "kafka" in one_line_error(KI_KAFKA__SASL_PASSWORD_FILE=str(wrong))


def test_an_untrusted_certificate_fails_with_one_line_naming_the_service(tmp_path: Path) -> None:
    _, foreign = issue_certificate("some-other-ca", None)
    ca = tmp_path / "foreign-ca.pem"
    ca.write_bytes(pem_cert(foreign))
    for service, setting in {"postgres": "KI_DATABASE__SSLROOTCERT", "opensearch": "KI_OPENSEARCH__CA_FILE",
                             "kafka": "KI_KAFKA__SSL_CA_FILE"}.items():  # fmt: skip
        line = one_line_error(**{setting: str(ca)})
        assert service in line and "certificate" in line, line


def kafka_as(settings: Settings, material: SecureMaterial, login: str) -> dict[str, str]:
    return {"bootstrap.servers": settings.kafka.bootstrap_servers, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN", "sasl.username": login, "sasl.password": material.password("kafka", login),
            "ssl.ca.location": str(material.ca_cert)}  # fmt: skip


def produce_error(config: dict[str, str], topic: str) -> int | None:
    """The error code of one record produced to `topic` (None: written)."""
    from confluent_kafka import Producer

    errors: list[int | None] = []
    producer = Producer({**config, "message.timeout.ms": 15000})
    producer.produce(topic, b"probe", on_delivery=lambda err, _msg: errors.append(err.code() if err else None))
    producer.flush(30)
    assert errors, f"no delivery report for {topic}"
    return errors[0]


def test_each_kafka_login_is_refused_what_its_role_does_not_need(settings: Settings, material: SecureMaterial) -> None:
    """One Kafka login per role (apps/dev/stack/kafka_acls.py): the API reads only the access tables' topics,
    the worker writes no CDC topic and reads no Connect topic, nobody joins another's group."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka.admin import AdminClient

    grants, dlq = "ki.public.grants", settings.streams.dlq_topic
    visible = {login: set(AdminClient(kafka_as(settings, material, login)).list_topics(timeout=15).topics)
               for login in ("ki_api", "ki_worker", "ki_operator")}  # fmt: skip
    assert grants in visible["ki_api"] and dlq not in visible["ki_api"]
    assert not any(topic.startswith("ki-connect-") for topic in visible["ki_api"] | visible["ki_worker"])
    assert grants in visible["ki_worker"] and "ki-connect-offsets" in visible["ki_operator"]
    refused = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(kafka_as(settings, material, "ki_api"), grants) == refused
    assert produce_error(kafka_as(settings, material, "ki_worker"), grants) == refused  # CDC: Debezium's alone
    consumer = Consumer({**kafka_as(settings, material, "ki_api"), "group.id": f"{settings.streams.app_id}-probe"})
    try:
        consumer.subscribe([grants])
        message = consumer.poll(15)
        while message is not None and message.error() is None:
            message = consumer.poll(15)
        assert message is not None and message.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()

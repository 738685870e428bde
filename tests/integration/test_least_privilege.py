"""The least-privilege roles of deploy/postgres/roles.sql on the live PostgreSQL: the API's role reads what
search needs and writes only its statistics (never a grant), the worker's reads only, Debezium's may
replicate and beat its heart; the real `ki serve` runs end to end as the API's role."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors
from sqlalchemy import Engine

from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.postgres import Postgres
from ki.db.models import HEARTBEAT_ACTION_QUERY
from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, SyncWorker, isolated, remove_world, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack

ROLES_SQL = REPO_ROOT / "deploy" / "postgres" / "roles.sql"
ROLES = ("ki_api", "ki_worker", "ki_debezium")


@pytest.fixture(scope="module")
def passwords(settings: Settings) -> Iterator[dict[str, str]]:
    postgres = Postgres(settings, StackPaths.from_settings(settings))
    chosen = {role: secrets.token_urlsafe(12) for role in ROLES}
    with postgres.superuser(settings.database.name) as conn:
        conn.execute(ROLES_SQL.read_text())
        conn.execute(ROLES_SQL.read_text())  # idempotent
        for role, password in chosen.items():
            conn.execute(psycopg.sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(password)))  # fmt: skip
    yield chosen
    with postgres.superuser(settings.database.name) as conn:
        for role in ROLES:
            conn.execute(psycopg.sql.SQL("ALTER ROLE {} NOLOGIN").format(psycopg.sql.Identifier(role)))


def connect(settings: Settings, role: str, password: str) -> psycopg.Connection[tuple[object, ...]]:
    db = settings.database
    return psycopg.connect(host=db.host, port=db.port, dbname=db.name, user=role, password=password,
                           connect_timeout=5)  # fmt: skip


def denied(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bool:
    try:
        conn.execute(statement)
    except errors.InsufficientPrivilege:
        conn.rollback()
        return True
    conn.rollback()
    return False


def test_the_api_role_reads_and_writes_its_statistics_but_never_a_grant(
    settings: Settings, passwords: dict[str, str]
) -> None:
    with connect(settings, "ki_api", passwords["ki_api"]) as conn:
        for table in ("grants", "documents", "document_versions", "relations", "decision_records"):
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert denied(conn, "INSERT INTO grants (scope, project_id, principal, effect) "
                            "SELECT 'project', id, 'user:mallory', 'allow' FROM projects LIMIT 1")  # fmt: skip
        assert denied(conn, "UPDATE documents SET title = title")
        assert denied(conn, "DELETE FROM group_memberships")
        assert denied(conn, "TRUNCATE ki_search_stats")
        conn.execute("INSERT INTO ki_search_stats (mode, hit_count, lexical_only, semantic_only, both_legs, identity, "
                     "took_ms) VALUES ('lexical', 0, 0, 0, 0, 'off', 1)")  # fmt: skip
        conn.execute("DELETE FROM ki_search_stats WHERE mode = 'lexical' AND took_ms = 1 AND hit_count = 0")
        conn.rollback()


def test_the_worker_role_only_reads_and_debezium_replicates(settings: Settings, passwords: dict[str, str]) -> None:
    with connect(settings, "ki_worker", passwords["ki_worker"]) as conn:
        conn.execute("SELECT count(*) FROM source_observations").fetchone()
        assert denied(conn, "INSERT INTO principal_aliases (alias, principal) VALUES ('x', 'user:x')")
        assert denied(conn, "INSERT INTO ki_search_stats (mode, hit_count, identity, took_ms) "
                            "VALUES ('lexical', 0, 'off', 1)")  # fmt: skip
    with connect(settings, "ki_debezium", passwords["ki_debezium"]) as conn:
        assert conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)
        conn.execute(HEARTBEAT_ACTION_QUERY)
        conn.rollback()
        assert denied(conn, "DELETE FROM grants")


def test_the_worker_and_the_api_run_end_to_end_as_their_roles(
    settings: Settings, passwords: dict[str, str], engine: Engine
) -> None:
    with isolated(settings, prefix="ki-roles-test") as env:
        worker = SyncWorker({**env, "KI_DATABASE__USER": "ki_worker", "KI_DATABASE__PASSWORD": passwords["ki_worker"]})
        server = Server(
            "least-privilege-api", **env, KI_DATABASE__USER="ki_api", KI_DATABASE__PASSWORD=passwords["ki_api"]
        )
        worker.start()
        server.start()
        with engine.begin() as conn:  # written by the owner, as an upstream system would
            w = World(conn)
            project, source = w.project("Rollen"), w.source("local_fs")
            doc = w.searchable(project, "Vollmacht", f"rollenwort{w.tag} Die Vollmacht ist widerruflich.",
                               w.source_object(source), "vo")  # fmt: skip
            w.grant("project", project, f"user:anna-{w.tag}")
        try:
            wait_until_indexed(server, settings, [project], {doc}, "a document synced by the worker's role")
            anna = mint_token(settings.api, f"anna-{w.tag}")
            status, body = server.call("/v1/search", {"query": f"rollenwort{w.tag}", "mode": "lexical"}, anna)
            assert status == 200 and [h["document_id"] for h in body["hits"]] == [doc], body
            admin = mint_token(settings.api, "root", roles=["admin"])
            status, stats = server.call("/v1/stats?hours=1", token=admin)  # flushes the statistics buffer
            assert status == 200 and stats["queries"] >= 1, stats
            assert server.metric("ki_search_stats_dropped_total") == 0
        finally:
            server.stop()
            worker.stop()
            remove_world(engine, [project], [source])

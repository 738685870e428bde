"""The demo generator against the real PostgreSQL: counts and invariants checked in SQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from apps.dev.bench.cleanup import Footprint, delete_from_postgres
from apps.dev.demo.generator import GenerationSummary, demo_data_exists, generate
from ki.acl import resolve_caller, visible_scope
from ki.clients import make_engine
from ki.db.models import grants_scope_check_sql
from ki.settings import Settings
from search.web.auth import authenticate, mint_token

pytestmark = pytest.mark.stack

SCALE = 50


@pytest.fixture(scope="module")
def engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings, pooled=False)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def run(engine: Engine) -> Iterator[GenerationSummary]:
    lines: list[str] = []
    summary = generate(engine, scale=SCALE, seed=11, progress=lines.append, batch_size=20)
    assert lines and any(f"{SCALE}/{SCALE} versions" in line for line in lines)
    yield summary
    # Removed again: a later `ki demo` would find it and wait for the content lane to embed all its rows.
    delete_from_postgres(engine, Footprint.ending_in(summary.label))


RUN_DOCS = """
    SELECT d.* FROM documents d JOIN projects p ON p.id = d.project_id WHERE p.name LIKE '%' || :label
"""
RUN_VERSIONS = f"SELECT v.* FROM document_versions v JOIN ({RUN_DOCS}) d ON d.id = v.document_id"


def _scalar(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def test_counts_match_summary(engine: Engine, run: GenerationSummary) -> None:
    label = run.label
    assert run.versions == SCALE
    assert _scalar(engine, f"SELECT count(*) FROM ({RUN_VERSIONS}) x", label=label) == SCALE
    assert _scalar(engine, f"SELECT count(*) FROM ({RUN_DOCS}) x", label=label) == run.documents
    assert _scalar(engine, "SELECT count(*) FROM projects WHERE name LIKE '%' || :label", label=label) == run.projects
    assert _scalar(engine, "SELECT count(*) FROM sources WHERE name LIKE '%' || :label", label=label) == 3
    assert demo_data_exists(engine)
    assert sum(run.statuses.values()) == SCALE
    assert _scalar(engine, f"SELECT count(*) FROM ({RUN_VERSIONS}) x WHERE length(text) < 1500", label=label) == 0
    assert (
        _scalar(
            engine,
            "SELECT count(*) FROM group_memberships gm JOIN sources s ON s.id = gm.source_id "
            "WHERE s.name LIKE '%' || :label",
            label=label,
        )
        == run.memberships
    )


def test_latest_final_points_at_own_final_version(engine: Engine, run: GenerationSummary) -> None:
    sql = f"""
        SELECT count(*) FROM ({RUN_DOCS}) d
        WHERE (d.latest_final_version_id IS NULL) <> NOT EXISTS (
                  SELECT 1 FROM document_versions v WHERE v.document_id = d.id AND v.status IN ('final', 'executed'))
           OR (d.latest_final_version_id IS NOT NULL AND d.latest_final_version_id <> (
                  SELECT v.id FROM document_versions v WHERE v.document_id = d.id
                  AND v.status IN ('final', 'executed') ORDER BY v.version_no DESC LIMIT 1))
    """
    assert _scalar(engine, sql, label=run.label) == 0
    assert (
        _scalar(
            engine, f"SELECT count(*) FROM ({RUN_DOCS}) d WHERE d.latest_final_version_id IS NOT NULL", label=run.label
        )
        > 0
    )


def test_every_version_actively_observed_at_a_run_source(engine: Engine, run: GenerationSummary) -> None:
    sql = f"""
        SELECT count(*) FROM ({RUN_VERSIONS}) v WHERE NOT EXISTS (
            SELECT 1 FROM source_observations o
            JOIN source_objects so ON so.id = o.source_object_id
            JOIN sources s ON s.id = so.source_id
            WHERE o.document_version_id = v.id AND o.deleted_at IS NULL AND s.name LIKE '%' || :label)
    """
    assert _scalar(engine, sql, label=run.label) == 0


def test_status_progression_and_clauses(engine: Engine, run: GenerationSummary) -> None:
    # No draft after a final/executed version, no final after an executed one.
    sql = f"""
        SELECT count(*) FROM ({RUN_VERSIONS}) a JOIN document_versions b
          ON b.document_id = a.document_id AND b.version_no > a.version_no
        WHERE (a.status IN ('final', 'executed') AND b.status = 'draft')
           OR (a.status = 'executed' AND b.status = 'final')
    """
    assert _scalar(engine, sql, label=run.label) == 0
    missing = f"""
        SELECT count(*) FROM ({RUN_VERSIONS}) v
        WHERE (v.status IN ('final', 'executed')) = (jsonb_array_length(v.notable_clauses) = 0)
    """
    assert _scalar(engine, missing, label=run.label) == 0
    dangling = f"""
        SELECT count(*) FROM ({RUN_VERSIONS}) v, jsonb_array_elements(v.notable_clauses) c
        WHERE NOT EXISTS (SELECT 1 FROM ontology_nodes n
                          WHERE n.id = (c->>'clause_type_id')::bigint AND n.kind = 'clause_type')
    """
    assert _scalar(engine, dangling, label=run.label) == 0


def test_grants_satisfy_scope_check_and_cover_every_scope(engine: Engine, run: GenerationSummary) -> None:
    grants = f"""
        SELECT g.* FROM grants g WHERE g.project_id IN (SELECT id FROM projects WHERE name LIKE '%' || :label)
           OR g.document_id IN (SELECT id FROM ({RUN_DOCS}) d)
           OR g.source_object_id IN (SELECT so.id FROM source_objects so JOIN sources s ON s.id = so.source_id
                                     WHERE s.name LIKE '%' || :label)
    """
    assert _scalar(engine, f"SELECT count(*) FROM ({grants}) g", label=run.label) == run.grants
    assert _scalar(engine, f"SELECT count(*) FROM ({grants}) g WHERE NOT ({grants_scope_check_sql()})",
                   label=run.label) == 0  # fmt: skip
    with engine.connect() as conn:
        scopes = {r[0] for r in conn.execute(text(f"SELECT DISTINCT scope FROM ({grants}) g"), {"label": run.label})}
        effects = {r[0] for r in conn.execute(text(f"SELECT DISTINCT effect FROM ({grants}) g"), {"label": run.label})}
    assert {"project", "source_object"} <= scopes
    assert effects >= {"allow"}
    # Object grants only on objects whose ACL is known (mirrored ACLs).
    assert (
        _scalar(
            engine,
            f"SELECT count(*) FROM ({grants}) g JOIN source_objects so ON so.id = g.source_object_id "
            "WHERE NOT so.acl_known",
            label=run.label,
        )
        == 0
    )


def test_a_demo_user_logs_in_with_an_email_alias_and_sees_their_documents(
    engine: Engine, run: GenerationSummary, settings: Settings
) -> None:
    """A partner of this run logs in with a token whose subject is their e-mail address, as an upstream
    login names them: the API's authentication makes that `user:<address>`, the demo's alias of that name
    resolves to the partner, and the caller sees exactly the partner's documents (more than none)."""
    with engine.connect() as conn:
        alias, user = conn.execute(
            text(
                "SELECT pa.alias, pa.principal FROM principal_aliases pa"
                " JOIN group_memberships gm ON gm.member_principal = pa.principal"
                " JOIN sources s ON s.id = gm.source_id"
                " WHERE gm.group_principal = 'group:partner' AND s.name LIKE '%' || :label"
                " AND pa.alias LIKE '%@kanzlei-demo.de' ORDER BY pa.alias LIMIT 1"
            ),
            {"label": run.label},
        ).one()
        email = alias.removeprefix("user:")
        principals = authenticate(f"Bearer {mint_token(settings.api, email)}", settings.api)
        assert principals == [f"user:{email}"]
        caller = resolve_caller(conn, principals, settings.security)
        assert user in caller.principals
        run_projects = text("SELECT id FROM projects WHERE name LIKE '%' || :label")
        projects = [int(p) for (p,) in conn.execute(run_projects, {"label": run.label})]
        by_email = visible_scope(conn, caller, settings.security, project_ids=projects)
        partner = resolve_caller(conn, [user], settings.security)
        by_user = visible_scope(conn, partner, settings.security, project_ids=projects)
    assert by_email[1], f"{email} sees no documents of {run.label}"
    assert by_email == by_user

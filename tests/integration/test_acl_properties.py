"""Property tests: the SQL access scope (`ki.acl.resolve_caller` + `ki.acl.visible_versions`), the citable
observations (`ki.acl.visible_observations`) and the principal projection (`ki.acl.version_projections`)
equal the pure-Python reference evaluator of the spec (`tests/acl_reference.py`) on random worlds.

Every example writes its world into the real PostgreSQL inside one transaction and rolls it back, so
nothing reaches CDC and nothing leaks between examples. The database may hold other data (a demo corpus,
other tests' worlds): results are narrowed to the world's projects or versions, and every principal
carries a per-run tag so no foreign grant, membership or alias can match.

Principals are generated in random case, with non-ASCII letters whose lower-casing is special ("İ" ->
"i̇", final "Σ" -> "ς", "ẞ" -> "ß", "Ü" -> "ü") and surrounded by odd whitespace (tab, no-break space,
ideographic space, line separator ...); now and then a principal is nothing but such whitespace, so it must
match nobody. The SQL side normalises with `ki_principal(x)` (migration 0003: trims the `str.isspace()`
characters, lower-cases with the ICU root collation), the reference with `str.strip().lower()`;
`test_sql_normalisation_equals_python_on_every_code_point` checks that the two are one definition.

The projection property: a principal is in a version's `allowed_principals` (`denied_principals`) exactly
when, held alone by a caller, it resolves to the principal of an allow (deny) grant applying to the
version -- so the projection agrees with `resolve_caller`, alias chains and nested groups included.
"""

from __future__ import annotations

import datetime as dt
import time
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, Row, Table, insert, text

from ki.acl import normalize_principal, resolve_caller, version_projections, visible_observations, visible_versions
from ki.db import models as m
from ki.db.engine import make_engine
from ki.settings import SecuritySettings, Settings
from tests import acl_reference as ref

pytestmark = pytest.mark.stack

TAG = uuid.uuid4().hex[:8]
NAMES = ("u1", "jürgen", "g1", "gruppe-οδοσ", "boss", "İrem", "straẞe")
# str.isspace() characters beyond the ASCII space: PostgreSQL's btrim() alone trims none of them.
ODD_SPACE = ("\t", "\n", "\xa0", "\u3000", "\u2009", "\u2028", "\x1c", "\x85")
KINDS = ("local_fs", "local_fs", "sharepoint", "dms")
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)

EXAMPLES = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is repeatable
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings, pool_size=2)
    yield eng
    eng.dispose()


# ---------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------

rarely = st.sampled_from([False] * 5 + [True])


@st.composite
def principals(draw: st.DrawFn) -> str:
    """One of a few tagged principals, in random case with random surrounding whitespace; rarely blank
    apart from whitespace that is not a space (the database's CHECK only rejects spaces)."""
    space = st.lists(st.sampled_from((" ", " ", *ODD_SPACE)), max_size=2).map("".join)
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from(ODD_SPACE)) + draw(space)
    name = f"acl{TAG}:{draw(st.sampled_from(NAMES))}"
    upper = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    cased = "".join(c.upper() if u else c for c, u in zip(name, upper, strict=True))
    return draw(space) + cased + draw(space)


@dataclass(frozen=True)
class Case:
    world: ref.World
    security: SecuritySettings
    caller: tuple[object, ...]
    narrow_versions: tuple[int, ...]
    narrow_projects: tuple[int, ...]


@st.composite
def cases(draw: st.DrawFn, mode: str) -> Case:
    n_projects = draw(st.integers(1, 3))
    documents = tuple(
        ref.Document(i, draw(st.integers(1, n_projects)), deleted=draw(rarely))
        for i in range(1, draw(st.integers(1, 5)) + 1)
    )
    versions: list[ref.Version] = []
    for d in documents:
        versions += [ref.Version(len(versions) + 1, d.id) for _ in range(draw(st.integers(1, 3)))]
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3))
    sources = tuple(ref.Source(i, k) for i, k in enumerate(kinds, 1))
    objects = tuple(
        ref.SourceObject(i, draw(st.integers(1, len(sources))), acl_known=draw(st.booleans()))
        for i in range(1, draw(st.integers(1, 5)) + 1)
    )
    observations = tuple(
        ref.Observation(v.id, draw(st.integers(1, len(objects))), deleted=draw(rarely))
        for v in versions
        for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3])))
    )
    targets = {"project": n_projects, "document": len(documents), "source_object": len(objects)}
    grants = tuple(
        ref.Grant(
            scope,
            draw(st.integers(1, targets[scope])),
            draw(principals()),
            draw(st.sampled_from(["allow"] * 3 + ["deny"])),
        )
        for scope in [draw(st.sampled_from(ref.SCOPES)) for _ in range(draw(st.integers(2, 16)))]
    )
    memberships = tuple(
        ref.Membership(g, mb)
        for g, mb in draw(st.lists(st.tuples(principals(), principals()), max_size=8, unique=True))
    )
    aliases = tuple(
        ref.Alias(a, p)
        for a, p in draw(st.lists(st.tuples(principals(), principals()), max_size=4, unique_by=lambda t: t[0]))
    )
    security = SecuritySettings(
        source_acl_mode=mode,
        admin_principals=draw(st.lists(principals(), max_size=2)),
        aliases=draw(st.dictionaries(principals(), principals(), max_size=3)),
    )
    junk = st.sampled_from(["   ", "", None, 7, "\t\u3000"])
    caller = tuple(draw(st.lists(st.one_of(principals(), principals(), principals(), junk), min_size=1, max_size=4)))
    world = ref.World(
        projects=tuple(range(1, n_projects + 1)),
        documents=documents,
        versions=tuple(versions),
        sources=sources,
        objects=objects,
        observations=observations,
        grants=grants,
        memberships=memberships,
        aliases=aliases,
    )
    version_ids = [v.id for v in versions]
    return Case(
        world,
        security,
        caller,
        narrow_versions=tuple(draw(st.lists(st.sampled_from(version_ids), max_size=len(version_ids), unique=True))),
        narrow_projects=tuple(draw(st.lists(st.integers(1, n_projects), min_size=1, unique=True))),
    )


# ---------------------------------------------------------------------------------------------------
# Writing a world
# ---------------------------------------------------------------------------------------------------


def _table(model: type[m.Base]) -> Table:
    return m.Base.metadata.tables[model.__tablename__]


def _ids(conn: Connection, table: Table, rows: list[dict[str, object]]) -> list[int]:
    if not rows:
        return []
    result = conn.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True), rows)
    return [row.id for row in result]


@dataclass(frozen=True)
class Written:
    """Database ids of a written world, keyed by its local ids."""

    projects: dict[int, int]
    documents: dict[int, int]
    versions: dict[int, int]
    objects: dict[int, int]
    observations: list[int]  # database ids, in the order of `world.observations`


def write(conn: Connection, world: ref.World) -> Written:
    def mapping(local: list[int], db: list[int]) -> dict[int, int]:
        return dict(zip(local, db, strict=True))

    projects = mapping(
        list(world.projects), _ids(conn, _table(m.Project), [{"name": f"acl {TAG}"} for _ in world.projects])
    )
    documents = mapping(
        [d.id for d in world.documents],
        _ids(
            conn,
            _table(m.Document),
            [
                {"project_id": projects[d.project_id], "title": "d", "deleted_at": NOW if d.deleted else None}
                for d in world.documents
            ],
        ),
    )
    version_no: dict[int, int] = {}
    version_rows = []
    for v in world.versions:
        version_no[v.document_id] = version_no.get(v.document_id, 0) + 1
        version_rows.append(
            {"document_id": documents[v.document_id], "version_no": version_no[v.document_id], "status": "final"}
        )
    versions = mapping([v.id for v in world.versions], _ids(conn, _table(m.DocumentVersion), version_rows))
    sources = mapping(
        [s.id for s in world.sources],
        _ids(conn, _table(m.Source), [{"kind": s.kind, "name": f"acl {TAG}"} for s in world.sources]),
    )
    objects = mapping(
        [o.id for o in world.objects],
        _ids(
            conn,
            _table(m.SourceObject),
            [
                {"source_id": sources[o.source_id], "external_ref": f"acl-{TAG}-{o.id}", "acl_known": o.acl_known}
                for o in world.objects
            ],
        ),
    )
    observations = _ids(
        conn,
        _table(m.SourceObservation),
        [
            {
                "document_version_id": versions[o.version_id],
                "source_object_id": objects[o.object_id],
                "deleted_at": NOW if o.deleted else None,
            }
            for o in world.observations
        ],
    )
    targets = {"project": projects, "document": documents, "source_object": objects}
    _ids(
        conn,
        _table(m.Grant),
        [
            {
                "scope": g.scope,
                "project_id": None,
                "document_id": None,
                "source_object_id": None,
                m.GRANT_SCOPE_COLUMNS[g.scope]: targets[g.scope][g.target],
                "principal": g.principal,
                "effect": g.effect,
            }
            for g in world.grants
        ],
    )
    _ids(
        conn,
        _table(m.GroupMembership),
        [{"source_id": None, "group_principal": g.group, "member_principal": g.member} for g in world.memberships],
    )
    _ids(conn, _table(m.PrincipalAlias), [{"alias": a.alias, "principal": a.principal} for a in world.aliases])
    return Written(projects, documents, versions, objects, observations)


# ---------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------


def check(engine: Engine, case: Case) -> None:
    world = case.world
    expected_caller = ref.resolve(world, case.caller, case.security)
    expected = ref.visible(world, expected_caller, case.security)
    project_of = {d.id: d.project_id for d in world.documents}
    in_projects = {v.id for v in world.versions if project_of[v.document_id] in case.narrow_projects}
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            ids = write(conn, world)
            # Every visible row must carry its own document and project: db version id -> (document, project).
            belongs = {
                ids.versions[v.id]: (ids.documents[v.document_id], ids.projects[project_of[v.document_id]])
                for v in world.versions
            }
            local_version = {db: local for local, db in ids.versions.items()}

            caller = resolve_caller(conn, case.caller, case.security)
            assert caller.principals == expected_caller.principals
            assert caller.is_admin == expected_caller.is_admin

            def sql(projects: tuple[int, ...] | None, versions: tuple[int, ...] | None) -> set[int]:
                rows = visible_versions(
                    conn,
                    caller,
                    case.security,
                    project_ids=None if projects is None else [ids.projects[p] for p in projects],
                    version_ids=None if versions is None else [ids.versions[v] for v in versions],
                )
                assert all(belongs[r.version_id] == (r.document_id, r.project_id) for r in rows)
                assert len(rows) == len({r.version_id for r in rows}), "a version is listed twice"
                return {local_version[r.version_id] for r in rows}

            assert sql(world.projects, None) == expected
            assert sql(case.narrow_projects, None) == expected & in_projects
            assert sql(None, case.narrow_versions) == expected & set(case.narrow_versions)
            assert sql(case.narrow_projects, case.narrow_versions) == expected & in_projects & set(case.narrow_versions)

            # Citations: per source object, narrowed to the versions asked about.
            citable = ref.citable(world, expected_caller, case.security)
            asked = {ids.versions[v] for v in case.narrow_versions}
            observations = visible_observations(conn, caller, case.security, sorted(asked))
            want = {ids.observations[i] for i in citable} & {
                ids.observations[i] for i, o in enumerate(world.observations) if ids.versions[o.version_id] in asked
            }
            assert {o.observation_id for o in observations} == want
            assert len(observations) == len(want), "an observation is listed twice"
            object_of = dict(zip(ids.observations, [o.object_id for o in world.observations], strict=True))
            version_of = dict(zip(ids.observations, [o.version_id for o in world.observations], strict=True))
            assert {o.version_id for o in observations} == {ids.versions[v] for v in expected} & asked
            for o in observations:
                assert belongs[o.version_id] == (o.document_id, o.project_id)
                assert local_version[o.version_id] == version_of[o.observation_id]
                assert ids.objects[object_of[o.observation_id]] == o.source_object_id

            # The projection agrees with resolve_caller.
            projected = version_projections(conn, ids.versions.values(), case.security)
            for local, (allowed, denied) in ref.projection(world, case.security).items():
                got = projected[ids.versions[local]]
                assert set(got.allowed_principals) == allowed
                assert set(got.denied_principals) == denied
        finally:
            trans.rollback()


@pytest.mark.parametrize("mode", ref.MODES)
@EXAMPLES
@given(data=st.data())
def test_sql_scope_equals_the_reference(engine: Engine, mode: str, data: st.DataObject) -> None:
    case = data.draw(cases(mode), label="case")
    note(f"world: {case.world}\nsecurity: {case.security!r}\ncaller: {case.caller!r}")
    caller = ref.resolve(case.world, case.caller, case.security)
    verdicts = ref.verdicts(case.world, caller, case.security)
    for verdict in set(verdicts.values()):  # which rules this example exercises (--hypothesis-show-statistics)
        event(verdict)
    seen = sum(why in ref.SEEN for why in verdicts.values())
    event(f"visible versions: {'none' if not seen else 'all' if seen == len(verdicts) else 'some'}")
    check(engine, case)


# ---------------------------------------------------------------------------------------------------
# One normalisation: ki_principal(x) in SQL == ki.acl.normalize_principal(x) in Python
# ---------------------------------------------------------------------------------------------------

_SQL_NORMALISE = text("SELECT x, ki_principal(x) AS folded FROM unnest(CAST(:xs AS text[])) AS x")


def _sql_normalised(engine: Engine, values: list[str]) -> dict[str, str | None]:
    with engine.connect() as conn:
        return {row.x: row.folded for row in conn.execute(_SQL_NORMALISE, {"xs": values})}


def test_sql_normalisation_equals_python_on_every_code_point(engine: Engine) -> None:
    """Every code point alone, trimmed, and as the context of a final sigma (PostgreSQL text cannot hold
    NUL or surrogates). In that context only code points Python's Unicode database knows can agree:
    whether a newer one is case-ignorable (ICU) or not (Python: unassigned) decides between "ς" and "σ".
    That is why `ki.acl` normalises callers in SQL too."""
    chars = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    known = [c for c in chars if unicodedata.category(c) != "Cn"]
    for wrap, domain in (("{}", chars), (" {}\u3000", chars), ("A{}Σ", known), ("Σ{}", known)):
        values = [wrap.format(c) for c in domain]
        folded = _sql_normalised(engine, values)
        wrong = [v for v in values if folded[v] != normalize_principal(v)]
        assert not wrong, [(v, folded[v], normalize_principal(v)) for v in wrong[:10]]


KNOWN_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cn"), blacklist_characters="\x00"))


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(values=st.lists(KNOWN_TEXT, max_size=200))
def test_sql_normalisation_equals_python_on_random_text(engine: Engine, values: list[str]) -> None:
    folded = _sql_normalised(engine, values)
    assert {v: normalize_principal(v) for v in values} == folded


# ---------------------------------------------------------------------------------------------------
# A large scope
# ---------------------------------------------------------------------------------------------------

LARGE_DOCUMENTS = 12_000  # two versions each


def write_large(conn: Connection, member: str, team: str) -> int:
    """A project of 24,000 versions, set-based: most are visible to `team` (whose member is `member`);
    deleted documents, deleted observations, document denies and a sharepoint share with partly
    mirrored allows and denies carve out the rest. Returns the project id."""
    project = int(conn.execute(text("INSERT INTO projects (name) VALUES (:n) RETURNING id"), {"n": TAG}).scalar_one())
    local, share = (
        int(
            conn.execute(
                text("INSERT INTO sources (kind, name) VALUES (:k, :n) RETURNING id"), {"k": k, "n": TAG}
            ).scalar_one()
        )
        for k in ("local_fs", "sharepoint")
    )
    p = {
        "p": project,
        "local": local,
        "share": share,
        "n": LARGE_DOCUMENTS,
        "team": team,
        "member": member,
        "ref": f"big-{TAG}-",
    }
    for sql in (
        "INSERT INTO documents (project_id, title, deleted_at) "
        "SELECT :p, 'doc ' || i, CASE WHEN i % 101 = 0 THEN now() END FROM generate_series(1, :n) i",
        "INSERT INTO document_versions (document_id, version_no, status) "
        "SELECT d.id, n, 'final' FROM documents d CROSS JOIN generate_series(1, 2) n WHERE d.project_id = :p",
        # Every 13th version lives on the sharepoint share (known ACL), the rest on local_fs (no ACL).
        "INSERT INTO source_objects (source_id, external_ref, acl_known) "
        "SELECT CASE WHEN dv.id % 13 = 0 THEN :share ELSE :local END, :ref || dv.id, dv.id % 13 = 0 "
        "FROM document_versions dv JOIN documents d ON d.id = dv.document_id WHERE d.project_id = :p",
        "INSERT INTO source_observations (document_version_id, source_object_id, deleted_at) "
        "SELECT dv.id, so.id, CASE WHEN dv.id % 37 = 0 THEN now() END "
        "FROM document_versions dv JOIN documents d ON d.id = dv.document_id "
        "JOIN source_objects so ON so.external_ref = :ref || dv.id AND so.source_id IN (:local, :share) "
        "WHERE d.project_id = :p",
        "INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, upper(:team), 'allow')",
        "INSERT INTO grants (scope, document_id, principal, effect) "
        "SELECT 'document', d.id, ' ' || :member, 'deny' FROM documents d WHERE d.project_id = :p AND d.id % 97 = 0",
        "INSERT INTO grants (scope, source_object_id, principal, effect) "
        "SELECT 'source_object', so.id, :team, CASE WHEN so.id % 3 = 0 THEN 'deny' ELSE 'allow' END "
        "FROM source_objects so WHERE so.source_id = :share AND so.id % 2 = 0",
        "INSERT INTO group_memberships (group_principal, member_principal) VALUES (:team, :member)",
    ):
        conn.execute(text(sql), p)
    return project


def read_world(conn: Connection, project: int) -> ref.World:
    """One project's rows, read back from PostgreSQL for the reference (memberships and aliases: all)."""

    def rows(sql: str) -> list[Row[Any]]:
        return list(conn.execute(text(sql), {"p": project}))

    documents = "SELECT id FROM documents WHERE project_id = :p"
    versions = f"SELECT id FROM document_versions WHERE document_id IN ({documents})"
    objects = f"SELECT source_object_id FROM source_observations WHERE document_version_id IN ({versions})"
    return ref.World(
        projects=(project,),
        documents=tuple(
            ref.Document(r.id, r.project_id, r.deleted_at is not None)
            for r in rows("SELECT id, project_id, deleted_at FROM documents WHERE project_id = :p")
        ),
        versions=tuple(
            ref.Version(r.id, r.document_id)
            for r in rows(f"SELECT id, document_id FROM document_versions WHERE id IN ({versions})")
        ),
        sources=tuple(ref.Source(r.id, r.kind) for r in rows("SELECT id, kind FROM sources")),
        objects=tuple(
            ref.SourceObject(r.id, r.source_id, r.acl_known)
            for r in rows(f"SELECT id, source_id, acl_known FROM source_objects WHERE id IN ({objects})")
        ),
        observations=tuple(
            ref.Observation(r.document_version_id, r.source_object_id, r.deleted_at is not None)
            for r in rows(
                "SELECT document_version_id, source_object_id, deleted_at FROM source_observations "
                f"WHERE document_version_id IN ({versions})"
            )
        ),
        grants=tuple(
            ref.Grant(r.scope, r.target, r.principal, r.effect)
            for r in rows(
                "SELECT scope, COALESCE(project_id, document_id, source_object_id) AS target, principal, effect "
                f"FROM grants WHERE project_id = :p OR document_id IN ({documents}) OR source_object_id IN ({objects})"
            )
        ),
        memberships=tuple(
            ref.Membership(r.group_principal, r.member_principal)
            for r in rows("SELECT group_principal, member_principal FROM group_memberships")
        ),
        aliases=tuple(ref.Alias(r.alias, r.principal) for r in rows("SELECT alias, principal FROM principal_aliases")),
    )


def test_a_caller_who_sees_more_than_twenty_thousand_versions(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    member, team = f"acl{TAG}:big-member", f"acl{TAG}:big-team"
    security = SecuritySettings()
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            project = write_large(conn, member, team)
            # Fresh tables have no statistics and autovacuum cannot see uncommitted rows: without this
            # the planner takes the 24,000-row tables for tiny ones and picks quadratic plans.
            conn.execute(text("ANALYZE documents, document_versions, source_objects, source_observations, grants"))
            world = read_world(conn, project)
            expected = ref.visible(world, ref.resolve(world, [member], security), security)
            assert len(expected) >= 20_000, "the world was meant to be large"
            assert len(expected) < len(world.versions), "and not everything in it visible"

            caller = resolve_caller(conn, [f"  {member.upper()} "], security)
            assert caller.principals == {member, team}
            timings = {}
            for label, narrowing in (
                ("project", {"project_ids": [project]}),
                ("versions", {"version_ids": [v.id for v in world.versions]}),
                ("none", {}),
            ):
                start = time.perf_counter()
                rows = visible_versions(conn, caller, security, **narrowing)
                timings[label] = time.perf_counter() - start
                assert {r.version_id for r in rows} == expected
                assert len(rows) == len(expected)
        finally:
            trans.rollback()
    with capsys.disabled():
        spent = ", ".join(f"narrowed by {k}: {v * 1000:.0f} ms" for k, v in timings.items())
        print(f"\nvisible_versions: {len(expected)} of {len(world.versions)} versions visible; {spent}")

"""Property tests: the SQL access scope (`ki.acl.resolve_caller` + `ki.acl.visible_versions`), the citable
observations (`ki.acl.visible_observations`) and the principal projection (`ki.acl.version_projections`)
equal the pure-Python reference evaluator of the spec (`tests/acl_reference.py`) on random worlds.

The worlds, their writing and their reading live in `tests/integration/acl_worlds.py` (shared with the
authorisation soak). Every example writes its world into the real PostgreSQL inside one transaction and
rolls it back, so nothing reaches CDC and nothing leaks between examples. The database may hold other
data (a demo corpus, other tests' worlds): results are narrowed to the world's projects or versions, and
every principal carries a per-run tag so no foreign grant, membership or alias can match.

Principals are generated in random case, with non-ASCII letters whose case folding is special ("İ" ->
"i̇", "Σ"/"ς" -> "σ", "ẞ"/"ß" -> "ss", "ﬁ" -> "fi") and surrounded by odd whitespace (tab, no-break
space, ideographic space, line separator ...); callers also hold values that are no principal (blank,
no kind), which must match nobody. The SQL side normalises with `ki_principal(x)` (migration 0004: trims
the `str.isspace()` characters, casefolds, NULL unless `kind:name`), the reference with
`str.strip().casefold()` and the same form; the `test_sql_canonical_form_*` tests check that SQL and
`ki.principals.canonical_principal` are one definition.

The projection property: a principal is in a version's `allowed_principals` (`denied_principals`) exactly
when, held alone by a caller, it resolves to the principal of an allow (deny) grant applying to the
version -- so the projection agrees with `resolve_caller`, alias chains and nested groups included.
"""

from __future__ import annotations

import hashlib
import time
import typing
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text

from ki.acl import (
    Driver,
    Unresolved,
    Walk,
    resolve_caller,
    search_scope,
    version_projections,
    visible_observations,
    visible_scope,
    visible_versions,
)
from ki.clients import make_engine
from ki.principals import canonical_principal
from ki.settings import SecuritySettings, Settings
from tests import acl_reference as ref
from tests.integration.acl_worlds import TAG, Case, cases, read_world, write

pytestmark = pytest.mark.stack


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

            def sql(
                projects: tuple[int, ...] | None, versions: tuple[int, ...] | None, driver: Driver = "auto"
            ) -> set[int]:
                rows = visible_versions(
                    conn,
                    caller,
                    case.security,
                    project_ids=None if projects is None else [ids.projects[p] for p in projects],
                    version_ids=None if versions is None else [ids.versions[v] for v in versions],
                    driver=driver,
                )
                assert all(belongs[r.version_id] == (r.document_id, r.project_id) for r in rows)
                assert len(rows) == len({r.version_id for r in rows}), "a version is listed twice"
                return {local_version[r.version_id] for r in rows}

            # Both drivers (starting from all versions, or from those the caller's grants reach) agree.
            for driver in typing.get_args(Driver):
                assert sql(world.projects, None, driver) == expected
                assert sql(case.narrow_projects, None, driver) == expected & in_projects
            assert sql(None, case.narrow_versions) == expected & set(case.narrow_versions)
            assert sql(case.narrow_projects, case.narrow_versions) == expected & in_projects & set(case.narrow_versions)

            # The search scope: the same decision, aggregated to sorted, distinct project and document ids.
            for driver in typing.get_args(Driver):
                # Narrowed to the world: an admin would otherwise also see the data other tests left behind.
                for narrow, versions in ((world.projects, expected), (case.narrow_projects, expected & in_projects)):
                    narrow_ids = None if narrow is None else [ids.projects[p] for p in narrow]
                    projects, documents = visible_scope(
                        conn, caller, case.security, project_ids=narrow_ids, driver=driver
                    )
                    db_versions = [ids.versions[v] for v in versions]
                    assert projects == tuple(sorted({belongs[v][1] for v in db_versions}))
                    assert documents == tuple(sorted({belongs[v][0] for v in db_versions}))

            # Citations: per source object, narrowed to the versions asked about.
            citable = ref.citable(world, expected_caller, case.security)
            asked = {ids.versions[v] for v in case.narrow_versions}
            observations = visible_observations(conn, caller, case.security, sorted(asked))
            want = {ids.observations[i] for i in citable} & {
                ids.observations[i] for i, o in enumerate(world.observations) if ids.versions[o.version_id] in asked
            }
            assert {o.observation_id for o in observations} == want
            assert len(observations) == len(want), "an observation is listed twice"
            # The search's re-verify resolves the caller inside the statement, walking the memberships up from
            # the caller or down from the grants on the asked documents: the same rows, of the versions asked
            # and of every version of their documents.
            siblings = visible_observations(conn, caller, case.security, sorted(asked), of="siblings")
            for walk in typing.get_args(Walk):
                unresolved = Unresolved.of(case.caller)
                resolving = visible_observations(conn, unresolved, case.security, sorted(asked), walk=walk)
                assert sorted(resolving, key=repr) == sorted(observations, key=repr), walk
                of_documents = visible_observations(
                    conn, unresolved, case.security, sorted(asked), of="siblings", walk=walk
                )
                assert sorted(of_documents, key=repr) == sorted(siblings, key=repr), walk
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

            # The search's per-version leg filters admit exactly the visible versions: the ids minus the hidden
            # versions, and (for a caller whom grants bind) the principal projection minus the hidden versions.
            for driver in typing.get_args(Driver):
                scope = search_scope(
                    conn, caller, case.security, project_ids=[ids.projects[p] for p in world.projects], driver=driver
                )
                hidden = set(scope.hidden_version_ids)
                visible_db = {ids.versions[v] for v in expected}
                # The projection filter is given up only where an alias leads out of the caller's principals.
                assert not scope.aliases_escape or bool(world.aliases or case.security.aliases)
                event(f"projection filter: {'given up' if scope.aliases_escape else 'used'}")
                assert not hidden & visible_db, "a visible version is listed as hidden"
                for db_version, (document, project) in belongs.items():
                    by_ids = document in scope.document_ids and project in scope.project_ids
                    assert (by_ids and db_version not in hidden) == (db_version in visible_db)
                    if caller.is_admin or scope.aliases_escape:
                        continue
                    rows = projected[db_version]
                    by_projection = not set(scope.allow_principals).isdisjoint(rows.allowed_principals) and set(
                        scope.deny_principals
                    ).isdisjoint(rows.denied_principals)
                    assert (by_projection and db_version not in hidden) == (db_version in visible_db)
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
# One canonical form: ki_principal(x) in SQL == ki.principals.canonical_principal(x) in Python
# ---------------------------------------------------------------------------------------------------

_SQL_CANONICAL = text("SELECT x, ki_principal(x) AS canonical FROM unnest(CAST(:xs AS text[])) AS x")

#: Every code point except NUL and the surrogates (PostgreSQL text holds neither).
CODE_POINTS = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
#: The code points whose case folding is not their lower-casing: SQL maps these after lower-casing.
FOLD_NOT_LOWER = [c for c in CODE_POINTS if c.casefold() != c.lower()]


def _assert_sql_is_python(engine: Engine, values: list[str]) -> None:
    with engine.connect() as conn:
        canonical = {row.x: row.canonical for row in conn.execute(_SQL_CANONICAL, {"xs": values})}
    wrong = [v for v in values if canonical[v] != canonical_principal(v)]
    assert not wrong, [(v, canonical[v], canonical_principal(v)) for v in wrong[:10]]


#: The canonical form of every code point in `:wrap` (its "{}" replaced), computed and digested in SQL:
#: shipping 1.1 million strings each way per wrap took most of this test's time. Each result is framed
#: by its length, so the digest tells sequences apart; NULL (not a principal) is "-".
_SQL_CODE_POINT_DIGEST = text(
    """
    SELECT md5(string_agg(coalesce(length(p) || ':' || p, '-'), '' ORDER BY c))
    FROM generate_series(1, 1114111) AS c,
         LATERAL (SELECT ki_principal(replace(CAST(:wrap AS text), '{}', chr(c))) AS p) AS canonical
    WHERE c NOT BETWEEN 55296 AND 57343
    """
)


def _python_digest(values: list[str]) -> str:
    framed = ("-" if (p := canonical_principal(v)) is None else f"{len(p)}:{p}" for v in values)
    return hashlib.md5("".join(framed).encode("utf-8")).hexdigest()


def test_sql_canonical_form_equals_python_on_every_code_point(engine: Engine) -> None:
    """Every code point as a name (alone, trimmed, next to a sigma in final position: the context
    lower-casing depends on and case folding ignores) and as a kind (valid only when it folds to ASCII).
    SQL and Python digest their answers in code point order; a differing digest compares value by value."""
    for wrap in ("k:{}", " \u3000K:{}\t", "K:A{}Σ", "K:Σ{}", "{}:x", "{}"):
        values = [wrap.format(c) for c in CODE_POINTS]
        with engine.connect() as conn:
            sql = conn.execute(_SQL_CODE_POINT_DIGEST, {"wrap": wrap}).scalar_one()
        if sql != _python_digest(values):
            _assert_sql_is_python(engine, values)  # names the values that differ
            raise AssertionError(f"{wrap!r}: the digests differ although every value agrees")


def test_sql_canonical_form_equals_python_where_casefold_is_not_lower(engine: Engine) -> None:
    """The code points SQL folds specially, in every case, in pairs, in a kind, and all in one name."""
    special = FOLD_NOT_LOWER + [c.lower() for c in FOLD_NOT_LOWER] + [c.upper() for c in FOLD_NOT_LOWER]
    values = [w.format(c) for c in special for w in ("user:{}", "User:x{}Y", "GROUP:{0}{0}", "{0}{0}:x", "k:{}ΣΣ ")]
    values += [f"User:{''.join(special)}", f"{''.join(FOLD_NOT_LOWER)}:x", f"u:{''.join(FOLD_NOT_LOWER)}Σ"]
    _assert_sql_is_python(engine, values)


KNOWN_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cn"), blacklist_characters="\x00"))
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
# Random principal-like strings: a kind from a mix of ASCII and special letters, maybe a colon, a name.
KIND_TEXT = st.text(st.sampled_from("aZ09_.-: \tKſßİ"), max_size=6)
SPECIAL_TEXT = st.text(st.one_of(st.sampled_from(FOLD_NOT_LOWER), st.characters(max_codepoint=0x3FF)), max_size=8)
PRINCIPAL_LIKE = st.tuples(KIND_TEXT, st.sampled_from(["", ":", "::"]), st.one_of(SPECIAL_TEXT, KNOWN_TEXT)).map(
    "".join
)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(values=st.lists(st.one_of(KNOWN_TEXT, ANY_TEXT, PRINCIPAL_LIKE, PRINCIPAL_LIKE), max_size=200))
def test_sql_canonical_form_equals_python_on_random_text(engine: Engine, values: list[str]) -> None:
    _assert_sql_is_python(engine, values)
    event(f"well-formed: {'some' if any(canonical_principal(v) for v in values) else 'none'}")


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

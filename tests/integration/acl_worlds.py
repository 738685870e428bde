"""Random ACL worlds shared by the property tests and the authorisation soak: hypothesis strategies that
draw a world (projects, documents, versions, sources, objects, observations, grants, memberships, aliases)
in the shape of the reference evaluator's `tests.acl_reference.World`, writing one into PostgreSQL, and
reading one back from PostgreSQL.

Principals carry a per-run tag (`TAG`, their kind) so no foreign grant, membership or alias can match
them; they are drawn in random case, with non-ASCII letters, and odd surrounding whitespace; callers also
hold look-alikes that full case folding would merge with a stored name, which match nobody (see
`tests/integration/test_acl_properties.py`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given
from hypothesis import seed as hyp_seed
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Row, Table, insert, text

from ki.db import models as m
from ki.principals import canonical_principal
from ki.settings import SecuritySettings
from tests import acl_reference as ref

TAG = uuid.uuid4().hex[:8]
# Stored names: "İrem" folds to "i̇rem" (two code points); "gruppe-οδοσ" and "gruppe-οδος" are one name.
NAMES = ("u1", "jürgen", "g1", "gruppe-οδοσ", "gruppe-οδος", "boss", "İrem", "strasse", "finn", "kai")
# Look-alikes that full case folding merged with a stored name, which must match nobody (migration 0007):
# "straẞe", "ﬁnn", the long s, the Kelvin sign, a decomposed "ü".
LOOK_ALIKES = ("straẞe", "ﬁnn", "boſs", "\u212aai", "ju\u0308rgen")
# str.isspace() characters beyond the ASCII space: PostgreSQL's btrim() alone trims none of them.
ODD_SPACE = ("\t", "\n", "\xa0", "\u3000", "\u2009", "\u2028", "\x1c", "\x85")
KINDS = ("local_fs", "local_fs", "sharepoint", "dms")
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
#: An expiry that has not passed (and will not while a test runs).
LATER = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)


def _expiry(expired: bool, row_id: int) -> dt.datetime | None:
    """`expires_at` of a generated row: passed when `expired`; else none, or one still ahead for every other row."""
    return NOW if expired else (LATER if row_id % 2 == 0 else None)


# ---------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------

rarely = st.sampled_from([False] * 5 + [True])


def principals(tag: str = TAG) -> st.SearchStrategy[str]:
    """One of a few tagged principals (kind `acl<tag>`), in random case with random surrounding
    whitespace. Always well-formed: the database rejects anything else (`ck_*_form`)."""
    return _cased_principals(tag).filter(lambda p: canonical_principal(p) is not None)


@st.composite
def _cased_principals(draw: st.DrawFn, tag: str) -> str:
    space = st.lists(st.sampled_from((" ", " ", *ODD_SPACE)), max_size=2).map("".join)
    name = f"acl{tag}:{draw(st.sampled_from(NAMES))}"
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
def cases(
    draw: st.DrawFn,
    mode: str,
    max_documents: int = 5,
    max_objects: int = 5,
    min_grants: int = 2,
    max_grants: int = 16,
    tag: str = TAG,
) -> Case:
    """A world, settings and a caller; principals are `acl<tag>:<name>` (see `principals`)."""
    n_projects = draw(st.integers(1, 3))
    documents = tuple(
        ref.Document(
            i,
            draw(st.integers(1, n_projects)),
            deleted=draw(rarely),
            expired=draw(rarely),
            promoted=draw(st.booleans()),
        )
        for i in range(1, draw(st.integers(1, max_documents)) + 1)
    )
    versions: list[ref.Version] = []
    for d in documents:
        for _ in range(draw(st.integers(1, 3))):  # each version an id of its own
            versions.append(ref.Version(len(versions) + 1, d.id))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3))
    sources = tuple(ref.Source(i, k, expired=draw(rarely)) for i, k in enumerate(kinds, 1))
    objects = tuple(
        ref.SourceObject(i, draw(st.integers(1, len(sources))), acl_known=draw(st.booleans()))
        for i in range(1, draw(st.integers(1, max_objects)) + 1)
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
            draw(principals(tag)),
            draw(st.sampled_from(["allow"] * 3 + ["deny"])),
        )
        for scope in [draw(st.sampled_from(ref.SCOPES)) for _ in range(draw(st.integers(min_grants, max_grants)))]
    )
    memberships = tuple(
        ref.Membership(g, mb)
        for g, mb in draw(st.lists(st.tuples(principals(tag), principals(tag)), max_size=8, unique=True))
    )
    aliases = tuple(
        ref.Alias(a, p)
        for a, p in draw(st.lists(st.tuples(principals(tag), principals(tag)), max_size=4, unique_by=lambda t: t[0]))
    )
    security = SecuritySettings(
        source_acl_mode=mode,
        admin_principals=draw(st.lists(principals(tag), max_size=2)),
        aliases=draw(st.dictionaries(principals(tag), principals(tag), max_size=3)),
    )
    # Caller principals that are none: blank, not text, without a kind (the tagged name alone).
    junk = st.sampled_from(
        ["   ", "", None, 7, "\t\u3000", f"acl{tag}jürgen", f"acl{tag}: ", *(f"acl{tag}:{n}" for n in LOOK_ALIKES)]
    )
    caller = tuple(
        draw(st.lists(st.one_of(principals(tag), principals(tag), principals(tag), junk), min_size=1, max_size=4))
    )
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
    memberships: list[int]
    aliases: list[int]


def write(conn: Connection, world: ref.World, texts: Callable[[ref.Version], str] | None = None) -> Written:
    """Insert `world` (ids are the database's; the world's own ids map to them). `texts`: each version's
    text (default: empty, nothing to search for)."""

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
                {
                    "project_id": projects[d.project_id],
                    "title": "d",
                    "deleted_at": NOW if d.deleted else None,
                    "expires_at": _expiry(d.expired, d.id),
                    "promoted": d.promoted,
                }
                for d in world.documents
            ],
        ),
    )
    version_no: dict[int, int] = {}
    version_rows = []
    for v in world.versions:
        version_no[v.document_id] = version_no.get(v.document_id, 0) + 1
        version_rows.append(
            {
                "document_id": documents[v.document_id],
                "version_no": version_no[v.document_id],
                "status": "final",
                "text": texts(v) if texts else "",
            }
        )
    versions = mapping([v.id for v in world.versions], _ids(conn, _table(m.DocumentVersion), version_rows))
    sources = mapping(
        [s.id for s in world.sources],
        _ids(
            conn,
            _table(m.Source),
            [{"kind": s.kind, "name": f"acl {TAG}", "expires_at": _expiry(s.expired, s.id)} for s in world.sources],
        ),
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
    memberships = _ids(
        conn,
        _table(m.GroupMembership),
        [{"source_id": None, "group_principal": g.group, "member_principal": g.member} for g in world.memberships],
    )
    aliases = _ids(
        conn, _table(m.PrincipalAlias), [{"alias": a.alias, "principal": a.principal} for a in world.aliases]
    )
    return Written(projects, documents, versions, objects, observations, memberships, aliases)


def read_world(conn: Connection, projects: int | Sequence[int]) -> ref.World:
    """These projects' rows, read back from PostgreSQL for the reference (memberships and aliases: all)."""
    ids = [projects] if isinstance(projects, int) else list(projects)

    def rows(sql: str) -> list[Row[Any]]:
        return list(conn.execute(text(sql), {"p": ids}))

    documents = "SELECT id FROM documents WHERE project_id = ANY(:p)"
    versions = f"SELECT id FROM document_versions WHERE document_id IN ({documents})"
    objects = f"SELECT source_object_id FROM source_observations WHERE document_version_id IN ({versions})"
    return ref.World(
        projects=tuple(ids),
        documents=tuple(
            ref.Document(r.id, r.project_id, r.deleted_at is not None, r.expired)
            for r in rows(
                "SELECT id, project_id, deleted_at, coalesce(expires_at <= now(), false) AS expired FROM documents"
                " WHERE project_id = ANY(:p)"
            )
        ),
        versions=tuple(
            ref.Version(r.id, r.document_id)
            for r in rows(f"SELECT id, document_id FROM document_versions WHERE id IN ({versions})")
        ),
        sources=tuple(
            ref.Source(r.id, r.kind, r.expired)
            for r in rows("SELECT id, kind, coalesce(expires_at <= now(), false) AS expired FROM sources")
        ),
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
                f"FROM grants WHERE project_id = ANY(:p) OR document_id IN ({documents}) "
                f"OR source_object_id IN ({objects})"
            )
        ),
        memberships=tuple(
            ref.Membership(r.group_principal, r.member_principal)
            for r in rows("SELECT group_principal, member_principal FROM group_memberships")
        ),
        aliases=tuple(ref.Alias(r.alias, r.principal) for r in rows("SELECT alias, principal FROM principal_aliases")),
    )


def draw(strategy: st.SearchStrategy[Any], n: int, seed: int) -> list[Any]:
    """`n` values of `strategy`, the same ones for the same seed (for tests that need a few random worlds
    outside `@given`, e.g. because each one is synced through the whole stack). No shrinking: these are
    inputs, not counterexamples. The first example Hypothesis tries is the simplest one (all choices
    minimal), so it is left out."""
    out: list[Any] = []

    @hyp_settings(
        max_examples=n + 1,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hyp_seed(seed)
    @given(strategy)
    def collect(value: Any) -> None:
        out.append(value)

    collect()
    return out[1:][-n:]

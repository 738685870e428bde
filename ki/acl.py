"""The one ACL semantics: who may see which document version.

Both query-scope compilation (search) and the principal projection (sync) use this module; nothing
else decides access. The rules (`version_predicate` of the reference spec):

* Caller principals are trimmed and lower-cased, passed through aliases (table `principal_aliases` and
  `security.aliases`, alias -> principal; the caller keeps its own principals and gains every target,
  transitively across both sources), then expanded with mirrored group memberships (transitively).
* A version is only ever visible through an *active* source observation (admins included).
* Administrators (`security.admin_principals`, matched before group expansion so a mirrored group can
  never make somebody an admin) bypass grants.
* Deny wins: a matching deny grant on the project, the document, or an actively observed source object
  excludes the version.
* An active observation is *accessible* when
  - its object is on a `local_fs` source without a known ACL: a local (project or document) allow is
    needed — the object delegates to the project boundary;
  - otherwise (a known object ACL, or any external source): a mirrored source-object allow is needed.
    A local grant can never override it, and an external object with no mirrored grants fails closed.
* Visible = no deny, at least one accessible active observation, and — with
  `source_acl_mode = intersect` — additionally a local project/document allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, Connection, TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Boolean, Text

from ki.settings import SecuritySettings


def normalize_principal(raw: object) -> str | None:
    """Trimmed, lower-cased principal; None for anything that is not a non-empty string."""
    if not isinstance(raw, str):
        return None
    value = raw.strip().lower()
    return value or None


def normalize_principals(raw: Iterable[object]) -> frozenset[str]:
    return frozenset(p for p in (normalize_principal(r) for r in raw) if p)


@dataclass(frozen=True)
class Caller:
    """A caller's effective principals (normalised, aliased, group-expanded) and admin flag."""

    principals: frozenset[str]
    is_admin: bool = False

    @property
    def is_anonymous(self) -> bool:
        return not self.principals and not self.is_admin


@dataclass(frozen=True)
class GrantedPrincipals:
    """Denormalised grants of one version, for inspection and export (not used to authorise)."""

    allowed_principals: tuple[str, ...]
    denied_principals: tuple[str, ...]


_PRINCIPALS = bindparam("principals", type_=ARRAY(Text))

_EXPAND_SQL = text(
    """
    WITH RECURSIVE aliased(principal) AS (
        SELECT unnest(CAST(:principals AS text[]))
        UNION
        SELECT t.target
        FROM aliased a
        CROSS JOIN LATERAL (
            SELECT lower(btrim(pa.principal)) AS target
            FROM principal_aliases pa
            WHERE lower(btrim(pa.alias)) = a.principal
            UNION ALL
            SELECT c.target
            FROM unnest(CAST(:alias_keys AS text[]), CAST(:alias_targets AS text[])) AS c(alias, target)
            WHERE c.alias = a.principal
        ) t
    ),
    expanded(principal) AS (
        SELECT principal FROM aliased
        UNION
        SELECT lower(btrim(gm.group_principal))
        FROM group_memberships gm
        JOIN expanded e ON lower(btrim(gm.member_principal)) = e.principal
    )
    SELECT principal, principal IN (SELECT principal FROM aliased) AS direct FROM expanded
    """
).bindparams(_PRINCIPALS, bindparam("alias_keys", type_=ARRAY(Text)), bindparam("alias_targets", type_=ARRAY(Text)))


def resolve_caller(conn: Connection, raw_principals: Iterable[object], security: SecuritySettings) -> Caller:
    """Normalise, alias (transitively, through the table and the configured aliases) and group-expand a
    caller's principals in SQL. Admin is decided on the aliased principals, before group expansion."""
    base = normalize_principals(raw_principals)
    if not base:
        return Caller(frozenset())
    config_aliases = sorted(_config_aliases(security.aliases))
    rows = conn.execute(
        _EXPAND_SQL,
        {
            "principals": sorted(base),
            "alias_keys": [alias for alias, _ in config_aliases],
            "alias_targets": [target for _, target in config_aliases],
        },
    ).all()
    direct = {row.principal for row in rows if row.direct}
    admins = normalize_principals(security.admin_principals)
    return Caller(frozenset(row.principal for row in rows), is_admin=bool(direct & admins))


def _config_aliases(aliases: Mapping[str, str]) -> set[tuple[str, str]]:
    """`security.aliases` as normalised (alias, principal) pairs; blank entries are dropped."""
    pairs = {(normalize_principal(alias), normalize_principal(principal)) for alias, principal in aliases.items()}
    return {(a, p) for a, p in pairs if a and p}


# The version predicate as one set-based statement. :principals are the caller's effective principals.
# The caller's grants are few, so they are read once (expression index on the normalised principal) and
# split into six small id sets; every candidate observation is then hash-joined against them and the
# verdict aggregated per version. No correlated subquery runs per candidate row, so the cost grows
# linearly with the number of candidate observations (see `ki bench scope`).
_VISIBLE_TEMPLATE = """
    WITH caller_grants AS MATERIALIZED (
        SELECT g.scope, g.effect, g.project_id, g.document_id, g.source_object_id
        FROM grants g
        WHERE lower(btrim(g.principal)) = ANY(CAST(:principals AS text[]))
    ),
    allow_project AS (SELECT DISTINCT project_id AS id FROM caller_grants
                      WHERE effect = 'allow' AND scope = 'project'),
    allow_document AS (SELECT DISTINCT document_id AS id FROM caller_grants
                       WHERE effect = 'allow' AND scope = 'document'),
    allow_object AS (SELECT DISTINCT source_object_id AS id FROM caller_grants
                     WHERE effect = 'allow' AND scope = 'source_object'),
    deny_project AS (SELECT DISTINCT project_id AS id FROM caller_grants
                     WHERE effect = 'deny' AND scope = 'project'),
    deny_document AS (SELECT DISTINCT document_id AS id FROM caller_grants
                      WHERE effect = 'deny' AND scope = 'document'),
    deny_object AS (SELECT DISTINCT source_object_id AS id FROM caller_grants
                    WHERE effect = 'deny' AND scope = 'source_object')
    SELECT dv.id AS version_id, d.id AS document_id, d.project_id
    FROM documents d
    JOIN document_versions dv ON dv.document_id = d.id
    JOIN source_observations o ON o.document_version_id = dv.id AND o.deleted_at IS NULL
    JOIN source_objects so ON so.id = o.source_object_id
    JOIN sources s ON s.id = so.source_id
    LEFT JOIN allow_project ap ON ap.id = d.project_id
    LEFT JOIN allow_document ad ON ad.id = d.id
    LEFT JOIN allow_object ao ON ao.id = o.source_object_id
    LEFT JOIN deny_object dob ON dob.id = o.source_object_id
    WHERE d.deleted_at IS NULL
      {narrowing}
      AND (CAST(:is_admin AS boolean) OR (
            NOT EXISTS (SELECT 1 FROM deny_project x WHERE x.id = d.project_id)
        AND NOT EXISTS (SELECT 1 FROM deny_document x WHERE x.id = d.id)
        AND (NOT CAST(:intersect AS boolean) OR ap.id IS NOT NULL OR ad.id IS NOT NULL)))
    GROUP BY dv.id, d.id, d.project_id
    HAVING CAST(:is_admin AS boolean) OR (
        NOT bool_or(dob.id IS NOT NULL)
        AND bool_or(CASE WHEN s.kind = 'local_fs' AND NOT so.acl_known
                         THEN ap.id IS NOT NULL OR ad.id IS NOT NULL  -- delegates to the project boundary
                         ELSE ao.id IS NOT NULL                       -- known or external ACL decides
                    END))
"""

_NARROWING = {
    "project_ids": "AND d.project_id = ANY(CAST(:project_ids AS bigint[]))",
    "version_ids": "AND dv.id = ANY(CAST(:version_ids AS bigint[]))",
}


def _visible_sql(narrow_by: tuple[str, ...]) -> TextClause:
    """One statement per narrowing combination, so each gets its own plan (a generic `$1 IS NULL OR`
    plan would scan everything even when re-verifying twenty versions)."""
    statement = text(_VISIBLE_TEMPLATE.format(narrowing="\n      ".join(_NARROWING[n] for n in narrow_by)))
    params: list[BindParameter[Any]] = [
        _PRINCIPALS,
        bindparam("is_admin", type_=Boolean),
        bindparam("intersect", type_=Boolean),
    ]
    params += [bindparam(n, type_=ARRAY(BigInteger)) for n in narrow_by]
    return statement.bindparams(*params)


_VISIBLE_SQL = {
    narrow_by: _visible_sql(narrow_by)
    for narrow_by in [(), ("project_ids",), ("version_ids",), ("project_ids", "version_ids")]
}


@dataclass(frozen=True)
class VisibleVersion:
    version_id: int
    document_id: int
    project_id: int


def visible_versions(
    conn: Connection,
    caller: Caller,
    security: SecuritySettings,
    *,
    project_ids: Sequence[int] | None = None,
    version_ids: Sequence[int] | None = None,
) -> list[VisibleVersion]:
    """Every version the caller may see, optionally narrowed to projects or versions. Fails closed."""
    if caller.is_anonymous:
        return []
    params: dict[str, object] = {
        "principals": sorted(caller.principals),
        "is_admin": caller.is_admin,
        "intersect": security.source_acl_mode == "intersect",
    }
    if project_ids is not None:
        params["project_ids"] = [int(p) for p in project_ids]
    if version_ids is not None:
        params["version_ids"] = [int(v) for v in version_ids]
    narrow_by = tuple(n for n in ("project_ids", "version_ids") if n in params)
    rows = conn.execute(_VISIBLE_SQL[narrow_by], params).all()
    return [VisibleVersion(r.version_id, r.document_id, r.project_id) for r in rows]


# Grants that apply to each version: project, document, and actively observed source objects.
_APPLICABLE_SQL = text(
    """
    WITH target AS (
        SELECT dv.id AS version_id, d.id AS document_id, d.project_id
        FROM document_versions dv JOIN documents d ON d.id = dv.document_id
        WHERE dv.id = ANY(CAST(:version_ids AS bigint[]))
    )
    SELECT t.version_id, lower(btrim(g.principal)) AS principal, g.effect
    FROM target t JOIN grants g ON g.scope = 'project' AND g.project_id = t.project_id
    UNION
    SELECT t.version_id, lower(btrim(g.principal)), g.effect
    FROM target t JOIN grants g ON g.scope = 'document' AND g.document_id = t.document_id
    UNION
    SELECT t.version_id, lower(btrim(g.principal)), g.effect
    FROM target t
    JOIN source_observations o ON o.document_version_id = t.version_id AND o.deleted_at IS NULL
    JOIN grants g ON g.scope = 'source_object' AND g.source_object_id = o.source_object_id
    """
).bindparams(bindparam("version_ids", type_=ARRAY(BigInteger)))

# Everyone a granted principal stands for: itself, its group members (transitively) and their aliases.
_STANDS_FOR_SQL = text(
    """
    WITH RECURSIVE members(root, principal) AS (
        SELECT p, p FROM unnest(CAST(:principals AS text[])) AS p
        UNION
        SELECT m.root, lower(btrim(gm.member_principal))
        FROM members m JOIN group_memberships gm ON lower(btrim(gm.group_principal)) = m.principal
    )
    SELECT root, principal FROM members
    UNION
    SELECT m.root, lower(btrim(pa.alias))
    FROM members m JOIN principal_aliases pa ON lower(btrim(pa.principal)) = m.principal
    """
).bindparams(_PRINCIPALS)


def version_projections(
    conn: Connection, version_ids: Iterable[int], security: SecuritySettings
) -> dict[int, GrantedPrincipals]:
    """The principal projection of each version: who is granted (allow) and who is denied, with group
    members and aliases of those principals included. Versions without grants get empty tuples.

    Each distinct granted principal is expanded once (not once per version it is granted on): a fan-out
    over thousands of versions usually names only a handful of groups."""
    ids = sorted({int(v) for v in version_ids})
    if not ids:
        return {}
    granted: dict[int, dict[str, set[str]]] = {v: {"allow": set(), "deny": set()} for v in ids}
    for row in conn.execute(_APPLICABLE_SQL, {"version_ids": ids}):
        granted[row.version_id][row.effect].add(row.principal)
    roots = sorted({p for sets in granted.values() for names in sets.values() for p in names})
    stands_for: dict[str, set[str]] = {}
    if roots:
        for row in conn.execute(_STANDS_FOR_SQL, {"principals": roots}):
            stands_for.setdefault(row.root, set()).add(row.principal)
    reverse_config = _reverse_aliases(security.aliases)

    def expand(names: set[str]) -> tuple[str, ...]:
        out: set[str] = set()
        for name in names:
            out |= stands_for.get(name, {name})
        return _with_config_aliases(out, reverse_config)

    return {
        v: GrantedPrincipals(allowed_principals=expand(sets["allow"]), denied_principals=expand(sets["deny"]))
        for v, sets in granted.items()
    }


def _reverse_aliases(aliases: Mapping[str, str]) -> dict[str, set[str]]:
    reverse: dict[str, set[str]] = {}
    for alias, principal in aliases.items():
        a, p = normalize_principal(alias), normalize_principal(principal)
        if a and p:
            reverse.setdefault(p, set()).add(a)
    return reverse


def _with_config_aliases(principals: set[str], reverse: dict[str, set[str]]) -> tuple[str, ...]:
    out = set(principals)
    for p in principals:
        out |= reverse.get(p, set())
    return tuple(sorted(out))

"""The one ACL semantics: who may see which document version.

Both query-scope compilation (search) and the principal projection (sync) use this module; nothing
else decides access. The rules (`version_predicate` of the reference spec):

* Principals are compared in their canonical form `kind:name`, trimmed and casefolded: in SQL the
  function `ki_principal(text)` (migration 0004; NULL for anything that is not a well-formed principal,
  which then matches nobody), in Python `ki.principals.canonical_principal`, one definition. Stored
  grants, memberships and aliases are compared exactly as callers are. Caller principals are passed
  through aliases (table `principal_aliases` and `security.aliases`, alias -> principal; the caller
  keeps its own principals and gains every target, transitively across both sources), then expanded
  with mirrored group memberships (transitively).
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
* Expiry (admins included): a document whose `expires_at` has passed is visible to nobody; an observation at
  an object of a source whose `expires_at` has passed counts as no observation (so a version observed only
  at expired sources is hidden, and no citation names such an object). Decided in SQL against the
  database's clock, so exact before the sync has dropped any row.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy import BindParameter, Connection, TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Boolean, Text

from ki.settings import SecuritySettings


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

# Alias and group expansion of :principals (raw), as CTEs so the re-verify can inline them.
_ALIAS_CTES = """
    config_aliases(alias, target) AS (
        SELECT ki_principal(c.alias), ki_principal(c.target)
        FROM unnest(CAST(:alias_keys AS text[]), CAST(:alias_targets AS text[])) AS c(alias, target)
    ),
    aliased(principal) AS (
        SELECT ki_principal(raw) FROM unnest(CAST(:principals AS text[])) AS raw
        UNION
        SELECT t.target
        FROM aliased a
        CROSS JOIN LATERAL (
            SELECT ki_principal(pa.principal) AS target
            FROM principal_aliases pa
            WHERE ki_principal(pa.alias) = a.principal
            UNION ALL
            SELECT c.target FROM config_aliases c WHERE c.alias = a.principal
        ) t
    )"""
_GROUPS_CTE = """
    expanded(principal) AS (
        SELECT principal FROM aliased
        UNION
        SELECT t.principal
        FROM expanded e
        -- One index probe per principal reached (OFFSET 0 keeps the subquery from being flattened into a
        -- join): a merge or hash join would evaluate ki_principal over every membership row of the table on
        -- each round (25k memberships: 1 -> 77 ms for a caller of one group).
        CROSS JOIN LATERAL (
            SELECT ki_principal(gm.group_principal) AS principal
            FROM group_memberships gm
            WHERE ki_principal(gm.member_principal) = e.principal
            OFFSET 0
        ) t
    )"""
_EXPAND_CTES = _ALIAS_CTES + "," + _GROUPS_CTE
_EXPAND_SELECT = """
    -- A malformed (NULL) principal reached through a link matches nothing and is dropped here, not in the
    -- recursion, where an IS NOT NULL filter would make the planner scan a whole index.
    SELECT principal,
           principal IN (SELECT principal FROM aliased WHERE principal IS NOT NULL)
           AND principal IN (SELECT ki_principal(x) FROM unnest(CAST(:admins AS text[])) AS x) AS admin
    FROM expanded
    WHERE principal IS NOT NULL"""
_EXPAND_SQL = text("WITH RECURSIVE" + _EXPAND_CTES + _EXPAND_SELECT).bindparams(
    _PRINCIPALS,
    bindparam("alias_keys", type_=ARRAY(Text)),
    bindparam("alias_targets", type_=ARRAY(Text)),
    bindparam("admins", type_=ARRAY(Text)),
)


def resolve_caller(conn: Connection, raw_principals: Iterable[object], security: SecuritySettings) -> Caller:
    """Normalise, alias (transitively, through the table and the configured aliases) and group-expand a
    caller's principals in SQL. Admin is decided on the aliased principals, before group expansion.

    Everything is normalised by `ki_principal` in SQL (callers, configured aliases and admins as well as
    the stored rows), so the ACL compares with one definition; a caller principal that is not
    well-formed (no `kind:`) matches nothing."""
    base = sorted({r for r in raw_principals if isinstance(r, str) and r.strip()})
    if not base:
        return Caller(frozenset())
    params = {"principals": base, "admins": _strings(security.admin_principals), **_config_alias_params(security)}
    rows = conn.execute(_EXPAND_SQL, params).all()
    return Caller(frozenset(row.principal for row in rows), is_admin=any(row.admin for row in rows))


def expand_principals(conn: Connection, principals: Iterable[object], security: SecuritySettings) -> frozenset[str]:
    """Everything a caller holding `principals` would hold after aliasing and group expansion (as
    `resolve_caller`). The sync fan-out uses it: a grant's projection names a principal exactly when the
    grant's principal is in that principal's expansion, so a changed alias or membership of P affects the
    versions granted to `expand_principals({P})`."""
    return resolve_caller(conn, principals, security).principals


def _strings(values: Iterable[object]) -> list[str]:
    return sorted({v for v in values if isinstance(v, str)})


def _config_alias_params(security: SecuritySettings) -> dict[str, list[str]]:
    """`security.aliases` as raw (alias, principal) arrays; SQL normalises them (malformed ones match nothing)."""
    pairs = sorted((a, p) for a, p in security.aliases.items() if isinstance(a, str) and isinstance(p, str))
    return {"alias_keys": [alias for alias, _ in pairs], "alias_targets": [target for _, target in pairs]}


# The version predicate as one set-based statement. :principals are the caller's effective principals.
# The caller's grants are few, so they are read once (expression index on the normalised principal) and
# split into six small id sets. Every candidate observation is tested against them with `IN (SELECT ...)`
# inside an expression, which PostgreSQL always runs as a hashed subplan: O(1) per row whatever the
# estimates (as LEFT JOINs, a misestimated one-row CTE made the planner nest-loop 10k observations
# against 1.5k allowed objects: 1 s instead of tens of ms). The verdict is aggregated per version, so the
# cost grows linearly with the number of candidate observations.
#
# Which observations are candidates: a non-admin caller can only see a version that one of their allow
# grants reaches (a project or document allow, or an allow on an object observing it). When those grants
# reach a small part of the corpus (`_NARROW_GRANTS_SQL`), the statement starts from the reached versions
# (`{driver}` = _REACHABLE_DRIVER) and its cost follows the caller's scope, not the corpus (100 visible
# documents in a database of 112k observations: 245 -> 10 ms). Everyone else, admins, and statements
# narrowed to a few versions start from the documents and versions tables (_DIRECT_DRIVER).
_CANDIDATES_TEMPLATE = """
    WITH caller_grants AS MATERIALIZED (
        SELECT g.scope, g.effect, g.project_id, g.document_id, g.source_object_id,
               ki_principal(g.principal) AS principal
        FROM grants g
        WHERE ki_principal(g.principal) = ANY(CAST(:principals AS text[]))
    ),
    allow_project AS (SELECT project_id AS id FROM caller_grants WHERE effect = 'allow' AND scope = 'project'),
    allow_document AS (SELECT document_id AS id FROM caller_grants WHERE effect = 'allow' AND scope = 'document'),
    allow_object AS (SELECT source_object_id AS id FROM caller_grants
                     WHERE effect = 'allow' AND scope = 'source_object'),
    deny_project AS (SELECT project_id AS id FROM caller_grants WHERE effect = 'deny' AND scope = 'project'),
    deny_document AS (SELECT document_id AS id FROM caller_grants WHERE effect = 'deny' AND scope = 'document'),
    deny_object AS (SELECT source_object_id AS id FROM caller_grants WHERE effect = 'deny' AND scope = 'source_object'),
    {reachable}
    candidates AS (  -- every active observation of a live version that no project/document rule excludes
        {candidates}
    ),
    verdicts AS (
        SELECT version_id, document_id, project_id
        FROM candidates
        GROUP BY version_id, document_id, project_id
        HAVING CAST(:is_admin AS boolean) OR (NOT bool_or(object_denied) AND bool_or(accessible))
    )
"""

_CANDIDATE_SELECT = """SELECT dv.id AS version_id, d.id AS document_id, d.project_id, o.id AS observation_id,
               o.source_object_id,
               o.source_object_id IN (SELECT id FROM deny_object) AS object_denied,
               CASE WHEN s.kind = 'local_fs' AND NOT so.acl_known  -- delegates to the project boundary
                    THEN d.project_id IN (SELECT id FROM allow_project) OR d.id IN (SELECT id FROM allow_document)
                    ELSE o.source_object_id IN (SELECT id FROM allow_object)  -- known or external ACL decides
               END AS accessible
        {driver}
        JOIN source_observations o ON o.document_version_id = dv.id AND o.deleted_at IS NULL
        JOIN source_objects so ON so.id = o.source_object_id
        JOIN sources s ON s.id = so.source_id
        WHERE d.deleted_at IS NULL
          -- Expiry (migration 0013): an expired document is visible to nobody, and an observation at an object of
          -- an expired source is no candidate (a version seen only there is hidden; none is cited through it).
          -- `now()` is the statement's transaction start; the statement is the same whatever expired.
          AND (d.expires_at IS NULL OR d.expires_at > now())
          AND (s.expires_at IS NULL OR s.expires_at > now())
          {narrowing}
          AND (CAST(:is_admin AS boolean) OR (
                NOT (d.project_id IN (SELECT id FROM deny_project))
            AND NOT (d.id IN (SELECT id FROM deny_document))
            AND (NOT CAST(:intersect AS boolean)
                 OR d.project_id IN (SELECT id FROM allow_project) OR d.id IN (SELECT id FROM allow_document))))
"""

# Versions one of the caller's allow grants reaches; each branch is a semi-join driven by a small id set.
_REACHABLE_CTE = """
    reachable(id) AS (
        SELECT dv.id FROM documents d JOIN document_versions dv ON dv.document_id = d.id
        WHERE d.project_id IN (SELECT id FROM allow_project)
        UNION
        SELECT dv.id FROM document_versions dv WHERE dv.document_id IN (SELECT id FROM allow_document)
        UNION
        SELECT o.document_version_id FROM source_observations o
        WHERE o.source_object_id IN (SELECT id FROM allow_object) AND o.deleted_at IS NULL
    ),"""
_REACHABLE_DRIVER = """FROM reachable r
        JOIN document_versions dv ON dv.id = r.id
        JOIN documents d ON d.id = dv.document_id"""
_DIRECT_DRIVER = """FROM documents d
        JOIN document_versions dv ON dv.document_id = d.id"""

_VISIBLE_SELECT = "SELECT version_id, document_id, project_id FROM verdicts"

# Citable observations: active and accessible, of a visible version (admins: every active observation).
# With what a citation shows of its version and where its objects live, so re-verification is one round trip.
_OBSERVATIONS_SELECT = """
    SELECT c.version_id, c.document_id, c.project_id, c.observation_id, c.source_object_id,
           d.title, dv.version_no, d.latest_final_version_id, dv.status, dv.doc_date, dv.language,
           so.external_ref, s.kind AS source_kind
    FROM candidates c
    JOIN document_versions dv ON dv.id = c.version_id
    JOIN documents d ON d.id = c.document_id
    JOIN source_objects so ON so.id = c.source_object_id
    JOIN sources s ON s.id = so.source_id
    WHERE (CAST(:is_admin AS boolean) OR c.accessible)
      AND c.version_id IN (SELECT version_id FROM verdicts)
"""

# The compiled scope of a search: the distinct, sorted id sets as two arrays in one row, so a caller who
# sees 100k documents costs PostgreSQL one aggregate rather than the API 100k row objects.
_SCOPE_SELECT = """
    SELECT coalesce(array_agg(DISTINCT project_id ORDER BY project_id), '{}') AS project_ids,
           coalesce(array_agg(DISTINCT document_id ORDER BY document_id), '{}') AS document_ids
    FROM verdicts
"""

# A search's scope (`search_scope`): the visible projects and documents as above, and what filters the
# legs per version. `hidden_version_ids` are the versions a per-document filter or the principal
# projection would let through although the caller may not see them: every hidden version of a visible
# document, and every version one of the caller's allow grants reaches (so its projection names the
# caller) that no projection deny excludes -- minus the visible ones. `allow_principals` and
# `deny_principals` are the caller's principals that grants name: a row's projection admits the caller
# exactly when it lists one of the first and none of the second (a projection always lists the granted
# principal itself, so this holds while memberships and aliases are still being synced) -- unless
# `aliases_escape`: a projection lists P for what P resolves to *held alone*, aliases included, but a
# principal the caller reached through a group membership is not aliased further, so an alias from one of
# the caller's principals to one they do not hold lets the projection admit versions no grant of the
# caller reaches (nor lists as hidden). Such a caller's search does not filter by the projection.
_SEARCH_SCOPE_SELECT = """
    SELECT coalesce((SELECT array_agg(DISTINCT project_id ORDER BY project_id) FROM verdicts), '{}') AS project_ids,
           coalesce((SELECT array_agg(DISTINCT document_id ORDER BY document_id) FROM verdicts), '{}') AS document_ids,
           coalesce((SELECT array_agg(id ORDER BY id) FROM (
               SELECT v.id FROM document_versions v WHERE v.document_id IN (SELECT document_id FROM verdicts)
               UNION
               SELECT dv.id
               {driver}
               WHERE NOT CAST(:is_admin AS boolean)
                 {narrowing}
                 AND (d.project_id IN (SELECT id FROM allow_project) OR d.id IN (SELECT id FROM allow_document)
                      OR EXISTS (SELECT 1 FROM source_observations o
                                 WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL
                                   AND o.source_object_id IN (SELECT id FROM allow_object)))
                 AND NOT (d.project_id IN (SELECT id FROM deny_project))
                 AND NOT (d.id IN (SELECT id FROM deny_document))
                 AND EXISTS (SELECT 1 FROM source_observations o
                             WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL)
                 AND NOT EXISTS (SELECT 1 FROM source_observations o
                                 WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL
                                   AND o.source_object_id IN (SELECT id FROM deny_object))
               EXCEPT SELECT version_id FROM verdicts) hidden), '{}') AS hidden_version_ids,
           coalesce((SELECT array_agg(DISTINCT principal ORDER BY principal) FROM caller_grants
                     WHERE effect = 'allow' AND principal IS NOT NULL), '{}') AS allow_principals,
           coalesce((SELECT array_agg(DISTINCT principal ORDER BY principal) FROM caller_grants
                     WHERE effect = 'deny' AND principal IS NOT NULL), '{}') AS deny_principals,
           EXISTS (SELECT 1 FROM (SELECT ki_principal(pa.alias) AS alias, ki_principal(pa.principal) AS target
                                  FROM principal_aliases pa
                                  WHERE ki_principal(pa.alias) = ANY(CAST(:principals AS text[]))
                                  UNION ALL
                                  SELECT ki_principal(c.alias), ki_principal(c.target)
                                  FROM unnest(CAST(:alias_keys AS text[]), CAST(:alias_targets AS text[]))
                                       AS c(alias, target)) link
                   WHERE link.alias = ANY(CAST(:principals AS text[]))
                     AND NOT (link.target = ANY(CAST(:principals AS text[])))) AS aliases_escape
"""

# The documents at the other end of the frontier's relations (of the wanted kinds and directions): a
# traversal's level asks for their visible versions without reading the edges to hidden ones first.
_NEIGHBOURS = (
    "SELECT r.to_document_id FROM relations r WHERE r.from_document_id = ANY(CAST(:neighbours_of AS bigint[]))"
    " AND CAST(:outgoing AS boolean) AND (CAST(:kinds AS text[]) IS NULL OR r.kind = ANY(CAST(:kinds AS text[])))"
    " UNION SELECT r.from_document_id FROM relations r WHERE r.to_document_id = ANY(CAST(:neighbours_of AS bigint[]))"
    " AND CAST(:incoming AS boolean) AND (CAST(:kinds AS text[]) IS NULL OR r.kind = ANY(CAST(:kinds AS text[])))"
)

# The documents whose title, or one of whose identifiers, has one of the identity keys asked: one probe per key
# of the partial expression indexes of migrations 0005 and 0010 (hence `deleted_at IS NULL` in each probe:
# without it neither index applies and every title is folded, 30-60 ms on 2,254 documents against 4-8 ms),
# evaluated once as an array. The title's B-tree holds the key's first TITLE_KEY_PREFIX characters, so a row
# found is not folded again (a hash index made every carrier found, hidden ones too, cost a fold); keys asked
# are shorter than that (`visible_carriers`), so prefix equality is key equality.
TITLE_KEY_PREFIX = 255
_TITLE_KEY = f"left(ki_identity_key({{title}}), {TITLE_KEY_PREFIX})"
# `_NAMED_PAIRS` says which key found which document, so the preflight's answer is read from the probes and no
# document's title or identifiers are folded again (folding every visible carrier once per key asked cost
# 0.2 ms a pair: 3 s for "Schadensersatz 823 BGB" over 1,500 visible carriers of "BGB").
_NAMED_PAIRS = (
    "SELECT k.key, 'title' AS why, n.id FROM unnest(CAST(:title_keys AS text[])) AS k(key)"
    " CROSS JOIN LATERAL (SELECT id FROM documents WHERE deleted_at IS NULL"
    f" AND {_TITLE_KEY.format(title='title')} = k.key) n"
    " UNION ALL SELECT k.key, 'identifier' AS why, n.id FROM unnest(CAST(:identifier_keys AS text[])) AS k(key)"
    " CROSS JOIN LATERAL (SELECT id FROM documents"
    " WHERE deleted_at IS NULL AND ki_identity_keys(identifiers) @> ARRAY[k.key]) n"
)
_NAMED = f"SELECT named.id FROM ({_NAMED_PAIRS}) named"

_NARROWING = {
    "project_ids": "AND d.project_id = ANY(CAST(:project_ids AS bigint[]))",
    "named": f"AND d.id = ANY(ARRAY({_NAMED}))",
    "neighbours_of": f"AND d.id IN ({_NEIGHBOURS})",
    # The documents condition repeats the narrowing as a semi-join on document ids, so the planner reaches
    # documents by primary key from the few versions instead of scanning every document (re-verifying
    # 120 versions of a 16k-version corpus: 7 -> 5 ms, and no longer growing with the corpus).
    "version_ids": "AND dv.id = ANY(CAST(:version_ids AS bigint[]))"
    " AND d.id IN (SELECT v.document_id FROM document_versions v WHERE v.id = ANY(CAST(:version_ids AS bigint[])))",
    # Every version of the documents these versions belong to (a document's versions as the caller sees them).
    "sibling_ids": "AND d.id IN (SELECT v.document_id FROM document_versions v"
    " WHERE v.id = ANY(CAST(:sibling_ids AS bigint[])))",
    # Every version of these documents.
    "document_ids": "AND d.id = ANY(CAST(:document_ids AS bigint[]))",
}


# The caller resolved inside the statement (`_EXPAND_SQL` as CTEs): the re-verify of a search then reads
# aliases, memberships and grants in one snapshot and one round trip, whatever a cache says about the caller.
_RESOLVED_CALLER_CTE = (
    "RECURSIVE"
    + _EXPAND_CTES
    + """,
    caller AS MATERIALIZED (
        SELECT coalesce(array_agg(principal), '{}') AS principals, coalesce(bool_or(admin), false) AS is_admin
        FROM ("""
    + _EXPAND_SELECT
    + """) resolved
    ),"""
)


# The recursive step of a walk down the memberships, `{walk}(root, principal)`: the members of each principal
# reached, one index probe per principal (OFFSET 0 keeps the subquery from being flattened into a join, as
# in the caller's expansion).
_MEMBERS_STEP = """
        SELECT m.root, t.principal
        FROM {walk} m
        CROSS JOIN LATERAL (
            SELECT ki_principal(gm.member_principal) AS principal
            FROM group_memberships gm
            WHERE ki_principal(gm.group_principal) = m.principal
            OFFSET 0
        ) t"""

# How a re-verify finds which grants name the caller. `from_caller`: walk up from the caller's principals to
# every group they belong to (`expanded`), then keep the asked documents' grants naming any of them -- one
# index probe per principal the caller holds. `from_grants`: read the grants on the asked documents (their projects, the
# documents, the objects observing their versions), walk *down* from the principals those grants name to
# their members, transitively, and keep the granted principals whose members include one of the caller's
# aliased principals -- one probe per member of the granted groups, whatever the caller's groups number.
# The same memberships walked the other way, so the same granted principals: a caller in 25,000 groups costs
# the second what the asked documents' grants cost, not 25,000 probes on every search. The choice is a plan
# hint (`walk_for`), never a different answer (the property tests compare both).
Walk = Literal["from_caller", "from_grants"]

# Above this many principals (a caller's groups, aliases and own), the walk from the grants: a caller's walk
# costs one index probe per principal held, the grants' walk one per member of the page's granted groups
# (typically a few hundred; a firm-wide group a few thousand).
WALK_FROM_GRANTS_ABOVE = 1_000


def walk_for(caller_principals: int) -> Walk:
    """The cheaper walk for a caller who resolved to this many principals (see `Walk`)."""
    return "from_grants" if caller_principals > WALK_FROM_GRANTS_ABOVE else "from_caller"


# The documents a re-verify asks about, per narrowing (the grants' walk starts from their grants).
_ASKED_DOCUMENTS = {
    "version_ids": "d.id IN (SELECT v.document_id FROM document_versions v"
    " WHERE v.id = ANY(CAST(:version_ids AS bigint[])))",
    "sibling_ids": "d.id IN (SELECT v.document_id FROM document_versions v"
    " WHERE v.id = ANY(CAST(:sibling_ids AS bigint[])))",
    "document_ids": "d.id = ANY(CAST(:document_ids AS bigint[]))",
    "neighbours_of": f"d.id IN ({_NEIGHBOURS})",
    "named": f"d.id = ANY(ARRAY({_NAMED}))",
}
_GRANT_COLUMNS = "g.scope, g.effect, g.project_id, g.document_id, g.source_object_id, ki_principal(g.principal)"
# The grants that can decide the asked documents: on their projects, on them, on the objects observing any of
# their versions. Both walks read the caller's grants from these alone, so a re-verify costs what the page's
# grants cost, not what every grant naming the caller costs (a broad caller of the 1M bench corpus is named by
# 29,779 grants, each principal folded on every search: 170 ms).
_ASKED_GRANTS_CTES = (
    """
    asked_documents AS MATERIALIZED (SELECT d.id, d.project_id FROM documents d WHERE {asked}),
    asked_grants(scope, effect, project_id, document_id, source_object_id, principal) AS MATERIALIZED (
        SELECT """
    + _GRANT_COLUMNS
    + """ FROM grants g
        WHERE g.project_id IN (SELECT project_id FROM asked_documents) AND g.scope = 'project'
        UNION ALL
        SELECT """
    + _GRANT_COLUMNS
    + """ FROM grants g
        WHERE g.document_id IN (SELECT id FROM asked_documents) AND g.scope = 'document'
        UNION ALL
        SELECT """
    + _GRANT_COLUMNS
    + """ FROM grants g
        WHERE g.scope = 'source_object' AND g.source_object_id IN (
            SELECT o.source_object_id FROM source_observations o
            JOIN document_versions dv ON dv.id = o.document_version_id
            WHERE dv.document_id IN (SELECT id FROM asked_documents))
    )"""
)
_FROM_GRANTS_CTES = (
    "RECURSIVE"
    + _ALIAS_CTES
    + ","
    + _ASKED_GRANTS_CTES
    + """,
    granted_members(root, principal) AS (
        SELECT DISTINCT principal, principal FROM asked_grants WHERE principal IS NOT NULL
        UNION"""
    + _MEMBERS_STEP.replace("{walk}", "granted_members")
    + """
    ),
    caller AS MATERIALIZED (
        SELECT coalesce((SELECT array_agg(DISTINCT m.root) FROM granted_members m
                         WHERE m.principal IN (SELECT principal FROM aliased WHERE principal IS NOT NULL)),
                        '{}') AS principals,
               -- admin as `_EXPAND_SELECT` decides it: on the aliased principals, before any group
               EXISTS (SELECT 1 FROM aliased a
                       WHERE a.principal IN (SELECT ki_principal(x) FROM unnest(CAST(:admins AS text[])) AS x))
               AS is_admin
    ),"""
)


def _replace_once(sql: str, old: str, new: str, count: int = 1) -> str:
    if sql.count(old) != count:
        raise AssertionError(f"ACL statement template changed: {old!r} occurs {sql.count(old)} times")
    return sql.replace(old, new)


def _visible_sql(
    narrow_by: tuple[str, ...],
    select: str = _VISIBLE_SELECT,
    *,
    reachable: bool = False,
    resolve: Walk | None = None,
    aliases: bool = False,
) -> TextClause:
    """One statement per narrowing combination and driver, so each gets its own plan (a generic
    `$1 IS NULL OR` plan would scan everything even when re-verifying twenty versions). `reachable`:
    start from the versions the caller's allow grants reach (non-admin callers with narrow grants).
    `resolve`: `:principals` are the caller's raw principals, resolved in the statement (with
    `:admins`, `:alias_keys`, `:alias_targets`) by that walk (`Walk`), not already expanded ones with
    `:is_admin`; only where the narrowing names documents (`_ASKED_DOCUMENTS`), whose grants alone are read.
    `aliases`: the select reads the configured aliases (`:alias_keys`, `:alias_targets`) too."""
    narrowing = "\n          ".join(_NARROWING[n] for n in narrow_by)
    driver = _REACHABLE_DRIVER if reachable else _DIRECT_DRIVER
    candidates = _CANDIDATE_SELECT.format(driver=driver, narrowing=narrowing)
    # A select may name the driver and the narrowing too (replaced, not formatted: selects hold '{}' literals).
    select = select.replace("{driver}", driver).replace("{narrowing}", narrowing)
    sql = _CANDIDATES_TEMPLATE.format(reachable=_REACHABLE_CTE if reachable else "", candidates=candidates) + select
    params: list[BindParameter[Any]] = [_PRINCIPALS, bindparam("intersect", type_=Boolean)]
    if resolve:
        (asked,) = (_ASKED_DOCUMENTS[n] for n in narrow_by)
        if resolve == "from_caller":
            ctes = _RESOLVED_CALLER_CTE + _ASKED_GRANTS_CTES.replace("{asked}", asked) + ","
        else:
            ctes = _FROM_GRANTS_CTES.replace("{asked}", asked)
        sql = _replace_once(sql, "WITH caller_grants", f"WITH {ctes}\n    caller_grants")
        sql = _replace_once(
            sql,
            """ki_principal(g.principal) AS principal
        FROM grants g
        WHERE ki_principal(g.principal) = ANY(CAST(:principals AS text[]))""",
            """g.principal
        FROM asked_grants g
        WHERE g.principal = ANY(CAST((SELECT principals FROM caller) AS text[]))""",
        )
        sql = _replace_once(sql, "CAST(:is_admin AS boolean)", "(SELECT is_admin FROM caller)", sql.count(":is_admin"))
        params += [bindparam(n, type_=ARRAY(Text)) for n in ("alias_keys", "alias_targets", "admins")]
    else:
        params.append(bindparam("is_admin", type_=Boolean))
        if aliases:
            params += [bindparam(n, type_=ARRAY(Text)) for n in ("alias_keys", "alias_targets")]
    statement = text(sql)
    params += [bindparam(n, type_=ARRAY(BigInteger)) for n in narrow_by if n != "named"]
    if "named" in narrow_by:
        params += [bindparam("title_keys", type_=ARRAY(Text)), bindparam("identifier_keys", type_=ARRAY(Text))]
    if "neighbours_of" in narrow_by:
        params += [bindparam("kinds", type_=ARRAY(Text)), bindparam("outgoing", type_=Boolean),
                   bindparam("incoming", type_=Boolean)]  # fmt: skip
    return statement.bindparams(*params)


# Starting from the reached versions pays off only when they are a small part of the corpus; for a
# caller who reaches most of it, the direct hash joins are cheaper than the nested loops. This estimate
# (planner statistics and the caller's allow grants, no other rows read) puts a project allow at the
# average project's size and a document or object allow at one document, and says whether the total
# is under a quarter of the documents. Tables never analysed give false: the direct driver, the safe
# default. A wrong guess costs time, never a different answer.
_NARROW_GRANTS_SQL = text(
    """
    SELECT coalesce((SELECT sum(CASE WHEN g.scope = 'project'
                                     THEN greatest(d.reltuples, 0) / greatest(p.reltuples, 1) ELSE 1 END)
                     FROM grants g
                     WHERE ki_principal(g.principal) = ANY(CAST(:principals AS text[])) AND g.effect = 'allow'), 0)
           < greatest(d.reltuples, 0) / 4 AS narrow
    FROM pg_class d, pg_class p
    WHERE d.oid = 'documents'::regclass AND p.oid = 'projects'::regclass
    """
).bindparams(_PRINCIPALS)


_NARROWINGS: list[tuple[str, ...]] = [(), ("project_ids",), ("version_ids",), ("project_ids", "version_ids")]
# (narrowing, reachable-driven) -> statement. Narrowed to versions, the direct driver is already small.
_VISIBLE_SQL = {
    (narrow_by, reachable): _visible_sql(narrow_by, reachable=reachable)
    for narrow_by in _NARROWINGS
    for reachable in (False, True)
}
# (narrowing, resolving) -> statement: the versions named, or every version of their documents.
_OBSERVATIONS_SQL = {
    (narrowing, resolve): _visible_sql((narrowing,), _OBSERVATIONS_SELECT, resolve=resolve)
    for narrowing in ("version_ids", "sibling_ids", "document_ids", "neighbours_of")
    for resolve in (None, *get_args(Walk))
}
# Per identity key asked, the documents carrying it that the caller may see (the identity preflight).
_NAMED_SELECT = (
    """
    SELECT DISTINCT named.key, named.why, d.id AS document_id, d.project_id, d.title
    FROM verdicts v
    JOIN ("""
    + _NAMED_PAIRS
    + """) named ON named.id = v.document_id
    JOIN documents d ON d.id = v.document_id
    ORDER BY named.key, named.why, d.id
"""
)
_NAMED_SQL = {resolve: _visible_sql(("named",), _NAMED_SELECT, resolve=resolve) for resolve in get_args(Walk)}


@dataclass(frozen=True)
class NamedCarrier:
    key: str
    why: str  # "title" or "identifier"
    document_id: int
    project_id: int
    title: str


def visible_carriers(
    conn: Connection,
    caller: Unresolved,
    security: SecuritySettings,
    title_keys: Sequence[str],
    identifier_keys: Sequence[str],
    *,
    walk: Walk = "from_caller",
) -> list[NamedCarrier]:
    """Per identity key asked (as a title, as an identifier), the documents carrying it that the caller may
    see: one statement, whose rows are only those documents (a name carried by hidden documents returns what a
    name carried by none does). Fails closed."""
    title_keys = [k for k in title_keys if len(k) < TITLE_KEY_PREFIX]  # no title is named by longer ones
    if not caller.principals or not (title_keys or identifier_keys):
        return []
    params = {**_unresolved_params(caller, security), "title_keys": title_keys,
              "identifier_keys": list(identifier_keys)}  # fmt: skip
    rows = conn.execute(_NAMED_SQL[walk], params).all()
    return [NamedCarrier(str(r.key), str(r.why), int(r.document_id), int(r.project_id), str(r.title)) for r in rows]


_SCOPE_SQL = {
    (narrow_by, reachable): _visible_sql(narrow_by, _SCOPE_SELECT, reachable=reachable)
    for narrow_by in [(), ("project_ids",)]
    for reachable in (False, True)
}
_SEARCH_SCOPE_SQL = {
    (narrow_by, reachable): _visible_sql(narrow_by, _SEARCH_SCOPE_SELECT, reachable=reachable, aliases=True)
    for narrow_by in [(), ("project_ids",)]
    for reachable in (False, True)
}


Driver = Literal["auto", "direct", "reachable"]

# The driver choice is only a plan hint (both drivers give the same answer), so it is remembered per
# principal set for a while instead of costing every search a grant read.
DRIVER_HINT_TTL_S = 60.0
_DRIVER_HINTS_MAX = 10_000
_DRIVER_HINTS: dict[tuple[str, ...], tuple[bool, float]] = {}


def _driven_by_grants(conn: Connection, caller: Caller, narrow_by: tuple[str, ...], driver: Driver) -> bool:
    """Start from the versions the caller's grants reach? Not for admins (they reach everything), not
    when narrowed to versions (already few), and only when the allow grants reach a small part.
    `driver` forces one (both give the same answer; the property tests check each)."""
    if caller.is_admin or "version_ids" in narrow_by or driver == "direct":
        return False
    if driver == "reachable":
        return True
    key = tuple(sorted(caller.principals))
    now = time.monotonic()
    hint = _DRIVER_HINTS.get(key)
    if hint is not None and now - hint[1] < DRIVER_HINT_TTL_S:
        return hint[0]
    narrow = bool(conn.execute(_NARROW_GRANTS_SQL, {"principals": list(key)}).scalar())
    if len(_DRIVER_HINTS) >= _DRIVER_HINTS_MAX:
        _DRIVER_HINTS.clear()
    _DRIVER_HINTS[key] = (narrow, now)
    return narrow


def _unresolved_params(caller: Unresolved, security: SecuritySettings) -> dict[str, object]:
    """The parameters of a statement that resolves the caller itself (`Unresolved`)."""
    return {
        "principals": list(caller.principals),
        "intersect": security.source_acl_mode == "intersect",
        "admins": _strings(security.admin_principals),
        **_config_alias_params(security),
    }


def _caller_params(caller: Caller, security: SecuritySettings) -> dict[str, object]:
    return {
        "principals": sorted(caller.principals),
        "is_admin": caller.is_admin,
        "intersect": security.source_acl_mode == "intersect",
    }


def caller_params(caller: Caller, security: SecuritySettings) -> dict[str, object]:
    """The parameters `visible_statement` needs for a resolved caller."""
    return _caller_params(caller, security)


def visible_statement(prelude: str, narrowing: str, select: str) -> TextClause:
    """The one ACL statement for a resolved caller (`caller_params`), for readers whose question needs the
    verdicts and their own rows in one snapshot and one round trip: `prelude` (CTEs of the reader's own, each
    followed by a comma) before the ACL's, `narrowing` (SQL over `d` and `dv`, starting with AND) restricting
    the versions judged, `select` answering over `verdicts`, the reader's CTEs and the tables."""
    candidates = _CANDIDATE_SELECT.format(driver=_DIRECT_DRIVER, narrowing=narrowing)
    sql = _CANDIDATES_TEMPLATE.format(reachable="", candidates=candidates) + select
    sql = _replace_once(sql, "WITH caller_grants", f"WITH {prelude}\n    caller_grants")
    flags = [bindparam("intersect", type_=Boolean), bindparam("is_admin", type_=Boolean)]
    return text(sql).bindparams(_PRINCIPALS, *flags)


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
    driver: Driver = "auto",
) -> list[VisibleVersion]:
    """Every version the caller may see, optionally narrowed to projects or versions. Fails closed."""
    if caller.is_anonymous:
        return []
    params = _caller_params(caller, security)
    if project_ids is not None:
        params["project_ids"] = [int(p) for p in project_ids]
    if version_ids is not None:
        params["version_ids"] = [int(v) for v in version_ids]
    narrow_by = tuple(n for n in ("project_ids", "version_ids") if n in params)
    rows = conn.execute(_VISIBLE_SQL[narrow_by, _driven_by_grants(conn, caller, narrow_by, driver)], params).all()
    return [VisibleVersion(r.version_id, r.document_id, r.project_id) for r in rows]


def visible_scope(
    conn: Connection,
    caller: Caller,
    security: SecuritySettings,
    *,
    project_ids: Sequence[int] | None = None,
    driver: Driver = "auto",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(projects, documents) holding at least one version the caller may see, each sorted and distinct:
    the same decision as `visible_versions`, aggregated in SQL. Fails closed."""
    if caller.is_anonymous:
        return (), ()
    params = _caller_params(caller, security)
    if project_ids is not None:
        params["project_ids"] = [int(p) for p in project_ids]
    narrow_by: tuple[str, ...] = ("project_ids",) if project_ids is not None else ()
    row = conn.execute(_SCOPE_SQL[narrow_by, _driven_by_grants(conn, caller, narrow_by, driver)], params).one()
    return tuple(row.project_ids), tuple(row.document_ids)


@dataclass(frozen=True)
class SearchScope:
    """What a search needs of a caller's access (`_SEARCH_SCOPE_SELECT`), each tuple sorted and distinct."""

    project_ids: tuple[int, ...]
    document_ids: tuple[int, ...]
    hidden_version_ids: tuple[int, ...]
    allow_principals: tuple[str, ...]
    deny_principals: tuple[str, ...]
    # The principal projection admits versions outside the scope and its hidden versions (an alias leads
    # from one of the caller's principals to one they do not hold): do not filter by it.
    aliases_escape: bool = False


def search_scope(
    conn: Connection,
    caller: Caller,
    security: SecuritySettings,
    *,
    project_ids: Sequence[int] | None = None,
    driver: Driver = "auto",
) -> SearchScope:
    """`visible_scope` with what filters a search's legs per version (see `_SEARCH_SCOPE_SELECT`). Fails closed."""
    if caller.is_anonymous:
        return SearchScope((), (), (), (), ())
    params = {**_caller_params(caller, security), **_config_alias_params(security)}
    if project_ids is not None:
        params["project_ids"] = [int(p) for p in project_ids]
    narrow_by: tuple[str, ...] = ("project_ids",) if project_ids is not None else ()
    statement = _SEARCH_SCOPE_SQL[narrow_by, _driven_by_grants(conn, caller, narrow_by, driver)]
    row = conn.execute(statement, params).one()
    return SearchScope(
        tuple(row.project_ids),
        tuple(row.document_ids),
        tuple(row.hidden_version_ids),
        tuple(row.allow_principals),
        tuple(row.deny_principals),
        bool(row.aliases_escape),
    )


@dataclass(frozen=True)
class VisibleObservation:
    version_id: int
    document_id: int
    project_id: int
    observation_id: int
    source_object_id: int
    title: str = ""
    version_no: int = 0
    latest_final_version_id: int | None = None
    status: str = ""
    doc_date: dt.date | None = None
    language: str = ""
    external_ref: str = ""  # where the cited object lives, and its source's kind (a citation's link)
    source_kind: str = ""


@dataclass(frozen=True)
class Unresolved:
    """A caller's principals as presented (a token's claims), to be resolved inside the statement that uses
    them: aliases, memberships and grants are then read in one snapshot and one round trip."""

    principals: tuple[str, ...]

    @classmethod
    def of(cls, raw: Iterable[object]) -> Unresolved:
        return cls(tuple(sorted({r for r in raw if isinstance(r, str) and r.strip()})))


def visible_observations(
    conn: Connection,
    caller: Caller | Unresolved,
    security: SecuritySettings,
    ids: Sequence[int],
    *,
    of: Literal["versions", "siblings", "documents", "neighbours"] = "versions",
    walk: Walk = "from_caller",
    relations: Mapping[str, object] | None = None,
) -> list[VisibleObservation]:
    """The observations a caller may cite, per source object: active and *accessible* to the caller (the
    rule of `visible_versions`), of a version the caller may see. An object the caller cannot access is
    never cited, even when the version is visible through another object. Admins: every active
    observation of a visible version. Fails closed. The versions named are exactly the visible ones among
    `version_ids` (a visible version always has a citable observation), so this can replace
    `visible_versions` where citations are needed. An `Unresolved` caller is resolved (`resolve_caller`'s
    rules) in the same statement. `of`: `ids` are versions; or versions whose documents' every version is
    asked (`siblings`: what a caller's view of those documents is computed from, `search.access.version_view`); or
    documents, every version of which is asked. One statement whether or not the ids exist. `walk`: how an
    `Unresolved` caller's groups are found (`Walk`: the same rows either way, at a different cost).
    `neighbours`: `ids` are documents, and every version of the documents their relations lead to is asked
    (`relations`: `kinds` (None: all), `outgoing`, `incoming`; see `neighbour_relations`)."""
    if not ids:
        return []
    versions = sorted({int(v) for v in ids})
    narrowing = {"versions": "version_ids", "siblings": "sibling_ids", "documents": "document_ids",
                 "neighbours": "neighbours_of"}[of]  # fmt: skip
    extra = dict(relations or {}) if of == "neighbours" else {}
    if isinstance(caller, Unresolved):
        if not caller.principals:
            return []
        params: dict[str, object] = {**_unresolved_params(caller, security), narrowing: versions, **extra}
        rows = conn.execute(_OBSERVATIONS_SQL[narrowing, walk], params).all()
    else:
        if caller.is_anonymous:
            return []
        params = {**_caller_params(caller, security), narrowing: versions, **extra}
        rows = conn.execute(_OBSERVATIONS_SQL[narrowing, None], params).all()
    return [
        VisibleObservation(
            r.version_id,
            r.document_id,
            r.project_id,
            r.observation_id,
            r.source_object_id,
            r.title,
            r.version_no,
            r.latest_final_version_id,
            r.status,
            r.doc_date,
            r.language,
            r.external_ref,
            r.source_kind,
        )
        for r in rows
    ]


def neighbour_relations(kinds: Iterable[str] | None, direction: str) -> dict[str, object]:
    """`visible_observations(of="neighbours")`'s relation parameters: which kinds (None: every kind), which way."""
    return {
        "kinds": None if kinds is None else sorted(set(kinds)),
        "outgoing": direction in ("outgoing", "both"),
        "incoming": direction in ("incoming", "both"),
    }


# Grants that apply to each version: project, document, and actively observed source objects.
_APPLICABLE_SQL = text(
    """
    WITH target AS (  -- a version without an active observation is visible to nobody: empty projection
        SELECT dv.id AS version_id, d.id AS document_id, d.project_id
        FROM document_versions dv JOIN documents d ON d.id = dv.document_id
        WHERE dv.id = ANY(CAST(:version_ids AS bigint[]))
          AND EXISTS (
              SELECT 1 FROM source_observations o WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL
          )
    )
    SELECT t.version_id, ki_principal(g.principal) AS principal, g.effect
    FROM target t JOIN grants g ON g.scope = 'project' AND g.project_id = t.project_id
    UNION
    SELECT t.version_id, ki_principal(g.principal), g.effect
    FROM target t JOIN grants g ON g.scope = 'document' AND g.document_id = t.document_id
    UNION
    SELECT t.version_id, ki_principal(g.principal), g.effect
    FROM target t
    JOIN source_observations o ON o.document_version_id = t.version_id AND o.deleted_at IS NULL
    JOIN grants g ON g.scope = 'source_object' AND g.source_object_id = o.source_object_id
    """
).bindparams(bindparam("version_ids", type_=ARRAY(BigInteger)))

# Everyone a granted principal stands for: the reverse of `resolve_caller`. Its group members
# (transitively), then everybody whose alias chain (table and configured aliases, transitively) reaches
# one of them. A caller holding any of these principals resolves to the granted one.
_STANDS_FOR_SQL = text(
    """
    WITH RECURSIVE members(root, principal) AS (
        SELECT p, p FROM unnest(CAST(:principals AS text[])) AS p
        UNION"""
    + _MEMBERS_STEP.replace("{walk}", "members")
    + """
    ),
    aliases(root, principal) AS (
        SELECT root, principal FROM members
        UNION
        SELECT a.root, t.alias
        FROM aliases a
        CROSS JOIN LATERAL (
            SELECT ki_principal(pa.alias) AS alias
            FROM principal_aliases pa
            WHERE ki_principal(pa.principal) = a.principal
            UNION ALL
            SELECT ki_principal(c.alias)
            FROM unnest(CAST(:alias_keys AS text[]), CAST(:alias_targets AS text[])) AS c(alias, target)
            WHERE ki_principal(c.target) = a.principal
        ) t
    )
    SELECT root, principal FROM aliases WHERE principal IS NOT NULL
    """
).bindparams(_PRINCIPALS, bindparam("alias_keys", type_=ARRAY(Text)), bindparam("alias_targets", type_=ARRAY(Text)))


def _without_table_scans(conn: Connection, statement: TextClause, params: dict[str, Any]) -> list[Any]:
    """`statement`'s rows, planned without sequential scans where the connection is in a transaction (the
    sync's are). Its probes of memberships and aliases each compare the principal fold of stored rows, which
    costs ~3-4 us a row but which the planner prices as a few operators: a table of a few pages then looks
    cheaper to scan on every probe than to probe by its fold index -- 200 granted principals over a
    77-row membership table took 52 ms by scans, under 2 ms by probes. (PostgreSQL has no plan hints; a
    transaction-local setting is the one scoped way.)"""
    if not conn.in_transaction():
        return list(conn.execute(statement, params))
    conn.execute(text("SET LOCAL enable_seqscan = off"))
    try:
        return list(conn.execute(statement, params))
    finally:
        conn.execute(text("RESET enable_seqscan"))


def version_projections(
    conn: Connection, version_ids: Iterable[int], security: SecuritySettings
) -> dict[int, GrantedPrincipals]:
    """The principal projection of each version: who is granted (allow) and who is denied, with group
    members and aliases of those principals included. Versions without grants get empty tuples, and so
    do versions without an active observation (rule: visible to nobody), so losing the last observation
    rewrites the projection like a revocation.

    Each distinct granted principal is expanded once (not once per version it is granted on): a fan-out
    over thousands of versions usually names only a handful of groups."""
    ids = sorted({int(v) for v in version_ids})
    if not ids:
        return {}
    granted: dict[int, dict[str, set[str]]] = {v: {"allow": set(), "deny": set()} for v in ids}
    for row in conn.execute(_APPLICABLE_SQL, {"version_ids": ids}):
        if row.principal is not None:  # a malformed principal (no kind, blank) matches nobody
            granted[row.version_id][row.effect].add(row.principal)
    roots = sorted({p for sets in granted.values() for names in sets.values() for p in names})
    stands_for: dict[str, set[str]] = {}
    if roots:
        params = {"principals": roots, **_config_alias_params(security)}
        for row in _without_table_scans(conn, _STANDS_FOR_SQL, params):
            stands_for.setdefault(row.root, set()).add(row.principal)

    def expand(names: set[str]) -> tuple[str, ...]:
        out: set[str] = set()
        for name in names:
            out |= stands_for.get(name, {name})
        return tuple(sorted(out))

    return {
        v: GrantedPrincipals(allowed_principals=expand(sets["allow"]), denied_principals=expand(sets["deny"]))
        for v, sets in granted.items()
    }

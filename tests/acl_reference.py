"""A pure-Python reference evaluator of the reference spec's `version_predicate` (the test oracle).

Written from the spec ("Scope compilation"), not from the SQL in `ki/acl.py`, and kept deliberately
naive: plain loops over plain rows, one small function per rule, no cleverness that could share a bug
with the set-based SQL. The property tests (`tests/integration/test_acl_properties.py`) assert that
`ki.acl.resolve_caller` + `ki.acl.visible_versions` agree with it on random worlds.

The rules, in the order they are applied:

1. Normalisation: a principal is trimmed and casefolded (`str.strip().casefold()`: every `str.isspace()`
   character, full Unicode case folding, so "İ" becomes "i̇"); anything that is not then of the form
   `kind:name` (a kind of ASCII letters, digits, `_`, `.`, `-`, a colon, a non-empty name) is not a
   principal and is dropped -- and so is anything folding would merge with a name that differs in more
   than case: a trimmed value not in NFC (the Kelvin sign, decomposed accents), or one whose case folding
   is not its lower-casing ("ß", "ſ", "ﬁ"; the final sigma "ς" counts as the "σ" it is).
2. Aliases: the caller's principals are passed through the aliases of the `principal_aliases` table and of
   `security.aliases` (both map alias -> principal, both normalised on both sides). The caller keeps its own
   principals and gains every alias target, transitively (a chain a -> b -> c gives {a, b, c}, whichever
   of the two sources each link comes from).
3. Administrators: the caller is an administrator when one of its *aliased* principals (before group
   expansion, so membership in a mirrored group never makes anybody an admin) is in
   `security.admin_principals` (normalised).
4. Groups: the aliased principals are expanded with mirrored group memberships, transitively
   (member -> group -> group ...; cycles terminate).
5. A version is only ever visible when its document is neither deleted nor expired and it has at least one
   *active* source observation: not deleted, and at an object of a source that has not expired (an
   observation at an expired source counts as none, for every rule below). Admins need nothing more: they
   bypass grants, allow and deny alike.
6. Deny wins: a deny grant matching any of the caller's principals on the document's project, on the
   document, or on a source object the version is actively observed at excludes the version.
7. An active observation is *accessible* when
   - its object is on a `local_fs` source and has no known ACL (`acl_known` false): the object delegates to
     the project boundary, so a local allow (on the project or the document) is needed;
   - otherwise (the object carries a known ACL, or it lives on an external source): an allow grant on that
     source object is needed. A local allow never overrides it, and an external object without mirrored
     grants fails closed.
8. Visible = not denied and at least one accessible active observation; with
   `source_acl_mode = "intersect"` a local (project or document) allow is additionally required.
9. Citations are per source object: an observation may be cited when its version is visible and the
   observation itself is active and accessible (rule 7); admins may cite every active observation of a
   visible version.

Besides visibility, `projection` gives who the principal projection of a version (`allowed_principals`,
`denied_principals`) should name: every principal that, held alone, resolves (rules 1-4) to a principal
of an allow (deny) grant applying to the version (project, document, actively observed source object).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

LOCAL_FS = "local_fs"
SCOPES = ("project", "document", "source_object")
EFFECTS = ("allow", "deny")
MODES = ("sufficient", "intersect")


# ---------------------------------------------------------------------------------------------------
# The world: plain rows, ids are whatever the caller chooses
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    id: int
    project_id: int
    deleted: bool = False
    expired: bool = False  # `expires_at` has passed
    promoted: bool = False  # no part of access: the ranking's bonus (the search oracle)


@dataclass(frozen=True)
class Version:
    id: int
    document_id: int


@dataclass(frozen=True)
class Source:
    id: int
    kind: str
    expired: bool = False  # `expires_at` has passed


@dataclass(frozen=True)
class SourceObject:
    id: int
    source_id: int
    acl_known: bool = False


@dataclass(frozen=True)
class Observation:
    version_id: int
    object_id: int
    deleted: bool = False


@dataclass(frozen=True)
class Grant:
    scope: str  # project | document | source_object
    target: int  # the id of the project, document or source object
    principal: str  # as stored (not normalised)
    effect: str = "allow"


@dataclass(frozen=True)
class Membership:
    group: str
    member: str


@dataclass(frozen=True)
class Alias:
    alias: str
    principal: str


@dataclass(frozen=True)
class World:
    projects: tuple[int, ...] = ()
    documents: tuple[Document, ...] = ()
    versions: tuple[Version, ...] = ()
    sources: tuple[Source, ...] = ()
    objects: tuple[SourceObject, ...] = ()
    observations: tuple[Observation, ...] = ()
    grants: tuple[Grant, ...] = ()
    memberships: tuple[Membership, ...] = ()
    aliases: tuple[Alias, ...] = ()


class SecurityLike(Protocol):
    """The `security.*` settings the rules read (`ki.settings.SecuritySettings` fits)."""

    @property
    def source_acl_mode(self) -> str: ...
    @property
    def admin_principals(self) -> list[str] | tuple[str, ...]: ...
    @property
    def aliases(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Security:
    source_acl_mode: str = "sufficient"
    admin_principals: tuple[str, ...] = ("role:admin", "system:admin")
    aliases: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Caller:
    principals: frozenset[str]
    is_admin: bool = False


# ---------------------------------------------------------------------------------------------------
# Rules 1-4: who is calling
# ---------------------------------------------------------------------------------------------------


_KIND_NAME = re.compile(r"[a-z0-9_.-]+:.+", re.DOTALL)


def normalize(raw: object) -> str | None:
    """Rule 1: trimmed and casefolded; None for anything that is not then `kind:name`, or not NFC, or
    whose folding changes more than case."""
    if not isinstance(raw, str):
        return None
    trimmed = raw.strip()
    value = trimmed.casefold()
    if unicodedata.normalize("NFC", trimmed) != trimmed or value != trimmed.lower().replace("ς", "σ"):
        return None
    return value if _KIND_NAME.fullmatch(value) else None


def _closure(start: Iterable[str], step: Callable[[str], Iterable[str]]) -> set[str]:
    """Everything reachable from `start` by repeatedly applying `step` (terminates on cycles)."""
    seen = set(start)
    todo = list(seen)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _edges(pairs: Iterable[tuple[object, object]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, b in pairs:
        na, nb = normalize(a), normalize(b)
        if na and nb:
            out.setdefault(na, set()).add(nb)
    return out


def resolve(world: World, raw_principals: Iterable[object], security: SecurityLike) -> Caller:
    """Rules 1-4: normalise, alias (transitively, both sources), decide admin, expand groups."""
    base = {p for p in (normalize(r) for r in raw_principals) if p}
    alias_targets = _edges([(a.alias, a.principal) for a in world.aliases] + list(security.aliases.items()))
    aliased = _closure(base, lambda p: alias_targets.get(p, ()))
    admins = {p for p in (normalize(a) for a in security.admin_principals) if p}
    groups_of = _edges((m.member, m.group) for m in world.memberships)
    expanded = _closure(aliased, lambda p: groups_of.get(p, ()))
    return Caller(frozenset(expanded), is_admin=bool(aliased & admins))


# ---------------------------------------------------------------------------------------------------
# Rules 5-8: which versions the caller sees
# ---------------------------------------------------------------------------------------------------


def visible(world: World, caller: Caller, security: SecurityLike) -> frozenset[int]:
    """The ids of every version of `world` the resolved `caller` may see."""
    return frozenset(v for v, why in verdicts(world, caller, security).items() if why in SEEN)


#: Which rule decided a version's fate; the first two mean visible.
ADMIN, GRANTED = "visible: admin", "visible: granted"
SEEN = (ADMIN, GRANTED)
DELETED_DOCUMENT = "hidden: document deleted"
EXPIRED_DOCUMENT = "hidden: document expired"
NOT_OBSERVED = "hidden: no active observation"
DENIED = "hidden: denied"
NOT_ACCESSIBLE = "hidden: no accessible observation"
NO_LOCAL_ALLOW = "hidden: intersect without a local allow"


def verdicts(world: World, caller: Caller, security: SecurityLike) -> dict[int, str]:
    """For every version of `world`, the rule that decided it (one of the constants above)."""
    lookup = _Lookup(world, caller)
    return {v.id: _verdict(lookup, caller, security, v) for v in world.versions}


class _Lookup:
    """Plain dictionaries over the world (so large worlds stay linear), and the caller's matching grants."""

    def __init__(self, world: World, caller: Caller) -> None:
        self.documents = {d.id: d for d in world.documents}
        self.objects = {o.id: o for o in world.objects}
        self.kinds = {s.id: s.kind for s in world.sources}
        self.expired_sources = {s.id for s in world.sources if s.expired}
        self.observations: dict[int, list[Observation]] = {}
        for o in world.observations:
            self.observations.setdefault(o.version_id, []).append(o)
        self.caller_grants = {
            (g.effect, g.scope, g.target) for g in world.grants if normalize(g.principal) in caller.principals
        }

    def granted(self, effect: str, scope: str, target: int) -> bool:
        """Does a grant of `effect` on (`scope`, `target`) match one of the caller's principals?"""
        return (effect, scope, target) in self.caller_grants

    def active(self, observation: Observation) -> bool:
        """Rule 5: not deleted, and not at an object of an expired source."""
        return not observation.deleted and self.objects[observation.object_id].source_id not in self.expired_sources


def _local_allow(lookup: _Lookup, document: Document) -> bool:
    return lookup.granted("allow", "project", document.project_id) or lookup.granted("allow", "document", document.id)


def _accessible(lookup: _Lookup, document: Document, observation: Observation) -> bool:
    """Rule 7 for one observation."""
    obj = lookup.objects[observation.object_id]
    if lookup.kinds[obj.source_id] == LOCAL_FS and not obj.acl_known:
        return _local_allow(lookup, document)  # delegates to the project boundary
    return lookup.granted("allow", "source_object", obj.id)  # the source ACL decides; fails closed without grants


def citable(world: World, caller: Caller, security: SecurityLike) -> frozenset[int]:
    """Rule 9: the positions (in `world.observations`) of the observations the caller may cite."""
    lookup = _Lookup(world, caller)
    seen = visible(world, caller, security)
    versions = {v.id: v for v in world.versions}
    out = set()
    for i, o in enumerate(world.observations):
        if not lookup.active(o) or o.version_id not in seen:
            continue
        document = lookup.documents[versions[o.version_id].document_id]
        if caller.is_admin or _accessible(lookup, document, o):
            out.add(i)
    return frozenset(out)


# ---------------------------------------------------------------------------------------------------
# The principal projection
# ---------------------------------------------------------------------------------------------------


def vocabulary(world: World, security: SecurityLike) -> frozenset[str]:
    """Every normalised principal the world and the settings name."""
    raw: list[object] = [g.principal for g in world.grants]
    raw += [p for m in world.memberships for p in (m.group, m.member)]
    raw += [p for a in world.aliases for p in (a.alias, a.principal)]
    raw += [p for pair in security.aliases.items() for p in pair]
    return frozenset(p for p in (normalize(r) for r in raw) if p)


def projection(world: World, security: SecurityLike) -> dict[int, tuple[frozenset[str], frozenset[str]]]:
    """Per version: (allowed, denied) principals, i.e. every principal that held alone resolves to the
    principal of an allow (deny) grant applying to the version; both empty for a version without an active
    observation."""
    resolved = {p: resolve(world, [p], security).principals for p in vocabulary(world, security)}
    documents = {d.id: d for d in world.documents}
    out = {}
    for v in world.versions:
        document = documents[v.document_id]
        objects = {o.object_id for o in world.observations if o.version_id == v.id and not o.deleted}
        if not objects:  # never visible without an active observation: nobody is projected
            out[v.id] = (frozenset(), frozenset())
            continue
        applies = {("project", document.project_id), ("document", document.id)}
        applies |= {("source_object", o) for o in objects}
        sides = []
        for effect in EFFECTS:
            granted = {
                p
                for p in (
                    normalize(g.principal)
                    for g in world.grants
                    if g.effect == effect and (g.scope, g.target) in applies
                )
                if p
            }
            sides.append(frozenset(p for p, holds in resolved.items() if holds & granted))
        out[v.id] = (sides[0], sides[1])
    return out


def _verdict(lookup: _Lookup, caller: Caller, security: SecurityLike, version: Version) -> str:
    document = lookup.documents[version.document_id]
    granted = lookup.granted

    # Rule 5: deleted documents and versions without an active observation are invisible to everybody.
    if document.deleted:
        return DELETED_DOCUMENT
    if document.expired:
        return EXPIRED_DOCUMENT
    active = [o for o in lookup.observations.get(version.id, []) if lookup.active(o)]
    if not active:
        return NOT_OBSERVED
    if caller.is_admin:
        return ADMIN

    # Rule 6: deny wins at project, document and actively observed source-object scope.
    if granted("deny", "project", document.project_id) or granted("deny", "document", document.id):
        return DENIED
    if any(granted("deny", "source_object", o.object_id) for o in active):
        return DENIED

    # Rule 7: at least one accessible active observation.
    local_allow = _local_allow(lookup, document)
    if not any(_accessible(lookup, document, o) for o in active):
        return NOT_ACCESSIBLE

    # Rule 8: intersect additionally needs a local allow.
    if security.source_acl_mode == "intersect" and not local_allow:
        return NO_LOCAL_ALLOW
    return GRANTED

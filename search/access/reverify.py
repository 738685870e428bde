"""The SQL re-verification of hits: the authority on every hit, whatever the index or a cache holds."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from ki.acl import Unresolved, VisibleObservation, Walk, visible_observations
from ki.settings import Settings
from search.access.sources import SourceRef
from search.access.version_view import VersionFacts, by_document, compared_with, in_force, latest_final, shown_numbers


@dataclass(frozen=True)
class VerifiedVersion:
    version_id: int
    document_id: int
    project_id: int
    title: str
    version_no: int
    latest_final_version_id: int | None
    source_object_ids: tuple[int, ...]
    sources: tuple[SourceRef, ...] = ()  # the citable objects' kinds and refs (search.access.sources)
    compared: ComparedVersion | None = None  # a comparison's earlier side (the query asked for one)


@dataclass(frozen=True)
class ComparedVersion:
    """The caller's own version a hit is compared with (`version_id` None: they see none on that side)."""

    side: str  # "previous", "current" or the day (ISO)
    version_id: int | None
    version_no: int | None
    doc_date: dt.date | None


def reverify(
    conn: Connection,
    raw_principals: Sequence[str],
    settings: Settings,
    version_ids: Sequence[int],
    as_of: dt.date | None = None,
    walk: Walk = "from_caller",
    compare_with: dt.date | str | None = None,
) -> dict[int, VerifiedVersion]:
    """The candidates' versions the caller may see *now*, with citation data (ACL via ki.acl only): one
    statement that resolves the caller's aliases and groups and reads the grants, observations and rows
    in one snapshot -- whatever a cache holds, this is the authority on every hit.

    A citation lists only the source objects the caller may access (`ki.acl.visible_observations`): a
    version visible through one object never cites another object the caller has no grant for. The
    statement reads every version of the candidates' documents, so a version's number, its document's
    latest final version and (with `as_of`) which version is in force are those of the caller's own view
    (`search.access.version_view`): nothing shown depends on a version the caller may not see. With `as_of`, only
    the versions in force that day are answered. `walk`: how the caller's groups are found (`ki.acl.Walk`;
    the compiled scope says which is cheaper for this caller), never what is answered. `compare_with`: each
    answered version also names the caller's version it is compared with (`version_view.compared_with`)."""
    ids = sorted(set(version_ids))
    if not ids:
        return {}
    first: dict[int, VisibleObservation] = {}
    objects: dict[int, set[int]] = {}  # version -> citable source objects
    caller = Unresolved.of(raw_principals)
    refs: dict[int, SourceRef] = {}  # where each citable object lives, from the same statement
    for o in visible_observations(conn, caller, settings.security, ids, of="siblings", walk=walk):
        first.setdefault(o.version_id, o)
        objects.setdefault(o.version_id, set()).add(o.source_object_id)
        refs[o.source_object_id] = SourceRef(o.source_object_id, o.source_kind, o.external_ref)
    view = [VersionFacts(v, o.document_id, o.version_no, o.status, o.doc_date) for v, o in first.items()]
    numbers = shown_numbers(view)
    latest = latest_final(view, {o.document_id: o.latest_final_version_id for o in first.values()})
    wanted = set(ids) if as_of is None else set(ids) & set(in_force(view, as_of).values())
    answered = {v: o for v, o in first.items() if v in wanted}
    documents = by_document(view) if compare_with is not None else {}
    facts = {f.version_id: f for f in view}

    def compared(v: int, document_id: int) -> ComparedVersion | None:
        if compare_with is None:
            return None
        other = compared_with(documents[document_id], v, compare_with)
        side = compare_with.isoformat() if isinstance(compare_with, dt.date) else compare_with
        if other is None:
            return ComparedVersion(side, None, None, None)
        return ComparedVersion(side, other, numbers[other], facts[other].doc_date)

    return {
        v: VerifiedVersion(
            v,
            o.document_id,
            o.project_id,
            o.title,
            numbers[v],
            latest[o.document_id],
            tuple(sorted(objects[v])),
            tuple(refs[i] for i in sorted(objects[v]) if i in refs),
            compared(v, o.document_id),
        )  # fmt: skip
        for v, o in answered.items()
    }

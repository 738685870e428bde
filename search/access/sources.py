"""The source objects a caller may cite, by id: their kind and `external_ref` (where the file lives). The
re-verify reads them in the one ACL statement itself (`ki.acl.visible_observations`); reading a version looks
up the objects that statement answered as citable (`source_refs`, no statement for none), so nothing here names
an object the caller may not cite."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger

_SOURCES_SQL = text(
    "SELECT o.id, o.external_ref, s.kind FROM source_objects o JOIN sources s ON s.id = o.source_id"
    " WHERE o.id = ANY(:ids)"
).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))


@dataclass(frozen=True)
class SourceRef:
    source_object_id: int
    kind: str
    external_ref: str


def source_refs(conn: Connection, ids: Collection[int]) -> dict[int, SourceRef]:
    """The source objects `ids` (objects the caller may cite), by id."""
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return {}
    rows = conn.execute(_SOURCES_SQL, {"ids": wanted}).all()
    return {int(r.id): SourceRef(int(r.id), str(r.kind), str(r.external_ref)) for r in rows}

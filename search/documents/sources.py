"""Where a lawyer opens the file a citation names: the source objects' `external_ref`, rendered through a URL
template per source kind (`api.evidence.source_urls`, e.g. `{"sharepoint": "https://dms.example/{external_ref}"}`;
none for a kind: the raw ref is the link). Only ever asked for source objects the caller may cite (those the
one ACL statement answered), so nothing here can name another object; no statement runs for none."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger

PLACEHOLDER = "{external_ref}"

_SOURCES_SQL = text(
    "SELECT o.id, o.external_ref, s.kind FROM source_objects o JOIN sources s ON s.id = o.source_id"
    " WHERE o.id = ANY(:ids)"
).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))


@dataclass(frozen=True)
class SourceRef:
    source_object_id: int
    kind: str
    external_ref: str

    def to_json(self, templates: Mapping[str, str]) -> dict[str, Any]:
        return {
            "source_object_id": self.source_object_id,
            "kind": self.kind,
            "external_ref": self.external_ref,
            "link": source_link(self.kind, self.external_ref, templates),
        }


def source_link(kind: str, external_ref: str, templates: Mapping[str, str]) -> str:
    """The ref through its kind's template (percent-encoded, path separators kept), else the raw ref."""
    template = templates.get(kind)
    if not template:
        return external_ref
    return template.replace(PLACEHOLDER, quote(external_ref, safe="/"))


def source_refs(conn: Connection, ids: Collection[int]) -> dict[int, SourceRef]:
    """The source objects `ids` (objects the caller may cite), by id."""
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return {}
    rows = conn.execute(_SOURCES_SQL, {"ids": wanted}).all()
    return {int(r.id): SourceRef(int(r.id), str(r.kind), str(r.external_ref)) for r in rows}


def sources_json(
    ids: Collection[int], refs: Mapping[int, SourceRef], templates: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The citable objects `ids` as a citation names them (in id order)."""
    return [refs[i].to_json(templates) for i in sorted(ids) if i in refs]

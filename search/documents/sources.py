"""Where a lawyer opens the file a citation names: the source objects' `external_ref` (read with the caller's
citable objects, `search.access.sources`), rendered through a URL template per source kind
(`api.evidence.source_urls`, e.g. `{"sharepoint": "https://dms.example/{external_ref}"}`; none for a kind: the
raw ref is the link)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from search.access.sources import SourceRef, source_refs

__all__ = ["PLACEHOLDER", "SourceRef", "source_json", "source_link", "source_refs", "sources_json"]

PLACEHOLDER = "{external_ref}"


def source_link(kind: str, external_ref: str, templates: Mapping[str, str]) -> str:
    """The ref through its kind's template (percent-encoded, path separators kept), else the raw ref."""
    template = templates.get(kind)
    if not template:
        return external_ref
    return template.replace(PLACEHOLDER, quote(external_ref, safe="/"))


def source_json(ref: SourceRef, templates: Mapping[str, str]) -> dict[str, Any]:
    return {
        "source_object_id": ref.source_object_id,
        "kind": ref.kind,
        "external_ref": ref.external_ref,
        "link": source_link(ref.kind, ref.external_ref, templates),
    }


def sources_json(
    ids: Collection[int], refs: Mapping[int, SourceRef], templates: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The citable objects `ids` as a citation names them (in id order)."""
    return [source_json(refs[i], templates) for i in sorted(ids) if i in refs]


def refs_json(refs: Iterable[SourceRef], templates: Mapping[str, str]) -> list[dict[str, Any]]:
    return [source_json(ref, templates) for ref in sorted(refs, key=lambda r: r.source_object_id)]

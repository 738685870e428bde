"""One chunk by its id, as a caller may read it: `GET /v1/chunks/{chunk_id}` (a hit's `chunk_id`).

The caller's access is decided first, in SQL, by the re-verify statement every search hit passes
(`search.access.reverify`): a chunk of a version the caller may not see is answered exactly like one that
does not exist (None here, 404 over HTTP), by the same statement, before the index is asked anything. Only
for a visible version is the index row read -- for where the chunk sits in the version's text (`meta.start`,
`meta.end`: `projections.rows`) -- and a body chunk's text is then read from PostgreSQL at that place, the
source of truth, the same characters `GET .../versions/{version_id}/text` pages through (so its hash and
permalink check against a text slice). `current` says whether the index row still agrees with that text
(false while the sync has not yet applied an edit of the version). Clause and profile rows are not spans
of the version's text: their text is the index row's.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection

from ki.settings import Settings
from projections.text import normalise_text
from search.access.reverify import VerifiedVersion, reverify
from search.documents.sources import source_refs, sources_json
from search.documents.text import stored_slice
from search.evidence.citations import chunk_permalink, sha256_hex, stored_span, text_permalink
from search.evidence.injection import Mode, marked

T = TypeVar("T")
SqlRead = Callable[[Callable[[Connection], T]], Awaitable[T]]  # runs a read on a re-verify connection
IndexRow = Callable[[str], Awaitable[dict[str, Any] | None]]  # an index row's `_source` by its id

_CHUNK_ID = re.compile(r"([0-9]{1,18}):(chunk|profile|clause):(-?[0-9]{1,9})")


@dataclass(frozen=True)
class ChunkId:
    """An index row's id, `{version_id}:{chunk_kind}:{ordinal}` (`projections.rows.row_id`)."""

    version_id: int
    kind: str
    ordinal: int

    @classmethod
    def parse(cls, raw: str) -> ChunkId | None:
        """The id, or None when `raw` is not one (the API answers a 400 naming `chunk_id`)."""
        match = _CHUNK_ID.fullmatch(raw)
        if match is None or int(match[1]) < 1:
            return None
        return cls(int(match[1]), match[2], int(match[3]))

    def __str__(self) -> str:
        return f"{self.version_id}:{self.kind}:{self.ordinal}"


def row_belongs(source: dict[str, Any], version: VerifiedVersion) -> bool:
    """The index row is the verified version's (the id says so; the row's own fields must agree)."""
    return str(source.get("document_version_id")) == str(version.version_id) and str(source.get("document_id")) == str(
        version.document_id
    )


def chunk_json(
    chunk: ChunkId,
    version: VerifiedVersion,
    source: dict[str, Any],
    stored_text: str | None,
    injection: Mode,
    sources: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The answer for a visible chunk: `stored_text` is the version's text at the row's span (None: the row is
    not a span of the version's text; its indexed text is answered)."""
    span = stored_span(source) if stored_text is not None else None
    indexed = str(source.get("text") or "")
    text = stored_text if stored_text is not None else indexed
    handed_out, checked = marked(text, injection)  # the hash stays the stored text's
    answer: dict[str, Any] = {
        "chunk_id": str(chunk),
        "document_id": version.document_id,
        "version_id": version.version_id,
        "version_no": version.version_no,
        "chunk_kind": chunk.kind,
        "ordinal": chunk.ordinal,
        "span": {"start": span[0], "end": span[1]} if span else None,
        "current": normalise_text(text) == indexed,
        "text": handed_out,
        "injection": checked,
        "evidence": {
            "sha256": sha256_hex(text),
            "permalink": chunk_permalink(str(chunk)),
            "text_permalink": text_permalink(version.document_id, version.version_id, span[0], span[1] - span[0])
            if span
            else None,
            "source_object_ids": list(version.source_object_ids),
            "sources": sources or [],
        },
    }
    locus = (source.get("meta") or {}).get("locus")
    if locus:
        answer["locus"] = locus
    return answer


async def read_chunk(
    principals: Sequence[str],
    settings: Settings,
    chunk: ChunkId,
    sql: SqlRead[Any],
    index_row: IndexRow,
) -> dict[str, Any] | None:
    """The chunk as the caller may read it (None: not there, or of a version the caller may not see)."""
    verified = await sql(lambda conn: reverify(conn, principals, settings, [chunk.version_id]))
    version = verified.get(chunk.version_id)
    if version is None:
        return None  # hidden and missing alike: one statement, nothing asked of the index
    source = await index_row(str(chunk))
    if source is None or not row_belongs(source, version):
        return None
    span = stored_span(source)
    stored_text = None
    if span is not None:
        start, end = span
        stored_text, _, _ = await sql(
            lambda conn: stored_slice(conn, version.document_id, version.version_id, start, end - start)
        )
    refs = await sql(lambda conn: source_refs(conn, version.source_object_ids))
    sources = sources_json(version.source_object_ids, refs, settings.api.evidence.source_urls)
    return chunk_json(chunk, version, source, stored_text, settings.api.evidence.injection, sources)

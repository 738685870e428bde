"""What a citation is checked and reopened by: the hash of the text handed out, and the paths of this service
that read the same text again (relative to the API's base URL). Pure."""

from __future__ import annotations

import hashlib
from typing import Any


def sha256_hex(value: str) -> str:
    """The hash a reader checks a quoted passage against: SHA-256 over the text's UTF-8."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def text_permalink(document_id: int, version_id: int, offset: int, length: int) -> str:
    """`GET /v1/documents/{id}/versions/{version_id}/text` reading the same slice again."""
    return f"/v1/documents/{document_id}/versions/{version_id}/text?offset={offset}&length={length}"


def chunk_permalink(chunk_id: str) -> str:
    """`GET /v1/chunks/{chunk_id}` reading the same chunk again."""
    return f"/v1/chunks/{chunk_id}"


def stored_span(source: dict[str, Any]) -> tuple[int, int] | None:
    """Where an index row sits in its version's text as a reader pages through it: `meta.start`, `meta.end`
    (`projections.rows`). None: not a span of the version's text, or a row indexed before rows said so."""
    meta = source.get("meta") or {}
    start, end = meta.get("start"), meta.get("end")
    if source.get("chunk_kind") == "chunk" and isinstance(start, int) and isinstance(end, int) and 0 <= start <= end:
        return start, end
    return None

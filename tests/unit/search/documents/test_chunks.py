"""A chunk by its id (search.documents.chunks): the id's grammar and the answer made from a visible row."""

from __future__ import annotations

import hashlib

import pytest

from search.access.reverify import VerifiedVersion
from search.documents.chunks import ChunkId, chunk_json

VERSION = VerifiedVersion(9, 3, 1, "Mietvertrag", 2, 9, (5, 6))


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("9:chunk:0", ChunkId(9, "chunk", 0)),
        ("9:profile:-1", ChunkId(9, "profile", -1)),
        ("12:clause:1003", ChunkId(12, "clause", 1003)),
    ],  # fmt: skip
)
def test_a_hits_chunk_id_parses_and_prints_back(raw: str, parsed: ChunkId) -> None:
    assert ChunkId.parse(raw) == parsed and str(parsed) == raw


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "9",
        "9:chunk",
        "0:chunk:0",
        "9:vector:0",
        "9:chunk:x",
        "9:chunk:0:1",
        "-9:chunk:0",
        "9:chunk:0 ",
        "1" * 19 + ":chunk:0",
        "٩:chunk:0",
    ],  # fmt: skip
)
def test_anything_else_is_not_a_chunk_id(raw: str) -> None:
    assert ChunkId.parse(raw) is None


def _source(text: str, **meta: object) -> dict[str, object]:
    return {"document_id": "3", "document_version_id": "9", "chunk_kind": "chunk", "text": text, "meta": meta}


def test_a_body_chunk_answers_the_stored_text_at_its_span_with_hash_and_permalinks() -> None:
    stored = "Kündi\u00adgung"  # the stored text keeps the soft hyphen the index dropped
    answer = chunk_json(ChunkId(9, "chunk", 0), VERSION, _source("Kündigung", start=4, end=14), stored, "flag")
    assert answer["text"] == stored and answer["span"] == {"start": 4, "end": 14} and answer["current"]
    assert answer["evidence"] == {
        "sha256": hashlib.sha256(stored.encode()).hexdigest(),
        "permalink": "/v1/chunks/9:chunk:0",
        "text_permalink": "/v1/documents/3/versions/9/text?offset=4&length=10",
        "source_object_ids": [5, 6],
        "sources": [],
    }


def test_a_chunk_whose_stored_text_moved_on_is_not_current() -> None:
    answer = chunk_json(ChunkId(9, "chunk", 0), VERSION, _source("Kündigung", start=0, end=9), "Kündigt i", "flag")
    assert not answer["current"]


def test_a_clause_row_is_not_a_span_and_answers_its_indexed_text() -> None:
    source = {**_source("Gerichtsstand ist Berlin.", locus="§ 9"), "chunk_kind": "clause"}
    answer = chunk_json(ChunkId(9, "clause", 1000), VERSION, source, None, "flag")
    assert answer["text"] == "Gerichtsstand ist Berlin." and answer["span"] is None and answer["locus"] == "§ 9"
    assert answer["evidence"]["text_permalink"] is None and answer["current"]


def test_source_links_follow_their_kinds_template_and_are_the_raw_ref_without_one() -> None:
    from search.documents.sources import SourceRef, sources_json

    refs = {5: SourceRef(5, "sharepoint", "Mandate/Müller & Co/Vertrag.docx"), 6: SourceRef(6, "local_fs", "/a.pdf")}
    templates = {"sharepoint": "https://dms.example/open?path={external_ref}"}
    links = [s["link"] for s in sources_json([6, 5, 7], refs, templates)]  # 7: not among the refs asked for
    assert links == ["https://dms.example/open?path=Mandate/M%C3%BCller%20%26%20Co/Vertrag.docx", "/a.pdf"]

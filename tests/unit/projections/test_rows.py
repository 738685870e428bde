import unicodedata
from dataclasses import replace
from datetime import UTC, date, datetime

import pytest

from ki.settings import RetrievalSettings
from projections.rows import (
    AccessProjection,
    DocumentState,
    NotableClause,
    VersionState,
    build_rows,
    content_hash,
)
from projections.text import normalise_text
from tests.spec_fields import ADDED_FIELDS, SPEC_FIELDS

PARAGRAPHS = [f"Absatz {i}: Der Mieter zahlt die Miete pünktlich zum Monatsersten. " * 4 for i in range(8)]
TEXT = "\n".join(PARAGRAPHS)

DOC = DocumentState(
    id=7,
    project_id=3,
    title="Mietvertrag Hauptstraße 1",
    matter_id=11,
    doc_type_id=21,
    identifiers=("2 BvR 1234/19", " § 535 BGB ", "2 BvR 1234/19", ""),
    latest_final_version_id=42,
)
FINAL = VersionState(
    id=42,
    document_id=7,
    version_no=2,
    status="final",
    language="de",
    doc_date=date(2024, 3, 1),
    text=TEXT,
    notable_clauses=(
        NotableClause(clause_type_id=31, locus="§ 4", text="Kündigungsfrist drei Monate."),
        NotableClause(clause_type_id=None, locus="§ 5", text="   "),
        NotableClause(clause_type_id=32, locus="§ 9", text="Gerichtsstand ist Berlin."),
    ),
)
ACCESS = AccessProjection(
    allowed_principals=("user:b", "group:a", "user:b"), denied_principals=("user:x",), access_version=5
)
SETTINGS = RetrievalSettings(chunk_chars=300, chunk_overlap_chars=30)


def rows_for(document=DOC, version=FINAL, settings=SETTINGS, access=ACCESS, **kwargs):
    args = {
        "doc_type_ancestors": (21, 20, 1),
        "doc_type_label": "Mietvertrag",
        "matter_title": "Müller ./. Schmidt",
        "access": access,
        "settings": settings,
    }
    args.update(kwargs)
    return build_rows(document, version, **args)


def by_kind(rows, kind):
    return [r for r in rows if r.source["chunk_kind"] == kind]


def test_rows_carry_every_spec_field_except_the_vector():
    for row in rows_for():
        assert set(row.source) == SPEC_FIELDS | ADDED_FIELDS
        assert "embedding" not in row.source


def test_identity_and_filter_fields_are_strings_and_lists():
    row = by_kind(rows_for(), "chunk")[0]
    src = row.source
    assert (src["project_id"], src["document_id"], src["document_version_id"], src["matter_id"]) == (
        "3",
        "7",
        "42",
        "11",
    )
    assert src["doc_type"] == "21" and src["doc_type_ancestors"] == ["21", "20", "1"]
    assert src["version_status"] == "final" and src["language"] == "de" and src["doc_date"] == "2024-03-01"
    assert src["identifiers"] == ["2 BvR 1234/19", "§ 535 BGB"]
    assert src["identifiers_text"] == "2 BvR 1234/19 § 535 BGB"
    assert src["allowed_principals"] == ["group:a", "user:b"]
    assert src["denied_principals"] == ["user:x"]
    assert src["access_version"] == 5
    assert src["clause_type"] is None


def test_doc_type_itself_is_in_the_ancestor_closure():
    row = rows_for(doc_type_ancestors=(20, 1))[0]
    assert row.source["doc_type_ancestors"] == ["21", "20", "1"]


def test_nullable_columns_become_none():
    doc = replace(DOC, matter_id=None, doc_type_id=None, identifiers=())
    version = replace(FINAL, doc_date=None)
    src = rows_for(doc, version, doc_type_ancestors=(), doc_type_label=None, matter_title=None)[0].source
    assert src["matter_id"] is None and src["doc_type"] is None and src["doc_date"] is None
    assert src["doc_type_ancestors"] == [] and src["identifiers"] == [] and src["identifiers_text"] == ""


def test_body_chunks_have_consecutive_ordinals_and_raw_text():
    chunks = by_kind(rows_for(), "chunk")
    assert len(chunks) > 2
    assert [r.source["meta"]["ordinal"] for r in chunks] == list(range(len(chunks)))
    assert [r.id for r in chunks] == [f"42:chunk:{i}" for i in range(len(chunks))]
    for row in chunks:
        assert row.source["text"] in TEXT  # raw slice, no header
        assert row.source["meta"]["kind"] == "chunk"


def test_context_header_is_only_in_embed_input():
    row = by_kind(rows_for(), "chunk")[0]
    header = "Mietvertrag Hauptstraße 1 | Mietvertrag | Müller ./. Schmidt"
    assert row.embed_input == f"{header}\n{row.source['text']}"
    assert header not in row.source["text"]
    assert row.content_hash == content_hash(row.embed_input) == row.source["meta"]["content_hash"]


def test_without_contextualize_embed_input_is_the_raw_text():
    settings = SETTINGS.model_copy(update={"chunk_contextualize": False})
    for row in by_kind(rows_for(settings=settings), "chunk"):
        assert row.embed_input == row.source["text"]


def test_profile_row_only_for_latest_final_version():
    profiles = by_kind(rows_for(), "profile")
    assert len(profiles) == 1
    profile = profiles[0]
    assert profile.id == "42:profile:-1" and profile.source["meta"]["ordinal"] == -1
    older = replace(FINAL, id=41, version_no=1)
    assert by_kind(rows_for(version=older), "profile") == []
    no_profiles = SETTINGS.model_copy(update={"profile_embeddings": False})
    assert by_kind(rows_for(settings=no_profiles), "profile") == []


def test_profile_text_is_labeled_lines_plus_text_prefix():
    profile = by_kind(rows_for(matter_reference="AZ-2024-17"), "profile")[0]
    head, _, excerpt = profile.source["text"].partition("\n\n")
    assert head.splitlines() == [
        "Title: Mietvertrag Hauptstraße 1",
        "Document type: Mietvertrag",
        "Matter: Müller ./. Schmidt",
        "Reference: AZ-2024-17",
        "Identifiers: 2 BvR 1234/19; § 535 BGB",
        "Date: 2024-03-01",
    ]
    assert excerpt == TEXT[:400].strip()
    assert profile.embed_input == profile.source["text"]


def test_clause_rows_for_final_and_executed_only():
    clauses = by_kind(rows_for(), "clause")
    # The blank clause at position 1 is skipped without shifting the ordinal of the next one.
    assert [r.id for r in clauses] == ["42:clause:1000", "42:clause:1002"]
    first = clauses[0].source
    assert first["text"] == "Kündigungsfrist drei Monate."
    assert first["clause_type"] == "31"
    assert first["meta"] == {
        "kind": "clause",
        "ordinal": 1000,
        "content_hash": clauses[0].content_hash,
        "locus": "§ 4",
        "clause_type": "31",
    }
    executed = replace(FINAL, status="executed")
    assert len(by_kind(rows_for(version=executed), "clause")) == 2
    for status in ("draft", "unknown"):
        assert by_kind(rows_for(version=replace(FINAL, status=status)), "clause") == []
    off = SETTINGS.model_copy(update={"clause_embeddings": False})
    assert by_kind(rows_for(settings=off), "clause") == []


def test_deleted_document_has_no_rows():
    deleted = replace(DOC, deleted_at=datetime(2024, 5, 1, tzinfo=UTC))
    assert rows_for(document=deleted) == []


def test_version_of_another_document_is_rejected():
    with pytest.raises(ValueError):
        rows_for(version=replace(FINAL, document_id=8))


def test_empty_text_gives_no_body_chunks_but_keeps_profile_and_clauses():
    rows = rows_for(version=replace(FINAL, text=""))
    assert by_kind(rows, "chunk") == []
    assert len(by_kind(rows, "profile")) == 1 and len(by_kind(rows, "clause")) == 2


def test_rows_are_deterministic_and_ids_unique():
    first, second = rows_for(), rows_for()
    assert first == second
    ids = [r.id for r in first]
    assert len(ids) == len(set(ids))


def test_ids_stay_unique_beyond_a_thousand_body_chunks():
    settings = RetrievalSettings(chunk_chars=50, chunk_overlap_chars=0)
    version = replace(FINAL, text="wort " * 12_000)
    rows = rows_for(version=version, settings=settings)
    ids = [r.id for r in rows]
    assert len(by_kind(rows, "chunk")) > 1000
    assert len(ids) == len(set(ids))


def test_source_object_id_goes_into_meta():
    row = rows_for(source_object_id="so-9")[0]
    assert row.source["meta"]["source_object_id"] == "so-9"


def test_every_indexed_text_is_normalised():
    import unicodedata

    decomposed = replace(
        FINAL,
        text=unicodedata.normalize("NFD", TEXT).replace("Miete", "Mie\u00adte"),
        notable_clauses=(NotableClause(clause_type_id=31, locus="§\u00a04", text="Ku\u0308ndigungsfrist."),),
    )
    title = "Mietvertrag Hauptstra\u00dfe 1\u00a0(A\u0308nderung)"
    document = replace(DOC, title=title, identifiers=("§\u00a0535 BGB",))
    rows = rows_for(document, decomposed, doc_type_label="Mietvertra\u0308ge", matter_title="Mu\u0308ller")
    for row in rows:
        for text in (row.source["text"], row.embed_input, *row.source["identifiers"]):
            assert unicodedata.is_normalized("NFC", text)
            assert "\u00ad" not in text and "\u00a0" not in text
    assert by_kind(rows, "chunk")[0].source["text"] == TEXT[: len(by_kind(rows, "chunk")[0].source["text"])]
    assert by_kind(rows, "clause")[0].source["meta"]["locus"] == "§ 4"
    assert "Mietvertrag Hauptstraße 1 (Änderung) | Mietverträge | Müller" in by_kind(rows, "chunk")[0].embed_input
    # The decomposed and the composed spelling of the same document give the same rows.
    composed = rows_for(
        replace(document, title="Mietvertrag Hauptstraße 1 (Änderung)", identifiers=("§ 535 BGB",)),
        replace(decomposed, text=TEXT, notable_clauses=(NotableClause(31, "§ 4", "Kündigungsfrist."),)),
        doc_type_label="Mietverträge",
        matter_title="Müller",
    )

    # Only where the chunks sit in the stored text differs: the decomposed text also has soft hyphens.
    def unplaced(source):
        meta = {k: v for k, v in source["meta"].items() if k not in ("start", "end")}
        return {**source, "meta": meta}

    assert [(r.id, unplaced(r.source), r.embed_input) for r in rows] == [
        (r.id, unplaced(r.source), r.embed_input) for r in composed
    ]


def test_body_chunks_fit_the_token_budget_with_their_header():
    from projections.chunking import TokenBudget

    budget = TokenBudget(lambda s: len(s.split()) + 2, 40)
    rows = rows_for(settings=RetrievalSettings(chunk_chars=1200, chunk_overlap_chars=60), token_budget=budget)
    chunks = by_kind(rows, "chunk")
    unbounded = by_kind(rows_for(settings=RetrievalSettings(chunk_chars=1200, chunk_overlap_chars=60)), "chunk")
    assert len(chunks) > len(unbounded)
    assert all(budget.fits(r.embed_input) for r in chunks)  # header + text, as embedded


def test_body_chunks_say_where_they_sit_in_the_text_a_reader_pages_through():
    # Soft hyphens, no-break spaces and a decomposed umlaut: the normalised chunks are shorter than the
    # stored text, and the span still points at exactly their characters there (in NFC).
    raw = ("Die Ku\u0308ndi\u00adgung nach §\u00a0573 BGB ist schriftlich zu erkla\u0308ren. " * 30).strip()
    rows = by_kind(rows_for(version=replace(FINAL, text=raw)), "chunk")
    nfc = unicodedata.normalize("NFC", raw)
    assert len(rows) > 2
    for row in rows:
        meta = row.source["meta"]
        assert normalise_text(nfc[meta["start"] : meta["end"]]) == row.source["text"]
    assert rows[0].source["meta"]["start"] == 0 and rows[-1].source["meta"]["end"] == len(nfc)
    assert all("start" not in r.source["meta"] for r in rows_for() if r.source["chunk_kind"] != "chunk")

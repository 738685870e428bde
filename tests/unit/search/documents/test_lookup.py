"""Exact coordinates (search.documents.lookup): how a name is read and keyed, and the outcome decided from the
carriers and versions a caller may see (pure; the SQL side is tests/integration/test_lookup.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ki.acl import NamedCarrier
from ki.errors import RequestInvalid
from ki.settings import ApiSettings
from search.documents.lookup import (
    MAX_CANDIDATES,
    Ask,
    Lookup,
    ProvisionSpan,
    ask_for,
    by_tier,
    chunk_body,
    chunk_holding,
    decide,
    heading_patterns,
    key_variants,
    provision_name,
    provision_span,
    to_read,
    version_in_force,
)
from search.documents.read import VisibleDocument, VisibleVersionRow
from search.names.keys import identity_key
from search.query_words import Provision
from search.request import LookupRequest, parse_lookup_request
from search.telemetry.audit import named_documents

API = ApiSettings()


def ask(**body: Any) -> Ask:
    return ask_for(parse_lookup_request(body, API))


# --- reading the request -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "identifier"),
        ({"as_of": "2020-01-01"}, "identifier"),
        ({"identifier": "29 O 167/21", "title": "Klage"}, "title"),
        ({"identifier": "   "}, "identifier"),
        ({"title": ""}, "title"),
        ({"identifier": 29}, "identifier"),
        ({"identifier": "29 O 167/21", "as_of": "2020-02-30"}, "as_of"),
        ({"identifier": "29 O 167/21", "as_of": "gestern"}, "as_of"),
        ({"identifier": "29 O 167/21", "project_id": 0}, "project_id"),
        ({"identifier": "29 O 167/21", "project_id": []}, "project_id"),
        ({"identifier": "29 O 167/21", "limit": 3}, "limit"),
        ({"identifier": "x\x00y"}, "identifier"),
        ({"identifier": "a" * 2001}, "identifier"),
    ],
)
def test_a_bad_body_names_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_lookup_request(body, API)
    assert refused.value.field == field


def test_a_body_that_is_no_object_names_the_body() -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_lookup_request(["29 O 167/21"], API)
    assert refused.value.field == "body"


@pytest.mark.parametrize(("body", "field"), [({"identifier": "§ – …"}, "identifier"), ({"title": "– –"}, "title")])
def test_a_name_without_letters_or_digits_names_nothing(body: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        ask(**body)
    assert refused.value.field == field


def test_names_too_long_to_be_keys_are_refused() -> None:
    with pytest.raises(RequestInvalid) as refused:
        ask(title="Mietvertrag " * 25)  # a key over 254 characters: no title index entry holds it
    assert refused.value.field == "title"
    with pytest.raises(RequestInvalid) as refused:
        ask(identifier="AZ " * 90)
    assert refused.value.field == "identifier"


def test_project_ids_and_the_date_are_read() -> None:
    request = parse_lookup_request({"identifier": "29 O 167/21", "project_id": 4, "as_of": "2021-03-01"}, API)
    assert request.project_id == [4] and request.as_of == dt.date(2021, 3, 1)


# --- keys: spacing, case, Unicode forms, § / Art. / Abs. -----------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    ["29 O 167/21", "29 o 167/21", "29O167/21", "29  O  167 / 21", "29 O 167-21", " 29 O 167/21 ",
     "２９ Ｏ １６７／２１", "29\u00a0O\u2009167/21", "29 O 167/21."],
)  # fmt: skip
def test_file_number_variants_have_one_key(variant: str) -> None:
    a = ask(identifier=variant)
    assert a.identifier_keys == ["29 o 167 21"] and a.tiers[0].why == "identifier"
    # The kind is a label of the answer ("29 O 167-21" is not written as a file number); the key decides.
    assert a.kind == ("identifier" if variant in ("29  O  167 / 21", "29 O 167-21") else "file_number")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("VIII ZR 123/20", "file_number"),
        ("viii zr 123/20", "file_number"),  # read in capitals too
        ("2 BvR 1234/19", "file_number"),
        ("C-311/18", "file_number"),
        ("ECLI:DE:BGH:2020:123456UVIIIZR123.20.0", "ecli"),
        ("V-2020-00012", "identifier"),
        ("AZ-vertrag-1a2b3c4d", "identifier"),
    ],
)
def test_identifiers_are_classified_and_keyed_like_the_preflight(name: str, kind: str) -> None:
    a = ask(identifier=name)
    assert a.kind == kind
    assert a.identifier_keys[0] == identity_key(name)
    assert [t.why for t in a.tiers] == ["identifier", "title"]


def test_an_ecli_ignores_case_and_separators() -> None:
    assert key_variants("ECLI:DE:BGH:2020:123456UVIIIZR123.20.0") == key_variants(
        "ecli de bgh 2020 123456uviiizr123 20 0"
    )


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("§ 535 BGB", "535 bgb"),
        ("§535 BGB", "535 bgb"),
        ("§ 535 bgb", "535 bgb"),
        ("§ 535 Abs. 1 BGB", "535 bgb"),
        ("§ 535 Absatz 1 Satz 2 BGB", "535 bgb"),
        ("§ 535 Absatz 1 Satz 2 bgb", "535 bgb"),  # the law in lower case
        ("§535 abs. 1 bgb", "535 bgb"),
        ("§ 573c BGB", "573 c bgb"),
        ("Art. 3 GG", "art 3 gg"),
        ("Artikel 3 GG", "art 3 gg"),
        ("Art 3 Abs. 1 GG", "art 3 gg"),
        ("Art. 6 Abs. 1 lit. f DSGVO", "art 6 dsgvo"),
        ("§ 5 SGB V", "5 sgb v"),
    ],
)
def test_provisions_are_keyed_in_their_canonical_form_too(name: str, canonical: str) -> None:
    a = ask(identifier=name)
    assert a.kind == "provision" and a.provision is not None
    assert canonical in a.title_keys and canonical in a.identifier_keys
    assert [t.why for t in a.tiers] == ["title", "identifier", "statute"]
    assert a.tiers[-1].keys == key_variants(a.provision.law or "")


def test_a_provision_without_a_law_has_no_statute_tier() -> None:
    a = ask(identifier="§ 5")
    assert a.kind == "provision" and [t.why for t in a.tiers] == ["title", "identifier"]


def test_a_provision_inside_a_longer_name_is_no_provision_ask() -> None:
    a = ask(identifier="Gutachten zu § 535 BGB")
    assert a.kind == "identifier" and a.provision is None
    assert a.identifier_keys == ["gutachten zu 535 bgb"]


def test_canonical_provision_names() -> None:
    assert provision_name(Provision("paragraph", "535", "BGB", subsection="1")) == "§ 535 BGB"
    full = Provision("article", "6", "DSGVO", subsection="1", letter="f")
    assert provision_name(full, with_parts=True) == "Art. 6 Abs. 1 lit. f DSGVO"
    assert provision_name(Provision("section", "5")) == "Section 5"


def test_a_title_is_looked_up_as_a_title_only() -> None:
    a = ask(title="Mietvertrag  HAUPTSTRASSE 5 – Müller")
    assert a.kind == "title" and a.identifier_keys == []
    assert a.title_keys == [identity_key("Mietvertrag Hauptstraße 5 - müller")]


def test_nfc_and_nfkc_forms_are_both_keys() -> None:
    decomposed = "Ku\u0308ndigung ﬁnal"  # a combining diaeresis and the fi ligature
    keys = key_variants(decomposed)
    assert identity_key("Kündigung final") in keys


def test_the_ask_says_how_it_was_read() -> None:
    assert ask(identifier="§ 535 Abs. 1 BGB").to_json() == {
        "by": "identifier",
        "text": "§ 535 Abs. 1 BGB",
        "kind": "provision",
        "provision": "§ 535 Abs. 1 BGB",
    }
    assert ask(title="Klage").to_json() == {"by": "title", "text": "Klage", "kind": "title"}


# --- the outcome ---------------------------------------------------------------------------------------------------


def version(version_id: int, no: int = 1, status: str = "final", date: dt.date | None = dt.date(2021, 1, 1)) -> Any:
    return VisibleVersionRow(version_id, no, status, date, "de", (7,))


def view(*versions: VisibleVersionRow, latest: int | None = None) -> VisibleDocument:
    return VisibleDocument(list(versions), latest)


def carrier(document_id: int, key: str, why: str = "identifier", project_id: int = 1) -> NamedCarrier:
    return NamedCarrier(key, why, document_id, project_id, f"Akte {document_id}")


FILE = ask(identifier="29 O 167/21")
KEY = "29 o 167 21"


def test_one_visible_carrier_is_found_with_its_cited_version() -> None:
    seen = {10: view(version(100, 1), version(101, 2), latest=100)}
    decision = decide(FILE, [carrier(10, KEY)], seen, None)
    assert decision.outcome == "found" and decision.found is not None
    assert decision.found.version.version_id == 100 and decision.found.latest_final and decision.found.cited_by


def test_several_carriers_are_ambiguous_in_document_id_order_never_ranked() -> None:
    seen = {d: view(version(d * 10), latest=d * 10) for d in (30, 10, 20)}
    decision = decide(FILE, [carrier(30, KEY), carrier(10, KEY), carrier(20, KEY)], seen, None)
    assert decision.outcome == "ambiguous" and not decision.truncated
    assert [c.document_id for c in decision.candidates] == [10, 20, 30]


def test_a_carrier_without_a_visible_version_is_not_counted() -> None:
    # What visible_carriers and visible_versions_of answer for a hidden second carrier: nothing.
    seen = {10: view(version(100), latest=100)}
    assert decide(FILE, [carrier(10, KEY)], seen, None).outcome == "found"
    assert decide(FILE, [carrier(10, KEY), carrier(11, KEY)], seen, None).outcome == "found"
    assert decide(FILE, [], {}, None).outcome == "not_found"


def test_hidden_and_missing_are_the_same_decision() -> None:
    hidden = Lookup(FILE, None, decide(FILE, [], {}, None)).to_json()
    missing = Lookup(FILE, None, decide(FILE, [], {}, None)).to_json()
    assert (
        hidden
        == missing
        == {
            "outcome": "not_found",
            "asked": {"by": "identifier", "text": "29 O 167/21", "kind": "file_number", "as_of": None},
        }
    )


def test_the_first_tier_with_a_candidate_decides() -> None:
    seen = {d: view(version(d * 10), latest=d * 10) for d in (1, 2, 3)}
    # An identifier carried by one document and a title equal to it on another: the identifier decides.
    decision = decide(FILE, [carrier(1, KEY, "title"), carrier(2, KEY)], seen, None)
    assert decision.outcome == "found" and decision.found is not None and decision.found.document_id == 2
    # A provision: the document that is the provision (its title) before the documents citing it.
    provision = ask(identifier="§ 535 BGB")
    cited = [carrier(1, "535 bgb"), carrier(2, "535 bgb"), carrier(3, "535 bgb", "title")]
    found = decide(provision, cited, seen, None).found
    assert found is not None and (found.document_id, found.why) == (3, "title")
    # Then the documents citing it; then the statute (its law's name as a title or an identifier).
    assert decide(provision, cited[:2], seen, None).outcome == "ambiguous"
    statute = decide(provision, [carrier(1, "bgb", "title")], seen, None).found
    assert statute is not None and statute.why == "statute" and statute.key == "bgb"


def test_a_tier_whose_carriers_have_no_version_in_force_gives_way() -> None:
    provision = ask(identifier="§ 535 BGB")
    seen = {
        1: view(version(10, date=dt.date(2023, 1, 1)), latest=10),  # the provision's own document, newer
        2: view(version(20, date=dt.date(2019, 1, 1)), latest=20),  # the statute, in force in 2020
    }
    decision = decide(provision, [carrier(1, "535 bgb", "title"), carrier(2, "bgb")], seen, dt.date(2020, 6, 1))
    assert decision.found is not None and decision.found.document_id == 2


def test_project_ids_narrow_the_candidates() -> None:
    seen = {d: view(version(d * 10), latest=d * 10) for d in (1, 2)}
    carriers = [carrier(1, KEY, project_id=5), carrier(2, KEY, project_id=6)]
    assert decide(FILE, carriers, seen, None).outcome == "ambiguous"
    found = decide(FILE, carriers, seen, None, {6}).found
    assert found is not None and found.document_id == 2
    assert decide(FILE, carriers, seen, None, {7}).outcome == "not_found"


def test_as_of_chooses_the_version_in_force() -> None:
    seen = view(
        version(1, 1, "final", dt.date(2019, 3, 1)),
        version(2, 2, "executed", dt.date(2020, 3, 1)),
        version(3, 3, "draft", dt.date(2020, 6, 1)),
        version(4, 4, "final", dt.date(2021, 3, 1)),
        version(5, 5, "final", None),
        latest=4,
    )
    assert version_in_force(seen, None) == seen.versions[3]  # the cited one
    assert version_in_force(seen, dt.date(2020, 12, 31)) == seen.versions[1]  # not the draft
    assert version_in_force(seen, dt.date(2019, 3, 1)) == seen.versions[0]  # on the day
    assert version_in_force(seen, dt.date(2019, 2, 28)) is None  # nothing in force yet
    decision = decide(FILE, [carrier(9, KEY)], {9: seen}, dt.date(2020, 12, 31))
    assert decision.found is not None and decision.found.version.version_id == 2
    assert not decision.found.latest_final and not decision.found.cited_by
    assert decide(FILE, [carrier(9, KEY)], {9: seen}, dt.date(2018, 1, 1)).outcome == "not_found"


def test_many_candidates_are_truncated() -> None:
    ids = range(1, MAX_CANDIDATES + 6)
    seen = {d: view(version(d), latest=d) for d in ids}
    decision = decide(FILE, [carrier(d, KEY) for d in ids], seen, None)
    assert decision.outcome == "ambiguous" and decision.truncated
    assert [c.document_id for c in decision.candidates] == list(range(1, MAX_CANDIDATES + 1))
    # Carriers whose versions were not read: one candidate is still not `found`, nor is none `not_found`.
    one = decide(FILE, [carrier(1, KEY), carrier(2, KEY)], {1: seen[1]}, None, unread={2})
    assert one.outcome == "ambiguous" and one.truncated and [c.document_id for c in one.candidates] == [1]
    none = decide(FILE, [carrier(2, KEY)], {}, None, unread={2})
    assert none.outcome == "ambiguous" and none.truncated and none.candidates == ()


def test_the_versions_read_are_the_first_tiers_first() -> None:
    provision = ask(identifier="§ 535 BGB")
    carriers = [carrier(d, "535 bgb") for d in range(1, 6)] + [carrier(9, "535 bgb", "title"), carrier(0, "bgb")]
    tiers = by_tier(provision, carriers)
    assert [list(t) for t in tiers] == [[9], [1, 2, 3, 4, 5], [0]]
    assert to_read(tiers, 3) == ([9, 1, 2], {3, 4, 5, 0})
    # The provision's own document is read and decides, however many documents cite it.
    read, unread = to_read(tiers, 3)
    seen = {d: view(version(d + 100), latest=d + 100) for d in read}
    found = decide(provision, carriers, seen, None, unread=unread).found
    assert found is not None and found.document_id == 9
    assert [list(t) for t in by_tier(provision, carriers, project_ids={2})] == [[], [], []]


def test_the_answer_shapes() -> None:
    seen = {10: view(version(100, 1), latest=100), 11: view(version(110, 1), latest=110)}
    found = Lookup(FILE, None, decide(FILE, [carrier(10, KEY)], seen, None)).to_json()
    assert found == {
        "outcome": "found",
        "asked": {"by": "identifier", "text": "29 O 167/21", "kind": "file_number", "as_of": None},
        "document_id": 10,
        "project_id": 1,
        "title": "Akte 10",
        "matched": {"why": "identifier", "key": KEY},
        "version": {
            "version_id": 100,
            "version_no": 1,
            "status": "final",
            "doc_date": "2021-01-01",
            "language": "de",
            "latest_final": True,
        },  # fmt: skip
        "citation": {"project_id": 1, "document_id": 10, "version_id": 100, "source_object_ids": [7]},
    }
    ambiguous = Lookup(FILE, dt.date(2022, 1, 1), decide(FILE, [carrier(10, KEY), carrier(11, KEY)], seen, None))
    body = ambiguous.to_json()
    assert body["outcome"] == "ambiguous" and body["asked"]["as_of"] == "2022-01-01" and body["truncated"] is False
    assert [c["document_id"] for c in body["candidates"]] == [10, 11]
    assert "score" not in str(body) and "rank" not in str(body)
    # The audit names the documents a lookup answer names.
    assert named_documents(found) == (10,) and named_documents(body) == (10, 11)
    assert named_documents({"outcome": "not_found", "asked": {"text": "29 O 167/21"}}) == ()


# --- the provision in the statute's text ---------------------------------------------------------------------------


def test_heading_patterns() -> None:
    head, following = heading_patterns(Provision("paragraph", "535", "BGB"))
    assert head == r"^[[:blank:]]*§[[:blank:]]*535(?![0-9a-z]).*" and following == r"^[[:blank:]]*§[[:blank:]]*[0-9]"
    head, _ = heading_patterns(Provision("article", "3", "GG"))
    assert head.startswith(r"^[[:blank:]]*(?:art\.|artikel|art)[[:blank:]]*3(?!")


def test_the_span_runs_from_the_heading_to_the_next_one() -> None:
    body = "Bürgerliches Gesetzbuch\n  § 535 Inhalt und Hauptpflichten\nDer Vermieter ...\n§ 536 Mietminderung\n..."
    start = body.index("  § 535") + 1  # 1-based, as regexp_instr answers
    following = body.index("§ 536") + 1
    line = body[start - 1 : body.index("\n", start)]
    span = provision_span(start, len(body), following, line)
    assert span is not None
    assert body[span.start : span.end] == "§ 535 Inhalt und Hauptpflichten\nDer Vermieter ...\n"
    assert span.heading == "§ 535 Inhalt und Hauptpflichten"
    last = provision_span(following, len(body), 0, "§ 536 Mietminderung")
    assert last is not None and body[last.start : last.end] == "§ 536 Mietminderung\n..."
    assert provision_span(0, len(body), 0, None) is None


def test_the_chunk_holding_the_heading_is_the_first_by_ordinal() -> None:
    heading = "§ 535 Inhalt und Hauptpflichten"
    hits = [
        {"_id": "7:chunk:4", "_source": {"text": f"... {heading}\nDer Vermieter", "meta": {"ordinal": 4}}},
        {"_id": "7:chunk:3", "_source": {"text": f"Ende.\n{heading}", "meta": {"ordinal": 3}}},
        {"_id": "7:chunk:2", "_source": {"text": "§ 535 Inhalt und", "meta": {"ordinal": 2}}},  # cut: not whole
    ]
    assert chunk_holding(hits, heading) == "7:chunk:3"
    assert chunk_holding([], heading) is None
    body = chunk_body(7, heading)
    assert body["query"]["bool"]["filter"][0] == {"term": {"document_version_id": "7"}}
    assert body["query"]["bool"]["must"] == [{"match_phrase": {"text": heading}}]


def test_a_provision_found_carries_its_span_chunk_and_permalink() -> None:
    provision = ask(identifier="§ 535 Abs. 1 BGB")
    seen = {5: view(version(50), latest=50)}
    lookup = Lookup(provision, None, decide(provision, [carrier(5, "bgb", "title")], seen, None))
    assert lookup.to_json()["provision"] is None and lookup.chunk_query() is None  # no heading found
    lookup.provision = ProvisionSpan("§ 535 Inhalt", 24, 80)
    query = lookup.chunk_query()
    assert query is not None and query["query"]["bool"]["must"][0]["match_phrase"]["text"] == "§ 535 Inhalt"
    hits = [{"_id": "50:chunk:0", "_source": {"text": "BGB\n§ 535 Inhalt\n", "meta": {"ordinal": 0}}}]
    body = lookup.with_chunk_of(hits).to_json()
    assert body["provision"] == {
        "heading": "§ 535 Inhalt",
        "start": 24,
        "end": 80,
        "chunk_id": "50:chunk:0",
        "permalink": "/v1/documents/5/versions/50/text?offset=24&length=56",
    }
    assert body["matched"] == {"why": "statute", "key": "bgb"}
    assert body["asked"]["provision"] == "§ 535 Abs. 1 BGB"


def test_a_lookup_request_is_a_pydantic_model_with_its_schema() -> None:
    properties = LookupRequest.model_json_schema()["properties"]
    assert set(properties) == {"identifier", "title", "as_of", "project_id"}

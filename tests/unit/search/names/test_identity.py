"""Identity keys, query grams and the pure decisions of the identity preflight (search.names.keys)."""

from __future__ import annotations

import datetime as dt

import pytest

from search.names.keys import (
    NamedDocument,
    VersionRow,
    choose_versions,
    contains,
    identity_key,
    keep_subjects,
    name_grams,
    query_grams,
    resolve,
)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("§573 BGB", "§ 573 BGB"),
        ("§ 573  bgb", "§ 573 BGB"),
        ("5 U 123/22", "5U 123-22"),
        ("5 U 123/22", "5 u 123 22"),
        ("VII ZR 45/21", "vii zr 45–21"),
        ("Straße", "STRASSE"),
        ("Mietvertrag „Hauptstraße“", "mietvertrag hauptstrasse"),
        ("Art. 6 DSGVO", "art 6 dsgvo"),
        ("a\u0308rger", "ärger"),  # NFC
        ("V-2023-00417", "v 2023 00417"),
    ],
)
def test_spelling_variants_share_a_key(a: str, b: str) -> None:
    assert identity_key(a) == identity_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [("5 U 123/22", "5 U 12/322"), ("VIIZR 45/21", "VII ZR 45/21"), ("Miete", "Mieter"), ("§ 573 BGB", "§ 57 3BGB")],
)
def test_different_names_have_different_keys(a: str, b: str) -> None:
    assert identity_key(a) != identity_key(b)


def test_key_form() -> None:
    assert identity_key("  §573a BGB, Abs. 2 ") == "573 a bgb abs 2"
    assert identity_key("Müller GmbH ./. Weber") == "müller gmbh weber"


def test_query_grams_are_whole_token_runs_of_three_characters_or_more() -> None:
    grams = query_grams("Kündigung nach §573 BGB", 3)
    assert "573 bgb" in grams and "kündigung nach" in grams
    assert "kündigung nach 573 bgb" not in grams  # 4 tokens > 3
    assert "bgb" in grams and "573" in grams
    assert not [g for g in grams if len(g.replace(" ", "")) < 3]
    assert query_grams("§ 1 a", 5) == []  # "1a": two characters name nothing
    assert "ündigung" not in grams  # never part of a token


def test_short_titles_name_only_as_the_whole_query() -> None:
    titles, identifiers = name_grams("Anxiety and air pollution", **LIMITS)
    assert "anxiety" not in titles and "anxiety and" in titles
    assert "anxiety" in identifiers  # identifiers have no minimum length in tokens
    titles, _ = name_grams("  Anxiety! ", **LIMITS)
    assert titles == ["anxiety"]


LIMITS = {"max_title_tokens": 24, "min_title_tokens": 2, "max_identifier_tokens": 8}


def test_contains_is_whole_token() -> None:
    assert contains("atlas migration weekly plan", "atlas migration")
    assert not contains("atlas migrations", "atlas migration")
    assert not contains("atlas migration", "atlas migration weekly")


def named(doc: int, key: str, why: str = "title") -> NamedDocument:
    return NamedDocument(doc, 1, key.title(), why, key)  # type: ignore[arg-type]


def test_one_named_document_is_unique() -> None:
    identity = resolve([named(1, "mietvertrag hauptstrasse")], 5)
    assert identity.outcome == "unique" and identity.unique is not None and identity.unique.document_id == 1


def test_a_name_two_documents_carry_is_ambiguous() -> None:
    identity = resolve([named(1, "gutachten"), named(2, "gutachten")], 5)
    assert identity.outcome == "ambiguous" and [s.document_id for s in identity.subjects] == [1, 2]


def test_shadowed_title_leaves_the_group() -> None:
    identity = resolve([named(1, "atlas migration"), named(2, "atlas migration weekly plan")], 5)
    assert identity.outcome == "unique" and identity.subjects[0].document_id == 2
    assert identity.shadowed == ("atlas migration",)


def test_a_citation_inside_a_title_is_shadowed() -> None:
    citations = [named(d, "573 bgb", "identifier") for d in (1, 2)]
    identity = resolve([named(1, "gutachten zu 573 bgb mueller"), *citations], 5)
    assert identity.outcome == "unique" and identity.subjects[0].document_id == 1


def test_two_unrelated_named_titles_are_two_subjects() -> None:
    identity = resolve([named(1, "atlas migration"), named(2, "mietvertrag hauptstrasse")], 5)
    assert identity.outcome == "ambiguous"
    assert [s.document_id for s in identity.subjects] == [2, 1]  # the longer (more specific) name first


def test_a_common_name_names_nothing() -> None:
    identity = resolve([named(d, "573 bgb", "identifier") for d in range(1, 7)], 5)
    assert identity.outcome == "none" and identity.common == ("573 bgb",)
    assert resolve([named(1, "573 bgb")], 5, saturated={"573 bgb"}).outcome == "none"


def test_the_same_document_by_two_names_is_one_subject_identifier_first() -> None:
    identity = resolve([named(1, "urteil lg berlin"), named(1, "5 o 12 22", "identifier")], 5)
    assert identity.outcome == "unique" and identity.subjects[0].why == "title"  # the longer name
    identity = resolve([named(1, "5 o 12 22", "identifier"), named(1, "5 o 12 22")], 5)
    assert identity.subjects[0].why == "identifier"


def test_too_many_subjects_together_name_nothing() -> None:
    identity = resolve([named(d, f"titel nummer {d}") for d in range(1, 8)], 5)
    assert identity.outcome == "none" and identity.subjects == ()


def v(version: int, doc: int, status: str, day: dt.date | None, no: int) -> VersionRow:
    return VersionRow(version, doc, status, day, no)


VERSIONS = [
    v(10, 1, "final", dt.date(2023, 1, 10), 1),
    v(11, 1, "final", dt.date(2024, 3, 1), 2),
    v(12, 1, "draft", dt.date(2024, 6, 1), 3),
    v(20, 2, "draft", dt.date(2024, 1, 1), 1),
]


def test_without_as_of_the_latest_final_version_shows() -> None:
    assert choose_versions(VERSIONS, {10, 11, 12, 20}, {1: 11, 2: None}, None) == {1: 11, 2: 20}
    # The latest final one invisible: the highest-numbered visible one.
    assert choose_versions(VERSIONS, {10, 12}, {1: 11}, None) == {1: 12}


def test_as_of_picks_the_visible_version_in_force() -> None:
    visible = {10, 11, 12, 20}
    assert choose_versions(VERSIONS, visible, {1: 11}, dt.date(2023, 6, 30)) == {1: 10}
    assert choose_versions(VERSIONS, visible, {1: 11}, dt.date(2025, 1, 1)) == {1: 11}  # drafts are not in force
    assert choose_versions(VERSIONS, visible, {1: 11}, dt.date(2022, 1, 1)) == {}
    # 11 is in force but invisible: the caller's own version in force stands, as if 11 did not exist.
    assert choose_versions(VERSIONS, {10}, {1: 11}, dt.date(2025, 1, 1)) == {1: 10}


def test_keep_subjects_recounts() -> None:
    identity = resolve([named(1, "gutachten"), named(2, "gutachten")], 5)
    kept = keep_subjects(identity, {2: 21})
    assert kept.outcome == "unique" and kept.unique is not None and kept.unique.version_id == 21
    assert keep_subjects(identity, {}).outcome == "none"

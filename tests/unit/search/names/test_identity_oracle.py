"""The identity test oracle on the examples `docs/search-api.md` gives, so the demo identity set
(`tests/integration/test_identity_demo.py`) rests on an oracle that is itself checked."""

from __future__ import annotations

from collections import Counter

from tests.identity_oracle import Expected, Limits, Name, expected, name_key

LIMITS = Limits(max_candidates=5, max_documents_per_name=1000, max_title_tokens=24, min_title_tokens=2,
                max_identifier_tokens=8)  # fmt: skip


def test_keys_follow_the_documented_spellings() -> None:
    assert name_key("§573 BGB") == name_key("§ 573 BGB") == name_key("§ 573  bgb") == "573 bgb"
    assert name_key("5 U 123/22") == name_key("5U 123-22") == name_key("5 u 123 22") == "5 u 123 22"
    assert name_key("Hauptstraße") == name_key("HAUPTSTRASSE")
    assert name_key("VIIZR") != name_key("VII ZR")


def outcome(query: str, names: list[Name], visible: set[int], carriers: Counter[str] | None = None) -> Expected:
    if carriers is None:
        carriers = Counter(k for k, _ in {(name_key(n.text), n.document_id) for n in names})
    return expected(query, names, frozenset(visible), carriers, LIMITS)


def test_unique_ambiguous_shadowed_common_and_hidden() -> None:
    names = [
        Name(1, "Atlas Migration", "title"),
        Name(2, "Atlas Migration Weekly Plan", "title"),
        Name(3, "Gutachten zur Mietpreisbremse", "title"),
        Name(4, "Gutachten zur Mietpreisbremse", "title"),
        Name(5, "5 O 1234/22", "identifier"),
        Name(5, "Urteil Landgericht Berlin, Az. 5 O 1234/22", "title"),
        *[Name(10 + i, "§ 573 BGB", "identifier") for i in range(6)],
        Name(20, "Kündigung", "title"),
    ]
    everyone = {n.document_id for n in names}
    assert outcome("atlas migration", names, everyone) == Expected("unique", frozenset({1}), frozenset({"title"}))
    # shadowed: the shorter title inside the longer one leaves
    assert outcome("Atlas Migration Weekly Plan", names, everyone).documents == {2}
    assert outcome("Gutachten zur Mietpreisbremse", names, everyone) == Expected("ambiguous", frozenset({3, 4}))
    assert outcome("Gutachten zur Mietpreisbremse", names, everyone - {4}).documents == {3}  # the other is hidden
    assert outcome("5O 1234-22", names, everyone).reasons == {"identifier"}
    # the Aktenzeichen inside its own title: the title is the more specific name
    assert outcome("Urteil Landgericht Berlin, Az. 5 O 1234/22", names, everyone).reasons == {"title"}
    assert outcome("§573 BGB", names, everyone).outcome == "none"  # six documents carry it: common
    assert outcome("§573 BGB", names, {10, 11}).documents == {10, 11}  # two visible ones: ambiguous
    saturated = Counter({name_key("§ 573 BGB"): 1001})
    assert outcome("§573 BGB", names, {10}, saturated).outcome == "none"  # too many documents at all
    assert outcome("Kündigung", names, everyone).documents == {20}  # a one-token title as the whole query
    assert outcome("Kündigung des Mietvertrags", names, everyone).outcome == "none"  # ... else a topic
    assert outcome("Atlas Migration", names, set()).outcome == "none"

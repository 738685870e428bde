"""Synonym expansion of a query (search.ranking.synonyms)."""

from __future__ import annotations

import pytest

from ki.settings import RetrievalSettings
from search.ranking.synonyms import DEFAULT_SYNONYMS, expand_query

GROUPS = [["Kündigung", "Beendigung des Vertragsverhältnisses"], ["Kaution", "Mietsicherheit"], ["Lohn", "Gehalt"]]


def test_a_phrase_of_a_group_adds_the_others() -> None:
    out = expand_query("Frist für die Kündigung?", GROUPS)
    assert out.added == ("Beendigung des Vertragsverhältnisses",)
    assert out.text == "Frist für die Kündigung? Beendigung des Vertragsverhältnisses"


def test_the_long_phrase_adds_the_short_one_whatever_the_spelling() -> None:
    out = expand_query("beendigung des VERTRAGSVERHÄLTNISSES und kaution", GROUPS)
    assert out.added == ("Kündigung", "Mietsicherheit")


def test_whole_tokens_only_and_nothing_twice() -> None:
    assert expand_query("Lohnsteuer", GROUPS).added == ()  # not a whole token
    assert expand_query("Lohn und Gehalt", GROUPS).added == ()  # both already there
    assert expand_query("nichts davon", GROUPS).text == "nichts davon"


def test_groups_need_two_phrases() -> None:
    with pytest.raises(ValueError, match="two or more"):
        RetrievalSettings(synonyms=[["allein"]])
    with pytest.raises(ValueError, match="two or more"):
        RetrievalSettings(synonyms=[["a", " "]])


def test_the_shipped_list_is_well_formed() -> None:
    RetrievalSettings(synonyms=[list(g) for g in DEFAULT_SYNONYMS])
    phrases = [p.casefold() for g in DEFAULT_SYNONYMS for p in g]
    assert len(phrases) == len(set(phrases))

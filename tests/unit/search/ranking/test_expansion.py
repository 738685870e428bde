"""Chunk expansion's plan: which neighbouring rows to fetch for a page of hits (search.ranking.neighbours)."""

from __future__ import annotations

from search.ranking.neighbours import Neighbour, body_ordinal, plan_neighbours


def test_body_ordinal_parses_body_rows_only() -> None:
    assert body_ordinal("42:chunk:3") == (42, 3)
    assert body_ordinal("42:profile:-1") is None
    assert body_ordinal("42:clause:1000") is None
    assert body_ordinal("x:chunk:y") is None


def test_both_neighbours_of_a_middle_chunk_and_only_the_next_of_the_first() -> None:
    assert plan_neighbours([("7:chunk:3", 1)], 3) == [
        Neighbour("7:chunk:3", "7:chunk:2", "before"),
        Neighbour("7:chunk:3", "7:chunk:4", "after"),
    ]
    assert plan_neighbours([("7:chunk:0", 1)], 3) == [Neighbour("7:chunk:0", "7:chunk:1", "after")]


def test_a_neighbour_on_the_page_or_shared_is_not_repeated() -> None:
    planned = plan_neighbours([("7:chunk:3", 1), ("7:chunk:4", 1), ("8:chunk:1", 2), ("8:chunk:3", 2)], 10)
    ids = [n.chunk_id for n in planned]
    assert "7:chunk:4" not in ids and "7:chunk:3" not in ids  # both are hits
    assert ids.count("8:chunk:2") == 1  # the neighbour of both 8:1 and 8:3, fetched once (for the first)
    assert [n.hit_chunk_id for n in planned if n.chunk_id == "8:chunk:2"] == ["8:chunk:1"]


def test_cap_per_document_counts_its_hits_first() -> None:
    planned = plan_neighbours([("7:chunk:3", 1), ("9:chunk:5", 1), ("8:chunk:2", 2)], 3)
    assert [n.chunk_id for n in planned if n.chunk_id.startswith("7:") or n.chunk_id.startswith("9:")] == ["7:chunk:2"]
    assert [n.chunk_id for n in planned if n.chunk_id.startswith("8:")] == ["8:chunk:1", "8:chunk:3"]
    assert plan_neighbours([("7:chunk:3", 1)], 1) == []


def test_profile_and_clause_hits_have_no_neighbours() -> None:
    assert plan_neighbours([("7:profile:-1", 1), ("7:clause:1001", 1)], 5) == []

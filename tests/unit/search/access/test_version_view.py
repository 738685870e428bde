"""A document's versions as one caller sees them (search.access.version_view): nothing shown depends on a version
the caller may not see."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from search.access.version_view import VersionFacts, compared_with, in_force, latest_final, shown_numbers

D = dt.date


def v(
    version_id: int, version_no: int, status: str = "final", day: dt.date | None = None, doc: int = 1
) -> VersionFacts:
    return VersionFacts(version_id, doc, version_no, status, day)


def test_visible_versions_are_numbered_one_two_three_per_document() -> None:
    seen = [v(13, 3), v(11, 1), v(21, 4, doc=2)]
    assert shown_numbers(seen) == {11: 1, 13: 2, 21: 1}


def test_latest_final_is_the_pointer_when_visible_else_the_highest_visible_final() -> None:
    seen = [v(11, 1), v(13, 3, "draft")]
    assert latest_final(seen, {1: 11}) == {1: 11}
    assert latest_final(seen, {1: 12}) == {1: 11}  # the pointer names a hidden version: as if there were none
    assert latest_final(seen, {1: None}) == {1: 11}
    assert latest_final([v(13, 3, "draft")], {1: 12}) == {1: None}
    assert latest_final([v(11, 1), v(12, 2, "executed")], {}) == {1: 12}


def test_the_version_in_force_is_the_latest_dated_visible_final_one() -> None:
    seen = [v(11, 1, day=D(2024, 1, 1)), v(13, 3, "draft", D(2024, 3, 1)), v(14, 4, "executed", D(2024, 2, 1))]
    assert in_force(seen, D(2024, 1, 31)) == {1: 11}
    assert in_force(seen, D(2024, 6, 1)) == {1: 14}
    assert in_force(seen, D(2023, 1, 1)) == {}


def test_a_version_is_compared_with_the_callers_own_previous_or_dated_one() -> None:
    seen = [v(11, 1, day=D(2020, 1, 1)), v(12, 2, "draft", D(2020, 6, 1)), v(14, 4, day=D(2022, 1, 1))]
    assert compared_with(seen, 14, "previous") == 11  # the draft is no "Fassung"; 13 is hidden: never named
    assert compared_with(seen, 11, "previous") is None  # nothing before the first
    assert compared_with(seen, 11, "current") == 14
    assert compared_with(seen, 14, D(2021, 1, 1)) == 11
    assert compared_with(seen, 14, D(2019, 1, 1)) is None


versions = st.lists(
    st.tuples(st.integers(1, 6), st.sampled_from(["final", "executed", "draft"]), st.integers(0, 30)),
    min_size=1,
    max_size=6,
    unique_by=lambda t: t[0],
)


@settings(max_examples=200, derandomize=True, database=None)
@given(versions, st.sets(st.integers(1, 6)), st.integers(0, 30))
def test_a_hidden_version_changes_nothing_the_caller_is_shown(
    rows: list[tuple[int, str, int]], hidden_numbers: set[int], as_of: int
) -> None:
    """What a caller is shown of their versions depends only on those versions (and on a pointer that names
    one of them): the same whether the hidden ones exist or not."""
    every = [v(100 + no, no, status, D(2024, 1, 1) + dt.timedelta(days=day)) for no, status, day in rows]
    seen = sorted((x for x in every if x.version_no not in hidden_numbers), key=lambda x: x.version_no)
    pointer = max((x.version_id for x in every if x.status == "final"), default=None)
    alone = [
        VersionFacts(x.version_id, x.document_id, position, x.status, x.doc_date) for position, x in enumerate(seen, 1)
    ]
    day = D(2024, 1, 1) + dt.timedelta(days=as_of)
    visible_pointer = pointer if any(x.version_id == pointer for x in seen) else None
    assert shown_numbers(seen) == shown_numbers(alone)
    assert latest_final(seen, {1: pointer}) == latest_final(alone, {1: visible_pointer}) if seen else True
    assert in_force(seen, day) == in_force(alone, day)

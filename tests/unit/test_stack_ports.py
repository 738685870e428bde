"""The stack's ports kept out of the ephemeral range (apps.stack.ports), on a file standing in for /proc."""

from __future__ import annotations

from pathlib import Path

from apps.stack.ports import format_reserved, parse_reserved, reserve


def test_parse_and_format_round_trip_with_ranges():
    assert parse_reserved("") == set()
    assert parse_reserved("8080,9000-9002\n") == {8080, 9000, 9001, 9002}
    assert format_reserved({59093, 59092, 55432, 59200, 59201, 59202}) == "55432,59092-59093,59200-59202"
    assert parse_reserved(format_reserved({1, 2, 3, 10})) == {1, 2, 3, 10}


def test_reserve_adds_to_what_is_there_and_keeps_it(tmp_path: Path):
    path = tmp_path / "ip_local_reserved_ports"
    path.write_text("8080\n")
    assert reserve([59200, 59300, 59201], path) is True
    assert parse_reserved(path.read_text()) == {8080, 59200, 59201, 59300}
    before = path.stat().st_mtime_ns
    assert reserve([59200], path) is True and path.stat().st_mtime_ns == before  # nothing new: not written


def test_reserve_is_a_no_op_where_it_cannot_write(tmp_path: Path):
    assert reserve([59200], tmp_path / "missing" / "file") is False

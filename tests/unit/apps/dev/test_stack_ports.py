"""The stack's ports kept out of the ephemeral range (apps.dev.stack.ports), on a file standing in for /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.dev.stack.ports import format_reserved, parse_reserved, reserve, shifted_ports
from apps.dev.stack.ports import main as ports_main
from ki.settings import Settings, load_settings


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


def test_shifted_ports_move_every_stack_listener_and_nothing_else():
    settings = Settings()
    env = shifted_ports(settings, 1000)
    assert env["KI_DATABASE__PORT"] == str(settings.database.port + 1000)
    assert env["KI_KAFKA__BOOTSTRAP_SERVERS"] == "127.0.0.1:60092"
    assert env["KI_CONNECT__URL"] == "http://127.0.0.1:59083"
    assert env["KI_OPENSEARCH__URL"] == "http://127.0.0.1:60200"
    assert "KI_API__PORT" not in env and "KI_STACK__HOME" not in env
    # The shifted settings load, and none of their ports meets one of the first stack's.
    shifted = Settings.model_validate(
        {"kafka": {"bootstrap_servers": env["KI_KAFKA__BOOTSTRAP_SERVERS"]}, "connect": {"url": env["KI_CONNECT__URL"]}}
    )
    assert shifted.kafka.bootstrap_servers != settings.kafka.bootstrap_servers
    assert len(set(env.values())) == len(env)
    assert shifted_ports(settings, 0) == {}


def test_a_shift_past_the_port_range_is_refused():
    with pytest.raises(ValueError, match="outside 1-65535"):
        shifted_ports(Settings(), 10_000)


def test_ports_cli_prints_sourceable_lines_and_one_readable_error(capsys):
    assert ports_main(["--shift", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = load_settings().database.port + 1000  # the settings this run loads (a lane may be shifted already)
    assert f"KI_DATABASE__PORT={expected}" in lines and all("=" in line for line in lines)
    assert ports_main(["--shift", "70000"]) == 2
    assert capsys.readouterr().err.count("\n") == 1

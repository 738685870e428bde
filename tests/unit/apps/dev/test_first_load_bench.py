"""`ki bench first-load`'s pure parts: the size in the JSON's name and the refusal of bad options (the run
itself is tests/integration/test_bench_first_load.py)."""

from __future__ import annotations

import pytest

from apps.cli import main
from apps.dev.bench.first_load import size_name


def test_the_file_name_gives_the_chunks_to_one_significant_digit() -> None:
    assert [size_name(n) for n in (97_341, 101_234, 978_186, 6_256, 175)] == ["100k", "100k", "1m", "6k", "1k"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scale", "0"], "--scale must be at least 1"),
        (["--scale", "10", "--access-rate", "0"], "--access-rate must be at least 1"),
        (["--scale", "10", "--access-docs", "0"], "--access-docs must be at least 1"),
        (["--scale", "10", "--search-interval", "0"], "--search-interval must be above 0"),
        (["--scale", "10", "--vector-seconds", "-1"], "--vector-seconds must be at least 0"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "first-load", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ki: ") and message in err and len(err.splitlines()) == 1

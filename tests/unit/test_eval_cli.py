"""`ki eval` refuses bad input with exit code 2 and one readable line, before touching any service."""

import pytest

from ki.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--limit-docs", "0"], "--limit-docs must be at least 1"),
        (["--queries", "-3"], "--queries must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--timeout", "0"], "--timeout must be positive"),
        (["--worker-port", "70000"], "--worker-port must be a port number"),
        (["--data", "/nonexistent/scifact"], "--data /nonexistent/scifact: no such directory"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv, message, capsys):
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ki: {message}" or (err.startswith("ki: ") and message in err)
    assert len(err.splitlines()) == 1


def test_a_data_folder_without_the_corpus_is_one_line(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ki: ") and "neither corpus.jsonl" in err and len(err.splitlines()) == 1

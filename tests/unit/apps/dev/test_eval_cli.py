"""`ki eval` refuses bad input with exit code 2 and one readable line, before touching any service."""

import pytest

from apps.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--limit-docs", "0"], "--limit-docs must be at least 1"),
        (["--queries", "-3"], "--queries must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--answerable", "0"], "--answerable must be at least 1"),
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


def _beir_without_train(root):
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "Text"}\n')
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "Frage"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return root


def test_tune_without_a_train_split_is_one_line(tmp_path, capsys):
    root = _beir_without_train(tmp_path / "set")
    assert main(["eval", "--data", str(root), "--tune"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ki: --tune needs the train split") and "train.tsv" in err and len(err.splitlines()) == 1


def test_drop_and_fresh_exclude_each_other(capsys):
    assert main(["eval", "--drop", "--fresh"]) == 2
    assert "--drop and --fresh" in capsys.readouterr().err

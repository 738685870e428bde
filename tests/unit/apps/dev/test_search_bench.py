"""Pure parts of `ki bench search`: percentiles, the deterministic query mix, CLI validation."""

import re

import pytest

from apps.cli import main
from apps.dev.bench.search import _label_prefix, query_mix, recall_at, summarize, vocabulary
from apps.dev.bench.stats import percentile
from apps.dev.demo.generator import run_label


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_summarize_reports_ms_and_throughput() -> None:
    figures = summarize([0.010, 0.020, 0.030, 0.040], wall_s=0.05)
    assert figures["requests"] == 4
    assert figures["p50_ms"] == 20.0 and figures["p99_ms"] == 40.0 and figures["mean_ms"] == 25.0
    assert figures["throughput_rps"] == 80.0


IDENTIFIERS = ["2 BvR 1234/19", "VI ZR 12/20", "§ 823 BGB", "§ 535 BGB", "Art. 6 DSGVO", "V-2021-00042"]


def test_query_mix_is_deterministic_and_mixed() -> None:
    first = query_mix(7, IDENTIFIERS, doc_type_id=5)
    assert first == query_mix(7, list(reversed(IDENTIFIERS)), doc_type_id=5)
    assert first != query_mix(8, IDENTIFIERS, doc_type_id=5)
    texts = [b["query"] for b in first]
    assert len(texts) == 16
    assert sum(1 for t in texts if re.search(r"BvR|ZR", t)) == 2, "two Aktenzeichen"
    assert sum(1 for t in texts if t.startswith(("§", "Art."))) == 2, "two statute references"
    with_filters = [b for b in first if "filters" in b]
    assert 0 < len(with_filters) < len(first)
    assert {"doc_type": [5]} in [b["filters"] for b in with_filters]
    assert all(b["limit"] == 10 for b in first)


def test_query_mix_without_aktenzeichen_fills_up_with_other_identifiers() -> None:
    texts = [b["query"] for b in query_mix(7, ["§ 823 BGB", "V-2021-00001", "V-2022-00002"], doc_type_id=None)]
    assert "§ 823 BGB" in texts and "V-2021-00001" in texts and "V-2022-00002" in texts
    assert all("doc_type" not in b.get("filters", {}) for b in query_mix(7, [], doc_type_id=None))


def test_vocabulary_has_content_words_only() -> None:
    words = vocabulary()
    assert words == sorted(words) and len(words) > 50
    assert all(len(w) >= 5 and "{" not in w for w in words)
    assert "Pflichtverletzung" in words


def test_label_prefix_matches_the_demo_generator() -> None:
    assert run_label(7, 1000).startswith(_label_prefix(7, 1000) + "-")
    assert _label_prefix(7, 1000) == "ki-demo-s7-n1000"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scale", "0"], "--scale must be at least 1"),
        (["--requests", "0"], "--requests must be at least 1"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--concurrency", "1,x"], "--concurrency must be comma-separated integers"),
        (["--concurrency", "0,8"], "--concurrency values must be at least 1"),
        (["--concurrency", ""], "--concurrency needs at least one level"),
        (["--scope-sizes", "100,-1"], "--scope-sizes values must be at least 1"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "search", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ki: ") and message in err and len(err.splitlines()) == 1


def test_sides_take_turns_going_first():
    from apps.dev.bench.search import side_order

    sides = ["api", "raw_msearch", "api_compare"]
    orders = [side_order(sides, r) for r in range(3)]
    assert [o[0] for o in orders] == sides  # each side goes first once in three rounds
    assert all(sorted(o) == sorted(sides) for o in orders)
    assert side_order(["api", "raw_msearch"], 1) == ["raw_msearch", "api"]


def test_compare_env_takes_settings_overrides_only():
    import pytest

    from apps.cli import CliError, _env_pairs

    assert _env_pairs("--compare-env", "") == {}
    assert _env_pairs("--compare-env", "KI_A__B=1, KI_C__D=x") == {"KI_A__B": "1", "KI_C__D": "x"}
    for bad in ("PATH=/tmp", "KI_A__B", "KI_A__B="):
        with pytest.raises(CliError, match="--compare-env"):
            _env_pairs("--compare-env", bad)


@pytest.mark.parametrize(
    ("kind", "own", "foreign"),
    [("search", "--scale", "--rate"), ("freshness", "--rate", "--scale"), ("sync", "--paragraphs", "--pairs")],
)
def test_each_bench_kind_lists_only_its_own_options(
    kind: str, own: str, foreign: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", kind, "--help"])
    shown = capsys.readouterr().out
    assert exit_.value.code == 0 and own in shown and foreign not in shown


def test_an_option_of_another_bench_kind_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "sync", "--scale", "10"])
    assert exit_.value.code == 2 and "--scale" in capsys.readouterr().err


def test_recall_counts_rows_tied_with_the_tenth_exact_score_as_relevant():
    exact = [(f"e{i}", 1.0 - i * 0.01) for i in range(9)] + [("t1", 0.5), ("t2", 0.5), ("far", 0.1)]
    approx = [f"e{i}" for i in range(9)] + ["t2"]
    assert recall_at(approx, exact) == 1.0  # t2 is as near as t1: either is a right tenth answer
    assert recall_at([f"e{i}" for i in range(9)] + ["far"], exact) == 0.9
    assert recall_at(["x", "e0"], [("e0", 0.9), ("e1", 0.8)]) == 0.5  # the filter admits two rows
    assert recall_at(["x"], []) is None

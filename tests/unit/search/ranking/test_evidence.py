"""The evidence gate (search.ranking.mode_gate): binding hashes, report parsing, the default-mode decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ki.evidence_keys import make_keys, sign
from ki.settings import load_settings
from search.ranking.mode_gate import (
    PINNED_REPORTS,
    EvidenceReport,
    ReportInvalid,
    Trust,
    analyzer_hash,
    binding_for,
    binding_hash,
    decide,
    load_reports,
    parse_report,
    parse_self_report,
    ranking_hash,
)

SIGNATURE = "multilingual-e5-small-384"


def settings(**retrieval):
    env = {f"KI_RETRIEVAL__{k.upper()}": (v if isinstance(v, str) else json.dumps(v)) for k, v in retrieval.items()}
    return load_settings(environ=env)


def report_json(s, *, lexical=0.50, hybrid=0.55, signature=SIGNATURE, dataset="gesetze-headings-dev"):
    binding = binding_for(s, signature, "ab" * 32)
    return {
        "dataset": {"name": dataset, "language": "de"},
        "binding": binding,
        "binding_hash": binding_hash(binding),
        "results": {"lexical": {"ndcg@10": lexical}, "semantic": {"ndcg@10": 0.4}, "hybrid": {"ndcg@10": hybrid}},
    }


KEY = Ed25519PrivateKey.generate()  # this deployment's signing key
TRUST = Trust((KEY.public_key(),))


def signed(data):
    return sign(data, KEY)


def reports(s, *items):
    return [parse_report(f"r{i}.json", item) for i, item in enumerate(items)]


def test_hashes_change_with_what_they_bind():
    base = settings()
    assert analyzer_hash(base.retrieval) != analyzer_hash(settings(text_analyzer="english").retrieval)
    assert ranking_hash(base.retrieval) != ranking_hash(settings(weight_semantic=0.3).retrieval)
    assert ranking_hash(base.retrieval) != ranking_hash(settings(fusion_rrf_k=20).retrieval)
    assert ranking_hash(base.retrieval) != ranking_hash(settings(chunk_chars=900).retrieval)
    # Settings that do not change a ranking do not invalidate reports.
    assert ranking_hash(base.retrieval) == ranking_hash(settings(rerank__timeout_s=5).retrieval)
    assert analyzer_hash(base.retrieval) == analyzer_hash(settings(index_name="other").retrieval)
    # Temporal decay binds reports only when it is on (off, it changes no ranking).
    assert ranking_hash(base.retrieval) == ranking_hash(settings(decay_min_weight=0.5).retrieval)
    decayed = ranking_hash(settings(decay_enabled=True).retrieval)
    assert decayed != ranking_hash(base.retrieval)
    assert decayed != ranking_hash(settings(decay_enabled=True, decay_min_weight=0.5).retrieval)


def test_hybrid_by_default_when_a_matching_report_shows_it_helps():
    s = settings()
    decision = decide(reports(s, report_json(s)), s, SIGNATURE)
    assert decision.default_mode == "hybrid"
    assert "gesetze-headings-dev 0.550 >= 0.500" in decision.reason


def test_keyword_only_without_a_matching_report():
    s = settings()
    decision = decide([], s, SIGNATURE)
    assert decision.default_mode == "lexical" and "no evaluation report matches" in decision.reason
    # Reports for another embedder, analyzer or ranking do not count.
    other = [
        report_json(s, signature="all-minilm-l6-v2-384"),
        report_json(settings(text_analyzer="english")),
        report_json(settings(weight_semantic=0.3)),
    ]
    assert decide(reports(s, *other), s, SIGNATURE).default_mode == "lexical"


def test_one_matching_report_where_hybrid_loses_turns_semantic_off():
    s = settings()
    found = reports(s, report_json(s), report_json(s, lexical=0.94, hybrid=0.90, dataset="xquad-de"))
    decision = decide(found, s, SIGNATURE)
    assert decision.default_mode == "lexical"
    assert "xquad-de 0.900 < 0.940" in decision.reason


def test_a_loss_that_is_not_significant_keeps_hybrid_and_says_so():
    s = settings()
    noisy = {**report_json(s, lexical=0.94, hybrid=0.93, dataset="xquad-de"), "hybrid_vs_lexical": {"p_value": 0.4}}
    decision = decide(reports(s, report_json(s), noisy), s, SIGNATURE)
    assert decision.default_mode == "hybrid" and "xquad-de 0.930 < 0.940 not significantly (p 0.400" in decision.reason
    real = {**noisy, "hybrid_vs_lexical": {"p_value": 0.01}}
    assert decide(reports(s, real), s, SIGNATURE).default_mode == "lexical"
    strict = settings(mode_gate__significance_level=1.0)  # every difference counts, as before the paired test
    counted = {**report_json(strict, lexical=0.94, hybrid=0.93), "hybrid_vs_lexical": {"p_value": 0.4}}
    assert decide(reports(strict, counted), strict, SIGNATURE).default_mode == "lexical"


def test_semantic_weight_zero_means_keyword_only_whatever_the_reports():
    s = settings(weight_semantic=0)
    assert decide(reports(s, report_json(s)), s, SIGNATURE).default_mode == "lexical"


def test_a_report_edited_by_hand_is_refused():
    s = settings()
    data = report_json(s)
    data["binding"]["ranking_hash"] = ranking_hash(settings(weight_semantic=0.2).retrieval)
    with pytest.raises(ReportInvalid, match="binding_hash"):
        parse_report("edited.json", data)


def test_other_benchmark_files_are_not_reports():
    assert parse_report("sync.json", {"rounds": []}) is None
    assert parse_report("list.json", [1, 2]) is None


def test_load_reports_reads_a_folder_and_skips_what_it_cannot_use(tmp_path: Path):
    s = settings()
    (tmp_path / "gesetze.json").write_text(json.dumps(signed(report_json(s))))
    (tmp_path / "sync.json").write_text(json.dumps({"rounds": []}))
    (tmp_path / "broken.json").write_text("{not json")
    bad = report_json(s)
    bad["binding_hash"] = "0" * 16
    (tmp_path / "bad.json").write_text(json.dumps(signed(bad)))
    found = load_reports(str(tmp_path), TRUST)
    assert [type(r) for r in found] == [EvidenceReport]
    assert found[0].dataset == "gesetze-headings-dev"
    assert load_reports(str(tmp_path / "missing"), TRUST) == []


def test_new_ranking_steps_bind_reports_only_when_on():
    off = {"semantic_floor_enabled": False}
    base = ranking_hash(settings(**off).retrieval, SIGNATURE)
    floors = {"semantic_floor": {SIGNATURE: 0.8, "all-minilm-l6-v2-384": 0.2}}
    assert ranking_hash(settings(**off, **floors).retrieval, SIGNATURE) == base
    floored = ranking_hash(settings(semantic_floor_enabled=True, **floors).retrieval, SIGNATURE)
    assert floored != base
    # Only the floor stored for the report's own signature counts.
    other_model = {"semantic_floor": {SIGNATURE: 0.8, "all-minilm-l6-v2-384": 0.3}}
    assert ranking_hash(settings(semantic_floor_enabled=True, **other_model).retrieval, SIGNATURE) == floored
    assert ranking_hash(settings(**off, synonyms_enabled=True).retrieval, SIGNATURE) != base
    assert ranking_hash(settings(**off, synonyms=[["a b", "c"]]).retrieval, SIGNATURE) == base
    assert ranking_hash(settings(**off, graph_rag_enabled=True).retrieval, SIGNATURE) != base
    assert ranking_hash(settings(**off, graph_rag__hop_penalty=0.3).retrieval, SIGNATURE) == base


def test_a_variant_of_a_report_is_evidence_for_its_own_settings(tmp_path: Path):
    """`ki eval --features` writes, beside the default run, each feature switched: switching the feature on
    keeps hybrid as the default when the variant showed it still beats lexical, and turns it off where not."""
    s = settings()
    augmented = settings(graph_rag_enabled=True)
    floored = settings(semantic_floor_enabled=True, semantic_floor={SIGNATURE: 0.9})
    data = report_json(s)
    data["variants"] = []
    for name, variant_settings, hybrid in (("graph_rag on", augmented, 0.56), ("semantic_floor on", floored, 0.45)):
        binding = binding_for(variant_settings, SIGNATURE, "ab" * 32)
        data["variants"].append({
            "name": name,
            "binding": binding,
            "binding_hash": binding_hash(binding),
            "results": {"lexical": {"ndcg@10": 0.50}, "hybrid": {"ndcg@10": hybrid}},
        })  # fmt: skip
    (tmp_path / "gesetze.json").write_text(json.dumps(signed(data)))
    found = load_reports(str(tmp_path), TRUST)
    assert [r.dataset for r in found] == [
        "gesetze-headings-dev",
        "gesetze-headings-dev (graph_rag on)",
        "gesetze-headings-dev (semantic_floor on)",
    ]
    assert decide(found, s, SIGNATURE).default_mode == "hybrid"
    assert decide(found, augmented, SIGNATURE).reports == ("gesetze-headings-dev (graph_rag on)",)
    assert decide(found, augmented, SIGNATURE).default_mode == "hybrid"
    assert decide(found, floored, SIGNATURE).default_mode == "lexical"  # 0.45 < 0.50
    data["variants"][0]["binding_hash"] = "0" * 16  # edited by hand (and signed again): the whole file is refused
    (tmp_path / "gesetze.json").write_text(json.dumps(signed(data)))
    assert load_reports(str(tmp_path), TRUST) == []


def test_the_shipped_settings_and_reports_make_hybrid_the_default():
    """The committed `ki eval` reports (benchmarks/) must match the shipped ranking settings: otherwise the
    service silently answers keyword-only (a changed ranking default needs its reports re-measured)."""
    shipped = load_settings(environ={})
    assert shipped.embedding.model == "multilingual-e5-small"
    assert shipped.retrieval.mode_gate.reports_dir is None  # the reports shipped in the package
    decision = decide(load_reports(shipped.retrieval.mode_gate.reports_dir, Trust.of(shipped)), shipped, SIGNATURE)
    assert decision.default_mode == "hybrid", decision.reason
    assert {"gesetze-headings-dev", "xquad-de"} <= {name.split(" (")[0] for name in decision.reports}


def self_report(s, decision="lexical", signature=SIGNATURE):
    binding = binding_for(s, signature, "cd" * 32)
    data = {"binding": binding, "binding_hash": binding_hash(binding), "summary": "hybrid -0.210 on 80 queries"}
    return parse_self_report(12, "2026-12-03T09:00:00+00:00", decision, data)


def test_the_deployments_own_report_decides_when_it_matches():
    s = settings()
    committed = reports(s, report_json(s))
    own = self_report(s, "lexical")
    decision = decide(committed, s, SIGNATURE, own)
    assert decision.default_mode == "lexical" and decision.reports == ("self-eval #12 (2026-12-03T09:00:00+00:00)",)
    assert "this deployment's own evaluation, self-eval #12" in decision.reason
    assert decision.reason.endswith("keyword-only") and "-0.210" not in decision.reason  # no corpus figures
    assert decide(committed, s, SIGNATURE, self_report(s, "hybrid")).default_mode == "hybrid"
    # Measured with another embedder or ranking: the committed reports decide again.
    stale = self_report(settings(weight_semantic=0.3), "lexical")
    assert decide(committed, s, SIGNATURE, stale).default_mode == "hybrid"
    assert decide(committed, s, SIGNATURE, self_report(s, "lexical", "other-384")).default_mode == "hybrid"


def test_a_self_report_edited_by_hand_or_without_figures_is_no_evidence():
    s = settings()
    own = self_report(s)
    edited = {**own.binding, "ranking_hash": "0" * 12}
    data = {"binding": edited, "binding_hash": binding_hash(own.binding), "summary": "x"}
    assert parse_self_report(1, "t", "lexical", data) is None
    good = {"binding": own.binding, "binding_hash": binding_hash(own.binding)}
    assert parse_self_report(1, "t", "lexical", good) is None  # no summary
    assert parse_self_report(1, "t", "semantic", {**good, "summary": "x"}) is None  # not a decision it makes


def test_an_operator_pin_overrides_all_evidence_but_not_a_switched_off_leg():
    pinned = settings(default_mode="hybrid")
    decision = decide([], pinned, SIGNATURE, self_report(pinned, "lexical"))
    assert decision.default_mode == "hybrid" and "pinned by the operator" in decision.reason
    assert decide([], settings(default_mode="lexical"), SIGNATURE).default_mode == "lexical"
    off = settings(default_mode="hybrid", weight_semantic=0)
    assert decide([], off, SIGNATURE).default_mode == "lexical"


# -- signed and pinned evidence (ki.evidence_keys) ----------------------------------------------------------------


def _shipped_copy(tmp_path: Path) -> Path:
    """The shipped reports, byte for byte, in a folder of their own."""
    from search.ranking.mode_gate import resolve_dir

    folder = tmp_path / "reports"
    folder.mkdir()
    for name in PINNED_REPORTS:
        (folder / name).write_bytes((resolve_dir(None) / name).read_bytes())
    return folder


def _edit_one_digit(path: Path, field: str) -> None:
    """Change one digit of the first number after `"<field>":` in the file, nothing else."""
    raw = path.read_text(encoding="utf-8")
    at = raw.index(f'"{field}":') + len(f'"{field}":')
    while not raw[at].isdigit():
        at += 1
    at = next(i for i in range(at, at + 12) if raw[i].isdigit() and raw[i] != "0") if raw[at] == "0" else at
    path.write_text(raw[:at] + str((int(raw[at]) + 1) % 10) + raw[at + 1 :], encoding="utf-8")


def test_the_shipped_reports_count_only_as_pinned_a_one_digit_edit_turns_the_gate_to_keyword(tmp_path: Path):
    shipped = load_settings(environ={})
    folder = _shipped_copy(tmp_path)
    assert decide(load_reports(str(folder), Trust()), shipped, SIGNATURE).default_mode == "hybrid"
    for name in PINNED_REPORTS:  # every report edited: one digit of its nDCG@10
        _edit_one_digit(folder / name, "ndcg@10")
    decision = decide(load_reports(str(folder), Trust()), shipped, SIGNATURE)
    assert decision.default_mode == "lexical" and decision.vectors_proven is False


def test_an_unsigned_report_and_one_signed_by_another_key_are_no_evidence(tmp_path: Path):
    s = settings()
    (tmp_path / "unsigned.json").write_text(json.dumps(report_json(s)))
    (tmp_path / "foreign.json").write_text(json.dumps(sign(report_json(s), Ed25519PrivateKey.generate())))
    assert load_reports(str(tmp_path), TRUST) == []
    assert decide(load_reports(str(tmp_path), TRUST), s, SIGNATURE).default_mode == "lexical"
    (tmp_path / "ours.json").write_text(json.dumps(signed(report_json(s))))
    assert [r.path for r in load_reports(str(tmp_path), TRUST)] == [str(tmp_path / "ours.json")]


def test_a_one_digit_edit_of_a_signed_reports_relevance_latency_memory_or_size_is_refused(tmp_path: Path):
    s = settings()
    data = report_json(s)
    data["cost"] = {"latency_ms": {"hybrid": {"p50": 41.5, "p99": 183.2}}, "peak_rss_mb": 712.4,
                    "index": {"bytes": 48_213_004, "rows": 9_413}}  # fmt: skip
    path = tmp_path / "ours.json"
    for field in ("ndcg@10", "p99", "peak_rss_mb", "bytes"):
        path.write_text(json.dumps(signed(data), indent=2))
        assert len(load_reports(str(tmp_path), TRUST)) == 1
        _edit_one_digit(path, field)
        assert load_reports(str(tmp_path), TRUST) == [], field


def test_what_a_report_measured_must_be_within_the_bounds():
    s = settings()
    data = signed({**report_json(s), "cost": {"latency_ms": {"hybrid": {"p99": 180.0}}, "peak_rss_mb": 700.0,
                                              "index": {"bytes": 5_000_000, "rows": 900}}})  # fmt: skip
    assert Trust((KEY.public_key(),), max_p99_ms=200, max_rss_mb=800, max_index_bytes=10**7).refusal(data) is None
    assert "p99 180.0 ms exceeds" in Trust((KEY.public_key(),), max_p99_ms=150).refusal(data)
    assert "peak RSS 700.0 MB exceeds" in Trust((KEY.public_key(),), max_rss_mb=512).refusal(data)
    unmeasured = signed(report_json(s))
    assert "measured no hybrid p99" in Trust((KEY.public_key(),), max_p99_ms=150).refusal(unmeasured)


def test_a_self_eval_report_counts_only_when_signed_by_a_trusted_key():
    s = settings()
    binding = binding_for(s, SIGNATURE, "cd" * 32)
    data = {"binding": binding, "binding_hash": binding_hash(binding), "summary": "hybrid -0.210 on 80 queries"}
    assert parse_self_report(31, "t", "lexical", data, TRUST) is None  # unsigned
    assert parse_self_report(32, "t", "lexical", sign(data, Ed25519PrivateKey.generate()), TRUST) is None
    assert parse_self_report(33, "t", "lexical", signed(data), TRUST) is not None


def test_keys_come_from_files_and_are_never_overwritten(tmp_path: Path):
    private, public = make_keys(tmp_path / "keys")
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    s = load_settings(environ={"KI_RETRIEVAL__MODE_GATE__TRUSTED_KEY_FILES": json.dumps([str(public)])})
    assert len(Trust.of(s).keys) == 1
    with pytest.raises(Exception, match="exists already"):
        make_keys(tmp_path / "keys")

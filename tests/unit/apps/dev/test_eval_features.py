"""`ki eval --features` (apps.dev.eval.features): which runs a feature needs and how a result is judged."""

from __future__ import annotations

from apps.dev.eval.features import (
    FEATURES,
    MAX_DEFAULT_LOSS,
    default_state,
    floor_override,
    markdown_rows,
    switched,
    verdict,
)
from ki.settings import load_settings

SIGNATURE = "multilingual-e5-small-384"


def test_each_feature_is_a_retrieval_switch_and_is_flipped_from_its_default():
    s = load_settings(environ={})
    for feature in FEATURES:
        before = default_state(s, feature)
        assert isinstance(getattr(s.retrieval, feature.setting), bool)
        assert default_state(switched(s, feature), feature) is (not before)
    assert default_state(s, next(f for f in FEATURES if f.name == "identity")) is True


def test_the_floor_run_uses_the_floor_tuned_in_this_run():
    s = load_settings(environ={"KI_RETRIEVAL__SEMANTIC_FLOOR": '{"other-384": 0.1}'})
    assert floor_override(s, SIGNATURE, None) == {}
    assert floor_override(s, SIGNATURE, 0.81) == {"semantic_floor": {"other-384": 0.1, SIGNATURE: 0.81}}


def test_verdict_holds_a_default_on_feature_to_the_loss_bound():
    assert verdict(True, base=0.560, variant=0.560 + MAX_DEFAULT_LOSS - 0.001) == "ok"  # off gains less
    assert "costs 0.0100" in verdict(True, base=0.550, variant=0.560)
    assert verdict(False, base=0.550, variant=0.540) == "off by default; on: -0.0100 nDCG@10"


def test_markdown_rows_show_off_on_and_the_difference():
    rows = markdown_rows("xquad-de", [
        {"feature": "graph_rag", "default_on": False, "ndcg@10_off": 0.9, "ndcg@10_on": 0.91},
        {"feature": "decay", "default_on": False, "ndcg@10_off": None, "ndcg@10_on": None, "unmeasurable": "no dates"},
    ])  # fmt: skip
    assert rows[0] == "| xquad-de | graph_rag | off | 0.9000 | 0.9100 | +0.0100 |"
    assert "not measured: no dates" in rows[1]

"""The train-split choice of one fusion setting over every data set and embedder (apps.dev.eval.fusion_choice)."""

from __future__ import annotations

from apps.dev.eval.fusion_choice import Measured, choose, measured, table


def report(name: str, train: dict[str, float], test: dict[str, tuple[str, float, float]]) -> dict:
    return {
        "dataset": {"name": name},
        "settings": {"embedding_signature": "e5-384"},
        "train": {"results": {k: {"ndcg@10": v} for k, v in train.items()}},
        "results": {
            label: {"ndcg@10": value, "fusion": method, "weights": {"semantic": weight}}
            for label, (method, weight, value) in test.items()
        },
    }


def test_the_setting_that_never_loses_to_its_best_leg_wins_over_a_bigger_average() -> None:
    strong = Measured("a", {"lexical": 0.5, "semantic": 0.6, "hybrid-rrf": 0.70, "hybrid-minmax": 0.66}, {})
    weak = Measured("b", {"lexical": 0.9, "semantic": 0.5, "hybrid-rrf": 0.85, "hybrid-minmax": 0.91}, {})
    label, worst, mean = choose([strong, weak])
    assert label == "hybrid-minmax" and round(worst, 4) == 0.01 and round(mean, 4) == 0.785
    assert "| hybrid-rrf | 0.7000 / – | 0.8500 / – | -0.0500 |" in table([strong, weak])


def test_test_results_are_named_by_their_fusion_and_weight() -> None:
    found = measured(report("x", {"lexical": 0.5, "semantic": 0.4, "hybrid-rrf": 0.6},
                            {"lexical": ("", 1.0, 0.5), "hybrid": ("minmax", 1.0, 0.61),
                             "hybrid-rrf": ("rrf", 1.0, 0.58), "hybrid-tuned": ("rrf", 0.3, 0.7)}))  # fmt: skip
    assert found.test == {"lexical": 0.5, "hybrid-minmax": 0.61, "hybrid-rrf": 0.58}
    assert found.name == "x / e5-384"

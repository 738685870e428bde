"""The answer-gate study's weighted coverages and its grid (apps.dev.eval.gate_study): pure, no services."""

import math

import pytest

from apps.dev.eval.gate_study import local_weight, point, study, weighted_coverage


def test_weighted_coverage_counts_the_best_passage_by_weight():
    words = ("warschau", "einwohner")
    passages = ["Warschau ist die Hauptstadt.", "Die Einwohner von Warschau"]
    heavy = {"warschau": 1.0, "einwohner": 3.0}
    assert weighted_coverage(words, passages, lambda w, _: heavy[w]) == 1.0
    assert weighted_coverage(words, passages[:1], lambda w, _: heavy[w]) == 0.25
    assert weighted_coverage((), passages, lambda w, _: 1.0) is None
    assert weighted_coverage(words, [], lambda w, _: 1.0) == 0.0


def test_local_weight_makes_the_topic_word_light_and_the_missing_one_heavy():
    # Three on-topic passages all hold the topic word; none holds the word the question asks about.
    passages = ["Super Bowl 50 in Santa Clara", "Super Bowl 50 und die Broncos", "Super Bowl 50: Halbzeitshow"]
    words = ("super", "bowl", "nationalhymne")
    assert local_weight("super", [True, True, True]) == pytest.approx(math.log(4 / 3.5))
    assert local_weight("nationalhymne", [False, False, False]) == pytest.approx(math.log(8))
    share = weighted_coverage(words, passages, local_weight)
    assert share is not None and share < 0.15  # plain coverage would say 2/3


def _row(split, kind, similarity, signal, ndcg=None, hits=("d1",)):
    return {"split": split, "kind": kind, "similarity": similarity, "plain": signal, "ndcg@10": ndcg,
            "hits": list(hits), "identifier": False, "reason": None}  # fmt: skip


def test_point_and_study_gate_below_both_bars_and_choose_on_train():
    rows = [
        _row("train", "answerable", 0.90, 0.2, 1.0), _row("train", "answerable", 0.84, 0.8, 1.0),
        _row("train", "removed_answer", 0.84, 0.3), _row("train", "real_word", 0.81, 0.0),
        _row("test", "answerable", 0.83, 0.3, 1.0), _row("test", "answerable", 0.90, 0.9, 0.5),
        _row("test", "removed_answer", 0.85, 0.3), _row("test", "real_word", 0.82, 0.0),
    ]  # fmt: skip
    train = [r for r in rows if r["split"] == "train"]
    assert point(train, "plain", 0.86, 0.5) == (1.0, 1.0)  # the similar answerable one is kept, both others emptied
    assert point(train, "plain", 0.86, 0.9) == (0.5, 1.0)  # its coverage 0.8 is now below the bar too
    result = study(rows, "plain", 0.01)
    assert result["chosen_on_train"]["train_empty"] == 1.0 and result["chosen_on_train"]["train_cost"] == 0.0
    # On test the train choice empties an answerable query that train never showed: its cost is reported.
    assert result["chosen_on_train"]["test_cost"] == 0.5 and result["ceiling_on_test"]["test_cost"] <= 0.01


def test_passage_sentences_split_at_ends_and_lines_and_keep_short_pieces_with_a_neighbour():
    from apps.dev.eval.gate_study import passage_sentences

    text = "§ 573\nDer Vermieter kann kündigen. Nur bei berechtigtem Interesse! Ja.\nWann endet die Frist?"
    # The heading joins the first sentence, the one-word "Ja." joins the next: no piece below three words.
    assert passage_sentences(text) == [
        "§ 573 Der Vermieter kann kündigen.", "Nur bei berechtigtem Interesse!", "Ja. Wann endet die Frist?"
    ]  # fmt: skip
    assert passage_sentences("Kurz.") == ["Kurz."]
    assert passage_sentences("   ") == []


def test_study_uses_the_grid_it_is_given():
    rows = [_row("train", "answerable", 0.84, 0.85, 1.0), _row("train", "removed_answer", 0.84, 0.82),
            _row("test", "answerable", 0.84, 0.85, 1.0), _row("test", "removed_answer", 0.84, 0.81)]  # fmt: skip
    # A cosine grid separates 0.82 from 0.85; the coverage grid's steps of 0.05 from 0.1 cannot (0.85 is on it).
    assert study(rows, "plain", 0.01, (0.83,))["chosen_on_train"]["test_empty"] == 1.0

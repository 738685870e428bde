"""Evidence shaping: the semantic relevance floor and the evidence budget --
pure functions, no services."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ki.settings import SettingsError, load_settings
from search.ranking.budget import fit_budget
from search.ranking.floor import apply_floor, cosine_from_score, floor_empties_answer, floor_for, floor_from_train
from search.ranking.legs import LegHit

SIGNATURE = "multilingual-e5-small-384"


def settings(**retrieval):
    env = {f"KI_RETRIEVAL__{k.upper()}": (v if isinstance(v, str) else json.dumps(v)) for k, v in retrieval.items()}
    return load_settings(environ=env)


def leg_hit(chunk: str, doc: int, score: float = 1.0) -> LegHit:
    return LegHit(chunk, score, {"document_id": str(doc), "document_version_id": str(doc), "project_id": "1"})


# --- relevance floor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("space", "score_of"),
    [
        ("cosinesimil", lambda cos: (1 + cos) / 2),
        ("innerproduct", lambda cos: 1 + cos if cos >= 0 else 1 / (1 - cos)),
        ("l2", lambda cos: 1 / (1 + (2 - 2 * cos))),
    ],
)
@pytest.mark.parametrize("cos", [-0.9, -0.2, 0.0, 0.35, 0.8, 1.0])
def test_cosine_inverts_each_space_types_score(space, score_of, cos):
    assert cosine_from_score(score_of(cos), space) == pytest.approx(cos)


def test_unknown_space_type_has_no_similarity():
    with pytest.raises(ValueError, match="hamming"):
        cosine_from_score(0.5, "hamming")


def test_floor_applies_only_when_on_and_stored_for_the_signature():
    stored = {"semantic_floor": {SIGNATURE: 0.8}}
    assert floor_for(settings(semantic_floor_enabled=False, **stored).retrieval, SIGNATURE) is None  # switched off
    on = settings(semantic_floor_enabled=True, **stored).retrieval
    assert floor_for(on, SIGNATURE) == 0.8
    assert floor_for(on, "all-minilm-l6-v2-384") is None  # another model's cosines are not comparable


def test_floor_must_be_a_cosine():
    with pytest.raises(SettingsError, match="semantic_floor"):
        settings(semantic_floor={SIGNATURE: 1.5})


def test_apply_floor_keeps_rank_order_and_counts_the_dropped():
    hits = [leg_hit("a", 1, (1 + 0.9) / 2), leg_hit("b", 2, (1 + 0.7) / 2), leg_hit("c", 3, (1 + 0.85) / 2)]
    kept, dropped = apply_floor(hits, 0.8, "cosinesimil")
    assert [h.id for h in kept] == ["a", "c"] and dropped == 1
    assert apply_floor(hits, None, "cosinesimil") == (hits, 0)
    assert apply_floor(hits, 0.95, "cosinesimil") == ([], 3)


def test_the_floor_empties_the_answer_only_when_it_dropped_every_semantic_hit_and_no_identifier_matched():
    hits = [leg_hit("c1", 1), leg_hit("c2", 2)]
    lexical = [leg_hit("c3", 3)]
    assert floor_empties_answer({"semantic": hits, "lexical": lexical}, 0)  # words alone are no evidence
    assert not floor_empties_answer({"semantic": hits, "lexical": lexical}, 1)  # one hit reached the floor
    assert not floor_empties_answer({"semantic": hits, "identifier": [leg_hit("c4", 4)]}, 0)  # an identifier matched
    assert not floor_empties_answer({"semantic": [], "lexical": lexical}, 0)  # the leg found nothing to judge
    assert not floor_empties_answer({"lexical": lexical}, 0)  # lexical mode: no semantic leg ran


def test_the_answer_gate_is_off_by_default():
    assert settings().retrieval.semantic_floor_gates_answer is False
    assert settings(semantic_floor_gates_answer=True).retrieval.semantic_floor_gates_answer is True


def test_floor_from_train_keeps_the_share_it_promises():
    values = [i / 1000 for i in range(700, 900)]  # 200 train queries
    floor = floor_from_train(values, 0.99)
    assert floor is not None
    kept = sum(v >= floor for v in values)
    assert kept >= 0.99 * len(values)
    assert floor_from_train([], 0.99) is None
    assert floor_from_train([0.8123], 0.99) == 0.812  # rounded down, so the one query is kept


@given(st.lists(st.floats(min_value=-1, max_value=1), min_size=1, max_size=300), st.floats(0.5, 1.0))
def test_floor_from_train_property(values, keeps):
    floor = floor_from_train(values, keeps)
    assert floor is not None
    assert sum(v >= floor for v in values) >= keeps * len(values) - 1e-9


# --- evidence budget -------------------------------------------------------------------------------


def page(*sizes: int, context: int | None = None) -> list[dict]:
    hits = []
    for n, size in enumerate(sizes):
        hit = {"chunk_id": f"c{n}", "text": "x" * size}
        if context is not None:
            hit["context"] = [{"chunk_id": f"c{n}:after", "position": "after", "text": "y" * context}]
        hits.append(hit)
    return hits


def test_budget_takes_hits_in_rank_order_and_stops_at_the_first_that_does_not_fit():
    kept, use = fit_budget(page(400, 300, 500, 10), 800, offset=20)
    assert [h["chunk_id"] for h in kept] == ["c0", "c1"]  # c3 would fit but may not jump ahead of c2
    assert use.to_json() == {"budget_chars": 800, "used_chars": 700, "hits_dropped": 2, "next_offset": 22}


def test_budget_cuts_a_first_hit_longer_than_the_whole_budget():
    kept, use = fit_budget(page(5000, 10, context=50), 1000)
    assert len(kept) == 1 and len(kept[0]["text"]) == 1000 and kept[0]["text_truncated"] is True
    assert kept[0]["context"] == [] and use.used == 1000 and use.hits_dropped == 1


def test_budget_gives_up_context_before_a_hit():
    kept, use = fit_budget(page(300, 300, context=250), 900)
    assert [h["chunk_id"] for h in kept] == ["c0", "c1"]
    assert [len(h["context"]) for h in kept] == [1, 0]  # the second hit's neighbour did not fit
    assert use.used == 850


@given(st.lists(st.integers(0, 2000), max_size=20), st.integers(1, 5000))
def test_budget_never_exceeds_its_limit(sizes, budget):
    hits = page(*sizes, context=100)
    kept, use = fit_budget(hits, budget)
    total = sum(len(h["text"]) + sum(len(c["text"]) for c in h.get("context", [])) for h in kept)
    assert total == use.used <= budget
    assert [h["chunk_id"] for h in kept] == [h["chunk_id"] for h in hits[: len(kept)]]
    assert bool(kept) == bool(hits)  # evidence never becomes an empty answer

"""Pure parts of `ki bench corpus`: the bench vectors' method and the corpus size in file names."""

from collections.abc import Sequence

import numpy as np
import pytest

from apps.dev.bench.large_corpus import ANCHORS, BankVectors, CorpusError, _refuse_default_home, _size_name
from ki.embedding import EmbedStats
from ki.settings import load_settings


class Model:
    """A deterministic stand-in model with a real model's anisotropy: every vector leans on one direction."""

    dimensions, signature, max_tokens = 32, "stand-in-32", 512

    def __init__(self) -> None:
        self.stats = EmbedStats()
        self.embedded: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded += texts
        out = []
        for text in texts:
            v = np.random.default_rng(abs(hash(text)) % 2**32).normal(size=self.dimensions)
            v[0] += 6.0
            out.append((v / np.linalg.norm(v)).tolist())
        return out

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed(texts)


def test_bank_vectors_embed_anchors_and_a_sample_and_perturb_the_rest_to_the_target_cosine() -> None:
    model = Model()
    vectors = BankVectors(model, fraction=0.1, cosine=0.9, seed=3)  # type: ignore[arg-type]
    warm_up = vectors.embed([f"Anker {n}" for n in range(ANCHORS)])
    assert len(vectors.anchors) == ANCHORS and vectors.perturbed_texts == 0 and len(warm_up) == ANCHORS
    texts = [f"Absatz {n} über die Miete" for n in range(4000)]
    out = np.asarray(vectors.embed(texts))
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert vectors.signature == model.signature and vectors.max_tokens == model.max_tokens
    # After the anchors the model sees about a tenth of the inputs, chosen by hash.
    assert 0.07 * len(texts) < len(model.embedded) - ANCHORS == vectors.real_texts - ANCHORS < 0.13 * len(texts)
    assert vectors.real_texts + vectors.perturbed_texts == len(texts) + ANCHORS
    assert abs(np.mean(vectors.cosines) - 0.9) < 0.01
    # Perturbed vectors stay in the model's cone: the same component along the anchors' mean direction.
    anchors = np.asarray(vectors.anchors)
    centre = anchors.mean(axis=0) / np.linalg.norm(anchors.mean(axis=0))
    assert abs(float(np.mean(out @ centre)) - float(np.mean(anchors @ centre))) < 0.02
    # The same input always gets the same vector, whichever call it comes in.
    again = np.asarray(vectors.embed([texts[5], texts[3999]]))
    assert np.allclose(again, out[[5, 3999]], atol=1e-6)
    assert vectors.method()["anchors"] == ANCHORS


def test_corpus_sizes_in_file_names_are_rounded_to_one_digit() -> None:
    assert [_size_name(n) for n in (101_234, 98_000, 1_020_000, 6_400)] == ["100k", "100k", "1m", "6k"]


def test_the_corpus_is_never_built_into_the_default_stack() -> None:
    with pytest.raises(CorpusError, match="stack of its own"):
        _refuse_default_home(load_settings(environ={}))
    _refuse_default_home(load_settings(environ={"KI_STACK__HOME": "/tmp/ki-bench-100k"}))

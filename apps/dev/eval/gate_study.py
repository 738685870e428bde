"""How far can the answer gate's lexical signal go? A study over `ki eval --categories` side files
(`<out>/<data set>-gate-readings.jsonl`: each query of the coverage gate's curve with its reading and the first hits'
texts), for issue 50's unanswerable-query goal.

Each variant recomputes the coverage of every answer from the same texts and crosses it with the API's similarity
over the grid of `BARS` x `MINS`: a gated answerable query scores 0, a gated unanswerable one counts as empty (as
`eval.negatives.coverage_point` decides). Per variant and data set it prints

* **chosen on train**: the train point with the largest empty share within `--max-cost` nDCG@10 of the ungated train
  run, and its figures on test (what a deployment choosing on its own labelled queries would get);
* **ceiling on test**: the largest test empty share within the cost on test itself (chosen with the answers known:
  an upper bound of the variant, not a result).

Variants: `plain` (the shipped `search.ranking.coverage.coverage`), `rarity` (each content word weighted by its
surprisal under the XLM-R unigram model the default embedder's tokenizer ships: -sum of its pieces' log
probabilities, so "Nationalhymne" weighs more than "wurde"), `local` (each word weighted by how few of the first
hits hold it: log((n + 1) / (df + 0.5)), so the question's topic words, which every on-topic passage holds, weigh
little and its specific words a lot; read from the visible hits only); with `--sentences` also `sentence` (not a
coverage: the best cosine between the question and one sentence of the first hits, with the default embedder, over a
grid of cosines), which loads the model and embeds each distinct sentence once.

    python -m apps.dev.eval.gate_study [--sentences] build/eval-gate/*/*-gate-readings.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from search.ranking import coverage as cov

BARS: tuple[float, ...] = (0.8, 0.82, 0.83, 0.84, 0.845, 0.85, 0.855, 0.86, 0.865, 0.87, 0.88, 0.9, 1.0)
MINS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(2, 21))
# The sentence similarity is a cosine: its minimums lie where e5's cosines do.
SENTENCE_MINS: tuple[float, ...] = tuple(round(0.78 + 0.005 * i, 3) for i in range(0, 31))
Weight = Callable[[str, Sequence[bool]], float]  # a content word, whether each passage holds it -> its weight


def weighted_coverage(words: Sequence[str], passages: Sequence[str], weight: Weight) -> float | None:
    """The largest weighted share of `words` one passage holds; None without words or weight, 0.0 without passages."""
    if not words:
        return None
    if not passages:
        return 0.0
    folded = [(text, frozenset(cov._WORD.findall(text))) for text in map(cov.fold, passages)]
    held = [[cov._found(w, text, tokens) for text, tokens in folded] for w in words]
    weights = [weight(w, h) for w, h in zip(words, held, strict=True)]
    total = sum(weights)
    if total <= 0:
        return None
    return max(sum(wt for wt, h in zip(weights, held, strict=True) if h[j]) / total for j in range(len(folded)))


def local_weight(word: str, held: Sequence[bool]) -> float:
    """Rare among the first hits weighs most: log((n + 1) / (df + 0.5))."""
    return math.log((len(held) + 1) / (sum(held) + 0.5))


@lru_cache(maxsize=1)
def _unigram() -> tuple[Any, list[tuple[str, float]]]:
    from tokenizers import Tokenizer

    from ki.embedding.local import _package_file, resolve_local_model

    spec = resolve_local_model("multilingual-e5-small")
    path = _package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)
    vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    return Tokenizer.from_file(str(path)), vocab


@lru_cache(maxsize=100_000)
def surprisal(word: str) -> float:
    """-log P(word) under the tokenizer's unigram model: the sum of its pieces' negative log probabilities."""
    tokenizer, vocab = _unigram()
    return -sum(vocab[i][1] for i in tokenizer.encode(word, add_special_tokens=False).ids)


# A sentence ends at . ! ? or ; before whitespace, or at a line break (headings, list items).
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
MIN_SENTENCE_WORDS = 3


def passage_sentences(text: str) -> list[str]:
    """The passage's sentences; a piece shorter than MIN_SENTENCE_WORDS words joins the next (or the last) one."""
    out: list[str] = []
    carry = ""
    for piece in _SENTENCE_END.split(text):
        piece = f"{carry} {piece.strip()}".strip()
        if len(piece.split()) < MIN_SENTENCE_WORDS:
            carry = piece
            continue
        out.append(piece)
        carry = ""
    if carry:
        out[-1:] = [f"{out[-1]} {carry}"] if out else [carry]
    return out


class SentenceSimilarity:
    """The best cosine between the question and one sentence of the first hits (the default embedder, `query: ` and
    `passage: ` prefixes): a passage that is on topic but lacks the asked-for fact has no sentence close to the
    question, while the passage holding the answer usually has one."""

    def __init__(self) -> None:
        from ki.embedding import create_embedder
        from ki.settings import load_settings

        self.embedder = create_embedder(load_settings())
        self.cache: dict[str, np.ndarray] = {}

    def vectors(self, sentences: Sequence[str]) -> np.ndarray:
        missing = sorted({s for s in sentences if s not in self.cache})
        for start in range(0, len(missing), 64):
            batch = missing[start : start + 64]
            for text, vec in zip(batch, self.embedder.embed(batch), strict=True):
                self.cache[text] = np.asarray(vec, dtype=np.float32)
        return np.stack([self.cache[s] for s in sentences])

    def __call__(self, query: str, texts: Sequence[str]) -> float | None:
        sentences = [s for t in texts for s in passage_sentences(t)]
        if not sentences:
            return None
        q = np.asarray(self.embedder.embed_queries([query])[0], dtype=np.float32)
        return float(np.max(self.vectors(sentences) @ q))


VARIANTS: dict[str, Callable[[str, Sequence[str]], float | None]] = {
    "plain": lambda query, texts: cov.coverage(cov.content_words(query), texts),
    "rarity": lambda query, texts: weighted_coverage(cov.content_words(query), texts, lambda w, _: surprisal(w)),
    "local": lambda query, texts: weighted_coverage(cov.content_words(query), texts, local_weight),
}


def point(rows: Sequence[dict[str, Any]], signal: str, bar: float, minimum: float) -> tuple[float, float]:
    """(nDCG@10 of the answerable rows, empty share of the unanswerable ones) with the gate at (bar, minimum)."""

    def gated(r: dict[str, Any]) -> bool:
        value = r[signal]
        eligible = bool(r["hits"]) and not r["identifier"] and r["similarity"] is not None and value is not None
        return eligible and r["similarity"] < bar and value < minimum

    answerable = [r for r in rows if r["kind"] == "answerable"]
    unanswerable = [r for r in rows if r["kind"] != "answerable"]
    ndcg = sum(0.0 if gated(r) else r["ndcg@10"] for r in answerable) / max(len(answerable), 1)
    empty = [gated(r) or (not r["hits"] and r["reason"] == "no_credible_evidence") for r in unanswerable]
    return ndcg, sum(empty) / max(len(empty), 1)


def study(rows: Sequence[dict[str, Any]], signal: str, max_cost: float, mins: Sequence[float] = MINS) -> dict[str, Any]:
    """The train choice and the test ceiling of one variant over one data set's readings."""
    split = {s: [r for r in rows if r["split"] == s] for s in ("train", "test")}
    base = {s: sum(r["ndcg@10"] for r in rs if r["kind"] == "answerable")
               / max(sum(1 for r in rs if r["kind"] == "answerable"), 1) for s, rs in split.items()}  # fmt: skip
    grid = [(b, m, {s: point(split[s], signal, b, m) for s in split}) for b in BARS for m in mins]

    def best(on: str) -> tuple[float, float, dict[str, tuple[float, float]]]:
        within = [g for g in grid if base[on] - g[2][on][0] <= max_cost + 1e-12]
        return max(within, key=lambda g: (g[2][on][1], g[2][on][0]))

    chosen, ceiling = best("train"), best("test")
    return {
        "chosen_on_train": {"threshold": [chosen[0], chosen[1]], "train_empty": round(chosen[2]["train"][1], 4),
                            "train_cost": round(base["train"] - chosen[2]["train"][0], 4),
                            "test_empty": round(chosen[2]["test"][1], 4),
                            "test_cost": round(base["test"] - chosen[2]["test"][0], 4)},
        "ceiling_on_test": {"threshold": [ceiling[0], ceiling[1]], "test_empty": round(ceiling[2]["test"][1], 4),
                            "test_cost": round(base["test"] - ceiling[2]["test"][0], 4)},
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apps.dev.eval.gate_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("readings", nargs="+", help="<data set>-gate-readings.jsonl files of `ki eval --categories`")
    parser.add_argument("--max-cost", type=float, default=0.01, help="nDCG@10 the gate may cost (default 0.01)")
    parser.add_argument("--out", help="also write the figures as JSON here")
    parser.add_argument(
        "--sentences",
        action="store_true",
        help="also the sentence similarity (loads the default embedder and embeds the hits' sentences)",
    )
    args = parser.parse_args(argv)
    variants = dict(VARIANTS)
    if args.sentences:
        variants["sentence"] = SentenceSimilarity()
    grids = {v: SENTENCE_MINS if v == "sentence" else MINS for v in variants}
    report: dict[str, Any] = {"max_cost": args.max_cost, "bars": list(BARS), "min_coverages": list(MINS), "sets": {}}
    for path in map(Path, args.readings):
        name = path.name.removesuffix("-gate-readings.jsonl")
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        for r in rows:
            for variant, signal in variants.items():
                r[variant] = signal(r["query"], r["texts"])
        counts = {s: {k: sum(1 for r in rows if r["split"] == s and (r["kind"] == "answerable") == (k == "answerable"))
                      for k in ("answerable", "unanswerable")} for s in ("train", "test")}  # fmt: skip
        report["sets"][name] = {"queries": counts, **{v: study(rows, v, args.max_cost, grids[v]) for v in variants}}
        for variant in variants:
            c, t = report["sets"][name][variant]["chosen_on_train"], report["sets"][name][variant]["ceiling_on_test"]
            print(f"{name:24s} {variant:7s} train choice {c['threshold']}: train {c['train_empty']:.2f} "
                  f"(cost {c['train_cost']:.4f}), test {c['test_empty']:.2f} (cost {c['test_cost']:.4f}) | "
                  f"ceiling on test {t['test_empty']:.2f} at {t['threshold']} (cost {t['test_cost']:.4f})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

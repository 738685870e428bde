"""A deterministic subsample of a BEIR folder, for `ki eval` runs that must stay small on a shared machine (issue 50,
item 3: the per-category and unanswerable figures of SciFact and gesetze-headings-dev).

`choose(...)` (pure) takes `test` and `train` judged queries (seeded sample of each split), every document they judge,
and `distractors` further documents (seeded sample of the rest). The folder `write` makes holds `corpus.jsonl`,
`queries.jsonl` (the chosen queries with their metadata), `qrels/test.tsv`, `qrels/train.tsv` and a README naming
the source, the seed and the sizes. A subsample ranks far fewer documents, so it is an easier task than the full set:
compare its figures with each other, not with the full set's.

    python -m apps.dev.eval.subsample --data ../shared/data/scifact --out build/subsets/scifact \\
        --test 100 --train 100 --distractors 200 --language en
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apps.dev.eval import beir

SEED = 50


@dataclass(frozen=True)
class Subsample:
    test: dict[str, dict[str, int]]
    train: dict[str, dict[str, int]]
    doc_ids: list[str]  # in corpus order


def _sample(qrels: Mapping[str, Mapping[str, int]], count: int, rng: random.Random) -> dict[str, dict[str, int]]:
    judged = sorted(qid for qid, j in qrels.items() if any(g > 0 for g in j.values()))
    return {qid: dict(qrels[qid]) for qid in sorted(rng.sample(judged, min(count, len(judged))))}


def choose(
    corpus_ids: Sequence[str],
    test: Mapping[str, Mapping[str, int]],
    train: Mapping[str, Mapping[str, int]],
    *,
    n_test: int,
    n_train: int,
    distractors: int,
    seed: int = SEED,
) -> Subsample:
    """The sampled queries of each split, their judged documents and `distractors` other documents."""
    rng = random.Random(seed)
    chosen_test, chosen_train = _sample(test, n_test, rng), _sample(train, n_train, rng)
    known = set(corpus_ids)
    judged = {d for qrels in (chosen_test, chosen_train) for j in qrels.values() for d in j if d in known}
    rest = sorted(known - judged)
    keep = judged | set(rng.sample(rest, min(distractors, len(rest))))
    return Subsample(chosen_test, chosen_train, [d for d in corpus_ids if d in keep])


def _qrels_tsv(qrels: Mapping[str, Mapping[str, int]]) -> str:
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, j in qrels.items() for d, g in j.items()]
    return "\r\n".join(lines) + "\r\n"


def write(source: Path, out: Path, sample: Subsample, language: str) -> None:
    corpus = {d.id: d for d in beir.load_corpus(source)}
    wanted = set(sample.test) | set(sample.train)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for doc_id in sample.doc_ids:
            doc = corpus[doc_id]
            handle.write(json.dumps({"_id": doc.id, "title": doc.title, "text": doc.text}, ensure_ascii=False) + "\n")
    lines = (source / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["_id"] in wanted]
    (out / "queries.jsonl").write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    (out / "qrels" / "test.tsv").write_text(_qrels_tsv(sample.test), encoding="utf-8", newline="")
    (out / "qrels" / "train.tsv").write_text(_qrels_tsv(sample.train), encoding="utf-8", newline="")
    (out / "README.md").write_text(
        f"# Subsample of {source.name}\n\nlanguage: {language}\n\nMade by `apps/dev/eval/subsample.py` (seed {SEED}) "
        f"from `{source}`: {len(sample.test)} test and {len(sample.train)} train queries, every document they judge "
        f"and further distractors, {len(sample.doc_ids)} documents in all. An easier task than the full set.\n",
        encoding="utf-8",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a deterministic subsample of a BEIR folder")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--distractors", type=int, default=200)
    parser.add_argument("--language", required=True)
    args = parser.parse_args(argv)
    corpus_ids = [d.id for d in beir.load_corpus(args.data)]
    test = beir.load_qrels(args.data / "qrels" / "test.tsv")
    train = beir.load_qrels(args.data / "qrels" / "train.tsv")
    sample = choose(corpus_ids, test, train, n_test=args.test, n_train=args.train, distractors=args.distractors)
    write(args.data, args.out, sample, args.language)
    print(f"{args.out}: {len(sample.test)} test, {len(sample.train)} train queries, {len(sample.doc_ids)} documents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

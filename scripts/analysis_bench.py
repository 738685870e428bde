"""Lexical-only comparison of text-analysis chains on German BEIR-layout sets (train splits).

For each candidate `text_analysis` definition (see CANDIDATES, or --candidates FILE with the same
shape) the corpus (title + text, no vectors) is bulk-indexed into a temporary index on the
OpenSearch of the current settings ($KI_CONFIG), queried with BM25 `multi_match`, and scored with
nDCG@10 (`apps.dev.eval.metrics`). Temporary indices (`ki-analysis-bench-*`) are deleted afterwards.

  KI_CONFIG=... python scripts/analysis_bench.py /work/shared/data/gesetze-headings-dev:1500 \
      /work/shared/data/xquad-de
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch, helpers

from apps.dev.eval.metrics import ndcg_at_k
from ki.clients import make_sync_client
from ki.settings import load_settings

STOP = {"type": "stop", "stopwords": "_german_"}
LIGHT = {"type": "stemmer", "language": "light_german"}
MINIMAL = {"type": "stemmer", "language": "minimal_german"}
SNOWBALL2 = {"type": "snowball", "language": "German2"}
SNOWBALL1 = {"type": "snowball", "language": "German"}
WDG = {
    "type": "word_delimiter_graph",
    "catenate_words": True,
    "preserve_original": False,
    "split_on_case_change": False,
    "split_on_numerics": False,
    "stem_english_possessive": False,
}


def custom(tokenizer: str, *filters: str, char_filter: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "custom",
        "tokenizer": tokenizer,
        "filter": list(filters),
        **({"char_filter": char_filter} if char_filter else {}),
    }


FILTERS = {
    "de_stop": STOP,
    "de_light": LIGHT,
    "de_minimal": MINIMAL,
    "de_snowball2": SNOWBALL2,
    "de_snowball": SNOWBALL1,
    "de_wdg": WDG,
}

CANDIDATES: dict[str, dict[str, Any]] = {
    "german (built-in)": {},
    "std+lc+stop+norm+light": {"a": custom("standard", "lowercase", "de_stop", "german_normalization", "de_light")},
    "std+lc+stop+norm+minimal": {"a": custom("standard", "lowercase", "de_stop", "german_normalization", "de_minimal")},
    "std+lc+stop+snowball(German2)": {"a": custom("standard", "lowercase", "de_stop", "de_snowball2")},
    "std+lc+stop+norm+snowball(German2)": {
        "a": custom("standard", "lowercase", "de_stop", "german_normalization", "de_snowball2")
    },
    "std+icu_normalizer+stop+norm+light": {
        "a": custom("standard", "icu_normalizer", "de_stop", "german_normalization", "de_light")
    },
    "std+icu_folding+stop+light": {"a": custom("standard", "icu_folding", "de_stop", "de_light")},
    "std+lc+stop+light+icu_folding": {"a": custom("standard", "lowercase", "de_stop", "de_light", "icu_folding")},
    "icu_tok+icu_normalizer+stop+norm+light": {
        "a": custom("icu_tokenizer", "icu_normalizer", "de_stop", "german_normalization", "de_light")
    },
    "ws+wdg(catenate)+lc+stop+norm+light": {
        "a": custom("whitespace", "de_wdg", "flatten_graph", "lowercase", "de_stop", "german_normalization", "de_light")
    },
    "std+lc+stop+snowball(German)": {"a": custom("standard", "lowercase", "de_stop", "de_snowball")},
    "std+icu_normalizer+stop+snowball(German2)": {"a": custom("standard", "icu_normalizer", "de_stop", "de_snowball2")},
    "std+icu_folding+stop+snowball(German2)": {"a": custom("standard", "icu_folding", "de_stop", "de_snowball2")},
    "std+lc+stop+snowball(German2)+icu_folding": {
        "a": custom("standard", "lowercase", "de_stop", "de_snowball2", "icu_folding")
    },
    "ws+wdg(catenate)+lc+stop+snowball(German2)": {
        "a": custom("whitespace", "de_wdg", "flatten_graph", "lowercase", "de_stop", "de_snowball2")
    },
    "std+lc+norm+light (no stopwords)": {"a": custom("standard", "lowercase", "german_normalization", "de_light")},
}


def analysis_for(analyzers: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if not analyzers:
        return "german", {}
    used = {ref for a in analyzers.values() for ref in a.get("filter", [])}
    return "a", {"analyzer": analyzers, "filter": {k: v for k, v in FILTERS.items() if k in used}}


def load(root: Path, limit: int | None, seed: int) -> tuple[list[dict[str, str]], dict[str, str], dict[str, str]]:
    nfc = lambda s: unicodedata.normalize("NFC", s)  # noqa: E731 - the API side normalises to NFC too
    corpus = []
    for part in sorted((root / "derived").glob("corpus.part*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            corpus.append({"_id": doc["_id"], "title": nfc(doc.get("title", "")), "text": nfc(doc["text"])})
    queries = {}
    for line in (root / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        queries[q["_id"]] = nfc(q["text"].strip())
    qrels: dict[str, str] = {}
    for line in (root / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.strip().split("\t")
        if int(score) > 0:
            qrels[qid] = did
    qids = sorted(qrels)
    if limit and len(qids) > limit:
        qids = sorted(random.Random(seed).sample(qids, limit))
    return corpus, {q: queries[q] for q in qids}, {q: qrels[q] for q in qids}


def run(client: OpenSearch, name: str, analyzer: str, analysis: dict[str, Any], data: Any) -> float:
    corpus, queries, qrels = data
    index = f"ki-analysis-bench-{name}"
    client.indices.delete(index=index, ignore=[404])
    settings: dict[str, Any] = {"number_of_shards": 1, "number_of_replicas": 0, "refresh_interval": "-1"}
    if analysis:
        settings["analysis"] = analysis
    field = {"type": "text", "analyzer": analyzer}
    client.indices.create(
        index=index,
        body={
            "settings": {"index": settings},
            "mappings": {"dynamic": False, "properties": {"title": field, "text": field}},
        },
    )
    try:
        actions = ({"_index": index, "_id": d["_id"], "title": d["title"], "text": d["text"]} for d in corpus)
        helpers.bulk(client, actions, chunk_size=1000, request_timeout=300)
        client.indices.refresh(index=index)
        qids = list(queries)
        scores = []
        for start in range(0, len(qids), 100):
            part = qids[start : start + 100]
            body: list[dict[str, Any]] = []
            for qid in part:
                body += [
                    {},
                    {
                        "size": 10,
                        "_source": False,
                        "query": {"multi_match": {"query": queries[qid], "fields": ["title", "text"]}},
                    },
                ]
            answers = client.msearch(index=index, body=body, request_timeout=300)["responses"]
            for qid, answer in zip(part, answers, strict=True):
                ranked = [hit["_id"] for hit in answer["hits"]["hits"]]
                scores.append(ndcg_at_k(ranked, {qrels[qid]: 1}, 10))
        return sum(scores) / len(scores)
    finally:
        client.indices.delete(index=index, ignore=[404])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sets", nargs="+", help="BEIR-layout directory, optionally :N to sample N train queries")
    parser.add_argument("--only", nargs="*", help="candidate names to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = load_settings()
    client = make_sync_client(settings, timeout_s=300)
    datasets = {}
    for spec in args.sets:
        path, _, limit = spec.partition(":")
        datasets[Path(path).name] = load(Path(path), int(limit) if limit else None, args.seed)
    names = args.only or list(CANDIDATES)
    print("| chain | " + " | ".join(f"{k} (n={len(v[1])})" for k, v in datasets.items()) + " | mean |")
    print("|---|" + "---|" * (len(datasets) + 1))
    for i, cand in enumerate(names):
        analyzer, analysis = analysis_for(CANDIDATES[cand])
        row = []
        for ds, data in datasets.items():
            started = time.monotonic()
            row.append(run(client, f"{i}-{ds}".lower(), analyzer, analysis, data))
            print(f"  {cand} on {ds}: {row[-1]:.4f} ({time.monotonic() - started:.0f}s)", file=sys.stderr)
        print(f"| {cand} | " + " | ".join(f"{v:.4f}" for v in row) + f" | {sum(row) / len(row):.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

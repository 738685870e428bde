"""`ki eval --identity-reach`: which test queries of a data set the identity preflight would act on.

The preflight changes a ranked answer only when a query names exactly one document (that document is put
first); `ambiguous` and `none` leave the ranking as it is. So counting, per data set, the test queries
that name a unique document -- and whether that document is a relevant one -- bounds the preflight's
effect on nDCG@10 exactly, without loading or embedding the corpus: zero such queries means the figures
with the preflight on equal those with it off. The eval loader writes titles and no identifiers, so
only titles can be named; every document counts as visible (the eval principal sees all of them).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from apps.dev.eval import beir
from ki.settings import Settings
from search.names.keys import NamedDocument, identity_key, name_grams, resolve


def identity_reach(root: Path, settings: Settings) -> dict[str, Any]:
    r = settings.retrieval
    corpus = beir.load_corpus(root)
    queries = beir.load_queries(root)
    qrels = beir.load_qrels(root / "qrels" / "test.tsv")
    ids = {doc.id: n for n, doc in enumerate(corpus, start=1)}
    by_key: dict[str, list[int]] = {}
    for doc in corpus:
        key = identity_key(doc.title)
        if key:
            by_key.setdefault(key, []).append(ids[doc.id])
    outcomes: Counter[str] = Counter()
    unique_relevant = 0
    examples: list[dict[str, Any]] = []
    for qid in sorted(qrels):
        titles, _ = name_grams(
            queries.get(qid, ""),
            max_title_tokens=r.name_lookup.max_title_tokens,
            min_title_tokens=r.name_lookup.min_title_tokens,
            max_identifier_tokens=r.name_lookup.max_identifier_tokens,
        )
        named = [NamedDocument(doc, 1, "", "title", gram) for gram in titles for doc in by_key.get(gram, [])]
        identity = resolve(named, r.name_lookup.max_candidates)
        outcomes[identity.outcome] += 1
        if identity.unique is not None:
            relevant = {ids[d] for d in qrels[qid] if d in ids and qrels[qid][d] > 0}
            unique_relevant += identity.unique.document_id in relevant
            if len(examples) < 10:
                examples.append({"query_id": qid, "matched": identity.unique.key})
    return {
        "data_set": root.resolve().name,
        "test_queries": len(qrels),
        "documents": len(corpus),
        "distinct_title_keys": len(by_key),
        "outcomes": dict(sorted(outcomes.items())),
        "unique_and_relevant": unique_relevant,
        "unique_examples": examples,
        "settings": {
            "name_lookup_max_candidates": r.name_lookup.max_candidates,
            "name_lookup_max_title_tokens": r.name_lookup.max_title_tokens,
            "name_lookup_min_title_tokens": r.name_lookup.min_title_tokens,
        },
    }


def write_reach(root: Path, settings: Settings, out: Path) -> dict[str, Any]:
    report = identity_reach(root, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report

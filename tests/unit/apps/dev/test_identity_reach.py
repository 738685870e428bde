"""`ki eval --identity-reach`: counting the test queries the identity preflight would act on."""

from __future__ import annotations

import json
from pathlib import Path

from apps.dev.eval.identity_reach import identity_reach
from ki.settings import Settings


def _dataset(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "§ 573 BGB", "text": "Der Vermieter kann kündigen."},
        {"_id": "d2", "title": "Anxiety", "text": "About anxiety."},
        {"_id": "d3", "title": "Nikola Tesla", "text": "Tesla lebte in New York."},
        {"_id": "d4", "title": "Nikola Tesla", "text": "Tesla starb 1943."},
    ]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus) + "\n", encoding="utf-8")
    queries = [
        {"_id": "q1", "text": "Was regelt § 573 BGB?"},  # names d1 (two tokens), relevant
        {"_id": "q2", "text": "anxiety and pollution"},  # a one-word title inside a query: not a name
        {"_id": "q3", "text": "Wann starb Nikola Tesla?"},  # two documents carry the title
        {"_id": "q4", "text": "§573 BGB"},  # names d1, but d4 is the relevant one
    ]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n", encoding="utf-8")
    qrels = "query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq2\td2\t1\r\nq3\td4\t1\r\nq4\td4\t1\r\n"
    (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return root


def test_counts_outcomes_and_relevance(tmp_path: Path) -> None:
    report = identity_reach(_dataset(tmp_path / "tiny"), Settings())
    assert report["test_queries"] == 4
    assert report["outcomes"] == {"ambiguous": 1, "none": 1, "unique": 2}
    assert report["unique_and_relevant"] == 1
    assert [e["query_id"] for e in report["unique_examples"]] == ["q1", "q4"]

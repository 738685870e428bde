#!/usr/bin/env python3
"""How many queries of each dev set the query's own words change the plan of (search.plan): `as_of`, a
comparison, or the text the legs search. Unchanged plans answer exactly as with `retrieval.query_words_enabled`
false, so this count bounds the dev sets' quality change from parsing. Writes benchmarks/query-words-dev-sets.json.

    .venv/bin/python scripts/query-words-effect.py [../shared/data]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ki.settings import RetrievalSettings
from search.plan import plan_query
from search.ranking.mode_gate import GateDecision
from search.request import SearchRequest

SETS = ("gesetze-headings-dev", "xquad-de", "scifact")


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent.parent / "shared" / "data")
    on, off = RetrievalSettings(), RetrievalSettings(query_words_enabled=False)
    gate = GateDecision("lexical", "a fixed gate: the mode does not matter here")
    figures: dict[str, dict[str, object]] = {}
    for name in SETS:
        queries = [json.loads(line)["text"] for line in (root / name / "queries.jsonl").open(encoding="utf-8")]
        changed, read = [], 0
        for text in queries:
            request = SearchRequest(query=text)
            plan, plain = plan_query(request, on, gate, None), plan_query(request, off, gate, None)
            read += bool(plan.words and plan.words.spans)
            if (plan.as_of, plan.compare_with, plan.expansion) != (None, None, plain.expansion):
                changed.append(text)
        figures[name] = {"queries": len(queries), "with_parsed_words": read, "plans_changed": len(changed),
                         "changed": changed}  # fmt: skip
        print(f"{name}: {len(queries)} queries, {read} with parsed words, {len(changed)} plans changed")
    out = Path(__file__).resolve().parent.parent / "benchmarks" / "query-words-dev-sets.json"
    out.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

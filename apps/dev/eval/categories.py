"""Question categories of `ki eval --categories` (issue 50, item 3): which kind of query each test query is, and the
metrics per kind. Pure: no I/O.

The rule (`assign_category`), first that applies:

1. `identifier`: the query names a statute provision ("§ 573 BGB", "Art. 20 GG"), a court file number or an ECLI,
   as the search service itself reads them (`search.query_words.parse_query`: `provisions` or `identifiers`).
2. `exact_title`: the data set says the query is a document's heading (its query metadata has a `section`, as in
   gesetze-headings-dev, whose queries are the official headings of the sections), or the query equals a loaded
   document's title (casefolded, whitespace collapsed).
3. `question`: the query ends with "?" or begins with an interrogative word (German or English).
4. `concept`: everything else (keyword phrases, statements such as SciFact's claims).

A data set may also name the category itself: query metadata `category` with one of CATEGORIES wins over the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from apps.dev.eval.metrics import METRICS, Qrels, Run, evaluate
from search.query_words import parse_query

CATEGORIES: tuple[str, ...] = ("identifier", "exact_title", "question", "concept")

_QUESTION_WORDS = (
    # German interrogatives (with the prepositional forms a question starts with)
    "wer wen wem wessen was wann wo woher wohin warum weshalb weswegen wieso wie welche welcher welches "
    "welchen welchem womit wofür wovon worauf woran worin worüber wodurch wozu inwiefern inwieweit "
    "ist sind kann können darf dürfen muss müssen gibt hat haben wird werden "
    # English
    "who whom whose what when where why which how is are can could does do did may must should will would"
)
QUESTION_WORDS = frozenset(_QUESTION_WORDS.split())


def normalise_title(text: str) -> str:
    return " ".join(text.casefold().split())


def assign_category(query: str, metadata: Mapping[str, Any] | None, titles: frozenset[str]) -> str:
    """The query's category by the module's rule; `titles` are the loaded documents' titles (`normalise_title`)."""
    declared = (metadata or {}).get("category")
    if isinstance(declared, str) and declared in CATEGORIES:
        return declared
    parsed = parse_query(query)
    if parsed.provisions or parsed.identifiers:
        return "identifier"
    if (metadata or {}).get("section") or normalise_title(query) in titles:
        return "exact_title"
    stripped = query.strip()
    words = re.findall(r"\w+", stripped.casefold())
    if stripped.endswith("?") or (words and words[0] in QUESTION_WORDS):
        return "question"
    return "concept"


def assign_all(
    queries: Mapping[str, str], metadata: Mapping[str, Mapping[str, Any]], titles: Iterable[str]
) -> dict[str, str]:
    """Query id -> category for each query of `queries`."""
    known = frozenset(normalise_title(t) for t in titles if t)
    return {qid: assign_category(text, metadata.get(qid), known) for qid, text in queries.items()}


def per_category(run: Run, qrels: Qrels, categories: Mapping[str, str]) -> dict[str, dict[str, float | int]]:
    """nDCG@10, MRR@10 and recall@100 per category over the judged queries, with each category's query count
    (a category without queries is listed with count 0 and no figures)."""
    out: dict[str, dict[str, float | int]] = {}
    for category in CATEGORIES:
        judged = {
            qid: j for qid, j in qrels.items() if categories.get(qid) == category and any(g > 0 for g in j.values())
        }
        if not judged:
            out[category] = {"queries": 0}
            continue
        scores = evaluate({qid: run.get(qid, ()) for qid in judged}, judged)
        out[category] = {"queries": len(judged), **{m: round(scores[m], 4) for m in METRICS}}
    return out


def category_counts(categories: Mapping[str, str]) -> dict[str, int]:
    return {c: sum(1 for v in categories.values() if v == c) for c in CATEGORIES}


def markdown_rows(name: str, record: Mapping[str, Any]) -> list[str]:
    """BENCHMARKS.md rows of a report's `categories`: `| data set | category | queries | mode: nDCG@10 / MRR@10 /
    recall@100 ... |`, one row per category (and the derived identifier queries)."""
    modes = [m for m in ("lexical", "semantic", "hybrid") if m in record["results"]]

    def cell(figures: Mapping[str, Any]) -> str:
        if not figures.get("queries", 1) or "ndcg@10" not in figures:
            return "–"
        return f"{figures['ndcg@10']:.3f} / {figures['mrr@10']:.3f} / {figures['recall@100']:.3f}"

    rows = []
    for category in CATEGORIES:
        count = record["counts"].get(category, 0)
        cells = " | ".join(cell(record["results"][m][category]) for m in modes)
        rows.append(f"| {name} | {category} | {count} | {cells} |")
    derived = record.get("derived_identifier")
    if derived:
        rows.append(f"| {name} | identifier (title as query) | {derived['queries']} | "
                    + " | ".join(cell(derived[m]) for m in modes) + " |")  # fmt: skip
    return rows


# The eval report's parts a committed `--categories` figure keeps (benchmarks/<set>-categories.json).
BENCHMARK_KEYS = ("dataset", "command", "machine", "versions", "settings", "corpus", "queries", "timings_s", "results",
                  "categories")  # fmt: skip


def benchmark_record(report: Mapping[str, Any]) -> dict[str, Any]:
    """A `--categories` report as committed beside the benchmarks: its figures, with the binding kept as
    `binding_of_run`, so the mode gate never takes a subsample's run for evidence (it reads only reports with a
    `binding`, and benchmarks/ holds the reports it ships)."""
    out = {key: report[key] for key in BENCHMARK_KEYS if key in report}
    gate = (out.get("categories") or {}).get("unanswerable", {}).get("coverage_gate")
    if gate and "readings" in gate:  # per-query readings stay in the run's own report
        unanswerable = {**out["categories"]["unanswerable"], "coverage_gate": {k: v for k, v in gate.items()
                                                                              if k != "readings"}}  # fmt: skip
        out["categories"] = {**out["categories"], "unanswerable": unanswerable}
    out["binding_of_run"] = {"binding": report.get("binding"), "binding_hash": report.get("binding_hash")}
    return out

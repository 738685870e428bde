"""`ki eval` on a versioned data set (apps.dev.eval.beir): the query's own words on against off, paired per
query, per query kind, and the comparison labels checked. Pure.

On a versioned set the eval runs each mode twice on the same index -- as configured, and with
`retrieval.query_words_enabled` false (`<mode>-words-off`) -- and compares them query by query
(apps.dev.eval.significance). Queries may say what they are in `metadata.kind` (e.g. `dated`, `compare`,
`dated-en`): the figures are also given per kind. A comparison query's `metadata.earlier` names the corpus id of
the version its earlier side is (null: none); the hit of its relevant version must carry that version as
`compare.earlier.version_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.dev.eval.metrics import METRICS, Qrels, Run, evaluate, per_query_scores
from apps.dev.eval.significance import paired_comparison

WORDS_OFF = "-words-off"  # the suffix of a mode's run with retrieval.query_words_enabled false
SETTING = "retrieval.query_words_enabled"


def kinds(metadata: Mapping[str, Mapping[str, Any]], query_ids: Sequence[str]) -> dict[str, list[str]]:
    """Kind -> its query ids (in `query_ids` order); a query without `metadata.kind` is of kind `other`."""
    out: dict[str, list[str]] = {}
    for qid in query_ids:
        out.setdefault(str(metadata.get(qid, {}).get("kind") or "other"), []).append(qid)
    return dict(sorted(out.items()))


def _means(run: Run, qrels: Qrels) -> dict[str, float]:
    scores = evaluate(run, qrels)
    return {m: round(scores[m], 6) for m in METRICS}


def on_against_off(runs: Mapping[str, Run], qrels: Qrels, mode: str) -> dict[str, Any]:
    """`mode` (words on) against `<mode>-words-off` on these judgments: both means and the paired test (positive
    differences favour the words on)."""
    on, off = runs[mode], runs[mode + WORDS_OFF]
    return {
        "on": _means(on, qrels),
        "off": _means(off, qrels),
        "paired_ndcg@10": paired_comparison(per_query_scores(on, qrels), per_query_scores(off, qrels)),
    }


def check_compare_labels(
    compared: Mapping[str, Mapping[str, str | None]],
    qrels: Qrels,
    metadata: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """For each judged query whose metadata names `earlier`: does the hit of its relevant version carry the
    expected earlier version as its `compare` label? `not_found`: no hit of the relevant version carried a label
    (it was not retrieved, or the query was not read as a comparison)."""
    checked = correct = 0
    not_found: list[str] = []
    wrong: list[dict[str, Any]] = []
    for qid, judgments in qrels.items():
        meta = metadata.get(qid, {})
        if "earlier" not in meta:
            continue
        checked += 1
        labels = compared.get(qid, {})
        relevant = [doc for doc, gain in judgments.items() if gain > 0 and doc in labels]
        if not relevant:
            not_found.append(qid)
            continue
        got = labels[relevant[0]]
        if got == meta["earlier"]:
            correct += 1
        else:
            wrong.append({"query_id": qid, "hit": relevant[0], "expected": meta["earlier"], "labelled": got})
    return {"checked": checked, "correct": correct, "not_found": len(not_found), "not_found_queries": not_found,
            "wrong": wrong}  # fmt: skip


def query_words_record(
    runs: Mapping[str, Run],
    qrels: Qrels,
    metadata: Mapping[str, Mapping[str, Any]],
    compared: Mapping[str, Mapping[str, str | None]],
    modes: Sequence[str] = ("lexical", "semantic", "hybrid"),
) -> dict[str, Any]:
    """The query's words on against off for every mode measured both ways, overall and per kind (hybrid), and
    the check of the comparison labels (`compared`: the hybrid run's, words on)."""
    measured = [m for m in modes if m in runs and m + WORDS_OFF in runs]
    per_kind: dict[str, Any] = {}
    for kind, ids in kinds(metadata, list(qrels)).items():
        judged = {qid: qrels[qid] for qid in ids}
        both = on_against_off(runs, judged, "hybrid") if "hybrid" in measured else {}
        per_kind[kind] = {"queries": len(ids), **both}
    return {
        "setting": SETTING,
        "queries": len(qrels),
        "modes": {mode: on_against_off(runs, qrels, mode) for mode in measured},
        "per_kind": per_kind,
        "compare_labels": check_compare_labels(compared, qrels, metadata),
    }


def markdown_rows(name: str, record: Mapping[str, Any]) -> list[str]:
    """One BENCHMARKS.md row per mode and per kind (hybrid): queries, nDCG@10 / MRR@10 / recall@100 on and off,
    the paired p-value."""

    def row(label: str, queries: int, entry: Mapping[str, Any]) -> str:
        on, off, paired = entry["on"], entry["off"], entry["paired_ndcg@10"]
        return (f"| {name} | {label} | {queries} | {on['ndcg@10']:.3f} / {off['ndcg@10']:.3f} | "
                f"{on['mrr@10']:.3f} / {off['mrr@10']:.3f} | {on['recall@100']:.3f} / {off['recall@100']:.3f} | "
                f"{paired['wins']}/{paired['losses']}/{paired['ties']} | {paired['p_value']:.4f} |")  # fmt: skip

    rows = [row(mode, record["queries"], entry) for mode, entry in record["modes"].items()]
    by_kind = record["per_kind"].items()
    rows += [row(f"hybrid, {kind}", entry["queries"], entry) for kind, entry in by_kind if "on" in entry]
    return rows

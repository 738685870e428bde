"""One coverage-gate setting for several data sets, chosen on their train splits only:
`python -m apps.dev.eval.gate_choice REPORT.json [REPORT.json ...]`, each the report of a `ki eval --categories`
run (its `categories.unanswerable.coverage_gate` curve, read from that run's answers without the gate).

Prints the point (`negatives.choose_joint`: within 0.01 nDCG@10 of each set's train baseline on every set, the
largest smallest train empty share), then per set its train and test figures at that point as the curve predicts
them, and the `config.json` fragment to measure it through the API (`ki --config … eval --categories`).
Exit code 1 when no point fits every set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from apps.dev.eval.negatives import choose_joint

MAX_NDCG_COST = 0.01


def _unanswerable(path: Path) -> tuple[str, dict[str, Any]]:
    report = json.loads(path.read_text(encoding="utf-8"))
    return str(report.get("dataset", {}).get("name", path.stem)), report["categories"]["unanswerable"]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m apps.dev.eval.gate_choice REPORT.json [REPORT.json ...]", file=sys.stderr)
        return 2
    sets = [_unanswerable(Path(a)) for a in argv]
    curves = [[{"threshold": p["threshold"], **p["train"]} for p in u["coverage_gate"]["curve"]] for _, u in sets]
    baselines = [float(u["without_coverage_gate"]["train"]["ndcg@10"]) for _, u in sets]
    chosen = choose_joint(curves, baselines, MAX_NDCG_COST)
    if chosen is None:
        print(f"no point of the grid keeps every set's train cost within {MAX_NDCG_COST}")
        return 1
    bar, minimum = chosen["threshold"]
    print(f"chosen on train: similarity < {bar} and coverage < {minimum}")
    for name, u in sets:
        at = next(p for p in u["coverage_gate"]["curve"] if p["threshold"] == chosen["threshold"])
        base = u["without_coverage_gate"]
        line = [name]
        for split in ("train", "test"):
            if split not in at:
                continue
            kinds = at[split]["kinds"]
            cost = base[split]["ndcg@10"] - at[split]["ndcg@10"]
            line.append(f"{split}: empty {at[split]['empty']:.2f} (words {kinds['real_word']['empty']:.2f} / removed "
                        f"{kinds['removed_answer']['empty']:.2f}), nDCG@10 cost {cost:.4f}")  # fmt: skip
        print("  " + "; ".join(line))
    print(json.dumps({"retrieval": {"answer_coverage_gate_enabled": True, "answer_coverage_gate": {
        "similarity": {"<embedding signature>": bar}, "min_coverage": minimum}}}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

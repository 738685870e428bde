"""One fusion setting for every data set and embedder, chosen on train splits only.

`python -m apps.dev.eval.fusion_choice REPORT.json ...` reads `ki eval` reports (each carries `train`: every
mode and every fusion × semantic weight on at most 1,000 train queries, and `results`: the test split),
prints one table of every method × data set × embedder, train and test, and the choice:

    the hybrid setting whose worst margin over the better single leg, across the reports' train splits,
    is largest (a setting that never loses to its best leg wins over one that wins big somewhere and
    loses elsewhere); ties go to the higher mean train nDCG@10.

The test figures are printed beside it to confirm, never to choose. Pure apart from `main`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

METRIC = "ndcg@10"
LEGS = ("lexical", "semantic")


@dataclass(frozen=True)
class Measured:
    """One report: its data set, embedder and nDCG@10 per label on train and (where measured) test."""

    name: str
    train: dict[str, float]
    test: dict[str, float]


def measured(report: dict[str, Any]) -> Measured:
    dataset = report["dataset"]["name"]
    signature = report["settings"]["embedding_signature"]
    train = {label: float(v[METRIC]) for label, v in (report.get("train") or {}).get("results", {}).items()}
    test: dict[str, float] = {}
    for label, v in report["results"].items():
        if label in LEGS:
            test[label] = float(v[METRIC])
        elif label == "hybrid" or (label.startswith("hybrid-") and label != "hybrid-tuned"):
            test[setting_label(v.get("fusion", "rrf"), float(v["weights"]["semantic"]))] = float(v[METRIC])
    return Measured(f"{dataset} / {signature}", train, test)


def setting_label(method: str, weight_semantic: float) -> str:
    """How `ki eval` names a hybrid setting on the train split: `hybrid-<method>[-wsem<w>]`."""
    return f"hybrid-{method}" + ("" if weight_semantic == 1.0 else f"-wsem{weight_semantic:g}")


def candidates(reports: Sequence[Measured]) -> list[str]:
    """The hybrid labels every report measured on train (`hybrid-<method>[-wsem<w>]`)."""
    sets = [{k for k in m.train if k.startswith("hybrid-")} for m in reports]
    return sorted(set.intersection(*sets)) if sets else []


def margin(m: Measured, label: str, split: str = "train") -> float:
    scores = m.train if split == "train" else m.test
    return scores[label] - max(scores[leg] for leg in LEGS)


def choose(reports: Sequence[Measured]) -> tuple[str, float, float]:
    """The label with the largest worst train margin over the best leg (ties: higher mean train nDCG@10),
    with that worst margin and mean."""
    scored = [
        (min(margin(m, label) for m in reports), fmean(m.train[label] for m in reports), label)
        for label in candidates(reports)
    ]
    if not scored:
        raise ValueError("no hybrid setting was measured on the train split of every report")
    worst, mean, label = max(scored)
    return label, worst, mean


def table(reports: Sequence[Measured]) -> str:
    labels = [*LEGS, *candidates(reports)]
    head = "| setting | " + " | ".join(f"{m.name} train / test" for m in reports) + " | worst train Δ vs best leg |"
    rows = [head, "| --- " * (len(reports) + 2) + "|"]
    for label in labels:
        cells = []
        for m in reports:
            test = m.test.get(label)
            cells.append(f"{m.train.get(label, float('nan')):.4f} / " + ("–" if test is None else f"{test:.4f}"))
        worst = "" if label in LEGS else f"{min(margin(m, label) for m in reports):+.4f}"
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {worst} |")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m apps.dev.eval.fusion_choice REPORT.json ...", file=sys.stderr)
        return 2
    reports = [measured(json.loads(Path(p).read_text(encoding="utf-8"))) for p in argv]
    print(table(reports))
    label, worst, mean = choose(reports)
    print(f"\nchosen on train: {label} (worst margin over the best leg {worst:+.4f}, mean nDCG@10 {mean:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`ki eval --features`: each ranking feature of the search path switched from its default, measured on
the same index and test queries.

A feature that is on by default must not lower nDCG@10 by more than `MAX_DEFAULT_LOSS` on any data set;
a feature that is off shows what switching it on would do. Each run is a pair (lexical, hybrid) with the
feature's own ranking hash, written into the report as a *variant* (`search.ranking.mode_gate.parse_reports`), so
the evidence gate keeps its footing when an operator switches the feature on. A feature that cannot
change the lexical-only ranking reuses the base lexical run.

Runs ask for the top 10 (the metric's depth) for the base and every variant alike, so one run costs a
tenth of the 100-deep mode runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ki.settings import Settings, with_overrides

MAX_DEFAULT_LOSS = 0.005  # nDCG@10 a default-on feature may cost on any data set
FEATURE_LIMIT = 10


@dataclass(frozen=True)
class Feature:
    name: str
    setting: str  # the retrieval.* switch
    touches_lexical: bool  # whether it can change the lexical-only ranking
    # why it is not measured here, when it cannot be (its run would be the base run)
    unmeasurable: str | None = None


FEATURES: tuple[Feature, ...] = (
    Feature("identity", "name_lookup_enabled", touches_lexical=True),
    Feature("synonyms", "synonyms_enabled", touches_lexical=True),
    Feature("semantic_floor", "semantic_floor_enabled", touches_lexical=False),
    Feature("graph_rag", "graph_rag_enabled", touches_lexical=True),
    Feature(
        "decay",
        "decay_enabled",
        touches_lexical=True,
        unmeasurable="no document of the data set has a doc_date: every one gets the same factor, the order stays",
    ),
)


def default_state(settings: Settings, feature: Feature) -> bool:
    return bool(getattr(settings.retrieval, feature.setting))


def switched(settings: Settings, feature: Feature, extra: dict[str, Any] | None = None) -> Settings:
    """`settings` with the feature flipped from its state there (and `extra` retrieval overrides)."""
    update = {feature.setting: not default_state(settings, feature), **(extra or {})}
    return with_overrides(settings, {"retrieval": update})


def floor_override(settings: Settings, signature: str, tuned: float | None) -> dict[str, Any]:
    """The floor a `semantic_floor` run uses: the one tuned in this run, else the stored one (none: {})."""
    if tuned is None:
        return {}
    return {"semantic_floor": {**settings.retrieval.semantic_floor, signature: tuned}}


def verdict(default_on: bool, base: float, variant: float) -> str:
    """`ok`, or why the measurement argues against the default."""
    if default_on:  # the variant is the feature off
        loss = variant - base  # what the default costs against having it off
        if loss <= MAX_DEFAULT_LOSS:
            return "ok"
        return f"on by default but costs {loss:.4f} nDCG@10 (> {MAX_DEFAULT_LOSS})"
    gain = variant - base
    return f"off by default; on: {gain:+.4f} nDCG@10"


def markdown_rows(dataset: str, entries: Sequence[dict[str, Any]]) -> list[str]:
    """One table row per feature: data set, feature, default, nDCG@10 off, on, difference."""
    rows = []
    for e in entries:
        if e.get("ndcg@10_on") is None:
            rows.append(f"| {dataset} | {e['feature']} | {'on' if e['default_on'] else 'off'} | — | — | "
                        f"not measured: {e.get('unmeasurable')} |")  # fmt: skip
            continue
        off, on = e["ndcg@10_off"], e["ndcg@10_on"]
        rows.append(f"| {dataset} | {e['feature']} | {'on' if e['default_on'] else 'off'} | {off:.4f} | "
                    f"{on:.4f} | {on - off:+.4f} |")  # fmt: skip
    return rows

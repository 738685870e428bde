"""The evidence budget: at most so many characters of evidence in one answer, for callers that put the
answer into a language model's context.

Hits are taken in rank order while their text fits; the first that does not fit ends the page (a later,
shorter hit never jumps ahead of a better one). Neighbouring chunks (`context`) count too and are given
up before a hit is. A first hit longer than the whole budget is cut to it (`text_truncated`), so a budget
never turns evidence into an empty answer. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BudgetUse:
    limit: int
    used: int
    hits_dropped: int
    next_offset: int  # where the next page starts, so paging skips none of the dropped hits

    def to_json(self) -> dict[str, int]:
        return {
            "budget_chars": self.limit,
            "used_chars": self.used,
            "hits_dropped": self.hits_dropped,
            "next_offset": self.next_offset,
        }


def fit_budget(hits: list[dict[str, Any]], budget: int, offset: int = 0) -> tuple[list[dict[str, Any]], BudgetUse]:
    """The hits (copies where changed) whose `text` and `context` texts fit `budget` characters in all."""
    kept: list[dict[str, Any]] = []
    used = 0
    for hit in hits:
        text = str(hit.get("text") or "")
        remaining = budget - used
        if len(text) > remaining:
            if not kept:  # the best hit, cut to the budget
                cut = {**hit, "text": text[:remaining], "text_truncated": True}
                if "context" in hit:
                    cut["context"] = []
                kept.append(cut)
                used = budget
            break
        used += len(text)
        if "context" in hit:
            context = []
            for neighbour in hit["context"]:
                size = len(str(neighbour.get("text") or ""))
                if used + size > budget:
                    break
                context.append(neighbour)
                used += size
            hit = {**hit, "context": context}
        kept.append(hit)
    return kept, BudgetUse(budget, used, len(hits) - len(kept), offset + len(kept))

"""Chunk expansion: each hit's neighbouring body chunks (ordinal ± 1, same version) as context.

Row ids are `f"{version_id}:{kind}:{ordinal}"` (projections.rows), so the neighbours of a hit are known
without a query and fetched for all hits in one `mget`. A neighbour that is itself a hit on the page, or
already another hit's neighbour, is not repeated; per document at most `max_per_document` chunks are
returned in all (its hits on the page first, then neighbours in rank order). Profile and clause rows have
no neighbours. A neighbour belongs to the hit's version, which the re-verify has just allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Position = Literal["before", "after"]


@dataclass(frozen=True)
class Neighbour:
    hit_chunk_id: str
    chunk_id: str
    position: Position


def body_ordinal(chunk_id: str) -> tuple[int, int] | None:
    """(version id, ordinal) of a body chunk's row id, else None."""
    parts = chunk_id.split(":")
    if len(parts) != 3 or parts[1] != "chunk":
        return None
    try:
        return int(parts[0]), int(parts[2])
    except ValueError:
        return None


def plan_neighbours(hits: Sequence[tuple[str, int]], max_per_document: int) -> list[Neighbour]:
    """The neighbours to fetch for `hits` ((chunk id, document id) in page order)."""
    on_page = {chunk_id for chunk_id, _ in hits}
    per_document: dict[int, int] = {}
    for _, document_id in hits:
        per_document[document_id] = per_document.get(document_id, 0) + 1
    planned: list[Neighbour] = []
    taken: set[str] = set()
    for chunk_id, document_id in hits:
        parsed = body_ordinal(chunk_id)
        if parsed is None:
            continue
        version_id, ordinal = parsed
        for position, other in (("before", ordinal - 1), ("after", ordinal + 1)):
            neighbour = f"{version_id}:chunk:{other}"
            if other < 0 or neighbour in on_page or neighbour in taken:
                continue
            if per_document[document_id] >= max_per_document:
                break
            per_document[document_id] += 1
            taken.add(neighbour)
            planned.append(Neighbour(chunk_id, neighbour, position))  # type: ignore[arg-type]
    return planned

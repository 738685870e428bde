"""Relations between documents: the traversal rule, pure.

Relations (`relations`: supersedes, annex_of, responds_to, references, thread) are directed document →
document edges, read from PostgreSQL when asked (`search.documents.read`); nothing in the index derives from
them. A traversal walks them breadth-first from the start documents, and every document it reaches is
checked against the caller's access (the one ACL, through the `visible` callable) before it is shown or
walked on: a document the caller may not see is cut, with its edges, never shown as a placeholder and
never walked through (that would reveal how two visible documents are connected through a hidden one).
Each document is reached once (cycles end there), at its least depth; at most `fanout` edges to documents the
caller may see are followed out of one document, in a fixed order (kind, then the other end's id), so the
answer does not depend on the database's row order, and nothing the caller may not see changes it.

Pure: the visibility and the neighbours come in as callables (`search.documents.read` passes SQL ones, the
property tests a reference evaluator's). `neighbours` answers, for one level's frontier, only the edges whose
other end the caller may see (or is already shown) and those visible ends, in one call: the edges to hidden
documents are never read out of the database, so neither the rows nor the statements of a level depend on
whether a hidden neighbour exists (`tests/integration/test_trace_equivalence.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Direction = Literal["outgoing", "incoming", "both"]


@dataclass(frozen=True, order=True)
class Edge:
    """`from_id` --kind--> `to_id`."""

    kind: str
    from_id: int
    to_id: int


@dataclass(frozen=True)
class Step:
    """An edge as seen from `at`: the document at the other end and which way the edge points."""

    edge: Edge
    at: int

    @property
    def other(self) -> int:
        return self.edge.to_id if self.edge.from_id == self.at else self.edge.from_id

    @property
    def direction(self) -> Literal["outgoing", "incoming"]:
        return "outgoing" if self.edge.from_id == self.at else "incoming"


def steps(edges: Iterable[Edge], at: int, kinds: Collection[str] | None, direction: Direction) -> list[Step]:
    """The edges of `at` of the wanted kinds and direction, ordered by (kind, other end, direction)."""
    out = []
    for edge in edges:
        if kinds is not None and edge.kind not in kinds:
            continue
        outgoing = edge.from_id == at and direction in ("outgoing", "both")
        incoming = edge.to_id == at and direction in ("incoming", "both")
        if outgoing or incoming:
            out.append(Step(edge, at))
    return sorted(set(out), key=lambda s: (s.edge.kind, s.other, s.direction))


@dataclass(frozen=True)
class Traversal:
    nodes: dict[int, int]  # visible document -> depth (the start documents: 0)
    edges: list[Edge]  # every edge walked, both ends visible
    not_found: list[int]  # start documents the caller may not see (or that do not exist)
    truncated: bool  # some document had more edges to visible documents than `fanout`


Neighbours = Callable[[Collection[int], Collection[int]], tuple[Iterable[Edge], Collection[int]]]


def neighbours_from(
    edges_of: Callable[[Collection[int]], Iterable[Edge]], visible: Callable[[Collection[int]], Collection[int]]
) -> Neighbours:
    """`neighbours` from every edge and a visibility test (the reference shape, for tests): the edges of the
    frontier whose other end is visible or already known, and the visible other ends."""

    def neighbours(frontier: Collection[int], known: Collection[int]) -> tuple[list[Edge], set[int]]:
        edges = list(edges_of(frontier))
        ends = {e.to_id for e in edges if e.from_id in frontier} | {e.from_id for e in edges if e.to_id in frontier}
        allowed = set(visible(ends - set(known))) if ends - set(known) else set()
        keep = allowed | set(known) | set(frontier)
        return [e for e in edges if e.from_id in keep and e.to_id in keep], allowed

    return neighbours


def traverse(
    starts: Sequence[int],
    *,
    visible: Callable[[Collection[int]], Collection[int]],
    neighbours: Neighbours,
    depth: int,
    fanout: int,
    kinds: Collection[str] | None = None,
    direction: Direction = "outgoing",
) -> Traversal:
    """Breadth-first from `starts`, `depth` edges deep, each level's visible neighbours in one call."""
    shown = set(visible(set(starts)))
    nodes = {s: 0 for s in dict.fromkeys(starts) if s in shown}
    not_found = [s for s in dict.fromkeys(starts) if s not in shown]
    walked: list[Edge] = []
    truncated = False
    frontier = list(nodes)
    for level in range(1, depth + 1):
        if not frontier:
            break
        known, allowed = neighbours(frontier, list(nodes))
        known = list(known)
        allowed = set(allowed)
        found = {at: steps(known, at, kinds, direction) for at in frontier}
        next_frontier: list[int] = []
        for at in frontier:
            # Only edges to documents the caller may see are read at all: a hidden neighbour can neither take
            # a visible one's place under the fan-out nor show through `truncated` that it exists.
            reachable = [s for s in found[at] if s.other in nodes or s.other in allowed]
            truncated = truncated or len(reachable) > fanout
            for step in reachable[:fanout]:
                other = step.other
                if other not in nodes:
                    nodes[other] = level
                    next_frontier.append(other)
                # else: an edge between two shown documents (a cycle, a sibling): shown, not walked on
                walked.append(step.edge)
        frontier = next_frontier
    return Traversal(nodes, sorted(set(walked)), not_found, truncated)

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

Pure: the edges and the visibility come in as callables (`search.documents.read` passes SQL ones, the property
tests a reference evaluator's).
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


def traverse(
    starts: Sequence[int],
    *,
    edges_of: Callable[[Collection[int]], Iterable[Edge]],
    visible: Callable[[Collection[int]], Collection[int]],
    depth: int,
    fanout: int,
    kinds: Collection[str] | None = None,
    direction: Direction = "outgoing",
) -> Traversal:
    """Breadth-first from `starts`, `depth` edges deep, each level's edges and visibility in one call."""
    shown = set(visible(set(starts)))
    nodes = {s: 0 for s in dict.fromkeys(starts) if s in shown}
    not_found = [s for s in dict.fromkeys(starts) if s not in shown]
    walked: list[Edge] = []
    truncated = False
    frontier = list(nodes)
    for level in range(1, depth + 1):
        if not frontier:
            break
        known = list(edges_of(frontier))
        found = {at: steps(known, at, kinds, direction) for at in frontier}
        fresh = {s.other for group in found.values() for s in group if s.other not in nodes}
        allowed = set(visible(fresh)) if fresh else set()
        next_frontier: list[int] = []
        for at in frontier:
            # Only edges to documents the caller may see count against the fan-out: a hidden neighbour must
            # neither take a visible one's place nor show through `truncated` that it exists.
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

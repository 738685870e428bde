"""The traversal rule (search.documents.graph) on random relation graphs: only visible documents, never through a
hidden one, each at its least depth, cycles ended, fan-out capped -- checked against a plain BFS written
here over the graph the caller may see."""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from search.documents.graph import Edge, neighbours_from, steps, traverse

KINDS = ("supersedes", "annex_of", "responds_to", "references", "thread")


def reference_bfs(
    starts: list[int], edges: set[Edge], visible: set[int], depth: int, direction: str, kinds: set[str] | None
) -> dict[int, int]:
    """Least depth of every visible document reachable over edges between visible documents."""
    out = {s: 0 for s in starts if s in visible}
    queue = deque(out)
    while queue:
        at = queue.popleft()
        if out[at] == depth:
            continue
        for e in edges:
            if kinds is not None and e.kind not in kinds:
                continue
            nexts = []
            if e.from_id == at and direction in ("outgoing", "both"):
                nexts.append(e.to_id)
            if e.to_id == at and direction in ("incoming", "both"):
                nexts.append(e.from_id)
            for n in nexts:
                if n in visible and n not in out:
                    out[n] = out[at] + 1
                    queue.append(n)
    return out


@st.composite
def graphs(draw: st.DrawFn) -> tuple[set[Edge], set[int], list[int]]:
    n = draw(st.integers(1, 12))
    pairs = draw(st.lists(st.tuples(st.integers(1, n), st.integers(1, n)), max_size=30))
    edges = {Edge(draw(st.sampled_from(KINDS)), a, b) for a, b in pairs if a != b}
    visible = set(draw(st.lists(st.integers(1, n), max_size=n)))
    starts = draw(st.lists(st.integers(1, n + 2), min_size=1, max_size=3))  # n+1, n+2: no such document
    return edges, visible, starts


@settings(max_examples=400, deadline=None)
@given(graphs(), st.integers(1, 4), st.sampled_from(["outgoing", "incoming", "both"]),
       st.one_of(st.none(), st.sets(st.sampled_from(KINDS), min_size=1)))  # fmt: skip
def test_traversal_equals_a_bfs_over_what_the_caller_may_see(graph, depth, direction, kinds) -> None:
    edges, visible, starts = graph
    asked: list[set[int]] = []

    def seen(ids):
        asked.append(set(ids))
        return {i for i in ids if i in visible}

    def edges_of(ids):
        return [e for e in edges if e.from_id in ids or e.to_id in ids]

    found = traverse(starts, visible=seen, neighbours=neighbours_from(edges_of, seen), depth=depth, fanout=1000,
                     kinds=kinds,
                     direction=direction)  # fmt: skip
    assert found.nodes == reference_bfs(starts, edges, visible, depth, direction, kinds)
    assert set(found.nodes) <= visible
    assert found.not_found == [s for s in dict.fromkeys(starts) if s not in visible]
    for e in found.edges:  # every edge shown joins two shown documents and is one of the graph's
        assert e in edges and e.from_id in found.nodes and e.to_id in found.nodes
    assert not found.truncated
    # Each level asks once, and never about a document it already knows.
    assert len(asked) <= depth + 1


@settings(max_examples=400, deadline=None)
@given(graphs(), st.integers(1, 4), st.sampled_from(["outgoing", "incoming", "both"]), st.integers(1, 3))
def test_what_the_caller_may_not_see_changes_nothing(graph, depth, direction, fanout) -> None:
    """The same answer (nodes, edges, truncated) as on the graph with every hidden document and its edges
    removed: a hidden neighbour takes no visible one's place under the fan-out and does not show as truncation."""
    edges, visible, starts = graph
    between_visible = {e for e in edges if e.from_id in visible and e.to_id in visible}

    def walk(over: set[Edge]):
        seen = lambda ids: {i for i in ids if i in visible}  # noqa: E731
        edges_of = lambda ids: [e for e in over if e.from_id in ids or e.to_id in ids]  # noqa: E731
        return traverse(starts, visible=seen, neighbours=neighbours_from(edges_of, seen), depth=depth, fanout=fanout,
                        direction=direction)  # fmt: skip

    assert walk(edges) == walk(between_visible)


def walk(edges: list[Edge], visible: Any) -> dict[str, Any]:
    return {"visible": visible, "neighbours": neighbours_from(lambda ids: edges, visible)}


def test_a_hidden_neighbour_neither_takes_a_place_nor_shows_as_truncation() -> None:
    edges = [Edge("references", 1, 2), Edge("references", 1, 3)]  # 2 is hidden, 3 visible
    found = traverse([1], **walk(edges, lambda ids: set(ids) - {2}), depth=1, fanout=1)
    assert found.nodes == {1: 0, 3: 1} and not found.truncated


def test_fanout_caps_edges_per_document_in_a_fixed_order() -> None:
    edges = [Edge("references", 1, n) for n in range(2, 12)]
    found = traverse([1], **walk(edges, lambda ids: set(ids)), depth=1, fanout=3)
    assert sorted(found.nodes) == [1, 2, 3, 4] and found.truncated
    assert [s.other for s in steps(reversed(edges), 1, None, "outgoing")][:3] == [2, 3, 4]  # row order is no matter


def test_a_hidden_document_is_not_walked_through() -> None:
    edges = [Edge("references", 1, 2), Edge("references", 2, 3)]
    found = traverse([1], **walk(edges, lambda ids: set(ids) - {2}), depth=3, fanout=10)
    assert found.nodes == {1: 0} and found.edges == []


def test_cycles_end_and_their_closing_edge_is_shown() -> None:
    edges = [Edge("thread", 1, 2), Edge("thread", 2, 3), Edge("thread", 3, 1)]
    found = traverse([1], **walk(edges, lambda ids: set(ids)), depth=5, fanout=10)
    assert found.nodes == {1: 0, 2: 1, 3: 2}
    assert found.edges == sorted(edges)


# --- graph augmentation (search.ranking.augment), pure parts ------------------------------------------------------


def _candidate(chunk: str, doc: int, score: float):
    from search.ranking.fusion import Candidate

    return Candidate(chunk, score, {"document_id": str(doc), "document_version_id": str(doc), "project_id": "1"})


def test_additions_are_cited_by_seeds_new_bounded_and_scored_by_the_best_seed() -> None:
    from search.ranking.augment import plan_additions

    seeds = [_candidate("a", 1, 0.9), _candidate("b", 2, 0.5)]
    edges = [(1, 7, 10), (2, 7, 10), (2, 8, 10), (1, 2, 10), (3, 9, 10)]  # 2 is present; 3 is no seed
    planned = plan_additions(seeds, edges, present={1, 2}, max_added=5)
    assert [(c.document_id, c.seed_score) for c in planned] == [(7, 0.9), (8, 0.5)]
    assert [c.document_id for c in plan_additions(seeds, edges, present={1, 2}, max_added=1)] == [7]


def test_merge_keeps_every_ranked_candidate_and_puts_ties_behind_it() -> None:
    from search.ranking.augment import Cited, added_candidates, merge

    kept = [_candidate("a", 1, 0.9), _candidate("b", 2, 0.4), _candidate("c", 3, 0.2)]
    hits = [{"_id": "x", "_source": {"document_id": "7", "document_version_id": "7", "project_id": "1"}},
            {"_id": "y", "_source": {"document_id": "8", "document_version_id": "8", "project_id": "1"}},
            {"_id": "z", "_source": {}}]  # fmt: skip
    added = added_candidates(hits, [Cited(7, 1, 0.9), Cited(8, 1, 0.8)], hop_penalty=0.5)
    assert [(c.chunk_id, c.score, c.match_reason) for c in added] == [("x", 0.45, "graph"), ("y", 0.4, "graph")]
    merged = merge(kept, added)
    assert [c.chunk_id for c in merged] == ["a", "x", "b", "y", "c"]  # y ties b and stays behind it
    assert {c.chunk_id for c in kept} <= {c.chunk_id for c in merged}

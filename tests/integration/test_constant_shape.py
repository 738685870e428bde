"""Constant-shape authorisation: asking about a document the caller may not see runs the same SQL statements as
asking about one that does not exist, for documents, related documents, traversal, decision search, reading a
version's text, reading a chunk by its id and looking a document up by its name (with the same rows too). The
statements (text and parameter names, not values) are recorded from the real PostgreSQL driver and compared; on
the code before, a hidden id ran a second ACL statement that a missing one skipped (11.2 vs 6.8 ms: a timing
oracle). The timings themselves are `ki bench authz-timing`'s.

The world is written and read in one transaction that is rolled back: nothing reaches CDC or the index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, text

from ki.settings import ApiSettings, Settings
from search.documents.chunks import ChunkId, read_chunk
from search.documents.decisions import search_decisions
from search.documents.lookup import look_up
from search.documents.read import get_document, related, run_traversal
from search.documents.text import read_text
from search.request import DecisionSearchRequest, parse_lookup_request
from tests.integration.world import World

pytestmark = pytest.mark.stack


class Recorder:
    """The statements a connection sends while recording (text and parameter names)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[str, ...]]] = []
        event.listen(conn, "before_cursor_execute", self._record)

    def _record(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        names = tuple(sorted(parameters)) if isinstance(parameters, dict) else ()
        self.statements.append((statement, names))

    def run(self, call: Callable[[], Any]) -> tuple[Any, list[tuple[str, tuple[str, ...]]]]:
        self.statements = []
        answer = call()
        return answer, list(self.statements)


@pytest.fixture()
def world(engine: Engine) -> Iterator[tuple[World, dict[str, int], Recorder]]:
    with engine.connect() as conn, conn.begin() as transaction:
        w = World(conn)
        mine, theirs = w.project("Sichtbar"), w.project("Verborgen")
        obj = w.source_object(w.source("local_fs"))
        visible = w.document(mine, f"Sichtbar {w.tag}")
        w.observe(w.version(visible, "Offen."), obj)
        hidden = w.document(theirs, f"Verborgen {w.tag}")
        w.observe(w.version(hidden, "Geheim."), obj)
        w.relation("references", visible, hidden)
        w.grant("project", mine, f"user:probe-{w.tag}")
        conn.execute(
            text("INSERT INTO decision_records (project_id, document_id, rationale) VALUES (:p, :d, :r)"),
            {"p": theirs, "d": hidden, "r": f"Kündigungsfrist{w.tag} verlängert"},
        )
        missing = int(conn.execute(text("SELECT coalesce(max(id), 0) + 1000000 FROM documents")).scalar_one())
        ids = {"visible": visible, "hidden": hidden, "missing": missing}
        yield w, ids, Recorder(conn)
        transaction.rollback()


def _same_for_hidden_and_missing(recorder: Recorder, call: Callable[[int], Any], ids: dict[str, int]) -> Any:
    hidden, hidden_sql = recorder.run(lambda: call(ids["hidden"]))
    missing, missing_sql = recorder.run(lambda: call(ids["missing"]))
    assert hidden == missing
    assert hidden_sql == missing_sql and hidden_sql, (len(hidden_sql), len(missing_sql))
    return hidden


def test_documents_related_and_traversal_run_the_same_statements_for_hidden_and_missing(
    world: tuple[World, dict[str, int], Recorder], settings: Settings
) -> None:
    w, ids, recorder = world
    conn, who, security = recorder.conn, [f"user:probe-{w.tag}"], settings.security
    assert get_document(conn, who, security, ids["visible"]) is not None  # the caller sees something
    assert _same_for_hidden_and_missing(recorder, lambda d: get_document(conn, who, security, d), ids) is None
    assert (
        _same_for_hidden_and_missing(
            recorder, lambda d: related(conn, who, security, d, kinds=None, direction="both", limit=10), ids
        )
        is None
    )

    def walk(start: int) -> dict[str, Any]:
        found = run_traversal(conn, who, security, [ids["visible"], start], kinds=None, direction="both", depth=2,
                              fanout=10)  # fmt: skip
        assert found["not_found"] == [start]  # the id asked about, either way
        return {**found, "not_found": None}

    walked = _same_for_hidden_and_missing(recorder, walk, ids)
    assert [n["document_id"] for n in walked["nodes"]] == [ids["visible"]] and walked["edges"] == []


def test_reading_runs_the_same_statements_for_a_hidden_and_a_missing_version(
    world: tuple[World, dict[str, int], Recorder], settings: Settings
) -> None:
    w, ids, recorder = world
    conn, who, security = recorder.conn, [f"user:probe-{w.tag}"], settings.security
    read = read_text(conn, who, security, ids["visible"], None, 0, 100)
    assert read is not None and read["text"] == "Offen." and read["next_offset"] is None
    # A document the caller may not see, and its version asked for by id from the visible document.
    hidden_version = int(
        conn.execute(text("SELECT id FROM document_versions WHERE document_id = :d"), {"d": ids["hidden"]}).scalar_one()
    )
    missing_version = hidden_version + 1_000_000
    assert (
        _same_for_hidden_and_missing(recorder, lambda d: read_text(conn, who, security, d, None, 0, 100), ids) is None
    )
    versions = {"hidden": hidden_version, "missing": missing_version}
    assert (
        _same_for_hidden_and_missing(
            recorder, lambda v: read_text(conn, who, security, ids["visible"], v, 0, 100), versions
        )
        is None
    )


def test_reading_a_chunk_runs_the_same_statements_for_a_hidden_and_a_missing_version(
    world: tuple[World, dict[str, int], Recorder], settings: Settings
) -> None:
    w, ids, recorder = world
    conn, who = recorder.conn, [f"user:probe-{w.tag}"]
    asked: list[str] = []

    async def sql(work: Callable[[Connection], Any]) -> Any:
        return work(conn)

    async def index_row(row_id: str) -> dict[str, Any] | None:
        asked.append(row_id)
        return None  # nothing of this rolled-back world is indexed

    def version_of(document_id: int) -> int:
        statement = text("SELECT id FROM document_versions WHERE document_id = :d")
        return int(conn.execute(statement, {"d": document_id}).scalar_one())

    def read(version_id: int) -> Any:
        return asyncio.run(read_chunk(who, settings, ChunkId(version_id, "chunk", 0), sql, index_row))

    # The visible version's chunk is looked up in the index; the hidden and the missing one's never are.
    assert read(version_of(ids["visible"])) is None and asked == [f"{version_of(ids['visible'])}:chunk:0"]
    asked.clear()
    hidden = version_of(ids["hidden"])
    assert _same_for_hidden_and_missing(recorder, read, {"hidden": hidden, "missing": hidden + 1_000_000}) is None
    assert asked == []


def test_decision_search_runs_the_same_statements_for_a_hidden_decision_and_for_nothing(
    world: tuple[World, dict[str, int], Recorder], settings: Settings
) -> None:
    w, _, recorder = world
    conn, who = recorder.conn, [f"user:probe-{w.tag}"]

    def ask(word: str) -> Callable[[], Any]:
        return lambda: search_decisions(conn, who, settings.security, DecisionSearchRequest(query=word)).to_json()

    hidden, hidden_sql = recorder.run(ask(f"Kündigungsfrist{w.tag}"))
    nothing, nothing_sql = recorder.run(ask(f"Nirgendwo{w.tag}"))
    assert hidden == nothing and hidden["hits"] == []
    assert hidden_sql == nothing_sql


def test_lookup_runs_the_same_statements_with_the_same_rows_for_a_hidden_and_a_missing_name(
    world: tuple[World, dict[str, int], Recorder], settings: Settings
) -> None:
    w, ids, recorder = world
    conn, who, security = recorder.conn, [f"user:probe-{w.tag}"], settings.security
    rows: list[int] = []

    def count(_conn: Any, cursor: Any, *_: Any) -> None:
        rows.append(cursor.rowcount)

    def ask(body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """The answer without what was asked (the names differ), and each statement with its parameter names and
        the rows it returned."""
        rows.clear()
        request = parse_lookup_request(body, ApiSettings())
        answer, statements = recorder.run(lambda: look_up(conn, who, security, request).to_json())
        return {k: v for k, v in answer.items() if k != "asked"}, list(zip(statements, rows, strict=True))

    event.listen(conn, "after_cursor_execute", count)
    try:
        found, found_trace = ask({"title": f"Sichtbar {w.tag}"})  # the caller sees something
        assert found["outcome"] == "found" and found["document_id"] == ids["visible"] and len(found_trace) == 2
        # A title only a hidden document carries, and one nobody carries.
        hidden, hidden_trace = ask({"title": f"Verborgen {w.tag}"})
        missing, missing_trace = ask({"title": f"Fehlt {w.tag}"})
        assert hidden == missing == {"outcome": "not_found"}
        assert hidden_trace == missing_trace and hidden_trace, (hidden_trace, missing_trace)
        # An identifier the visible document carries: a hidden second carrier changes no statement, row or answer.
        name = f"AZ-{w.tag}"
        add = text("UPDATE documents SET identifiers = CAST(:a AS text[]) WHERE id = :d")
        conn.execute(add, {"a": [name], "d": ids["visible"]})
        for body in ({"identifier": name}, {"identifier": name, "as_of": "2030-01-01"}):
            alone = ask(body)
            conn.execute(add, {"a": [name], "d": ids["hidden"]})
            beside_hidden = ask(body)
            conn.execute(add, {"a": [], "d": ids["hidden"]})
            assert alone == beside_hidden and alone[0]["outcome"] == "found", (alone, beside_hidden)
        # The name only on the hidden document, and on none.
        conn.execute(add, {"a": [], "d": ids["visible"]})
        conn.execute(add, {"a": [name], "d": ids["hidden"]})
        hidden_name = ask({"identifier": name})
        conn.execute(add, {"a": [], "d": ids["hidden"]})
        assert hidden_name == ask({"identifier": name}) and hidden_name[0] == {"outcome": "not_found"}
    finally:
        event.remove(conn, "after_cursor_execute", count)

"""No foreign exception crosses a port: each adapter that calls a client (PostgreSQL, OpenSearch, Kafka, the
embedding service) raises `ki.errors` types, the client's own exception chained as the cause. The clients are
real ones pointed at a loopback port nothing listens on; the stages, the pipeline and the facades neither catch
nor name a client library's exception types (read from their source)."""

from __future__ import annotations

import ast
import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import OpenSearchException
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from ki.embedding import EmbeddingUnavailable
from ki.embedding.http import HttpEmbedder
from ki.errors import ConnectionLost, Rejected, SearchUnavailable, Unavailable
from ki.kafka_offsets import topic_partitions
from ki.settings import Settings
from search.operations import Operations
from search.ports import SqlReader
from search.ranking.mode_gate import Trust
from search.ranking.scoped import ScopedIndex
from search.ranking.sql_reads import load_self_evidence
from search.telemetry.metrics import SearchMetrics

ROOT = Path(__file__).resolve().parents[3]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sql_reader_raises_ours_when_postgresql_is_unreachable() -> None:
    async def read() -> None:
        engine = create_async_engine(f"postgresql+psycopg://ki@127.0.0.1:{_closed_port()}/ki")
        try:
            reader = SqlReader(Settings(), engine, engine)
            for call in (reader.read, reader.verified_read):
                with pytest.raises(Unavailable) as raised:
                    await call(lambda conn: None)
                assert raised.value.service == "postgresql"
                assert isinstance(raised.value.__cause__, SQLAlchemyError)
        finally:
            await engine.dispose()

    asyncio.run(read())


def test_the_operations_and_the_mode_gate_reads_raise_ours_when_postgresql_is_unreachable() -> None:
    async def read() -> None:
        engine = create_async_engine(f"postgresql+psycopg://ki@127.0.0.1:{_closed_port()}/ki")
        none: Any = None  # no OpenSearch client: these reads do not reach it
        operations = Operations(Settings.model_validate({"api": {"audit": {"enabled": False}}}), engine, none,
                                SearchMetrics())  # fmt: skip
        try:
            for call in (
                operations.is_admin(["user:anna"]),
                operations.stats_summary(1),
                load_self_evidence(engine, Trust()),
            ):
                with pytest.raises(Unavailable) as raised:
                    await call
                assert isinstance(raised.value.__cause__, SQLAlchemyError)
        finally:
            await engine.dispose()

    asyncio.run(read())


class _Connection:
    def __init__(self, fail: BaseException | None) -> None:
        self.fail = fail

    async def run_sync(self, work: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        return work(self)


class _Engine:
    """Hands out connections whose first runs raise the given SQLAlchemy errors, in order."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[_Connection]:
        yield _Connection(self.failures.pop(0) if self.failures else None)


def test_a_dropped_reverify_connection_is_read_again_and_a_refusal_is_rejected() -> None:
    dropped = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)
    engine: Any = _Engine(dropped)
    assert asyncio.run(SqlReader(Settings(), engine, engine).verified_read(lambda conn: "read")) == "read"

    twice: Any = _Engine(dropped, dropped)
    with pytest.raises(ConnectionLost) as lost:
        asyncio.run(SqlReader(Settings(), twice, twice).verified_read(lambda conn: "read"))
    assert lost.value.__cause__ is dropped

    refused = IntegrityError("INSERT", {}, Exception("duplicate key"))
    engine = _Engine(refused)
    with pytest.raises(Rejected) as raised:
        asyncio.run(SqlReader(Settings(), engine, engine).read(lambda conn: "read"))
    assert raised.value.__cause__ is refused


def test_scoped_index_raises_ours_when_opensearch_is_unreachable() -> None:
    async def search() -> None:
        client = AsyncOpenSearch(hosts=[f"http://127.0.0.1:{_closed_port()}"], max_retries=0, timeout=5)
        try:
            with pytest.raises(SearchUnavailable) as raised:
                await ScopedIndex(client, "ki-chunks", None, SearchMetrics()).search({"query": {"match_all": {}}})
            assert isinstance(raised.value.__cause__, OpenSearchException)
        finally:
            await client.close()

    asyncio.run(search())


def test_kafka_admin_calls_raise_ours_when_no_broker_answers() -> None:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{_closed_port()}", "log_level": 0})
    with pytest.raises(Unavailable) as raised:
        topic_partitions(admin, ["ki.anything"], timeout_s=0.5)
    assert raised.value.service == "kafka"
    assert isinstance(raised.value.__cause__, KafkaException)


def test_embedding_client_raises_ours_when_the_service_is_unreachable() -> None:
    embedder = HttpEmbedder(
        url=f"http://127.0.0.1:{_closed_port()}/v1", model="m", dimensions=4, retries=0, timeout_s=5
    )
    with pytest.raises(EmbeddingUnavailable) as raised:
        embedder.embed_queries(["Mietvertrag"])
    causes = []
    cause = raised.value.__cause__
    while cause is not None:  # the attempt's error, chained to urllib's own
        causes.append(cause)
        cause = cause.__cause__
    assert isinstance(causes[-1], OSError)  # urllib's URLError


# The modules that work through the ports: they see `ki.errors` only.
PORT_USERS = sorted(
    [*(ROOT / "search" / "stages").glob("*.py")]
    + [ROOT / "search" / f"{name}.py" for name in ("pipeline", "plan", "ports", "reads", "service", "operations")]
    + [ROOT / "search" / "web" / "errors.py"]
)
CLIENT_LIBRARIES = ("sqlalchemy", "psycopg", "opensearchpy", "confluent_kafka", "aiokafka", "aiohttp", "urllib",
                    "faust")  # fmt: skip


def _foreign_exception_names(tree: ast.AST) -> list[str]:
    """Exception types a module imports from a client library, or names through its module (`aiohttp.X`)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLIENT_LIBRARIES:
            exceptions_module = (node.module or "").endswith((".exc", ".exceptions", ".errors", ".error"))
            found += [f"{node.module}.{a.name}" for a in node.names
                      if exceptions_module or a.name.endswith(("Error", "Exception"))]  # fmt: skip
        elif isinstance(node, ast.Attribute) and node.attr.endswith(("Error", "Exception")):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in CLIENT_LIBRARIES:
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", PORT_USERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_ports_users_neither_catch_nor_name_a_client_librarys_exceptions(path: Path) -> None:
    assert _foreign_exception_names(ast.parse(path.read_text(), str(path))) == []


def test_the_source_check_finds_a_foreign_exception() -> None:
    caught = "from sqlalchemy.exc import DBAPIError\ntry:\n    pass\nexcept aiohttp.ClientError:\n    pass\n"
    assert _foreign_exception_names(ast.parse(caught)) == ["sqlalchemy.exc.DBAPIError", "aiohttp.ClientError"]

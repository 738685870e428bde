"""The one exception tree: every error this project raises on purpose is a `KiError`.

Whether retrying can help is decided by the TYPE, never by reading a message:

    KiError
    ├── TransientError          goes away by itself; retry later (the worker retries forever, the API says 503/429)
    │   ├── Unavailable         a service we depend on did not answer (unreachable, timed out, 429/5xx); `.service`
    │   │   ├── SearchUnavailable           OpenSearch
    │   │   ├── ConnectionLost              a pooled PostgreSQL connection the server had closed
    │   │   ├── RerankUnavailable           the rerank gateway (search/ranking/rerank.py)
    │   │   └── EmbeddingUnavailable        the embedding service, after its own retries (ki/embedding)
    │   ├── Overloaded          the search API is at capacity (search/web/admission.py)
    │   ├── BulkThrottled       bulk items still answered 429/5xx after our retries (also a BulkError)
    │   └── IndexReadOnly       the index refuses writes (a block: flood-stage disk, or set by an operator)
    └── PermanentError          retrying the same thing fails the same way
        ├── SettingsError       settings or a config file are invalid
        ├── RequestInvalid      a caller's request is invalid; `.field` names the field (search/request.py)
        │   ├── WindowTooDeep               offset + limit beyond the ranked window (search/request.py)
        │   ├── SemanticUnavailable         a mode that needs vectors where there are none (search/plan.py)
        │   └── QueryTooManyTerms           OpenSearch refused the query text for its clause count (by type)
        ├── AuthError           missing or invalid credentials (search/web/auth.py)
        ├── Rejected            a service answered and refused (4xx, 500, a non-retriable Kafka error); `.service`
        ├── AlreadyExists       what we create exists already (a topic, an index): often fine, a concurrent creator
        ├── IndexSchemaError    the live index cannot hold what we write (dimension, analyzer, embedding)
        ├── BulkRejected        bulk items the index refused, e.g. 400 mapper_parsing_exception (also a BulkError)
        ├── PoisonEvent         a change event that can never be applied: dead-lettered (projections/cdc.py)
        ├── GaveUp              a lane stopped retrying a batch: it is dead-lettered with `.attempts` (streams/batch.py)
        ├── SelectionError      a `ki dlq` --key / --all that selects nothing to act on (streams/dead_letters.py)
        ├── EmbeddingError      the embedder cannot give a valid vector (ki/embedding); E5FormatError
        ├── ReportInvalid       an eval report that cannot serve as evidence (search/ranking/mode_gate.py)
        └── the applications' one-line errors: CliError, StackError, EvalError, BenchError, DataError,
            IsolationError (apps/)

Leaves that one module raises live in that module; the categories several modules share live here.
Foreign exceptions (opensearch-py, confluent-kafka, SQLAlchemy) become these types in one function per
library in `ki.clients`, beside the code that builds those clients, and where a client is called (the adapter
behind a port: `search.ports.SqlReader`, `search.ranking.scoped.ScopedIndex`, `search.consistency`,
`ki.kafka_offsets`, ...) through that library's context manager there (`database_errors`, `opensearch_errors`,
`kafka_errors`), so no foreign exception crosses a port; aiohttp's in `search/ranking/rerank.py`, the one
aiohttp client; urllib's and the model runtime's in `ki/embedding`. The search API maps the tree to HTTP in one
table (`search/web/errors.py`) and sees nothing else.

This module imports nothing but the standard library, so every layer (also the pure `projections/`) may
use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class KiError(Exception):
    """Root of every error raised on purpose here; its message is one readable line."""


class TransientError(KiError):
    """A failure that goes away by itself: a service restarting, overload, a dropped connection."""


class PermanentError(KiError):
    """A failure that retrying the same thing repeats: bad settings, bad input, data a service refuses."""


# -- transient -----------------------------------------------------------------------------------


class Unavailable(TransientError):
    """A service we depend on did not answer: unreachable, timed out, or answered 429/5xx."""

    service = "service"

    def __init__(self, message: str, *, service: str | None = None) -> None:
        if service is not None:
            self.service = service
        super().__init__(message)


class SearchUnavailable(Unavailable):
    """OpenSearch could not answer (unreachable, timed out, overloaded, a shard failing)."""

    service = "opensearch"


class WriteContention(TransientError):
    """Rows kept losing write races to other writers (the other lanes, other workers) for a sync's bounded
    rounds: contention, which passes as the writers move on, never a fault of the records themselves, so
    the batch is retried with backoff and never dead-lettered."""


class ConnectionLost(Unavailable):
    """A pooled PostgreSQL connection that the server had closed meanwhile (a restart, an idle timeout): the
    pool replaces it, so the same read on a fresh connection can succeed at once (`search.ports.SqlReader`)."""

    service = "postgresql"


# -- permanent -----------------------------------------------------------------------------------


class SettingsError(PermanentError):
    """Invalid configuration; the message is one readable line naming the key."""


class RequestInvalid(PermanentError):
    """A caller's request failed validation; `field` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


class QueryTooManyTerms(RequestInvalid):
    """OpenSearch refused a query for too many clauses (`indices.query.bool.max_clause_count`): the query
    text has more distinct terms than one query may match. The caller's input, so a 400 naming `query`,
    not a 500 for a refusal we caused."""

    def __init__(self) -> None:
        super().__init__("query", "has more distinct terms than the search index matches in one query; shorten it")


class Rejected(PermanentError):
    """A service answered and refused the request (4xx, 500, a non-retriable error): sent again, it
    is refused again. Usually a bug or data the service cannot take; `service` names who refused."""

    def __init__(self, message: str, *, service: str) -> None:
        self.service = service
        super().__init__(message)


class AlreadyExists(PermanentError):
    """What we asked a service to create exists already (a Kafka topic, an OpenSearch index)."""

    def __init__(self, message: str, *, service: str) -> None:
        self.service = service
        super().__init__(message)


class IndexSchemaError(PermanentError):
    """The live index cannot hold what we write (e.g. another embedding dimension or analyzer)."""


# -- bulk writes ---------------------------------------------------------------------------------

# OpenSearch error types (anywhere in the error: `caused_by`, `root_cause`, a shard's failure) that say the
# query has more clauses than Lucene's maxClauseCount; OpenSearch 2.x wraps them in a 400
# `search_phase_execution_exception`, so the top-level type alone does not tell.
TOO_MANY_CLAUSES_TYPES = frozenset({"too_many_clauses", "too_many_nested_clauses"})


def error_types(error: object, depth: int = 8) -> set[str]:
    """Every `type` in an OpenSearch error object and the objects nested in it (`depth` levels at most)."""
    if depth <= 0:
        return set()
    if isinstance(error, list):
        return set().union(*(error_types(item, depth - 1) for item in error))
    if not isinstance(error, dict):
        return set()
    found = {error["type"]} if isinstance(error.get("type"), str) else set()
    return found.union(*(error_types(value, depth - 1) for value in error.values()))


# HTTP statuses a bulk item (or any OpenSearch request) may succeed with later: overload and gateways.
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
# OpenSearch error types that say the index (or cluster) refuses writes for now: a block such as the one
# the flood-stage disk watermark sets (`index.blocks.read_only_allow_delete`, answered 429 by OpenSearch 2.x,
# 403 by older versions) or one an operator set (`index.blocks.write`, `read_only`: 403). Not the data's
# fault: a lane pauses until the block is lifted (streams.batch), never dead-letters.
WRITE_BLOCK_TYPES = frozenset({"cluster_block_exception", "index_create_block_exception"})
# OpenSearch error types that go away by themselves whatever their status: an index the sync worker has
# not created yet (it does so with its first write), or one a rebuild is about to point the alias at.
TRANSIENT_TYPES = frozenset({"index_not_found_exception"})


@dataclass(frozen=True)
class ItemFailure:
    """What OpenSearch answered for one bulk item, one `_msearch` leg or one request it did not serve: the
    HTTP status and error type (e.g. 400 `mapper_parsing_exception`, 429 `es_rejected_execution_exception`)
    decide whether it is transient; the human-readable reason is only shown."""

    status: int
    type: str = ""
    reason: str = ""

    @property
    def transient(self) -> bool:
        return self.status in RETRYABLE_STATUS or self.type in TRANSIENT_TYPES

    @property
    def write_blocked(self) -> bool:
        """The index refuses writes for now (a block), whatever the status it was answered with."""
        return self.type in WRITE_BLOCK_TYPES

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.reason}".strip().removesuffix(":")


class BulkError(KiError):
    """Some bulk items failed for a reason other than a version conflict; `failures` by document id.

    Never raised itself: `bulk_error` picks `BulkThrottled` or `BulkRejected` from the items' statuses."""

    def __init__(self, failures: Mapping[str, ItemFailure]) -> None:
        self.failures = dict(failures)
        shown = ", ".join(f"{doc_id}: {failure}" for doc_id, failure in list(self.failures.items())[:5])
        more = f" (+{len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        super().__init__(f"bulk write failed for {len(self.failures)} item(s): {shown}{more}")


class BulkThrottled(BulkError, TransientError):
    """Every failed item was answered 429/5xx (overload), still after our own retries."""


class BulkRejected(BulkError, PermanentError):
    """At least one item was refused for good (a mapping error, a document too large, ...)."""


class IndexReadOnly(TransientError):
    """The index refuses writes for now: a block (the flood-stage disk watermark's
    `index.blocks.read_only_allow_delete`, or one an operator set). Goes away when the block is lifted
    (OpenSearch lifts the flood-stage one once the disk is below the high watermark again): a sync lane
    pauses until then (streams.batch), and nothing is dead-lettered for it. `reason` is OpenSearch's."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"index read-only: {reason}")


def bulk_error(failures: Mapping[str, ItemFailure]) -> BulkError | IndexReadOnly:
    """The error for these failed items: `IndexReadOnly` if any was refused by a write block (the whole
    index refuses writes, whatever else failed), else transient only if every item failed transiently."""
    blocked = [failure for failure in failures.values() if failure.write_blocked]
    if blocked:
        return IndexReadOnly(str(blocked[0]))
    if all(failure.transient for failure in failures.values()):
        return BulkThrottled(failures)
    return BulkRejected(failures)

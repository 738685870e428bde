"""The one place that builds clients of the services from the settings object.

PostgreSQL engines (sync and asyncio), OpenSearch clients (sync and asyncio), Kafka admin and consumer
clients (the worker's own Kafka clients are Faust's). Everything that talks to a service gets its client
here, so connection options (and, later, TLS and credentials) are decided once.

It also decides how these clients' exceptions become ours (`ki.errors`): one function per library
(`opensearch_error`, `kafka_error`, `database_error`) reads the foreign exception's type, HTTP status or error
code, never its text; one context manager per library (`opensearch_errors`, `kafka_errors`,
`database_errors`) applies it where a client is called, the original chained as the cause; `as_ki_error` picks
the right one for any exception (for code that runs several clients, such as a lane's batch).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from opensearchpy import AsyncOpenSearch, OpenSearch
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import OpenSearchException, TransportError
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ki.errors import (
    TOO_MANY_CLAUSES_TYPES,
    AlreadyExists,
    ConnectionLost,
    IndexReadOnly,
    ItemFailure,
    KiError,
    QueryTooManyTerms,
    Rejected,
    SearchUnavailable,
    Unavailable,
    error_types,
)
from ki.settings import Settings

# Our statements are short and run often; PostgreSQL's JIT spends more compiling them (tens of ms) than
# it ever saves, so it is off for our sessions whatever the server default is.
_SESSION_OPTIONS = {"options": "-c jit=off"}


def _connect_args(settings: Settings, base: dict[str, str], given: dict[str, Any] | None) -> dict[str, Any]:
    """libpq parameters of a connection: the session options, TLS (database.ssl*), the caller's own."""
    return {**base, **settings.database.tls_parameters(), **(given or {})}


def make_engine(settings: Settings, *, pooled: bool = True, **kwargs: Any) -> Engine:
    """A synchronous engine (psycopg 3). `pooled=False` for one-shot tools such as migrations."""
    db = settings.database
    kwargs["connect_args"] = _connect_args(settings, _SESSION_OPTIONS, kwargs.get("connect_args"))
    if pooled:
        kwargs.setdefault("pool_size", db.pool_size)
        kwargs.setdefault("pool_pre_ping", True)
    else:
        kwargs.setdefault("poolclass", NullPool)
    return create_engine(db.url, **kwargs)


# For statements whose planning costs more than running them (the search's re-verify: ~2 ms of planning --
# the inlined principal normalisation -- for ~1 ms of execution), once psycopg has prepared them. And without
# sequential scans: those statements reach every row through an index from a few ids (a page's versions, a
# caller's principals), but the planner prices the principal fold of a stored row as a few operators
# (it costs ~3-4 us), so a membership or alias table of a few pages looked cheaper to scan once per
# principal than to probe -- the demo's re-verify of 30 versions 6.6-7.0 -> 3.4-4.6 ms without them.
_GENERIC_PLAN_OPTIONS = {"options": "-c jit=off -c plan_cache_mode=force_generic_plan -c enable_seqscan=off"}


def make_async_engine(settings: Settings, *, generic_plans: bool = False, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine on the same URL (psycopg 3 serves both), for the aiohttp API. `generic_plans`:
    prepared statements keep one plan (no planning per execution), planned for index probes only (the
    re-verify's engine, see `_GENERIC_PLAN_OPTIONS`)."""
    kwargs.setdefault("pool_size", settings.database.pool_size)
    kwargs.setdefault("pool_pre_ping", True)
    base = _GENERIC_PLAN_OPTIONS if generic_plans else _SESSION_OPTIONS
    kwargs["connect_args"] = _connect_args(settings, base, kwargs.get("connect_args"))
    return create_async_engine(settings.database.url, **kwargs)


def opensearch_options(settings: Settings) -> dict[str, Any]:
    """Credentials and TLS of the OpenSearch clients (opensearch.*); TLS follows the URL's scheme."""
    o = settings.opensearch
    options: dict[str, Any] = {"hosts": o.urls}
    if o.username:
        options["http_auth"] = (o.username, o.password)
    if o.url.startswith("https://"):
        options.update(use_ssl=True, verify_certs=o.verify_certs, ssl_show_warn=o.verify_certs)
        if o.ca_file:
            options["ca_certs"] = str(Path(o.ca_file).expanduser())
        if o.client_cert_file:
            options["client_cert"] = str(Path(o.client_cert_file).expanduser())
        if o.client_key_file:
            options["client_key"] = str(Path(o.client_key_file).expanduser())
    return options


def make_client(settings: Settings) -> AsyncOpenSearch:
    """The asyncio OpenSearch client of the sync writer and the search API."""
    return AsyncOpenSearch(
        **opensearch_options(settings),
        timeout=settings.opensearch.timeout_s,
        # Retries are ours (we also retry 429s and count them), but for one: a connection refused or reset goes
        # once more at once, to the next node of a cluster (the failed one is set aside), so a dead node costs
        # a search nothing but the refusal. Statuses are never retried here; timeouts neither.
        max_retries=1,
        retry_on_status=(),
        http_compress=settings.opensearch.http_compress,
    )


def make_sync_client(settings: Settings, *, timeout_s: float | None = None) -> OpenSearch:
    """A blocking OpenSearch client, for commands and status probes."""
    return OpenSearch(**opensearch_options(settings), timeout=timeout_s or settings.opensearch.timeout_s)


def kafka_security(settings: Settings) -> dict[str, str]:
    """librdkafka's TLS and SASL keys for kafka.* (nothing for PLAINTEXT)."""
    k = settings.kafka
    config: dict[str, str] = {}
    if k.security_protocol != "PLAINTEXT":
        config["security.protocol"] = k.security_protocol
    if k.uses_sasl:
        config.update({"sasl.mechanism": k.sasl_mechanism, "sasl.username": k.sasl_username,
                       "sasl.password": k.sasl_password})  # fmt: skip
    if k.uses_tls:
        files = {"ssl.ca.location": k.ssl_ca_file, "ssl.certificate.location": k.ssl_cert_file,
                 "ssl.key.location": k.ssl_key_file}  # fmt: skip
        config.update({key: str(Path(path).expanduser()) for key, path in files.items() if path})
    return config


def kafka_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the Python Kafka clients (the sync worker's), from the same kafka.ssl_* files."""
    k = settings.kafka
    if not k.uses_tls:
        return None
    context = ssl.create_default_context(cafile=str(Path(k.ssl_ca_file).expanduser()) if k.ssl_ca_file else None)
    if k.ssl_cert_file:
        key = str(Path(k.ssl_key_file).expanduser()) if k.ssl_key_file else None
        context.load_cert_chain(str(Path(k.ssl_cert_file).expanduser()), key)
    return context


#: librdkafka's own log lines (a broker refused, a handshake failed) go through logging, served when a client
#: polls, instead of straight to stderr from its threads: a long-running process logs them as it logs
#: anything, a command's one error line is not buried under them.
LIBRDKAFKA_LOG = logging.getLogger("ki.kafka.librdkafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())  # shown where a process configures logging, else not at all


def kafka_config(settings: Settings, **options: Any) -> dict[str, Any]:
    """librdkafka configuration for this stack's brokers (with TLS and SASL), plus the caller's options."""
    return {"bootstrap.servers": settings.kafka.bootstrap_servers, "logger": LIBRDKAFKA_LOG,
            **kafka_security(settings), **options}  # fmt: skip


# What librdkafka reports, through its error callback, when the brokers cannot be used at all.
_KAFKA_REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED})


def kafka_refusal(settings: Settings, timeout_s: float = 10.0) -> str | None:
    """Why the brokers refuse this configuration (SASL authentication, the TLS handshake), or None.

    A client's request only times out when a broker refuses its credentials or certificate; the reason
    comes through librdkafka's error callback, served while a client polls. This asks once more and waits
    for it (for the one line a command prints)."""
    refusals: list[KafkaError] = []

    def remember(error: KafkaError) -> None:
        if error.code() in _KAFKA_REFUSED:
            refusals.append(error)

    try:
        admin = AdminClient(kafka_config(settings, error_cb=remember))
    except KafkaException as exc:  # e.g. an unreadable CA file
        return str(exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc)
    deadline = time.monotonic() + timeout_s
    while not refusals and time.monotonic() < deadline:
        admin.poll(0.1)
    return refusals[0].str() if refusals else None


def make_kafka_admin(settings: Settings, **options: Any) -> AdminClient:
    return AdminClient(kafka_config(settings, **options))


def make_kafka_consumer(settings: Settings, group_id: str, **options: Any) -> Consumer:
    return Consumer(kafka_config(settings, **{"group.id": group_id, **options}))


# -- their failures, as ours ---------------------------------------------------------------------


def _reason(exc: TransportError) -> str:
    """The `error.reason` of an OpenSearch error body, for showing only (empty when there is none)."""
    body = exc.args[2] if len(exc.args) > 2 else None
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("reason", "")) if isinstance(error, dict) else ""


def opensearch_error(exc: OpenSearchException) -> KiError:
    """A write block on the index (`cluster_block_exception`, e.g. the flood-stage disk watermark's, whatever
    its status): `IndexReadOnly`; unreachable, timed out, 429/5xx or no index (yet): `SearchUnavailable`; an
    existing index: `AlreadyExists`; a query with more clauses than one query may hold: `QueryTooManyTerms`
    (the caller's query text, by the error types in the body); any other refusal (4xx, 500, a body it cannot
    read): `Rejected`."""
    if isinstance(exc, OpenSearchConnectionError):  # also ConnectionTimeout and SSLError
        return SearchUnavailable(f"OpenSearch unreachable: {exc}")
    if isinstance(exc, TransportError):
        status = exc.status_code
        if isinstance(status, int) and ItemFailure(status, str(exc.error)).write_blocked:
            return IndexReadOnly(f"{status} {exc.error}: {_reason(exc)}")
        if not isinstance(status, int) or ItemFailure(status, str(exc.error)).transient:
            return SearchUnavailable(f"OpenSearch answered {status}: {exc.error}")
        if exc.error == "resource_already_exists_exception":
            return AlreadyExists(f"OpenSearch: {exc}", service="opensearch")
        body = exc.args[2] if len(exc.args) > 2 else None  # `exc.info`, which raises when the body is missing
        if isinstance(body, dict) and error_types(body.get("error")) & TOO_MANY_CLAUSES_TYPES:
            return QueryTooManyTerms()
    return Rejected(f"OpenSearch refused: {type(exc).__name__}: {exc}", service="opensearch")


# librdkafka sets `retriable()` only on some errors; these codes mean a broker or the network is away.
_KAFKA_AWAY = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def kafka_error(exc: KafkaException | KafkaError) -> KiError:
    """By the error code: an existing topic is `AlreadyExists`, a broker away `Unavailable`, else `Rejected`."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if not isinstance(error, KafkaError):
        return Rejected(f"Kafka: {exc}", service="kafka")
    if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
        return AlreadyExists(f"Kafka: {error.str()}", service="kafka")
    if error.retriable() or error.code() in _KAFKA_AWAY:
        return Unavailable(f"Kafka: {error.name()}: {error.str()}", service="kafka")
    return Rejected(f"Kafka: {error.name()}: {error.str()}", service="kafka")


def database_error(exc: SQLAlchemyError) -> KiError:
    """A pooled connection the server had closed is `ConnectionLost`; a refused connection, a pool timeout, a
    restarting server (SQLAlchemy's `OperationalError` and `InterfaceError`) are `Unavailable`; anything else
    PostgreSQL refuses is `Rejected`."""
    message = f"PostgreSQL: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return ConnectionLost(message)
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout):
        return Unavailable(message, service="postgresql")
    return Rejected(message, service="postgresql")


@contextmanager
def _as_ours(foreign: type[Exception], mapped: Callable[[Any], KiError]) -> Iterator[None]:
    try:
        yield
    except foreign as exc:
        raise mapped(exc) from exc


def database_errors() -> AbstractContextManager[None]:
    """Around PostgreSQL calls: SQLAlchemy's exceptions come out as ours (`database_error`), theirs chained."""
    return _as_ours(SQLAlchemyError, database_error)


def opensearch_errors() -> AbstractContextManager[None]:
    """Around OpenSearch calls: opensearch-py's exceptions come out as ours (`opensearch_error`), theirs chained."""
    return _as_ours(OpenSearchException, opensearch_error)


def kafka_errors() -> AbstractContextManager[None]:
    """Around Kafka admin and client calls: confluent-kafka's exceptions come out as ours (`kafka_error`), theirs
    chained."""
    return _as_ours(KafkaException, kafka_error)


def as_ki_error(exc: BaseException) -> KiError | None:
    """Our error for `exc`: itself if it is one, the mapped error of a client library's exception, an
    `Unavailable` for a dropped connection or a time-out, None for anything else (that is a bug)."""
    if isinstance(exc, KiError):
        return exc
    if isinstance(exc, OpenSearchException):
        return opensearch_error(exc)
    if isinstance(exc, KafkaException):
        return kafka_error(exc)
    if isinstance(exc, SQLAlchemyError):
        return database_error(exc)
    if isinstance(exc, ConnectionError | TimeoutError):
        return Unavailable(f"{type(exc).__name__}: {exc}", service="network")
    return None

"""The one OpenSearch writer of the core: the chunk index's lifecycle and the single `_bulk` code path.

Every row the sync worker, rebuild, backfill and reconcile write goes through `IndexWriter.bulk`, and every
change they make to an index itself (create, mapping, alias swap, refresh interval, refresh, deleting a
retired index) through the `IndexWriter` methods below; `streams.replay` holds no OpenSearch client calls
of its own. Row writes are conditional (`if_seq_no`/`if_primary_term`, or `create` for new ids): the sync
reads the index *before* it reads PostgreSQL, so a write based on an older read of PostgreSQL can never
overwrite a newer one — it comes back as a version conflict and that version is simply projected again.
(Developer tooling in `apps.dev` — benchmarks, `ki eval` — still deletes its own scratch indices and rows
directly.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import NotFoundError, OpenSearchException, TransportError

from ki.backoff import Backoff
from ki.clients import opensearch_error
from ki.errors import (
    AlreadyExists,
    IndexReadOnly,
    IndexSchemaError,
    ItemFailure,
    SearchUnavailable,
    TransientError,
    bulk_error,
)
from ki.settings import Settings
from projections.mapping import (
    analyzer_mismatch,
    conflicting_fields,
    dimension_mismatch,
    embedding_signature_of,
    index_body,
    missing_fields,
    physical_index_name,
    text_analysis,
)
from projections.plan import VECTOR_PENDING

log = logging.getLogger(__name__)

OPENSEARCH_BACKOFF = Backoff(base_s=0.2, max_s=10.0)

# Rows fetched per search when reading what is indexed (the index.max_result_window default).
EXISTING_PAGE = 10_000
OpKind = Literal["index", "create", "update", "delete"]
# Keys looked up per search for vector reuse (one hit per key), at most the index's max_terms_count.
REUSE_PAGE = 1_000
# Values per "which versions are indexed" lookup: a few rows per version keep its versions within one
# aggregation's buckets.
LOOKUP_TERMS = 10_000


def reuse_query(embedding_keys: Sequence[str]) -> dict[str, Any]:
    """One row per key among these (any row with a vector: equal keys carry equal vectors), with its vector."""
    return {
        "query": {
            "bool": {
                "filter": {"terms": {"embedding_key": list(embedding_keys)}},
                "must_not": {"exists": {"field": VECTOR_PENDING}},  # a text row has no vector yet
            }
        },
        "collapse": {"field": "embedding_key"},
        "_source": {"includes": ["embedding_key", "embedding"]},
        "size": len(embedding_keys),
        "track_total_hits": False,
    }


def pending_vectors_query() -> dict[str, Any]:
    """How many rows wait for their vector, and since when the oldest does."""
    return {
        "size": 0,
        "track_total_hits": True,
        "query": {"exists": {"field": VECTOR_PENDING}},
        "aggs": {"oldest": {"min": {"field": VECTOR_PENDING}}},
    }


def pending_vectors_of(response: dict[str, Any], now: float | None = None) -> tuple[int, float]:
    """(rows waiting, seconds the oldest has waited) from the answer to `pending_vectors_query`."""
    waiting = int(response["hits"]["total"]["value"])
    oldest_ms = (response.get("aggregations") or {}).get("oldest", {}).get("value")
    if not waiting or oldest_ms is None:
        return waiting, 0.0
    return waiting, max(0.0, (now if now is not None else time.time()) - oldest_ms / 1000)


async def indices_with_signature(client: AsyncOpenSearch, names: Sequence[str], signature: str) -> list[str]:
    """The physical indices among `names` (indices, aliases, patterns) that record this embedding signature:
    those whose stored vectors are exactly what this embedder returns for the same string. Missing names
    are skipped; an index the login may not read leaves the list as it is (a vector is then embedded)."""
    if not names:
        return []
    try:
        mappings = await client.indices.get_mapping(
            index=",".join(names), params={"ignore_unavailable": "true", "allow_no_indices": "true"}
        )
    except OpenSearchException as exc:
        log.warning("vector sources %s not readable (%s): their vectors are not reused", list(names), exc)
        return []
    return sorted(name for name, body in mappings.items() if embedding_signature_of(body["mappings"]) == signature)


@dataclass(frozen=True)
class BulkOp:
    kind: OpKind
    doc_id: str
    body: dict[str, Any] | None = None
    if_seq_no: int | None = None
    if_primary_term: int | None = None
    group: str = ""  # what to re-project on a conflict (a version id)

    def lines(self, index: str) -> list[dict[str, Any]]:
        meta: dict[str, Any] = {"_index": index, "_id": self.doc_id}
        if self.if_seq_no is not None:
            meta["if_seq_no"] = self.if_seq_no
            meta["if_primary_term"] = self.if_primary_term
        if self.kind == "delete":
            return [{"delete": meta}]
        if self.kind == "update":
            return [{"update": meta}, {"doc": self.body}]
        return [{self.kind: meta}, self.body or {}]


@dataclass
class BulkResult:
    written: int = 0
    conflicts: set[str] = field(default_factory=set)  # groups whose write lost a race


@dataclass(frozen=True)
class ExistingRow:
    doc_id: str
    seq_no: int
    primary_term: int
    content_hash: str
    access_version: int
    source: dict[str, Any]


def interval_seconds(interval: str) -> float:
    """An OpenSearch time value ("1s", "500ms", "1m") in seconds; -1 (never refresh) as infinity."""
    value = interval.strip()
    if value.startswith("-"):
        return float("inf")
    for unit, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0)):
        if value.endswith(unit) and value[: -len(unit)].replace(".", "", 1).isdigit():
            return float(value[: -len(unit)]) * factor
    raise ValueError(f"not an OpenSearch time value: {interval!r}")


def _ndjson(lines: list[dict[str, Any]]) -> bytes:
    """An op's `_bulk` lines as sent, encoded once: its size decides the batches, and the batch's body is the
    ops' bytes joined (the client would otherwise encode every line again)."""
    return "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode()


SLOW_REFRESH_S = 0.3


class IndexWriter:
    def __init__(
        self,
        client: AsyncOpenSearch,
        settings: Settings,
        *,
        index: str | None = None,
        vector_sources: Sequence[str] = (),
        waits_for_refresh: bool = False,
    ) -> None:
        self.client = client
        self.settings = settings
        self.alias = settings.retrieval.index_name
        # Writes go to an explicit physical index during a rebuild, otherwise to the alias.
        self.index = index or self.alias
        # Where stored vectors are looked up: the index written, and during a rebuild the live index it
        # replaces when that one holds the same embedding signature (its vectors are exactly ours).
        self.vector_indices = ",".join(dict.fromkeys([self.index, *vector_sources]))
        self.keying: asyncio.Future[int] | None = None  # the keying of an older index's rows, while it runs
        self.bulk_seconds: list[float] = []
        # Versions this writer wrote that the index's periodic refresh may not have published yet. Reads
        # go through search, which only sees refreshed data: reading such a version would hand out an old
        # seq_no, the conditional write would lose a race against ourselves, and the batch would be redone.
        self._unpublished: dict[int, float] = {}
        self._publish_after_s = interval_seconds(settings.opensearch.refresh_interval) * 1.5
        # `waits_for_refresh` (the principals lane, which rewrites the same versions several times a second): each
        # `_bulk` returns once the index's periodic refresh has published it (`refresh=wait_for`), so its next
        # read needs no forced refresh; forcing one per batch wrote a segment per batch into an index under load.
        # Not when periodic refreshes are off: nothing would publish the write.
        self.waits_for_refresh = waits_for_refresh and math.isfinite(self._publish_after_s)

    # -- lifecycle -----------------------------------------------------------------------------

    async def ensure_index(self, embedding_signature: str) -> str:
        """The index behind the alias, checked and extended; a fresh one behind the alias if there is none.

        After `ki rebuild` the alias points at a generation of the physical index (`…--{generation}`):
        that index is the live one, so it is checked, never shadowed by a new empty index."""
        expected = physical_index_name(self.settings, embedding_signature)
        # Aliases are read through the alias itself (`/{alias}/_alias/{alias}`), never `/_alias/{alias}`
        # (every index): a login confined to the ki indices may not look at other indices' aliases.
        if await self.client.indices.exists_alias(index=self.alias, name=self.alias):
            targets = sorted((await self.client.indices.get_alias(index=self.alias, name=self.alias)).keys())
        else:
            if not await self.client.indices.exists(index=expected):
                await self.create_physical(expected, embedding_signature)
            else:  # another lane's, perhaps created a moment ago
                await self.wait_for_primaries(expected)
            await self.client.indices.update_aliases(
                body={"actions": [{"add": {"index": expected, "alias": self.alias}}]}
            )
            targets = [expected]
        wanted = index_body(self.settings)["mappings"]
        for target in targets:
            if target != expected and not target.startswith(expected + "--"):
                raise IndexSchemaError(
                    f"alias {self.alias} points at {target}, built for another embedding or analyzer than"
                    f" these settings ({expected}); run `ki rebuild` to build and swap in a matching index"
                )
            live = (await self.client.indices.get_mapping(index=target))[target]["mappings"]
            live_settings = (await self.client.indices.get_settings(index=target))[target]
            problem = dimension_mismatch(live, self.settings.retrieval.embedding_dimensions) or analyzer_mismatch(
                live, self.settings.retrieval.text_analyzer, text_analysis(self.settings), live_settings
            )
            conflicts = conflicting_fields(live, wanted)
            if conflicts and not problem:
                problem = (
                    f"field(s) {', '.join(conflicts)} have another type than these settings map;"
                    " run `ki rebuild` to build and swap in a matching index"
                )
            if problem:
                raise IndexSchemaError(f"{target}: {problem}")
            extra = missing_fields(live, wanted)
            if extra:
                log.info("adding %d missing mapped field(s) to %s: %s", len(extra), target, sorted(extra))
                await self.client.indices.put_mapping(index=target, body={"properties": extra})
            if "embedding_key" in extra:  # an index from before vector reuse: key its rows meanwhile
                self.keying = asyncio.ensure_future(self.key_older_rows(target))
            if embedding_signature_of(live) is None:  # an index from before it was recorded; checked above
                meta = {"embedding_signature": embedding_signature}
                await self.client.indices.put_mapping(index=target, body={"_meta": meta})
        return targets[0]

    async def key_older_rows(self, target: str) -> int:
        """Give rows written before `embedding_key` existed their key (`meta.content_hash`), page by page,
        each a conditional partial update: a row the sync rewrote meanwhile conflicts and already has it.
        Answers the rows keyed."""
        keyed = 0
        body = {
            "query": {"bool": {"must_not": {"exists": {"field": "embedding_key"}}}},
            "_source": {"includes": ["meta.content_hash"]},
            "seq_no_primary_term": True,
            "size": EXISTING_PAGE,
        }
        while True:
            await self.client.indices.refresh(index=target)
            response = await self._with_retries(lambda: self.client.search(index=target, body=body))
            ops = [
                BulkOp("update", hit["_id"], {"embedding_key": digest}, hit["_seq_no"], hit["_primary_term"])
                for hit in response["hits"]["hits"]
                if (digest := ((hit.get("_source") or {}).get("meta") or {}).get("content_hash"))
            ]
            if not ops:
                return keyed
            result = await IndexWriter(self.client, self.settings, index=target).bulk(ops)
            keyed += result.written
            log.info("keyed %d older row(s) of %s for vector reuse", keyed, target)
            if not result.written:
                return keyed  # only conflicts left: those rows were rewritten, with their key

    async def create_physical(self, physical: str, embedding_signature: str | None = None) -> None:
        """Create the index and return once its primary shards are active, whoever created it."""
        try:
            await self.client.indices.create(index=physical, body=index_body(self.settings, embedding_signature))
        except OpenSearchException as exc:
            error = opensearch_error(exc)
            if not isinstance(error, AlreadyExists):  # another writer created it first: fine
                raise error from exc
        await self.wait_for_primaries(physical)

    async def wait_for_primaries(self, physical: str) -> None:
        """Return once the index's primary shards are active. The two lanes start together: the one that did not
        create the index finds it (or hears "already exists") before the creator's primary shard has started,
        and an alias pointed at it then would answer every search with 503 (all shards failed) until it has."""
        # OpenSearch's `timeout` within the client's: opensearch-py reads `timeout` as the latter when it has no
        # `request_timeout`.
        request_s = self.settings.opensearch.timeout_s
        wait = f"{request_s / 2:g}s"
        for _ in range(self.settings.opensearch.max_retries + 1):
            health = await self._with_retries(lambda: self.client.cluster.health(
                index=physical, wait_for_status="yellow", timeout=wait, request_timeout=request_s, ignore=408
            ))  # fmt: skip
            if not health.get("timed_out"):
                return
            log.warning("opensearch: no primary shard of %s active after %s; waiting on", physical, wait)
        raise SearchUnavailable(f"OpenSearch: the primary shards of {physical} did not start")

    async def swap_alias(self, physical: str) -> list[str]:
        """Point the alias at `physical` atomically; return the indices it pointed at before."""
        try:
            current = list((await self.client.indices.get_alias(index=self.alias, name=self.alias)).keys())
        except NotFoundError:
            current = []
        actions: list[dict[str, Any]] = [{"remove": {"index": old, "alias": self.alias}} for old in current]
        actions.append({"add": {"index": physical, "alias": self.alias}})
        await self.client.indices.update_aliases(body={"actions": actions})
        return [old for old in current if old != physical]

    async def pause_refresh(self) -> None:
        """No periodic refresh of the index written (for an index nobody searches yet, while it is loaded:
        each refresh would write a segment and build its HNSW graph); `resume_refresh` undoes it."""
        await self.client.indices.put_settings(index=self.index, body={"index": {"refresh_interval": "-1"}})

    async def resume_refresh(self) -> None:
        """The configured periodic refresh (`opensearch.refresh_interval`) on the index written again."""
        body = {"index": {"refresh_interval": self.settings.opensearch.refresh_interval}}
        await self.client.indices.put_settings(index=self.index, body=body)

    async def delete_index(self, physical: str) -> None:
        """Delete a physical index (one an alias swap retired); one already gone is fine."""
        await self.client.indices.delete(index=physical, ignore=(404,))

    async def refresh(self) -> None:
        started = time.monotonic()
        await self.client.indices.refresh(index=self.index)
        self._unpublished = {v: t for v, t in self._unpublished.items() if t > started}
        took = time.monotonic() - started
        if took >= SLOW_REFRESH_S:  # a forced refresh is on the lane's critical path: say when it is not cheap
            log.info("refresh of %s took %.2fs", self.index, took)

    async def _publish_own_writes(self, version_ids: Sequence[int]) -> None:
        """Refresh first if one of these versions was written by us and may not be searchable yet."""
        now = time.monotonic()
        self._unpublished = {v: t for v, t in self._unpublished.items() if now - t < self._publish_after_s}
        if any(v in self._unpublished for v in version_ids):
            await self.refresh()

    # -- reads ---------------------------------------------------------------------------------

    async def existing_rows(
        self, version_ids: Iterable[int], *, with_source: Sequence[str] = (), with_doc_values: Sequence[str] = ()
    ) -> dict[int, dict[str, ExistingRow]]:
        """Every indexed row of these versions, with the sequence numbers needed for conditional writes.

        `with_source` fields come from `_source` ("*": everything but the vector). `with_doc_values`
        fields (keyword and numeric fields only) come from doc values instead, which spares decompressing
        each row's `_source` with its vector: the access-only path reads nothing else."""
        ids = sorted({int(v) for v in version_ids})
        found: dict[int, dict[str, ExistingRow]] = {v: {} for v in ids}
        if not ids:
            return found
        await self._publish_own_writes(ids)
        if with_doc_values and not with_source:
            fields: dict[str, Any] = {
                "_source": False,
                "docvalue_fields": ["document_version_id", "access_version", *with_doc_values],
            }
        elif "*" in with_source:
            fields = {"_source": {"excludes": ["embedding"]}}
        else:
            included = ["document_version_id", "meta.content_hash", "access_version", *with_source]
            fields = {"_source": {"includes": included}}
        for start in range(0, len(ids), 1000):
            part = [str(v) for v in ids[start : start + 1000]]
            body = {
                "query": {"terms": {"document_version_id": part}},
                **fields,
                "seq_no_primary_term": True,
                "size": EXISTING_PAGE,
                "sort": ["_doc"],
                "track_total_hits": True,
            }
            # One round trip in the common case; a scroll only when the rows do not fit one page.
            response = await self._with_retries(lambda body=body: self.client.search(index=self.index, body=body))
            if response["hits"]["total"]["value"] <= len(response["hits"]["hits"]):
                self._collect(response["hits"]["hits"], found)
                continue
            response = await self._with_retries(
                lambda body=body: self.client.search(index=self.index, body=body, scroll="1m")
            )
            scroll_id = response.get("_scroll_id")
            try:
                while response["hits"]["hits"]:
                    self._collect(response["hits"]["hits"], found)
                    response = await self.client.scroll(body={"scroll_id": scroll_id, "scroll": "1m"})
                    scroll_id = response.get("_scroll_id")
            finally:
                if scroll_id:
                    await self.client.clear_scroll(body={"scroll_id": scroll_id}, ignore=(404,))
        return found

    @staticmethod
    def _collect(hits: Sequence[dict[str, Any]], found: dict[int, dict[str, ExistingRow]]) -> None:
        for hit in hits:
            if "_source" in hit:
                src = hit["_source"]
            else:  # doc values come as (sorted, de-duplicated) lists; a field without values is absent
                src = dict(hit.get("fields") or {})
                for single in ("document_version_id", "access_version"):
                    src[single] = (src.get(single) or [None])[0]
            row = ExistingRow(
                doc_id=hit["_id"],
                seq_no=hit["_seq_no"],
                primary_term=hit["_primary_term"],
                content_hash=(src.get("meta") or {}).get("content_hash", ""),
                access_version=int(src.get("access_version") or 0),
                source=src,
            )
            found[int(src["document_version_id"])][row.doc_id] = row

    async def vectors(self, doc_ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored embedding of these rows (a realtime get); rows that no longer exist are left out."""
        if not doc_ids:
            return {}
        response = await self._with_retries(
            lambda: self.client.mget(
                index=self.index, body={"ids": list(doc_ids)}, params={"_source_includes": "embedding"}
            )
        )
        return {
            doc["_id"]: doc["_source"]["embedding"]
            for doc in response["docs"]
            if doc.get("found") and "embedding" in (doc.get("_source") or {})
        }

    async def reusable_vectors(self, embedding_keys: Iterable[str]) -> dict[str, list[float]]:
        """Stored vectors by the key of their embedded string (`embedding_key`), from any row of the
        vector indices: a new version repeating its predecessor's paragraphs, a clause another document
        holds word for word (header included), every row of a rebuild whose input did not change. One
        index holds one embedding signature, so an equal key means exactly the vector the embedder would
        return. Best effort: a row that is not searchable yet is simply embedded."""
        wanted = sorted(set(embedding_keys))
        found: dict[str, list[float]] = {}
        page = min(REUSE_PAGE, self.settings.opensearch.max_terms_count)
        for start in range(0, len(wanted), page):
            body = reuse_query(wanted[start : start + page])
            response = await self._with_retries(
                lambda body=body: self.client.search(
                    index=self.vector_indices, body=body, params={"ignore_unavailable": "true"}
                )
            )
            for hit in response["hits"]["hits"]:
                source = hit.get("_source") or {}
                if isinstance(source.get("embedding"), list):
                    found[source["embedding_key"]] = source["embedding"]
        return found

    async def pending_vectors(self) -> tuple[int, float]:
        """Rows written text first that still wait for their vector, and the oldest one's wait in seconds."""
        body = pending_vectors_query()
        response = await self._with_retries(lambda: self.client.search(index=self.index, body=body))
        return pending_vectors_of(response)

    async def all_indexed_versions(self) -> set[int]:
        """Every version id with rows in the index written (one aggregation, up to a million versions)."""
        body = {"size": 0, "aggs": {"versions": {"terms": {"field": "document_version_id", "size": 1_000_000}}}}
        response = await self.client.search(index=self.index, body=body)
        return {int(b["key"]) for b in response["aggregations"]["versions"]["buckets"]}

    async def indexed_versions(self, field_name: str, values: Iterable[int]) -> set[int]:
        """Version ids that have rows whose `field_name` is one of `values` (e.g. a deleted document). Asked
        LOOKUP_TERMS values at a time: a terms query takes at most `index.max_terms_count` (65,536) values,
        and the versions one lookup finds must fit its aggregation (a 1M-chunk corpus has 156k versions)."""
        terms = sorted({str(v) for v in values})
        found: set[int] = set()
        for start in range(0, len(terms), LOOKUP_TERMS):
            body = {
                "size": 0,
                "query": {"terms": {field_name: terms[start : start + LOOKUP_TERMS]}},
                "aggs": {"versions": {"terms": {"field": "document_version_id", "size": 65_535}}},
            }
            response = await self._with_retries(lambda body=body: self.client.search(index=self.index, body=body))
            found |= {int(bucket["key"]) for bucket in response["aggregations"]["versions"]["buckets"]}
        return found

    # -- the single write path -----------------------------------------------------------------

    async def bulk(self, ops: Sequence[BulkOp], *, refresh: bool = False) -> BulkResult:
        """Write `ops` in bounded batches. Conflicts are reported; any other failure raises (`bulk_error`):
        `IndexReadOnly` (transient) at once if an item met a write block (a full disk's flood stage),
        `BulkThrottled` (transient) if every failed item was still answered 429/5xx after our retries
        (back-pressure: a rejected execution, a full write queue), else `BulkRejected` (permanent)."""
        result = BulkResult()
        max_items = self.settings.streams.bulk_max_rows
        max_bytes = self.settings.streams.batch_max_bytes
        batch: list[BulkOp] = []
        encoded: list[bytes] = []
        size = 0
        for op in ops:
            op_bytes = _ndjson(op.lines(self.index))
            if batch and (len(batch) >= max_items or size + len(op_bytes) > max_bytes):
                await self._send(batch, encoded, result, refresh)
                batch, encoded, size = [], [], 0
            batch.append(op)
            encoded.append(op_bytes)
            size += len(op_bytes)
        if batch:
            await self._send(batch, encoded, result, refresh)
        return result

    async def _send(self, batch: list[BulkOp], encoded: list[bytes], result: BulkResult, refresh: bool) -> None:
        pending = batch
        body = b"".join(encoded)
        for attempt in range(self.settings.opensearch.max_retries + 1):
            started = time.perf_counter()
            response = await self._with_retries(
                lambda body=body, pending=pending: self._bulk_request(body, pending, refresh)
            )
            self.bulk_seconds.append(time.perf_counter() - started)
            retry: dict[str, tuple[BulkOp, ItemFailure]] = {}
            failures: dict[str, ItemFailure] = {}
            for op, item in zip(pending, response["items"], strict=True):
                outcome = item_outcome(op.kind, next(iter(item.values())))
                if isinstance(outcome, ItemFailure):
                    # A write block (flood-stage disk) is not retried here: the lane pauses until it is lifted.
                    if outcome.transient and not outcome.write_blocked:
                        retry[op.doc_id] = (op, outcome)
                    else:
                        failures[op.doc_id] = outcome
                elif outcome == "written":
                    result.written += 1
                    if op.group.isdigit() and not self.waits_for_refresh:  # published on return
                        self._unpublished[int(op.group)] = time.monotonic()
                else:
                    result.conflicts.add(op.group or op.doc_id)
            if failures:
                raise bulk_error(failures)
            if not retry:
                return
            if attempt == self.settings.opensearch.max_retries:
                raise bulk_error({doc_id: failure for doc_id, (_, failure) in retry.items()})
            delay = OPENSEARCH_BACKOFF.delay(attempt)
            log.warning("bulk: %d item(s) rejected with 429/5xx, retrying in %.1fs", len(retry), delay)
            await asyncio.sleep(delay)
            pending = [op for op, _ in retry.values()]
            body = b"".join(_ndjson(op.lines(self.index)) for op in pending)

    async def write_block(self) -> str | None:
        """The write block on the index written, if any (`index.blocks.*`: the flood-stage disk watermark's
        read_only_allow_delete, or read_only / write set by an operator); None: writes are not blocked."""
        response = await self.client.indices.get_settings(
            index=self.index, name="index.blocks.*", params={"flat_settings": "true"}
        )
        return write_block_of(response)

    async def _bulk_request(self, body: bytes, pending: Sequence[BulkOp], refresh: bool) -> dict[str, Any]:
        """One `_bulk`. OpenSearch pushing back on the request as a whole (429: shard indexing pressure's
        coordinating rejection, a full write queue) is answered as every item pushed back, so it takes the
        items' path: sent again with backoff, then `BulkThrottled` (a write block's 429 raises, as any refusal)."""
        try:
            publish = "true" if refresh else "wait_for" if self.waits_for_refresh else "false"
            response: dict[str, Any] = await self.client.bulk(body=body, params={"refresh": publish})
            return response
        except TransportError as exc:
            failure = ItemFailure(exc.status_code, str(exc.error)) if isinstance(exc.status_code, int) else None
            if failure is None or failure.status != 429 or failure.write_blocked:
                raise
            item = {"status": 429, "error": {"type": failure.type, "reason": "the _bulk request was rejected"}}
            return {"errors": True, "items": [{op.kind: item} for op in pending]}

    async def _with_retries(self, call: Any) -> Any:
        """Retry a request while its failure is transient (unreachable, 429/5xx; not a write block), with
        exponential backoff; raise the failure as a `ki.errors` type."""
        for attempt in range(self.settings.opensearch.max_retries + 1):
            try:
                return await call()
            except OpenSearchException as exc:
                error = opensearch_error(exc)
                # A write block is not waited out here: the lane pauses and checks it (streams.batch).
                last = attempt == self.settings.opensearch.max_retries
                if not isinstance(error, TransientError) or isinstance(error, IndexReadOnly) or last:
                    raise error from exc
            delay = OPENSEARCH_BACKOFF.delay(attempt)
            log.warning("opensearch: %s; retrying in %.1fs", error, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def item_outcome(kind: OpKind, outcome: dict[str, Any]) -> Literal["written", "conflict"] | ItemFailure:
    """What one `_bulk` item's answer means, by its status and error type (never its reason text).

    A 404 on a delete is written (gone either way); a 409, or a 404 on an update (the row was deleted
    after we read it), is a conflict: read again and project that version again. Anything else failed:
    `ItemFailure.transient` tells 429/5xx (retry) from a refusal (400 mapper_parsing_exception, ...)."""
    status = int(outcome.get("status", 500))
    if status < 300 or (kind == "delete" and status == 404):
        return "written"
    if status == 409 or (kind == "update" and status == 404):
        return "conflict"
    error = outcome.get("error")
    if isinstance(error, dict):
        return ItemFailure(status, str(error.get("type", "")), str(error.get("reason", "")))
    return ItemFailure(status, "", str(error or ""))


# The index settings that block writes, and what they mean to an operator.
WRITE_BLOCKS = {
    "index.blocks.read_only_allow_delete": "index read-only (flood stage: the disk is past its flood-stage watermark)",
    "index.blocks.read_only": "index read-only (index.blocks.read_only)",
    "index.blocks.write": "index refuses writes (index.blocks.write)",
}


def write_block_of(response: dict[str, Any]) -> str | None:
    """The first write block set on any index of a `GET {index}/_settings/index.blocks.*?flat_settings`
    answer (physical index -> settings), described; None when no index blocks writes."""
    for name in sorted(response):
        flat = (response[name] or {}).get("settings") or {}
        for setting, meaning in WRITE_BLOCKS.items():
            if str(flat.get(setting, "false")).lower() == "true":
                return f"{meaning} on {name}"
    return None

"""`IndexWriter.ensure_index` on the real OpenSearch: the alias's live index is checked and extended,
never shadowed by a new empty index, and a foreign or mismatched index is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from apps.dev.checkout import REPO_ROOT
from apps.runtime.processes import free_port
from ki.clients import make_client, make_engine, make_sync_client
from ki.errors import IndexSchemaError
from ki.settings import Settings, with_overrides
from projections.mapping import index_body, physical_index_name
from streams.app import EXIT_INDEX_MISMATCH
from streams.status import consumer_lag
from streams.writer import IndexWriter
from tests.conftest import wait_for

pytestmark = pytest.mark.stack

SIGNATURE = "test-embedder-384"


@pytest.fixture
def isolated(settings: Settings) -> Iterator[Settings]:
    """Settings with an alias of its own, so nothing here touches the main index; cleaned up after."""
    alias = f"lifecycle-{uuid.uuid4().hex[:8]}"
    own = with_overrides(settings, {"retrieval": {"index_name": alias}})
    yield own
    make_sync_client(settings).indices.delete(index=f"{alias}--*", ignore=[404])


def ensure(settings: Settings) -> str:
    async def run() -> str:
        client = make_client(settings)
        try:
            return await IndexWriter(client, settings).ensure_index(SIGNATURE)
        finally:
            await client.close()

    return asyncio.run(run())


def indices(settings: Settings) -> dict[str, Any]:
    search = make_sync_client(settings)
    return search.indices.get(index=f"{settings.retrieval.index_name}--*")


def test_a_fresh_alias_gets_the_signature_named_index(isolated: Settings) -> None:
    physical = ensure(isolated)
    assert physical == physical_index_name(isolated, SIGNATURE)
    assert list(indices(isolated)) == [physical]
    assert ensure(isolated) == physical  # idempotent


def test_after_a_rebuild_the_generation_behind_the_alias_stays_the_live_index(isolated: Settings) -> None:
    search = make_sync_client(isolated)
    rebuilt = physical_index_name(isolated, SIGNATURE, generation="20261129")
    search.indices.create(index=rebuilt, body=index_body(isolated))
    search.indices.update_aliases(
        body={"actions": [{"add": {"index": rebuilt, "alias": isolated.retrieval.index_name}}]}
    )
    assert ensure(isolated) == rebuilt
    assert list(indices(isolated)) == [rebuilt], "a restarted worker must not create an empty index beside it"


def test_missing_mapped_fields_are_added_to_the_live_index(isolated: Settings) -> None:
    search = make_sync_client(isolated)
    physical = physical_index_name(isolated, SIGNATURE)
    body = index_body(isolated)
    del body["mappings"]["properties"]["identifiers_text"]
    search.indices.create(index=physical, body=body)
    ensure(isolated)
    assert "identifiers_text" in search.indices.get_mapping(index=physical)[physical]["mappings"]["properties"]


def test_an_index_from_before_vector_reuse_records_its_embedder_and_keys_its_rows(isolated: Settings) -> None:
    search = make_sync_client(isolated)
    physical = physical_index_name(isolated, SIGNATURE)
    body = index_body(isolated)  # no embedding signature in _meta, no embedding_key field: as indices were
    del body["mappings"]["properties"]["embedding_key"]
    search.indices.create(index=physical, body=body)
    vector = [0.5] * isolated.retrieval.embedding_dimensions
    row = {"document_id": "1", "text": "alt", "meta": {"content_hash": "ab" * 32}, "embedding": vector}
    search.index(index=physical, id="1:chunk:0", body=row, refresh=True)

    async def start_up() -> int:  # as a worker starts: the index checked, its older rows keyed meanwhile
        client = make_client(isolated)
        try:
            writer = IndexWriter(client, isolated)
            await writer.ensure_index(SIGNATURE)
            assert writer.keying is not None
            return await writer.keying
        finally:
            await client.close()

    assert asyncio.run(start_up()) == 1
    mappings = search.indices.get_mapping(index=physical)[physical]["mappings"]
    assert mappings["_meta"] == {"embedding_signature": SIGNATURE}
    search.indices.refresh(index=physical)
    hits = search.search(index=physical, body={"query": {"term": {"embedding_key": "ab" * 32}}})["hits"]["hits"]
    assert [hit["_source"]["embedding"] for hit in hits] == [vector]


def test_a_field_mapped_with_another_type_is_refused(isolated: Settings) -> None:
    search = make_sync_client(isolated)
    physical = physical_index_name(isolated, SIGNATURE)
    body = index_body(isolated)
    body["mappings"]["properties"]["access_version"] = {"type": "keyword"}
    search.indices.create(index=physical, body=body)
    with pytest.raises(IndexSchemaError, match="access_version.*ki rebuild"):
        ensure(isolated)


def alias_an_index_for_another_embedder(isolated: Settings) -> None:
    """The live alias points at an index built for a different embedding signature."""
    search = make_sync_client(isolated)
    foreign = physical_index_name(isolated, "another-embedder-384")
    search.indices.create(index=foreign, body=index_body(isolated))
    search.indices.update_aliases(
        body={"actions": [{"add": {"index": foreign, "alias": isolated.retrieval.index_name}}]}
    )


def test_an_alias_on_an_index_for_another_embedder_is_refused(isolated: Settings) -> None:
    alias_an_index_for_another_embedder(isolated)
    with pytest.raises(IndexSchemaError, match="ki rebuild"):
        ensure(isolated)


def test_a_dimension_mismatch_is_refused(isolated: Settings) -> None:
    other = with_overrides(isolated, {"retrieval": {"embedding_dimensions": 8}})
    search = make_sync_client(isolated)
    search.indices.create(index=physical_index_name(isolated, SIGNATURE), body=index_body(other))
    with pytest.raises(IndexSchemaError, match="rebuild"):
        ensure(isolated)


def test_a_worker_whose_settings_do_not_fit_the_live_index_stops_and_acks_nothing(isolated: Settings) -> None:
    alias_an_index_for_another_embedder(isolated)
    engine = make_engine(isolated, pooled=False)
    try:
        with engine.begin() as conn:  # at least one event for the worker to try
            conn.execute(text("INSERT INTO projects (name) VALUES (:n)"), {"n": isolated.retrieval.index_name})
    finally:
        engine.dispose()
    group = isolated.retrieval.index_name
    log_path = REPO_ROOT / "build" / f"{group}.log"
    log_path.parent.mkdir(exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "KI_RETRIEVAL__INDEX_NAME": group,
        "KI_STREAMS__APP_ID": group,  # a group of its own, reading the topics from the start
        "KI_STREAMS__WEB_PORT": str(port),
        "KI_STREAMS__ACCESS_WEB_PORT": str(free_port()),
        "KI_STREAMS__PRINCIPALS_WEB_PORT": str(free_port()),
    }
    with log_path.open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "apps.cli", "sync", "run"], cwd=REPO_ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            code = wait_for(lambda: worker.poll(), timeout=180, what="the mismatched worker to stop")
        finally:
            if worker.poll() is None:
                worker.kill()
    assert code == EXIT_INDEX_MISMATCH
    assert "ki rebuild" in log_path.read_text()
    as_group = with_overrides(isolated, {"streams": {"app_id": group}})
    # The principals lane is left out: it commits its topics' end when it starts (`start_new_partitions_at_end`), a
    # position, not an acknowledgement; what lies before it is the access lane's, checked here.
    for lane in ("access", "content"):
        committed = [p.committed for p in consumer_lag(as_group, lane)]
        assert committed and all(c < 0 for c in committed), f"the {lane} lane must not commit what it never applied"


def test_which_versions_are_indexed_is_answered_past_a_terms_querys_allowance(isolated: Settings) -> None:
    """A 1M-chunk corpus has ~156,000 versions: more values than one terms query takes (65,536)."""
    search = make_sync_client(isolated)
    physical = physical_index_name(isolated, SIGNATURE)
    search.indices.create(index=physical, body=index_body(isolated))
    for version in (7, 70_007):  # one in the first lookup, one far past the allowance
        row = {"document_id": "1", "document_version_id": str(version), "text": "Vertrag"}
        search.index(index=physical, id=f"{version}:chunk:0", body=row, refresh=True)

    async def lookup() -> set[int]:
        client = make_client(isolated)
        try:
            writer = IndexWriter(client, isolated, index=physical)
            return await writer.indexed_versions("document_version_id", range(1, 80_001))
        finally:
            await client.close()

    assert asyncio.run(lookup()) == {7, 70_007}

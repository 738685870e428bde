"""`IndexWriter.ensure_index` on the real OpenSearch: the alias's live index is checked and extended,
never shadowed by a new empty index, and a foreign or mismatched index is refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opensearchpy import OpenSearch

from ki.settings import Settings
from projections.mapping import index_body, physical_index_name
from streams.writer import IndexSchemaError, IndexWriter, make_client

pytestmark = pytest.mark.stack

SIGNATURE = "test-embedder-384"


@pytest.fixture
def isolated(settings: Settings) -> Iterator[Settings]:
    """Settings with an alias of its own, so nothing here touches the main index; cleaned up after."""
    alias = f"lifecycle-{uuid.uuid4().hex[:8]}"
    own = settings.model_copy(update={"retrieval": settings.retrieval.model_copy(update={"index_name": alias})})
    yield own
    OpenSearch(hosts=[settings.opensearch.url]).indices.delete(index=f"{alias}--*", ignore=[404])


def ensure(settings: Settings) -> str:
    async def run() -> str:
        client = make_client(settings)
        try:
            return await IndexWriter(client, settings).ensure_index(SIGNATURE)
        finally:
            await client.close()

    return asyncio.run(run())


def indices(settings: Settings) -> dict[str, Any]:
    search = OpenSearch(hosts=[settings.opensearch.url])
    return search.indices.get(index=f"{settings.retrieval.index_name}--*")


def test_a_fresh_alias_gets_the_signature_named_index(isolated: Settings) -> None:
    physical = ensure(isolated)
    assert physical == physical_index_name(isolated, SIGNATURE)
    assert list(indices(isolated)) == [physical]
    assert ensure(isolated) == physical  # idempotent


def test_after_a_rebuild_the_generation_behind_the_alias_stays_the_live_index(isolated: Settings) -> None:
    search = OpenSearch(hosts=[isolated.opensearch.url])
    rebuilt = physical_index_name(isolated, SIGNATURE, generation="20261129")
    search.indices.create(index=rebuilt, body=index_body(isolated))
    search.indices.update_aliases(
        body={"actions": [{"add": {"index": rebuilt, "alias": isolated.retrieval.index_name}}]}
    )
    assert ensure(isolated) == rebuilt
    assert list(indices(isolated)) == [rebuilt], "a restarted worker must not create an empty index beside it"


def test_missing_mapped_fields_are_added_to_the_live_index(isolated: Settings) -> None:
    search = OpenSearch(hosts=[isolated.opensearch.url])
    physical = physical_index_name(isolated, SIGNATURE)
    body = index_body(isolated)
    del body["mappings"]["properties"]["identifiers_text"]
    search.indices.create(index=physical, body=body)
    ensure(isolated)
    assert "identifiers_text" in search.indices.get_mapping(index=physical)[physical]["mappings"]["properties"]


def test_an_alias_on_an_index_for_another_embedder_is_refused(isolated: Settings) -> None:
    search = OpenSearch(hosts=[isolated.opensearch.url])
    foreign = physical_index_name(isolated, "another-embedder-384")
    search.indices.create(index=foreign, body=index_body(isolated))
    search.indices.update_aliases(
        body={"actions": [{"add": {"index": foreign, "alias": isolated.retrieval.index_name}}]}
    )
    with pytest.raises(IndexSchemaError, match="ki rebuild"):
        ensure(isolated)


def test_a_dimension_mismatch_is_refused(isolated: Settings) -> None:
    other = isolated.model_copy(update={"retrieval": isolated.retrieval.model_copy(update={"embedding_dimensions": 8})})
    search = OpenSearch(hosts=[isolated.opensearch.url])
    search.indices.create(index=physical_index_name(isolated, SIGNATURE), body=index_body(other))
    with pytest.raises(IndexSchemaError, match="rebuild"):
        ensure(isolated)

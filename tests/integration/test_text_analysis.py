"""A defined text analyzer on the real OpenSearch: ICU components work, the definition is bound to the
index name, and a changed definition is refused until a fresh index is swapped in behind the alias."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opensearchpy import OpenSearch

from ki.clients import make_client, make_sync_client
from ki.errors import IndexSchemaError
from ki.settings import Settings, with_overrides
from projections.mapping import index_body, physical_index_name
from streams.writer import IndexWriter
from tests.integration.test_index_lifecycle import SIGNATURE, ensure

pytestmark = pytest.mark.stack

FOLDING: dict[str, Any] = {
    "char_filter": {"nfkc": {"type": "icu_normalizer", "name": "nfkc", "mode": "compose"}},
    "filter": {
        "de_stop": {"type": "stop", "stopwords": "_german_"},
        "de_stem": {"type": "snowball", "language": "German2"},
    },
    "analyzer": {
        "folded": {
            "type": "custom",
            "char_filter": ["nfkc"],
            "tokenizer": "icu_tokenizer",
            "filter": ["icu_folding", "de_stop", "de_stem"],
        }
    },
}


def with_analysis(settings: Settings, analysis: dict[str, Any], analyzer: str = "folded") -> Settings:
    data = settings.model_dump()
    data["retrieval"].update(text_analyzer=analyzer, text_analysis=analysis)
    return Settings.model_validate(data)  # validated like a config file


@pytest.fixture
def isolated(settings: Settings) -> Iterator[Settings]:
    alias = f"analysis-{uuid.uuid4().hex[:8]}"
    yield with_analysis(with_overrides(settings, {"retrieval": {"index_name": alias}}), FOLDING)
    make_sync_client(settings).indices.delete(index=f"{alias}--*", ignore=[404])


def swap_in_fresh_index(settings: Settings, generation: str) -> str:
    """What `ki rebuild` does around the replay: a fresh physical index for the settings, then the alias swap."""

    async def run() -> str:
        client = make_client(settings)
        try:
            physical = physical_index_name(settings, SIGNATURE, generation=generation)
            writer = IndexWriter(client, settings, index=physical)
            await writer.create_physical(physical)
            for old in await writer.swap_alias(physical):
                await client.indices.delete(index=old)
            return physical
        finally:
            await client.close()

    return asyncio.run(run())


def tokens(search: OpenSearch, index: str, text: str, analyzer: str = "folded") -> list[str]:
    answer = search.indices.analyze(index=index, body={"analyzer": analyzer, "text": text})
    return [t["token"] for t in answer["tokens"]]


def test_an_icu_chain_defined_in_the_settings_analyses_the_text_field(isolated: Settings, search: OpenSearch) -> None:
    physical = ensure(isolated)
    assert physical == physical_index_name(isolated, SIGNATURE)
    assert "folded" in physical
    # Decomposed ä (a + U+0308), the ﬁ ligature, capital ẞ: folded like their plain spellings.
    assert tokens(search, physical, "Ka\u0308se ﬁnal STRAẞE") == tokens(search, physical, "kase final strasse")
    assert tokens(search, physical, "Ka\u0308se") == ["kas"]
    # The text field really uses it: a plain query finds the decomposed, ligatured spelling.
    search.index(index=physical, id="1", body={"text": "Der Ka\u0308se ist ﬁnal"}, refresh=True)
    hits = search.search(index=physical, body={"query": {"match": {"text": "käse final"}}})["hits"]["hits"]
    assert [h["_id"] for h in hits] == ["1"]


def test_the_shipped_default_chain_works_on_the_stack(settings: Settings, search: OpenSearch) -> None:
    name = f"analysis-default-{uuid.uuid4().hex[:8]}"
    search.indices.create(index=name, body=index_body(settings))
    try:
        analyzer = settings.retrieval.text_analyzer
        assert tokens(search, name, "Verträgen", analyzer) == tokens(search, name, "Vertrag", analyzer)
        assert tokens(search, name, "Straße", analyzer) == tokens(search, name, "STRASSE", analyzer)
    finally:
        search.indices.delete(index=name)


def test_a_changed_definition_needs_a_new_index_and_the_alias_swap_picks_it(
    isolated: Settings, search: OpenSearch
) -> None:
    first = ensure(isolated)
    changed_analysis = json.loads(json.dumps(FOLDING))
    changed_analysis["filter"]["de_stem"] = {"type": "stemmer", "language": "light_german"}
    changed = with_analysis(isolated, changed_analysis)
    assert physical_index_name(changed, SIGNATURE) != first
    # A worker with the changed settings refuses the live index (it exits with EXIT_INDEX_MISMATCH).
    with pytest.raises(IndexSchemaError, match="ki rebuild"):
        ensure(changed)
    # The rebuild's path: a fresh index for the changed settings behind the alias, the old one gone.
    fresh = swap_in_fresh_index(changed, "20261130")
    assert fresh.startswith(physical_index_name(changed, SIGNATURE) + "--")
    assert set(search.indices.get_alias(name=isolated.retrieval.index_name)) == {fresh}
    assert ensure(changed) == fresh
    stem = search.indices.get_settings(index=fresh)[fresh]["settings"]["index"]["analysis"]["filter"]["de_stem"]
    assert stem == {"type": "stemmer", "language": "light_german"}
    # And the old settings are now the ones refused.
    with pytest.raises(IndexSchemaError):
        ensure(isolated)


def test_an_index_whose_definition_differs_under_the_expected_name_is_refused(isolated: Settings) -> None:
    """Even if a physical index carries the expected name, its live definition is compared."""
    search = make_sync_client(isolated)
    other_analysis = json.loads(json.dumps(FOLDING))
    other_analysis["analyzer"]["folded"]["filter"] = ["icu_folding", "de_stem"]
    physical = physical_index_name(isolated, SIGNATURE)
    search.indices.create(index=physical, body=index_body(with_analysis(isolated, other_analysis)))
    with pytest.raises(IndexSchemaError, match="otherwise than retrieval.text_analysis"):
        ensure(isolated)

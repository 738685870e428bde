"""Writers that wait for their own writes (search.consistency) on the real stack: a writer commits, reads
`pg_current_wal_lsn()`, and its next search with that token finds what it wrote -- a new document with a new
grant, or a new grant on a document already indexed -- on the first request, every time, although the same
caller searched (and the API cached its empty scope and its name look-ups) just before the write. Trials run
twenty at a time, so commits, lanes and searches overlap. A token the lanes cannot reach in time is a 412
`stale`, never an older answer; a malformed one a 400 naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, text

from ki.clients import make_sync_client
from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server, remove_world, synced_api
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

TRIALS, AT_ONCE = 200, 20
#: The module's index and consumer group (the API over them with a tight bound reads the same lanes).
ISOLATION: dict[str, str] = {}


@dataclass
class Trial:
    i: int
    user: str
    word: str
    project: int
    source_object: int
    document: int | None = None  # an already indexed document the trial's grant opens (odd trials)


@pytest.fixture(scope="module")
def api(settings: Settings) -> Iterator[Server]:
    # The bound is generous: CI runs other stacks beside this one, and the trials judge answers, not their speed
    # (`ki bench consistency` measures the wait).
    wait = {"KI_API__CONSISTENCY__MAX_WAIT_S": "30"}
    with synced_api(settings, "ki-consistency-test", "consistency-api", **wait) as (server, _, env):
        ISOLATION.update(env)
        yield server


@pytest.fixture(scope="module")
def trials(engine: Engine, api: Server, settings: Settings) -> Iterator[list[Trial]]:
    """One project; odd trials get a document in it, indexed before any trial starts, that nobody may see yet;
    even trials write theirs. Every trial's grant is on its own document."""
    with engine.begin() as conn:
        w = World(conn)
        source = w.source("local_fs")
        obj = w.source_object(source)
        project = w.project("Konsistenz")
        made = []
        for i in range(TRIALS):
            word = f"zuverlaessig{i}x{w.tag}"
            document = w.searchable(project, f"Vorhanden {i}", f"{word} vorhanden", obj, f"v{i}") if i % 2 else None
            made.append(Trial(i, f"writer{i}-{w.tag}", word, project, obj, document))
    existing = [str(t.document) for t in made if t.document is not None]
    index = load_settings(environ={**os.environ, **api.process.env}).retrieval.index_name
    client = make_sync_client(settings, timeout_s=30)
    body = {"size": 0, "query": {"terms": {"document_id": existing}},
            "aggs": {"documents": {"cardinality": {"field": "document_id", "precision_threshold": 1000}}}}  # fmt: skip

    def indexed() -> bool:
        if not client.indices.exists_alias(name=index):  # the worker makes the index when it starts
            return False
        found = client.search(index=index, body=body)["aggregations"]["documents"]["value"]
        return int(found) == len(existing)

    try:
        wait_for(indexed, timeout=180, what="the trials' existing documents in the index")
        yield made
    finally:
        client.close()
        remove_world(engine, [project], [source])


def _write(engine: Engine, t: Trial) -> tuple[int, str]:
    """The trial's write in one transaction, then the LSN read after the commit (the token)."""
    with engine.begin() as conn:
        w = World(conn)
        document = t.document
        if document is None:
            document = w.searchable(t.project, f"Neu {t.i}", f"{t.word} neu geschrieben", t.source_object, f"n{t.i}")
        w.grant("document", document, f"user:{t.user}")
    with engine.connect() as conn:
        token = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
    return document, token


def _trial(engine: Engine, api: Server, settings: Settings, t: Trial) -> str | None:
    """None when the first search after the write found it; else what went wrong."""
    bearer = mint_token(settings.api, t.user)
    body = {"query": t.word, "mode": "lexical", "limit": 5}
    status, before = api.call("/v1/search", body, bearer)
    if status != 200 or before["hits"]:
        return f"trial {t.i}: before the write {status} {before}"
    document, token = _write(engine, t)
    status, after = api.call("/v1/search", {**body, "consistency_token": token}, bearer)
    if status != 200:
        return f"trial {t.i}: {status} {after}"
    found = [h["document_id"] for h in after["hits"]]
    if found != [document] or after["consistency"]["consistent"] is not True:
        return f"trial {t.i}: found {found} instead of [{document}], {after.get('consistency')}"
    return None


def test_a_writer_finds_its_new_document_and_its_new_grant_on_the_first_request_every_time(
    engine: Engine, api: Server, settings: Settings, trials: list[Trial]
) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        outcomes = list(pool.map(lambda t: _trial(engine, api, settings, t), trials))
    failed = [o for o in outcomes if o is not None]
    assert not failed, f"{len(failed)} of {TRIALS} trials failed: {failed[:5]}"
    # The answer says which lane it waited for and whether the vectors are in too (they may well not be).
    bearer = mint_token(settings.api, trials[1].user)
    with engine.connect() as conn:
        token = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
    status, body = api.call("/v1/search/filter", {"limit": 1, "consistency_token": token}, bearer)
    assert status == 200 and body["hits"]
    assert body["consistency"]["waited_for"] == ["access"] and body["consistency"]["vectors"] in ("current", "pending")


def test_a_token_the_lanes_cannot_reach_is_stale_and_a_malformed_one_is_refused(
    api: Server, settings: Settings, trials: list[Trial]
) -> None:
    bearer = mint_token(settings.api, trials[0].user)
    tight = Server("consistency-api-tight", **ISOLATION, KI_API__CONSISTENCY__MAX_WAIT_S="1")
    tight.start()
    try:
        status, body = tight.call("/v1/search", {"query": "egal", "consistency_token": "FF/FFFFFFFF"}, bearer)
    finally:
        tight.stop()
    assert status == 412 and body["error"] == "stale" and body["waited_s"] >= 1
    status, body = api.call("/v1/search", {"query": "egal", "consistency_token": "gestern"}, bearer)
    assert status == 400 and body["field"] == "consistency_token"

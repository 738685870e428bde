"""Fixtures shared by the tests against the real stack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from ki.clients import make_engine, make_sync_client
from ki.settings import Settings


@pytest.fixture(scope="module")
def engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def search(settings: Settings) -> OpenSearch:
    return make_sync_client(settings, timeout_s=60)

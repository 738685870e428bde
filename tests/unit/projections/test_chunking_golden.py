"""The chunker cuts exactly the golden windows (`chunking_golden.py`): chunks feed the index rows, the ranking
hash and vector reuse by input key, so any change of a window is a change of every index."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.projections.chunking_golden import CONFIGS, GOLDEN, Config, chunk_spans


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_golden_file_covers_every_configuration(golden: dict[str, Any]) -> None:
    assert [tuple(c) for c in golden["configs"]] == CONFIGS
    assert golden["spans"].keys() == golden["texts"].keys()
    assert any(len(spans) > 100 for spans in golden["spans"]["url-and-table"].values())


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_windows_are_the_golden_ones(golden: dict[str, Any], config: Config) -> None:
    for name, text in golden["texts"].items():
        assert chunk_spans(text, config) == golden["spans"][name][config[0]], name

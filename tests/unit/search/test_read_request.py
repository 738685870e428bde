"""Reading a version's text: the query string's paging, and the evidence helpers (no services)."""

from __future__ import annotations

import hashlib

import pytest

from ki.errors import RequestInvalid
from ki.settings import ApiSettings
from search.evidence.citations import sha256_hex
from search.evidence.citations import text_permalink as permalink
from search.request import parse_read_request


def test_paging_defaults_to_the_start_and_the_limit() -> None:
    api = ApiSettings()
    request = parse_read_request({}, api)
    assert request.offset == 0 and request.characters(api) == api.limits.max_read_chars
    assert parse_read_request({"offset": "40", "length": "7"}, api).characters(api) == 7


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"offset": "-1"}, "offset"),
        ({"offset": "1e3"}, "offset"),
        ({"offset": "٣"}, "offset"),  # a digit, but not an ASCII one
        ({"length": "0"}, "length"),
        ({"length": "20001"}, "length"),
        ({"length": "9" * 13}, "length"),
        ({"page": "2"}, "page"),
    ],
)
def test_bad_paging_names_its_field(query: dict[str, str], field: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_read_request(query, ApiSettings())
    assert refused.value.field == field


def test_the_slice_hash_is_over_its_utf8_and_the_permalink_reads_it_again() -> None:
    text = "§ 7 Kündigung – Straße"
    assert sha256_hex(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert permalink(3, 9, 40, 7) == "/v1/documents/3/versions/9/text?offset=40&length=7"

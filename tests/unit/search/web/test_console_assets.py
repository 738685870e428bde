"""The console's static assets (no services, no browser): document text and every other API text reach the
page as text only, nothing loads from anywhere but this server, and the text view's cutting of a page into the
hit's passage and flagged passages counts characters as the API does (through Node.js, which
`scripts/bootstrap.sh --test` installs; the browser test in tests/integration/test_console.py runs the same code in
Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from search.web.console import CSP, STATIC

SCRIPT = (STATIC / "console.js").read_text(encoding="utf-8")
ASSETS = {path.name: path.read_text(encoding="utf-8") for path in STATIC.iterdir()}


@pytest.mark.parametrize(
    "sink", ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("]
)
def test_the_script_never_writes_markup_from_strings(sink: str) -> None:
    assert sink not in SCRIPT


def test_nothing_loads_from_elsewhere() -> None:
    for name, content in ASSETS.items():
        urls = set(re.findall(r"https?://[^\s\"'`)]+", content)) - {"http://www.w3.org/2000/svg"}
        assert not urls, (name, urls)
    page = ASSETS["index.html"]
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/console/static/console.js" defer>']
    assert " style=" not in page and "<style" not in page  # the policy allows no inline style
    assert "script-src 'self'" in CSP and "default-src 'none'" in CSP


def segments(
    text: str, offset: int, passage: dict[str, int] | None, flagged: list[dict[str, object]]
) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node is not None, "Node.js is missing: `scripts/bootstrap.sh --test` installs it"
    start, end = SCRIPT.index("function textSegments"), SCRIPT.index("// Document text is untrusted")
    arguments = json.dumps([text, offset, passage, flagged])
    program = f"{SCRIPT[start:end]}\nprocess.stdout.write(JSON.stringify(textSegments(...{arguments})));"
    return json.loads(subprocess.run([node, "-e", program], capture_output=True, check=True, text=True).stdout)


def test_a_page_is_cut_at_the_passage_and_the_flagged_spans_in_characters() -> None:
    # Offsets count code points as Python does: the emoji is one character, though two UTF-16 units.
    text = "ab😀cdefghij"
    cut = segments(text, 100, {"start": 102, "end": 106}, [{"start": 4, "end": 8, "kind": "override"}])
    assert cut == [
        {"text": "ab", "passage": False, "kinds": []},
        {"text": "😀c", "passage": True, "kinds": []},
        {"text": "de", "passage": True, "kinds": ["override"]},
        {"text": "fg", "passage": False, "kinds": ["override"]},
        {"text": "hij", "passage": False, "kinds": []},
    ]
    assert "".join(s["text"] for s in cut if s["passage"]) == text[2:6]


def test_a_passage_beyond_the_page_is_clipped_to_it() -> None:
    assert segments("abcdef", 10, {"start": 2, "end": 12}, []) == [
        {"text": "ab", "passage": True, "kinds": []},
        {"text": "cdef", "passage": False, "kinds": []},
    ]
    assert segments("abcdef", 0, None, []) == [{"text": "abcdef", "passage": False, "kinds": []}]

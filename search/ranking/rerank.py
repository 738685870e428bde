"""Optional rerank of the leading collapsed hits through an OpenAI-compatible chat-completions gateway.

With `retrieval.rerank_enabled`, the top `RERANK_TOP_N` (20) collapsed hits go to `retrieval.rerank_model`
in one `POST {retrieval.rerank.url}/chat/completions` call. The model answers a JSON object
`{"scores": {"<id>": <0..10>, ...}}` (a list of `{"id": ..., "score": ...}` is accepted too). Those scores
replace the fused scores and order that prefix; reranking reorders, it never drops: a hit the model did not
score (or scored outside 0..10) follows the scored ones in fused order, and everything past the prefix
keeps its fused order after them. Any gateway failure — unreachable, timeout, non-2xx, a reply that is not
the JSON asked for — raises `RerankUnavailable` (HTTP 503); there is no silent fallback to the fused order.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from ki.errors import SettingsError, Unavailable
from ki.settings import RetrievalSettings
from search.ranking.fusion import Candidate

RERANK_TOP_N = 20
MAX_SCORE = 10.0
_PASSAGE_CHARS = 1500

_SYSTEM_PROMPT = (
    "You judge how relevant each passage is to the query. Reply with one JSON object of the form "
    '{"scores": {"<passage id>": <relevance from 0 to 10>}} covering every passage, and nothing else.'
)


class RerankUnavailable(Unavailable):
    """The rerank gateway failed; the search must fail rather than return an unreranked order."""

    service = "rerank gateway"


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def passages(candidates: Sequence[Candidate], titles: Sequence[str]) -> list[Passage]:
    """One passage per candidate; the id is its 1-based position, so duplicate versions stay distinct."""
    return [
        Passage(str(i), title, str(c.source.get("text", ""))[:_PASSAGE_CHARS])
        for i, (c, title) in enumerate(zip(candidates, titles, strict=True), start=1)
    ]


def request_body(model: str, query: str, items: Sequence[Passage]) -> dict[str, Any]:
    user = {"query": query, "passages": [{"id": p.id, "title": p.title, "text": p.text} for p in items]}
    return {
        "model": model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": json.dumps(user, ensure_ascii=False)},
        ],
    }


def _valid(score: Any) -> bool:
    return isinstance(score, int | float) and not isinstance(score, bool) and 0 <= score <= MAX_SCORE


def parse_scores(response: Any, ids: Sequence[str]) -> dict[str, float]:
    """The scores of known ids from a chat-completions response; malformed replies raise."""
    try:
        content = response["choices"][0]["message"]["content"]
        reply = json.loads(content)
        raw = reply["scores"]
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
        raise RerankUnavailable(f"rerank gateway reply is not the expected JSON ({type(exc).__name__})") from None
    pairs: list[tuple[str, Any]]
    if isinstance(raw, list):
        pairs = [(str(e.get("id")), e.get("score")) for e in raw if isinstance(e, dict)]
    elif isinstance(raw, dict):
        pairs = [(str(k), v) for k, v in raw.items()]
    else:
        raise RerankUnavailable("rerank gateway reply: `scores` must be an object or a list")
    known = set(ids)
    return {k: float(v) for k, v in pairs if k in known and _valid(v) and math.isfinite(v)}


def apply_rerank(
    candidates: Sequence[Candidate], scores: dict[str, float], top_n: int = RERANK_TOP_N
) -> list[Candidate]:
    """Scored prefix members by score (ties keep fused order), then unscored prefix members, then the rest.

    `scores` is keyed by 1-based position within the prefix (as sent by `passages`)."""
    prefix, rest = list(candidates[:top_n]), list(candidates[top_n:])
    scored = [(i, c) for i, c in enumerate(prefix) if str(i + 1) in scores]
    unscored = [c for i, c in enumerate(prefix) if str(i + 1) not in scores]
    scored.sort(key=lambda pair: (-scores[str(pair[0] + 1)], pair[0]))
    reranked = [replace(c, rerank_score=scores[str(i + 1)]) for i, c in scored]
    return [*reranked, *unscored, *rest]


class Reranker:
    """The gateway client; one aiohttp session, opened on first use and closed by `close`."""

    def __init__(self, settings: RetrievalSettings) -> None:
        if not settings.rerank.url:
            raise SettingsError("retrieval.rerank_enabled is true but retrieval.rerank.url is empty")
        self.url = settings.rerank.url.rstrip("/") + "/chat/completions"
        self.model = settings.rerank_model
        self.timeout = aiohttp.ClientTimeout(total=settings.rerank.timeout_s)
        self.api_key = os.environ.get(settings.rerank.api_key_env, "") if settings.rerank.api_key_env else ""
        self._session: aiohttp.ClientSession | None = None

    async def scores(self, query: str, items: Sequence[Passage]) -> dict[str, float]:
        if not items:
            return {}
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with self._session.post(
                self.url, json=request_body(self.model, query, items), headers=headers
            ) as response:
                if response.status >= 300:
                    raise RerankUnavailable(f"rerank gateway answered HTTP {response.status}")
                payload = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RerankUnavailable(f"rerank gateway unreachable or unreadable ({type(exc).__name__})") from None
        return parse_scores(payload, [p.id for p in items])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

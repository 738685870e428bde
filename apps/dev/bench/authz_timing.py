"""`ki bench authz-timing`: can a caller tell a document they may not see from one that does not exist by
how long the API takes? (a timing oracle: 11.2 vs 6.8 ms before constant-shape
authorisation.)

A world of its own (labelled, removed at the end): the caller's project with one visible document, and
another project with `--pairs` documents the caller may not see (each with a version, an observation, a
relation from the visible document and a decision record with a word of its own). A `ki serve` child
answers over real HTTP, one kept-alive connection, one request at a time. For each pair, in random order:
the hidden id and an id that does not exist, on `GET /v1/documents/{id}`, `GET /v1/documents/{id}/related`,
`POST /v1/traverse` (start at the id) and `POST /v1/decisions/search` (the hidden decision's word, and a
word found nowhere). Reported per endpoint: the medians, their difference, and whether it is within 0.5 ms
(the goal); the answers must be equal (status and body) or the run fails. Writes
`benchmarks/authz-timing.json`.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from apps.dev.bench.cleanup import Footprint, bench_label, delete_from_postgres
from apps.dev.bench.search import ServeChild
from ki.clients import make_engine
from ki.settings import REPO_ROOT, Settings
from search.web.auth import mint_token

GOAL_MS = 0.5
WARMUP = 20


@dataclass(frozen=True)
class Probe:
    endpoint: str
    hidden: tuple[str, str, dict[str, Any] | None]  # method, path, body
    missing: tuple[str, str, dict[str, Any] | None]


@dataclass
class Series:
    hidden_ms: list[float] = field(default_factory=list)
    missing_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        hidden, missing = statistics.median(self.hidden_ms), statistics.median(self.missing_ms)
        return {
            "pairs": len(self.hidden_ms),
            "hidden_ms_p50": round(hidden, 3),
            "missing_ms_p50": round(missing, 3),
            "difference_ms": round(hidden - missing, 3),
            "within_goal": abs(hidden - missing) <= GOAL_MS,
        }


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_world(engine: Engine, label: str, pairs: int) -> tuple[str, list[int], list[str], int]:
    """The caller, the hidden documents, their decisions' words, and the first id that does not exist."""
    tag = uuid.uuid4().hex[:8]
    caller = f"bench-authz-{tag}"
    with engine.begin() as conn:

        def one(sql: str, **params: Any) -> int:
            return int(conn.execute(text(sql), params).scalar_one())

        mine = one("INSERT INTO projects (name) VALUES (:n) RETURNING id", n=label)
        theirs = one("INSERT INTO projects (name) VALUES (:n) RETURNING id", n=label)
        source = one("INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id", n=label)
        obj = one("INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :r) RETURNING id", s=source,
                  r=f"authz-{tag}")  # fmt: skip
        documents: list[int] = []
        for i, project in enumerate([mine] + [theirs] * pairs):
            doc = one("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id", p=project,
                      t=f"Akte {i} {tag}")  # fmt: skip
            version = one(
                "INSERT INTO document_versions (document_id, version_no, status, text) "
                "VALUES (:d, 1, 'final', :b) RETURNING id",
                d=doc,
                b=f"Vermerk {i}.",
            )
            latest = text("UPDATE documents SET latest_final_version_id = :v WHERE id = :d")
            conn.execute(latest, {"v": version, "d": doc})
            conn.execute(
                text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
                {"v": version, "o": obj},
            )
            documents.append(doc)
        visible, hidden = documents[0], documents[1:]
        words = [f"fristwort{i}x{tag}" for i in range(pairs)]
        for doc, word in zip(hidden, words, strict=True):
            conn.execute(
                text("INSERT INTO relations (kind, from_document_id, to_document_id) VALUES ('references', :a, :b)"),
                {"a": visible, "b": doc},
            )
            conn.execute(
                text("INSERT INTO decision_records (project_id, document_id, rationale) VALUES (:p, :d, :r)"),
                {"p": theirs, "d": doc, "r": f"{word} verlängert"},
            )
        conn.execute(
            text("INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :u, 'allow')"),
            {"p": mine, "u": f"user:{caller}"},
        )
        first_missing = one("SELECT coalesce(max(id), 0) + 1000000 FROM documents")
    return caller, hidden, words, first_missing


def probes(hidden: list[int], words: list[str], first_missing: int, tag: str) -> list[Probe]:
    out = []
    for i, (doc, word) in enumerate(zip(hidden, words, strict=True)):
        gone = first_missing + i
        out += [
            Probe("documents", ("GET", f"/v1/documents/{doc}", None), ("GET", f"/v1/documents/{gone}", None)),
            Probe("related", ("GET", f"/v1/documents/{doc}/related", None),
                  ("GET", f"/v1/documents/{gone}/related", None)),  # fmt: skip
            Probe("traverse", ("POST", "/v1/traverse", {"start": [doc]}), ("POST", "/v1/traverse", {"start": [gone]})),
            Probe("decisions", ("POST", "/v1/decisions/search", {"query": word}),
                  ("POST", "/v1/decisions/search", {"query": f"nirgendwort{i}x{tag}"})),  # fmt: skip
        ]
    return out


class Client:
    """One kept-alive HTTP connection: no connection set-up in the timed part."""

    def __init__(self, port: int, token: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def timed(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[float, int, Any]:
        payload = json.dumps(body).encode() if body is not None else None
        started = time.perf_counter()
        self.connection.request(method, path, body=payload, headers=self.headers)
        response = self.connection.getresponse()
        raw = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        return elapsed, response.status, json.loads(raw)


def _comparable(endpoint: str, answer: Any, asked: int | None) -> Any:
    """The answer with the id asked about taken out (a traversal names its unknown start ids)."""
    if endpoint == "traverse" and isinstance(answer, dict):
        assert answer.get("not_found") == [asked], answer
        return {**answer, "not_found": None}
    return answer


def main(settings: Settings, pairs: int, seed: int, out: Path | None, config: str | None, command: str) -> int:
    engine = make_engine(settings)
    label = bench_label("authz-timing")
    operator = mint_token(settings.api, "ki-bench", roles=["operator"], ttl_s=3600)  # /metrics, if asked
    server = ServeChild(config, REPO_ROOT / "build" / "bench" / "authz-timing-api.log", operator, needs_index=False)
    rng = random.Random(seed)
    try:
        _say(f"authz-timing: writing a world of {pairs} hidden documents ({label})")
        caller, hidden, words, first_missing = write_world(engine, label, WARMUP + pairs)
        asyncio.run(server.start())
        client = Client(server.port, mint_token(settings.api, caller, ttl_s=3600))
        planned = probes(hidden, words, first_missing, label.rsplit(" ", 1)[-1])
        series: dict[str, Series] = {}
        for n, probe in enumerate(planned):
            sides = [("hidden", probe.hidden), ("missing", probe.missing)]
            rng.shuffle(sides)
            answers: dict[str, Any] = {}
            for side, (method, path, body) in sides:
                ms, status, answer = client.timed(method, path, body)
                asked = (body or {}).get("start", [None])[0]
                answers[side] = (status, _comparable(probe.endpoint, answer, asked))
                if n >= WARMUP * 4:
                    timings = series.setdefault(probe.endpoint, Series())
                    (timings.hidden_ms if side == "hidden" else timings.missing_ms).append(ms)
            if answers["hidden"] != answers["missing"]:
                raise RuntimeError(f"{probe.endpoint}: the answers differ: {answers}")
            if (n + 1) % 100 == 0:
                _say(f"authz-timing: {n + 1}/{len(planned)} probes")
        endpoints = {name: s.summary() for name, s in series.items()}
        result = {
            "command": command,
            "pairs": pairs,
            "warmup_pairs": WARMUP,
            "seed": seed,
            "goal_ms": GOAL_MS,
            "endpoints": endpoints,
            "met": all(e["within_goal"] for e in endpoints.values()),
        }
    finally:
        server.stop()
        removal = delete_from_postgres(engine, Footprint.of_label(label))
        _say(f"authz-timing: removed the world ({removal.as_dict()})")
        engine.dispose()
    for name, e in endpoints.items():
        print(f"{name:10} hidden {e['hidden_ms_p50']:7.3f} ms  missing {e['missing_ms_p50']:7.3f} ms  "
              f"difference {e['difference_ms']:+.3f} ms  {'ok' if e['within_goal'] else 'OVER'}")  # fmt: skip
    target = out or REPO_ROOT / "benchmarks" / "authz-timing.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"authz-timing: wrote {target}")
    return 0 if result["met"] else 1

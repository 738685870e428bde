"""`ki bench injection`: the prompt-injection detector (`search.evidence.injection`) on the committed attack
corpus and on every chunk of German dev sets.

Recall: the share of `tests/data/injection/attacks.jsonl` with at least one finding, overall, per language,
plain or obfuscated and per kind (and how often the expected kind is among the findings). False positives:
every document of each BEIR data set is chunked as the sync chunks it (`projections.chunking.split_text` with
`retrieval.chunk_chars` and `chunk_overlap_chars`; without the embedder's token window, which needs the model
and which cuts no window of gesetze-headings-dev: the same 23,589 body chunks `ki eval` indexes) and each
chunk's text is scanned; a flagged chunk is listed with its kinds, rules and an excerpt around the first
finding. Issue 48's goals: recall at least 95 %, at most 0.5 % of gesetze-headings-dev's chunks flagged.
Speed: the time `scan` takes on each chunk (the chunking and the word counts not included), median and 99th
percentile in microseconds, per data set and over all of them (the search runs the detector per hit).
Pure CPU, no service: writes `benchmarks/injection.json`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.dev.bench.stats import machine, percentile
from apps.dev.checkout import REPO_ROOT
from apps.dev.eval import beir
from ki.settings import Settings
from projections.chunking import split_text
from search.evidence.injection import RULES, Finding, scan

ATTACKS = REPO_ROOT / "tests" / "data" / "injection" / "attacks.jsonl"
DEFAULT_SETS = ("gesetze-headings-dev", "xquad-de")
GOAL_SET = "gesetze-headings-dev"
RECALL_GOAL = 0.95
FLAGGED_GOAL = 0.005
EXCERPT_CHARS = 200
_PROGRESS_EVERY = 2000  # documents
# Words the rules build on: how many scanned chunks hold each (lower case, substring) says what a clean
# result was tested against.
RISKY_WORDS = (
    "anweisung", " weisung", "instruktion", "befehl", "regeln", "vorgabe", "system", "assistent", "vorherig",
    "bisherig", "ignor", "missacht", "vergess", "übergeh", "ab sofort", "von nun an", "http",
)  # fmt: skip


def default_data() -> list[Path]:
    """The German dev sets in the shared data folder `ki eval` reads (those present)."""
    root = beir.shared_data_dir()
    return [root / name for name in DEFAULT_SETS if (root / name).is_dir()]


@dataclass(frozen=True)
class InjectionOptions:
    data: list[Path] = field(default_factory=default_data)
    attacks: Path = ATTACKS
    out: Path = Path("benchmarks/injection.json")
    command: str = "ki bench injection"


def _say(message: str) -> None:
    print(f"bench injection: {message}", flush=True)


def load_attacks(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _share(found: int, total: int) -> dict[str, Any]:
    return {"found": found, "total": total, "recall": round(found / total, 4) if total else None}


def recall_figures(attacks: Sequence[dict[str, Any]], detect: Callable[[str], list[Finding]] = scan) -> dict[str, Any]:
    """Recall overall and per group, the share with the expected kind among the findings, the missed strings."""
    hits = [(attack, detect(attack["text"])) for attack in attacks]

    def group(key: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
        names = sorted({key(a) for a, _ in hits})
        return {n: _share(sum(bool(f) for a, f in hits if key(a) == n), sum(key(a) == n for a, _ in hits))
                for n in names}  # fmt: skip

    return {
        "overall": _share(sum(bool(f) for _, f in hits), len(hits)),
        "by_language": group(lambda a: a["lang"]),
        "by_obfuscation": group(lambda a: "obfuscated" if a["obfuscated"] else "plain"),
        "by_kind": group(lambda a: a["kind"]),
        "expected_kind_found": _share(sum(a["kind"] in {x.kind for x in f} for a, f in hits), len(hits)),
        "missed": [
            {"text": _clip(a["text"]), "lang": a["lang"], "kind": a["kind"], "obfuscated": a["obfuscated"]}
            for a, f in hits
            if not f
        ],
    }


def _clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt(text: str, finding: Finding, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of `text` around `finding` (the finding first, then context on both sides)."""
    span = finding.end - finding.start
    if span >= limit:
        return text[finding.start : finding.start + limit]
    before = (limit - span) // 2
    start = max(0, finding.start - before)
    end = min(len(text), start + limit)
    start = max(0, end - limit)
    return text[start:end]


def scan_time(nanoseconds: Sequence[int]) -> dict[str, Any]:
    """How long `scan` took on one chunk: median and 99th percentile in microseconds, over how many chunks."""
    if not nanoseconds:
        return {"chunks": 0, "median_us": None, "p99_us": None}
    return {
        "chunks": len(nanoseconds),
        "median_us": round(percentile(nanoseconds, 50) / 1000, 1),
        "p99_us": round(percentile(nanoseconds, 99) / 1000, 1),
    }


@dataclass
class DatasetScan:
    name: str
    documents: int = 0
    chunks: int = 0
    flagged: list[dict[str, Any]] = field(default_factory=list)
    with_risky_word: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RISKY_WORDS, 0))
    scan_ns: list[int] = field(default_factory=list)  # the time `scan` took on each chunk
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "chunks_scanned": self.chunks,
            "chunks_flagged": len(self.flagged),
            "flagged_rate": round(len(self.flagged) / self.chunks, 6) if self.chunks else None,
            "chunks_with_risky_word": self.with_risky_word,
            "scan_time_per_chunk": scan_time(self.scan_ns),
            "seconds": round(self.seconds, 1),
            "flagged": self.flagged,
        }


def scan_documents(
    name: str, docs: Iterable[beir.CorpusDoc], chunk_chars: int, overlap_chars: int, *, progress: bool = True
) -> DatasetScan:
    """Chunk every document as the sync does and scan each chunk; the flagged ones listed."""
    result = DatasetScan(name)
    began = time.monotonic()
    for doc in docs:
        result.documents += 1
        for chunk in split_text(doc.text, chunk_chars, overlap_chars):
            result.chunks += 1
            lowered = chunk.text.lower()
            for word in RISKY_WORDS:
                result.with_risky_word[word] += word in lowered
            started = time.perf_counter_ns()
            findings = scan(chunk.text)
            result.scan_ns.append(time.perf_counter_ns() - started)
            if findings:
                result.flagged.append({
                    "id": f"{doc.id}#{chunk.ordinal}",
                    "kinds": sorted({f.kind for f in findings}),
                    "rules": sorted({f.rule for f in findings}),
                    "excerpt": excerpt(chunk.text, findings[0]),
                })  # fmt: skip
        if progress and result.documents % _PROGRESS_EVERY == 0:
            _say(f"{name}: {result.documents} documents, {result.chunks} chunks, {len(result.flagged)} flagged")
    result.seconds = time.monotonic() - began
    return result


def summary_table(record: dict[str, Any]) -> str:
    recall = record["recall"]
    rows = [("attacks: overall", recall["overall"])]
    rows += [(f"attacks: {k}", v) for k, v in recall["by_language"].items()]
    rows += [(f"attacks: {k}", v) for k, v in recall["by_obfuscation"].items()]
    lines = [f"{'':34} {'found':>7} {'total':>7} {'recall':>8}"]
    lines += [f"{label:34} {v['found']:>7} {v['total']:>7} {v['recall']:>8.3f}" for label, v in rows]
    lines.append(f"\n{'data set':34} {'chunks':>7} {'flagged':>7} {'rate':>8} {'scan µs median':>15} {'p99':>8}")
    for name, figures in record["datasets"].items():
        rate = figures["flagged_rate"] or 0.0
        took = figures["scan_time_per_chunk"]
        lines.append(f"{name:34} {figures['chunks_scanned']:>7} {figures['chunks_flagged']:>7} {rate:>8.2%} "
                     f"{_us(took['median_us']):>15} {_us(took['p99_us']):>8}")  # fmt: skip
    overall = record["scan_time_per_chunk"]
    lines.append(f"{'all chunks':34} {overall['chunks']:>7} {'':>7} {'':>8} {_us(overall['median_us']):>15} "
                 f"{_us(overall['p99_us']):>8}")  # fmt: skip
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def goals(record: dict[str, Any]) -> dict[str, Any]:
    recall = record["recall"]["overall"]["recall"]
    goal_set = record["datasets"].get(GOAL_SET)
    rate = goal_set["flagged_rate"] if goal_set else None
    return {
        "recall_at_least": RECALL_GOAL,
        "recall_met": recall is not None and recall >= RECALL_GOAL,
        "flagged_rate_at_most": FLAGGED_GOAL,
        "flagged_rate_set": GOAL_SET,
        "flagged_rate_met": None if rate is None else rate <= FLAGGED_GOAL,
    }


def main(settings: Settings, options: InjectionOptions) -> int:
    load_start = os.getloadavg()
    began = time.monotonic()
    attacks = load_attacks(options.attacks)
    _say(f"{len(attacks)} attack strings from {options.attacks}")
    recall = recall_figures(attacks)
    retrieval = settings.retrieval
    datasets: dict[str, Any] = {}
    scan_ns: list[int] = []
    for root in options.data:
        docs = beir.load_corpus(root)
        _say(f"{root.name}: {len(docs)} documents, chunks of {retrieval.chunk_chars} characters "
             f"({retrieval.chunk_overlap_chars} overlap)")  # fmt: skip
        scanned = scan_documents(root.name, docs, retrieval.chunk_chars, retrieval.chunk_overlap_chars)
        datasets[root.name] = scanned.record()
        scan_ns += scanned.scan_ns
    record: dict[str, Any] = {
        "command": options.command,
        "detector": {"module": "search.evidence.injection", "rules": len(RULES)},
        "attacks_file": str(
            options.attacks.relative_to(REPO_ROOT) if options.attacks.is_relative_to(REPO_ROOT) else options.attacks
        ),  # fmt: skip
        "chunking": {
            "function": "projections.chunking.split_text",
            "chunk_chars": retrieval.chunk_chars,
            "chunk_overlap_chars": retrieval.chunk_overlap_chars,
            "token_window": "not applied (needs the embedder)",
        },
        "recall": recall,
        "datasets": datasets,
        "scan_time_per_chunk": scan_time(scan_ns),
        "machine": machine(load_start),
        "seconds": round(time.monotonic() - began, 1),
    }
    record["goals"] = goals(record)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(summary_table(record))
    for name, figures in datasets.items():
        for item in figures["flagged"]:
            print(f"flagged {name} {item['id']} {','.join(item['kinds'])}: {item['excerpt']!r}")
    for item in recall["missed"]:
        print(f"missed ({item['lang']}, {item['kind']}): {item['text']!r}")
    print(f"goals: {record['goals']}")
    print(f"bench injection: wrote {options.out}", file=sys.stderr, flush=True)
    return 0

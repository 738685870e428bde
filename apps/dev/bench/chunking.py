"""`python -m apps.dev.bench.chunking`: body chunks per second through the sync's chunking path, a baseline
commit's chunker against this checkout's, on the same texts in the same run (issue 53 item 2).

The path is `projections.rows.build_rows`'s: each text normalised, cut by `split_text` at the default
`retrieval.chunk_chars` / `chunk_overlap_chars` with the e5 token budget the sync worker uses (its
`count_tokens`: `passage: ` + context header + window, 512 tokens). The baseline is the baseline commit's
`projections/chunking.py` with the count as it was there (`len(tokenizer.encode(text).ids)` on the shipped
e5 tokenizer); the candidate is this checkout's chunker with `ki.embedding.local.token_counter`. Texts: the
demo generator's versions (contracts, opinions, court decisions) and the German dev sets' documents (statutes,
Wikipedia paragraphs). Every text's windows must be the same under both, or the command exits 1.

Rounds alternate which side goes first; each round starts the candidate's counter afresh (no remembered
pieces from an earlier round). Pure CPU, one thread, no service: writes `benchmarks/chunking.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from apps.dev.bench.stats import machine
from apps.dev.checkout import REPO_ROOT
from apps.dev.demo.generator import SetupIds, iter_documents, ontology_rows, plan_setup
from apps.dev.eval import beir
from ki.embedding.local import _counting_tokenizer, _package_file, resolve_local_model, token_counter
from ki.settings import Settings
from projections.chunking import TokenBudget, split_text
from projections.rows import context_header
from projections.text import normalise_text

MODEL = "multilingual-e5-small"
DEFAULT_BASELINE = "48ba436"  # the chunker and the count before issue 53 item 2
Text = tuple[str, str]  # (context header, normalised text)
Splitter = Callable[..., list[Any]]


def baseline_chunking(commit: str) -> ModuleType:
    """`projections/chunking.py` as it is at `commit`, imported under another name."""
    source = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{commit}:projections/chunking.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    name = f"baseline_chunking_{commit}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{commit}:projections/chunking.py", "exec"), module.__dict__)
    return module


def demo_texts(versions: int) -> list[Text]:
    plan = plan_setup(scale=versions, seed=53, label="bench-chunking")
    ontology = {row["key"]: 1000 + i for i, row in enumerate(ontology_rows())}
    matters = [[100 * (i + 1) + m for m in range(len(rows))] for i, rows in enumerate(plan.matters)]
    ids = SetupIds(ontology, [10 + i for i in range(len(plan.projects))], matters, {})
    return [
        (context_header(str(bundle.document["title"]), "Vertrag", "Akte"), normalise_text(str(version["text"])))
        for bundle in iter_documents(53, plan, ids, versions)
        for version in bundle.versions
    ]


def data_set_texts(name: str, limit: int | None) -> list[Text]:
    docs = beir.load_corpus(beir.shared_data_dir() / name)[:limit]
    return [(context_header(doc.title, None, None), normalise_text(doc.text)) for doc in docs]


def chunk_all(
    texts: Sequence[Text], split: Splitter, budget_type: Any, count: Callable[[str], int], settings: Settings
) -> tuple[float, list[list[tuple[int, int]]]]:
    """Seconds to chunk every text as `build_rows` does, and each text's windows."""
    budget = budget_type(count, settings.embedding.max_tokens)
    chunk_chars, overlap = settings.retrieval.chunk_chars, settings.retrieval.chunk_overlap_chars
    spans: list[list[tuple[int, int]]] = []
    started = time.perf_counter()
    for header, text in texts:

        def fits(window: str, header: str = header) -> bool:
            return bool(budget.fits(f"{header}\n{window}"))

        spans.append([(c.start, c.end) for c in split(text, chunk_chars, overlap, fits)])
    return time.perf_counter() - started, spans


def _with_prefix(counter: Callable[[str], int]) -> Callable[[str], int]:
    return lambda text: counter("passage: " + text)


def measure(sets: dict[str, list[Text]], baseline: ModuleType, rounds: int, settings: Settings) -> dict[str, Any]:
    spec = resolve_local_model(MODEL)
    tokenizer = _counting_tokenizer(str(_package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)))

    def encode_count(text: str) -> int:
        return len(tokenizer.encode("passage: " + text).ids)

    results: dict[str, Any] = {}
    for name, texts in sets.items():
        old_seconds: list[float] = []
        new_seconds: list[float] = []
        old_spans: list[list[tuple[int, int]]] = []
        new_spans: list[list[tuple[int, int]]] = []
        for round_ in range(rounds):
            counter = token_counter(MODEL)  # a fresh one: no pieces remembered from the round before
            if counter is None:
                raise SystemExit(f"the {MODEL} tokenizer is not installed")
            new_count = _with_prefix(counter)
            sides: list[tuple[str, Splitter, Any, Callable[[str], int]]] = [
                ("old", baseline.split_text, baseline.TokenBudget, encode_count),
                ("new", split_text, TokenBudget, new_count),
            ]
            for side, split, budget_type, count in sides if round_ % 2 == 0 else sides[::-1]:
                seconds, spans = chunk_all(texts, split, budget_type, count, settings)
                (old_seconds if side == "old" else new_seconds).append(seconds)
                if side == "old":
                    old_spans = spans
                else:
                    new_spans = spans
            if old_spans != new_spans:
                differ = sum(a != b for a, b in zip(old_spans, new_spans, strict=True))
                raise SystemExit(f"{name}: {differ} of {len(texts)} texts chunked differently")
        chunks = sum(len(s) for s in new_spans)
        old_median, new_median = statistics.median(old_seconds), statistics.median(new_seconds)
        results[name] = {
            "texts": len(texts),
            "characters": sum(len(text) for _, text in texts),
            "chunks": chunks,
            "identical": True,
            "old_seconds": [round(s, 3) for s in old_seconds],
            "new_seconds": [round(s, 3) for s in new_seconds],
            "old_chunks_per_s": round(chunks / old_median, 1),
            "new_chunks_per_s": round(chunks / new_median, 1),
            "speedup": round(old_median / new_median, 2),
        }
        print(f"{name}: {len(texts)} texts, {chunks} chunks, identical; "
              f"{results[name]['old_chunks_per_s']} -> {results[name]['new_chunks_per_s']} chunks/s "
              f"({results[name]['speedup']}x)", flush=True)  # fmt: skip
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the commit whose chunker is the baseline")
    parser.add_argument("--demo-versions", type=int, default=300, help="demo generator versions (default 300)")
    parser.add_argument("--statutes", type=int, default=2000,
                        help="gesetze-headings-dev documents, the first N (default 2000; 0: all)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/chunking.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.demo_versions < 0 or args.statutes < 0:
        parser.error("--rounds must be >= 1, --demo-versions and --statutes >= 0")
    settings = Settings()
    load_start = os.getloadavg()
    sets = {
        "demo": demo_texts(args.demo_versions),
        "gesetze-headings-dev": data_set_texts("gesetze-headings-dev", args.statutes or None),
        "xquad-de": data_set_texts("xquad-de", None),
    }
    results = measure({k: v for k, v in sets.items() if v}, baseline_chunking(args.baseline), args.rounds, settings)
    report = {
        "command": "python -m apps.dev.bench.chunking " + " ".join(sys.argv[1:] if argv is None else argv),
        "baseline": args.baseline,
        "model": MODEL,
        "chunk_chars": settings.retrieval.chunk_chars,
        "chunk_overlap_chars": settings.retrieval.chunk_overlap_chars,
        "max_tokens": settings.embedding.max_tokens,
        "rounds": args.rounds,
        "sets": results,
        "machine": machine(load_start),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

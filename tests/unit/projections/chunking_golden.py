"""The golden chunks of `projections.chunking.split_text`: varied German texts and the windows cut from them.

`data/chunking_golden.json` holds the texts and every configuration's windows as the chunker cut them at
commit 48ba436 (before issue 53's faster chunking). Chunks feed the index rows, the ranking hash and vector
reuse by input key, so a faster chunker must cut exactly these windows (`test_chunking_golden.py`).

Regenerate only on purpose (a change of the chunks is a change of every index):
`PYTHONPATH=$PWD .venv/bin/python -m tests.unit.projections.chunking_golden --write` (the shared data sets
and the demo generator supply some of the texts; the file keeps them, so the test needs neither).
"""

from __future__ import annotations

import argparse
import json
import random
import unicodedata
from collections.abc import Callable
from functools import cache
from pathlib import Path

from projections.chunking import TokenBudget, split_text

GOLDEN = Path(__file__).parent / "data" / "chunking_golden.json"
E5 = "multilingual-e5-small"
HEADER = "Mietvertrag Hauptstraße 12, Berlin – Müller GmbH | Vertrag | Akte 2024/117"


def word_tokens(text: str) -> int:
    """A stand-in tokenizer: one token per word plus two special tokens."""
    return len(text.split()) + 2


@cache
def e5_tokens() -> Callable[[str], int]:
    """The e5 tokenizer's count as the sync worker's budget counts: passage prefix and special tokens."""
    from ki.embedding.local import token_counter

    count = token_counter(E5)
    if count is None:
        raise RuntimeError(f"the {E5} tokenizer is not installed")
    return lambda text: count("passage: " + text)


# (name, chunk_chars, overlap_chars, counter, max_tokens, header) -- counter None: no token budget.
Config = tuple[str, int, int, str | None, int, str]
CONFIGS: list[Config] = [
    ("chars-1200-120", 1200, 120, None, 0, ""),
    ("chars-300-40", 300, 40, None, 0, ""),
    ("chars-50-0", 50, 0, None, 0, ""),
    ("words-1200-120-max80", 1200, 120, "words", 80, ""),
    ("e5-1200-120-max512-header", 1200, 120, "e5", 512, HEADER),  # the sync worker's default
    ("e5-1200-120-max128-header", 1200, 120, "e5", 128, HEADER),  # token-bound: every window bisected
    ("e5-400-0-max48", 400, 0, "e5", 48, ""),
]


def fits_for(counter: str | None, max_tokens: int, header: str) -> Callable[[str], bool] | None:
    if counter is None:
        return None
    budget = TokenBudget(word_tokens if counter == "words" else e5_tokens(), max_tokens)
    return (lambda window: budget.fits(f"{header}\n{window}")) if header else budget.fits


def chunk_spans(text: str, config: Config) -> list[list[int]]:
    _, chunk_chars, overlap, counter, max_tokens, header = config
    fits = fits_for(counter, max_tokens, header)
    return [[c.start, c.end] for c in split_text(text, chunk_chars, overlap, fits)]


def _synthetic_texts() -> dict[str, str]:
    rng = random.Random(53)
    words = ["Kündigung", "§", "573", "Abs.", "2", "BGB", "Mieter", "Vermieter", "Frist", "1.2.2024", "Rn.", "12"]
    url = "https://www.gesetze-im-internet.de/bgb/__573.html?" + "&".join(f"p{i}=wert{i * 7919}" for i in range(120))
    table = "\n".join("| " + " | ".join(f"{rng.randint(0, 10**6):>9}" for _ in range(8)) + " |" for _ in range(60))
    return {
        "empty": "",
        "whitespace-only": " \n\t\u00a0\n  ",
        "short": "Kurzer Vertrag.",
        "short-paragraphs": "\n\n".join(f"{i}. Der Mieter zahlt die Miete bis zum {i}. Werktag." for i in range(1, 80)),
        "long-compound-word": ("Donaudampfschifffahrtsgesellschaftskapitänsmützen" * 60) + " Ende.",
        "url-and-table": f"Siehe {url} und die Tabelle:\n{table}\nQuelle: {url}",
        "citations-dense": " ".join(rng.choice(words) for _ in range(2500)),
        "whitespace-oddities": "\r\n".join(
            f"Absatz\t{i}:\u00a0Die\u2009Parteien  vereinbaren\u200bFolgendes.   \u3000" + " " * (i % 7)
            for i in range(150)
        ),
        "combining-and-emoji": (unicodedata.normalize("NFD", "Äußerung über Öl ") + "👨\u200d👩\u200d👧 ") * 120,
        "no-whitespace-digits": "".join(str(rng.randint(0, 9)) for _ in range(5000)),
    }


def _real_texts() -> dict[str, str]:
    """Texts of the German dev sets and the demo generator (needs ../shared/data)."""
    from apps.dev.demo.generator import SetupIds, iter_documents, ontology_rows, plan_setup
    from apps.dev.eval.beir import load_corpus, shared_data_dir
    from projections.text import normalise_text

    texts: dict[str, str] = {}
    statutes = load_corpus(shared_data_dir() / "gesetze-headings-dev")
    by_length = sorted(statutes, key=lambda d: (len(d.text), d.id))
    n = len(by_length)  # long and token-dense statutes, a median one and the shortest
    for doc in [by_length[n * 995 // 1000], by_length[n * 97 // 100], by_length[n // 2], by_length[0]]:
        texts[f"gesetze:{doc.id}"] = normalise_text(doc.text)
    for doc in load_corpus(shared_data_dir() / "xquad-de")[:2]:
        texts[f"xquad:{doc.id}"] = normalise_text(doc.text)
    plan = plan_setup(scale=12, seed=53, label="chunking-golden")
    ontology = {row["key"]: 1000 + i for i, row in enumerate(ontology_rows())}
    matters = [[100 * (i + 1) + m for m in range(len(rows))] for i, rows in enumerate(plan.matters)]
    ids = SetupIds(ontology, [10 + i for i in range(len(plan.projects))], matters, {})
    for n, bundle in enumerate(iter_documents(53, plan, ids, 12)):
        if n < 4:
            texts[f"demo:{n}"] = normalise_text(bundle.versions[-1]["text"])
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN}")
    if not parser.parse_args().write:
        parser.error("pass --write to overwrite the golden chunks")
    texts = {**_synthetic_texts(), **_real_texts()}
    golden = {
        "configs": [list(c) for c in CONFIGS],
        "texts": texts,
        "spans": {name: {c[0]: chunk_spans(text, c) for c in CONFIGS} for name, text in texts.items()},
    }
    GOLDEN.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{GOLDEN}: {len(texts)} texts, {sum(len(s) for t in golden['spans'].values() for s in t.values())} windows")


if __name__ == "__main__":
    main()

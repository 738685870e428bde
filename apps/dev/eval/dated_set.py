"""A dated and comparison query set from the demo corpus's versions (issue 49, item 3): a versioned BEIR folder
(apps.dev.eval.beir) that `ki eval` runs like any other set.

    .venv/bin/python -m apps.dev.eval.dated_set [--out benchmarks/data/dated-de] [--seed 49] [--documents 300]

The corpus is `--documents` documents of the demo generator (apps.dev.demo.generator, `build_document`: its
titles, texts, statuses, version numbers and dates), every version an entry `d0012v2` with `document` `d0012`,
`version_no`, `status` and `doc_date`. The queries are what a lawyer types: words of the document's title (its
type and address, parties, court and file number, or the provision an opinion is on) and a version asked for by
its day, or a comparison. Deterministic: the same seed writes the same files.

Kinds (`metadata.kind`) and how each is labelled -- "in force on a day" is the latest final or executed version
dated on or before it (ties: the higher number), as `search.access.version_view.in_force` defines it, computed
here independently:

* `dated`: "<title words> in der Fassung vom 1. März 2020", "... Stand 01.03.2020", "... gültig am 1.3.2020",
  "die am ... geltende Fassung ...", "... Stand 2020" (a year: its last day). The day is drawn inside a final or
  executed version's validity (from its date up to the day before the next final one; the latest one: up to 120
  days after its date). Relevant: the version in force that day.
* `compare`: "Was hat sich seit 1. März 2020 am <title words> geändert", "<title words> Änderungen gegenüber der
  Fassung vom ...", "Unterschied zur vorherigen Fassung <title words>", "... Vergleich alte und neue Fassung".
  Relevant: the later side, the document's current version (its latest final one, `latest_final_version_id`).
  `metadata.earlier`: the version the earlier side names -- in force on the day (a dated side is drawn in the
  validity of a final version before the latest one), or for "vorherige" / "alte" Fassung the last final version
  before the current one (null: there is none) -- which the eval checks against each hit's `compare` label.
* `dated-en`, `compare-en`: the same in English ("<title words> as of March 1, 2020", "... version in force on
  2020-03-01", "compare the 2019 and current versions of ...", "what changed in ... since March 2020").

A document without a final or executed version gets no query (no version is in force on any day); a comparison
with a dated side needs two final versions. Every second query of each kind is on a document with two final
versions, and a dated one then asks for a version before the current one (the set is about telling versions
apart: drawn at random, nine in ten dated queries would ask for the current version). Each query has exactly one
relevant version (grade 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.dev.checkout import REPO_ROOT
from apps.dev.demo.generator import SetupIds, SetupPlan, ontology_rows, plan_setup
from apps.dev.demo.generator import build_document as demo_document

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "data" / "dated-de"
SEED = 49
DOCUMENTS = 300
LABEL = "dated-de"  # the demo run label the documents are generated under (their texts depend on it)
FINAL = frozenset({"final", "executed"})
LAST_VALIDITY_DAYS = 120  # how long after its date the latest final version is asked for
#: Queries per kind.
COUNTS: dict[str, int] = {"dated": 90, "compare": 50, "dated-en": 25, "compare-en": 20}

MONTHS_DE = ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
             "November", "Dezember")  # fmt: skip
MONTHS_EN = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
             "November", "December")  # fmt: skip


@dataclass(frozen=True)
class Version:
    corpus_id: str
    version_no: int
    status: str
    doc_date: dt.date


@dataclass(frozen=True)
class Doc:
    key: str  # the `document` grouping key
    title: str
    versions: tuple[Version, ...]  # in version_no order

    @property
    def finals(self) -> list[Version]:
        return [v for v in self.versions if v.status in FINAL]

    @property
    def current(self) -> Version | None:
        """The latest final version (what upstream's `latest_final_version_id` names)."""
        finals = self.finals
        return finals[-1] if finals else None


def in_force(doc: Doc, day: dt.date) -> Version | None:
    """The version in force on `day`: the latest final or executed version dated on or before it (ties: the
    higher number); None: none."""
    dated = [v for v in doc.finals if v.doc_date <= day]
    return max(dated, key=lambda v: (v.doc_date, v.version_no)) if dated else None


def validity(doc: Doc, version: Version) -> tuple[dt.date, dt.date]:
    """The days `version` is in force (first, last), the latest final version up to LAST_VALIDITY_DAYS after it."""
    later = sorted(v.doc_date for v in doc.finals if v.doc_date > version.doc_date)
    end = later[0] - dt.timedelta(days=1) if later else version.doc_date + dt.timedelta(days=LAST_VALIDITY_DAYS)
    return version.doc_date, end


# --- the corpus ----------------------------------------------------------------------------------------------


def _ids(plan: SetupPlan) -> SetupIds:
    """Made-up database ids: the demo generator's rows need some, the texts do not depend on them."""
    ontology = {row["key"]: n for n, row in enumerate(ontology_rows(), start=1)}
    projects = list(range(1, len(plan.projects) + 1))
    matters = [[100 * p + m for m in range(len(rows))] for p, rows in enumerate(plan.matters, start=1)]
    return SetupIds(ontology=ontology, projects=projects, matters=matters, sources={})


def corpus(seed: int, documents: int) -> tuple[list[Doc], list[dict[str, Any]]]:
    """The documents and their corpus entries (every version, in document then version order)."""
    setup = plan_setup(scale=documents, seed=seed, label=LABEL)
    ids = _ids(setup)
    docs: list[Doc] = []
    entries: list[dict[str, Any]] = []
    for index in range(documents):
        bundle = demo_document(seed, index, setup, ids, max_versions=10)
        key = f"d{index:04d}"
        title = str(bundle.document["title"])
        versions = []
        for row in bundle.versions:
            corpus_id = f"{key}v{row['version_no']}"
            versions.append(Version(corpus_id, int(row["version_no"]), str(row["status"]), row["doc_date"]))
            entries.append({"_id": corpus_id, "title": title, "text": row["text"], "document": key,
                            "version_no": row["version_no"], "status": row["status"],
                            "doc_date": row["doc_date"].isoformat()})  # fmt: skip
        docs.append(Doc(key, title, tuple(versions)))
    return docs, entries


# --- the words of a title -------------------------------------------------------------------------------------

_AZ = re.compile(r"^(?P<kind>\S+) (?P<court>.+?), Az\. (?P<az>.+?) – (?P<a>.+?) \./\. (?P<b>.+)$")
_CONTRACT = re.compile(r"^(?P<kind>\S+) (?P<street>.+?) (?P<no>\d+), (?P<city>.+?) – (?P<party>.+)$")
_OPINION = re.compile(r"^Gutachten zu (?P<provision>.+?) – (?P<party>.+)$")


def subjects(title: str) -> list[str]:
    """Ways a lawyer names the document: words of its title, without its punctuation."""
    if match := _CONTRACT.match(title):
        kind, street, no, city, party = (match.group(k) for k in ("kind", "street", "no", "city", "party"))
        return [f"{kind} {street} {no} {city}", f"{kind} {party} {street} {no}", f"{kind} {street} {no}",
                f"{kind} {party} {city}"]  # fmt: skip
    if match := _AZ.match(title):
        kind, court, az, a, b = (match.group(k) for k in ("kind", "court", "az", "a", "b"))
        return [f"{kind} {a} gegen {b}", f"{kind} {court} {az}", f"{kind} {az}", f"{kind} {a} {b} {court}"]
    if match := _OPINION.match(title):
        provision, party = match.group("provision"), match.group("party")
        return [f"Gutachten {provision} {party}", f"Gutachten {party} zu {provision}", f"Gutachten {party}"]
    return [re.sub(r"[,–]", " ", title).split("  ")[0]]


def long_de(day: dt.date) -> str:
    return f"{day.day}. {MONTHS_DE[day.month - 1]} {day.year}"


def dotted(day: dt.date) -> str:
    return f"{day:%d.%m.%Y}"


def short_de(day: dt.date) -> str:
    return f"{day.day}.{day.month}.{day.year}"


def long_en(day: dt.date) -> str:
    return f"{MONTHS_EN[day.month - 1]} {day.day}, {day.year}"


# --- the queries ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    kind: str
    relevant: str  # corpus id
    meta: dict[str, Any]


Template = Callable[[str, dt.date], str]

DATED_DE: tuple[Template, ...] = (
    lambda s, d: f"{s} in der Fassung vom {long_de(d)}",
    lambda s, d: f"{s} Stand {dotted(d)}",
    lambda s, d: f"{s} gültig am {short_de(d)}",
    lambda s, d: f"Fassung vom {long_de(d)} {s}",
    lambda s, d: f"die am {long_de(d)} geltende Fassung {s}",
    lambda s, d: f"{s} in der ab {dotted(d)} gültigen Fassung",
)
DATED_EN: tuple[Template, ...] = (
    lambda s, d: f"{s} as of {long_en(d)}",
    lambda s, d: f"{s} as of {d.isoformat()}",
    lambda s, d: f"{s} version in force on {d.isoformat()}",
)
COMPARE_DE_DATED: tuple[Template, ...] = (
    lambda s, d: f"Was hat sich seit {long_de(d)} am {s} geändert",
    lambda s, d: f"{s} Änderungen gegenüber der Fassung vom {dotted(d)}",
    lambda s, d: f"Was hat sich seit dem {dotted(d)} im {s} geändert",
)
COMPARE_DE_PREVIOUS: tuple[Callable[[str], str], ...] = (
    lambda s: f"Unterschied zur vorherigen Fassung {s}",
    lambda s: f"{s} Vergleich alte und neue Fassung",
    lambda s: f"{s} was hat sich gegenüber der vorherigen Fassung geändert",
)
COMPARE_EN_DATED: tuple[Template, ...] = (
    lambda s, d: f"what changed in {s} since {long_en(d)}",
    lambda s, d: f"{s} changes since {d.isoformat()}",
)


def _day_in(rng: random.Random, span: tuple[dt.date, dt.date]) -> dt.date:
    return span[0] + dt.timedelta(days=rng.randint(0, (span[1] - span[0]).days))


def _dated(rng: random.Random, doc: Doc, english: bool, earlier: bool) -> tuple[str, Version, dict[str, Any]]:
    """A dated query on `doc`: the day in a final version's validity (`earlier`: one before the current)."""
    finals = doc.finals
    version = rng.choice(finals[:-1] if earlier and len(finals) >= 2 else finals)
    day = _day_in(rng, validity(doc, version))
    subject = rng.choice(subjects(doc.title))
    if not english and rng.random() < 0.15:  # a year: its last day decides
        at_year_end = in_force(doc, dt.date(day.year, 12, 31))
        if at_year_end is not None:
            text = f"{subject} Stand {day.year}" if rng.random() < 0.5 else f"{subject} in der Fassung {day.year}"
            return text, at_year_end, {"as_of": f"{day.year}-12-31"}
    template = rng.choice(DATED_EN if english else DATED_DE)
    found = in_force(doc, day)
    assert found == version, (doc.key, day)  # the day lies in the version's validity
    return template(subject, day), version, {"as_of": day.isoformat()}


def _compare(rng: random.Random, doc: Doc, english: bool) -> tuple[str, Version, dict[str, Any]]:
    current = doc.current
    assert current is not None
    subject = rng.choice(subjects(doc.title))
    earlier_finals = [v for v in doc.finals if v.doc_date < current.doc_date]
    if english:
        if earlier_finals and rng.random() < 0.7:
            version = rng.choice(earlier_finals)
            day = _day_in(rng, validity(doc, version))
            if rng.random() < 0.4:  # "compare the 2019 and current versions": the year's last day
                year_end = dt.date(day.year, 12, 31)
                earlier = in_force(doc, year_end)
                if earlier is not None and earlier != current:
                    text = f"compare the {day.year} and current versions of {subject}"
                    return text, current, {"earlier": earlier.corpus_id, "earlier_side": year_end.isoformat()}
            text = rng.choice(COMPARE_EN_DATED)(subject, day)
            return text, current, {"earlier": version.corpus_id, "earlier_side": day.isoformat()}
        previous = earlier_finals[-1].corpus_id if earlier_finals else None
        text = f"{subject} compared with the previous version"
        return text, current, {"earlier": previous, "earlier_side": "previous"}
    if earlier_finals and rng.random() < 0.6:
        version = rng.choice(earlier_finals)
        day = _day_in(rng, validity(doc, version))
        text = rng.choice(COMPARE_DE_DATED)(subject, day)
        return text, current, {"earlier": version.corpus_id, "earlier_side": day.isoformat()}
    previous = earlier_finals[-1].corpus_id if earlier_finals else None
    text = rng.choice(COMPARE_DE_PREVIOUS)(subject)
    return text, current, {"earlier": previous, "earlier_side": "previous"}


def queries(seed: int, docs: Sequence[Doc], counts: dict[str, int] | None = None) -> list[Query]:
    """The labelled queries (the module doc's rules), documents drawn without repetition per kind while they
    last. Every second query of a kind is on a document with two final versions (a dated one then asks for a
    version before the current one): the set is about telling versions apart."""
    rng = random.Random(f"{seed}:queries")
    eligible = [d for d in docs if d.finals]
    two_finals = [d for d in eligible if len(d.finals) >= 2]
    out: list[Query] = []
    for kind, count in (counts or COUNTS).items():
        english = kind.endswith("-en")
        comparing = kind.startswith("compare")
        pool: list[Doc] = []
        for n in range(count):
            if not pool:
                pool = list(eligible)
                rng.shuffle(pool)
            older = bool(two_finals) and n % 2 == 0
            doc = rng.choice(two_finals) if older else pool.pop()
            text, version, meta = _compare(rng, doc, english) if comparing else _dated(rng, doc, english, older)
            qid = f"{kind}-{n + 1:03d}"
            out.append(Query(qid, text, kind, version.corpus_id, {"kind": kind, "document": doc.key, **meta}))
    return out


# --- the files ------------------------------------------------------------------------------------------------

README = """# dated-de: dated and comparison queries over the demo corpus's versions

language: de

A versioned BEIR folder (apps/dev/eval/beir.py) written by `{command}`
(apps/dev/eval/dated_set.py: its module doc has the labelling rules). Do not edit by hand: re-generate.

- {documents} documents of the demo generator, {versions} versions (entries with `document`, `version_no`,
  `status`, `doc_date`); statuses {statuses}.
- {queries} test queries, one relevant version each: {kinds}.
- {not_latest} of the dated queries ask for a version that is not the document's current one; {compare_none}
  comparison queries have no earlier version to name (`metadata.earlier` null).

`ki eval --data benchmarks/data/dated-de` runs it; on a versioned set the eval also runs every mode with
`retrieval.query_words_enabled` false and compares the two per query (BENCHMARKS.md).
"""


def summary(docs: Sequence[Doc], qs: Sequence[Query]) -> dict[str, Any]:
    versions = {v.corpus_id: (d, v) for d in docs for v in d.versions}
    dated = [q for q in qs if q.kind.startswith("dated")]
    not_latest = sum(1 for q in dated if versions[q.relevant][0].current != versions[q.relevant][1])
    return {
        "documents": len(docs),
        "versions": len(versions),
        "statuses": dict(sorted(Counter(v.status for _, v in versions.values()).items())),
        "queries": len(qs),
        "kinds": dict(Counter(q.kind for q in qs)),
        "dated_not_current": not_latest,
        "compare_without_earlier": sum(1 for q in qs if "earlier" in q.meta and q.meta["earlier"] is None),
    }


def write(out: Path, seed: int = SEED, documents: int = DOCUMENTS, command: str = "") -> dict[str, Any]:
    """Write corpus.jsonl, queries.jsonl, qrels/test.tsv and README.md under `out`; the summary."""
    docs, entries = corpus(seed, documents)
    qs = queries(seed, docs)
    (out / "qrels").mkdir(parents=True, exist_ok=True)

    def lines(rows: Sequence[dict[str, Any]]) -> str:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    (out / "corpus.jsonl").write_text(lines(entries), encoding="utf-8")
    (out / "queries.jsonl").write_text(lines([{"_id": q.id, "text": q.text, "metadata": q.meta} for q in qs]),
                                       encoding="utf-8")  # fmt: skip
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"{q.id}\t{q.relevant}\t1\n" for q in qs)
    (out / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    facts = summary(docs, qs)
    (out / "README.md").write_text(
        README.format(
            command=command or f"python -m apps.dev.eval.dated_set --seed {seed} --documents {documents}",
            documents=facts["documents"], versions=facts["versions"],
            statuses=", ".join(f"{k} {v}" for k, v in facts["statuses"].items()), queries=facts["queries"],
            kinds=", ".join(f"{k} {v}" for k, v in facts["kinds"].items()), not_latest=facts["dated_not_current"],
            compare_none=facts["compare_without_earlier"],
        ),
        encoding="utf-8",
    )  # fmt: skip
    return facts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apps.dev.eval.dated_set", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the BEIR folder to write")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--documents", type=int, default=DOCUMENTS, help="demo documents in the corpus")
    args = parser.parse_args(argv)
    facts = write(args.out, args.seed, args.documents,
                  f"python -m apps.dev.eval.dated_set --seed {args.seed} --documents {args.documents}")  # fmt: skip
    print(json.dumps(facts, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

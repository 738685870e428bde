"""The dated and comparison query set (apps.dev.eval.dated_set): deterministic, committed as generated, and
labelled by the rules of its module doc -- checked here against the search's own version view."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path

import pytest

from apps.dev.eval import beir, dated_set
from ki.settings import load_settings
from search.access.version_view import VersionFacts, compared_with, in_force
from search.plan import words_decide
from search.query_words import parse_query
from search.request import parse_search_request

COMMITTED = dated_set.DEFAULT_OUT


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dated")
    dated_set.write(out)
    return out


def test_the_committed_set_is_what_the_generator_writes(generated: Path):
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "README.md"):
        assert (generated / name).read_bytes() == (COMMITTED / name).read_bytes(), name


def test_another_seed_gives_another_set():
    docs, _ = dated_set.corpus(dated_set.SEED, 40)
    counts = {"dated": 10, "compare": 10}
    assert dated_set.queries(1, docs, counts) != dated_set.queries(2, docs, counts)
    assert dated_set.queries(1, docs, counts) == dated_set.queries(1, docs, counts)


def _facts(docs: list[beir.CorpusDoc]) -> dict[str, list[VersionFacts]]:
    """The search's view of each document's versions (numbering by the corpus id's order)."""
    ids = {d.id: n for n, d in enumerate(docs, start=1)}
    out: dict[str, list[VersionFacts]] = {}
    for group in beir.group_versions(docs):
        out[group[0].group] = [VersionFacts(ids[d.id], 1, d.version_no, d.status, d.doc_date) for d in group]
    return out


def test_every_query_is_labelled_by_the_search_s_own_version_rules(generated: Path):
    docs = beir.load_corpus(generated)
    by_number = {n: d.id for n, d in enumerate(docs, start=1)}
    facts = _facts(docs)
    queries = beir.load_queries(generated)
    metadata = beir.load_query_metadata(generated)
    qrels = beir.load_qrels(generated / "qrels" / "test.tsv")
    assert len(queries) == len(qrels) >= 150
    kinds = Counter(m["kind"] for m in metadata.values())
    assert set(kinds) == {"dated", "compare", "dated-en", "compare-en"} and min(kinds.values()) >= 20
    not_current = 0
    for qid, judgments in qrels.items():
        ((relevant, grade),) = judgments.items()
        meta = metadata[qid]
        versions = facts[meta["document"]]
        current = [v for v in versions if v.status in {"final", "executed"}][-1]
        if meta["kind"].startswith("dated"):
            day = dt.date.fromisoformat(meta["as_of"])
            assert by_number[in_force(versions, day)[1]] == relevant, qid
            not_current += by_number[current.version_id] != relevant
        else:
            assert by_number[current.version_id] == relevant, qid
            side = meta["earlier_side"]
            earlier = compared_with(versions, current.version_id, side if side == "previous" else
                                    dt.date.fromisoformat(side))  # fmt: skip
            assert (by_number[earlier] if earlier is not None else None) == meta["earlier"], qid
        assert grade == 1
    assert not_current >= 40  # the set asks for versions before the current one, not only for the current one


def test_the_query_words_read_the_day_or_the_comparison_of_nearly_every_query(generated: Path):
    api = load_settings().api
    metadata = beir.load_query_metadata(generated)
    read = 0
    queries = beir.load_queries(generated)
    for qid, text in queries.items():
        meta = metadata[qid]
        decided = words_decide(parse_search_request({"query": text}, api), parse_query(text))
        if meta["kind"].startswith("dated"):
            read += decided.get("as_of") == dt.date.fromisoformat(meta["as_of"]) and "compare_with" not in decided
        else:
            side = decided.get("compare_with")
            read += (side.isoformat() if isinstance(side, dt.date) else side) == meta["earlier_side"]
    assert read / len(queries) >= 0.95


def test_titles_become_the_words_a_lawyer_types():
    assert dated_set.subjects("Mietvertrag Zeil 12, Köln – Herr Jürgen Pohl")[:2] == [
        "Mietvertrag Zeil 12 Köln",
        "Mietvertrag Herr Jürgen Pohl Zeil 12",
    ]
    court = dated_set.subjects("Urteil Kammergericht, Az. 12 U 3/20 – Spree Software UG ./. Frau Petra Lorenz")
    assert court[:2] == ["Urteil Spree Software UG gegen Frau Petra Lorenz", "Urteil Kammergericht 12 U 3/20"]
    assert dated_set.subjects("Gutachten zu § 535 BGB – Hanse Wohnbau eG")[0] == "Gutachten § 535 BGB Hanse Wohnbau eG"


def test_the_queries_file_carries_kind_and_document(generated: Path):
    first = json.loads((generated / "queries.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"_id", "text", "metadata"} and {"kind", "document"} <= set(first["metadata"])

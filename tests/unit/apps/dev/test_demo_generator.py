"""The pure half of the demo generator: deterministic rows with valid identifiers, statuses and text."""

from __future__ import annotations

import re

import pytest

from apps.dev.demo.generator import (
    FINAL_STATUSES,
    IDENTIFIER_PATTERNS,
    MAX_TEXT_CHARS,
    MIN_TEXT_CHARS,
    DocumentBundle,
    SetupIds,
    SetupPlan,
    iter_documents,
    ontology_rows,
    plan_setup,
)
from ki.principals import canonical_principal

LABEL = "ki-demo-s7-n300-test"

# A version never goes back from executed to final or from final to draft.
STATUS_RANK = {"draft": 0, "final": 1, "executed": 2}


def _fake_ids(plan: SetupPlan) -> SetupIds:
    ontology = {row["key"]: 1000 + i for i, row in enumerate(ontology_rows())}
    projects = [10 + i for i in range(len(plan.projects))]
    matters = [[100 * (i + 1) + m for m in range(len(rows))] for i, rows in enumerate(plan.matters)]
    return SetupIds(ontology, projects, matters, {"local_fs": 1, "sharepoint": 2, "dms": 3})


def _corpus(scale: int = 300, seed: int = 7, label: str = LABEL) -> tuple[SetupPlan, list[DocumentBundle]]:
    plan = plan_setup(scale=scale, seed=seed, label=label)
    return plan, list(iter_documents(seed, plan, _fake_ids(plan), scale))


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    plan_a, docs_a = _corpus()
    plan_b, docs_b = _corpus()
    assert plan_a == plan_b
    assert docs_a == docs_b
    _, docs_c = _corpus(seed=8)
    assert [d.versions[0]["text"] for d in docs_c] != [d.versions[0]["text"] for d in docs_a]


@pytest.mark.parametrize("scale", [1, 2, 3, 7, 300, 1001])
def test_exactly_scale_versions(scale: int) -> None:
    _, docs = _corpus(scale=scale)
    assert sum(len(d.versions) for d in docs) == scale


def test_every_version_has_long_german_text() -> None:
    _, docs = _corpus()
    for doc in docs:
        for version in doc.versions:
            assert MIN_TEXT_CHARS <= len(version["text"]) <= MAX_TEXT_CHARS, doc.document["title"]
            assert version["language"] == "de"
            assert version["text"].count("\n\n") >= 3  # several paragraphs
    all_text = " ".join(v["text"] for d in docs for v in d.versions)
    for word in ("Haftung", "Kündigung", "Gerichtsstand", "Vertraulichkeit", "BGB", "DSGVO"):
        assert word in all_text


def test_status_progression() -> None:
    _, docs = _corpus(scale=1000)
    seen_sequences = set()
    for doc in docs:
        statuses = [v["status"] for v in doc.versions]
        seen_sequences.add(tuple(statuses))
        assert [v["version_no"] for v in doc.versions] == list(range(1, len(statuses) + 1))
        ranks = [STATUS_RANK[s] for s in statuses]
        assert ranks == sorted(ranks), statuses
        assert statuses.count("final") <= 1 and statuses.count("executed") <= 1
        dates = [v["doc_date"] for v in doc.versions]
        assert dates == sorted(dates)
        finals = [i for i, s in enumerate(statuses) if s in FINAL_STATUSES]
        assert doc.latest_final_index == (finals[-1] if finals else None)
        for version in doc.versions:
            if version["status"] in FINAL_STATUSES:
                assert version["notable_clauses"], doc.document["title"]
                for clause in version["notable_clauses"]:
                    assert set(clause) == {"clause_type_id", "locus", "text"}
                    assert clause["text"] in version["text"]
            else:
                assert version["notable_clauses"] == []
    assert ("draft", "final", "executed") in seen_sequences
    assert any(seq == ("draft",) or seq == ("draft", "draft") for seq in seen_sequences)


def test_identifier_formats() -> None:
    _, docs = _corpus(scale=1000)
    patterns = [re.compile(p) for p in IDENTIFIER_PATTERNS.values()]
    kinds_seen = set()
    for doc in docs:
        identifiers = doc.document["identifiers"]
        assert identifiers and len(identifiers) == len(set(identifiers))
        for identifier in identifiers:
            matches = [name for name, p in zip(IDENTIFIER_PATTERNS, patterns, strict=True) if p.match(identifier)]
            assert matches, identifier
            kinds_seen.update(matches)
    assert {"bgh", "lg", "olg", "statute", "contract"} <= kinds_seen
    court_ids = [i for d in docs for i in d.document["identifiers"] if " ZR " in i or " BvR " in i]
    assert court_ids
    for doc in docs:  # a court file number is named in the document's text
        first = doc.document["identifiers"][0]
        if " ZR " in first or " BvR " in first:
            assert all(first in v["text"] for v in doc.versions)


def test_observations_and_grants_are_consistent() -> None:
    plan, docs = _corpus(scale=1000)
    scopes = set()
    effects = set()
    for doc in docs:
        active = {v for v, _, is_active in doc.observations if is_active}
        assert active == set(range(len(doc.versions)))
        for _, obj, _ in doc.observations:
            assert 0 <= obj < len(doc.source_objects)
        for scope, obj, principal, effect in doc.grants:
            scopes.add(scope)
            effects.add(effect)
            assert re.match(r"^(user|group|role):[a-z0-9.\-]+$", principal)
            assert (obj is None) == (scope == "document")
            if scope == "source_object":
                assert doc.source_objects[obj]["acl_known"]
        refs = [o["external_ref"] for o in doc.source_objects]
        assert len(refs) == len(set(refs))
    assert scopes == {"document", "source_object"}
    assert effects == {"allow", "deny"}
    assert {effect for _, _, effect in plan.project_grants} == {"allow", "deny"}
    kinds = {o["source_kind"] for d in docs for o in d.source_objects}
    assert kinds == {"local_fs", "sharepoint", "dms"}
    assert all(p["name"].endswith(LABEL) for p in plan.projects)
    assert all(s["name"].endswith(LABEL) for s in plan.sources.values())


def test_ontology_has_depth_and_parents_first() -> None:
    rows = ontology_rows()
    seen: set[str] = set()
    for row in rows:
        assert row["parent_key"] is None or row["parent_key"] in seen
        seen.add(row["key"])
    parents = {r["key"]: r["parent_key"] for r in rows}

    def depth(key: str) -> int:
        return 0 if parents[key] is None else 1 + depth(parents[key])

    assert max(depth(k) for k in parents) >= 2
    assert {r["kind"] for r in rows} == {"doc_type", "clause_type"}


def test_every_principal_the_demo_writes_is_canonical() -> None:
    """Grants, memberships and aliases use the canonical form (`kind:name`, casefolded), so the database's
    `ck_*_form` checks accept them and a login can match them: a token's subject becomes `user:<sub>`."""
    plan, docs = _corpus(scale=200)
    written = [p for _, p, _ in plan.project_grants] + [p for d in docs for _, _, p, _ in d.grants]
    written += [p for _, group, member in plan.memberships for p in (group, member)]
    written += [p for row in plan.aliases for p in (row["alias"], row["principal"])]
    assert written and all(canonical_principal(p) == p for p in written), [
        p for p in written if canonical_principal(p) != p
    ]
    assert {"alias": "user:anna.schmidt@kanzlei-demo.de", "principal": "user:anna.schmidt"} in plan.aliases


def test_relations_join_documents_of_one_matter_deterministically() -> None:
    from apps.dev.demo.generator import DOC_TYPE_CHOICES, Placed, plan_relations
    from ki.db.models import RELATION_KINDS

    keys = [k for k, _, _ in DOC_TYPE_CHOICES]
    placed = [Placed(100 + i, keys[(i * 7) % len(keys)], 1, (i % 3) or None) for i in range(60)]
    relations = plan_relations(7, "label", placed)
    assert relations == plan_relations(7, "label", placed) != plan_relations(8, "label", placed)
    matter = {p.document_id: p.matter_id for p in placed}
    kind_of = {p.document_id: p.doc_type_key for p in placed}
    assert {k for k, _, _ in relations} == set(RELATION_KINDS)  # the demo shows every kind
    for kind, a, b in relations:
        assert a != b and matter[a] is not None and matter[a] == matter[b]
        if kind in ("supersedes", "annex_of"):
            assert ".vertrag." in kind_of[a] and ".vertrag." in kind_of[b] and a > b  # the later one points back
        if kind == "responds_to":
            assert kind_of[a].endswith("klageerwiderung") and kind_of[b].endswith("klageschrift")

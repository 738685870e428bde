"""A tagged corpus for the sync benchmarks, written to PostgreSQL as an upstream system would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, text


@dataclass(frozen=True)
class BenchCorpus:
    project: int
    document_ids: list[int]
    version_ids: list[int]


def write_corpus(
    engine: Engine, *, label: str, docs: int, text_of: Callable[[int], str], principal: str
) -> BenchCorpus:
    """`docs` one-version draft documents in a new project `label`, each observed at its own `local_fs`
    object, with a project allow for `principal`. One transaction: CDC sees it all at once."""
    with engine.begin() as conn:
        project = conn.execute(text("INSERT INTO projects (name) VALUES (:n) RETURNING id"), {"n": label}).scalar_one()
        source = conn.execute(
            text("INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id"), {"n": label}
        ).scalar_one()
        conn.execute(
            text("INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :w, 'allow')"),
            {"p": project, "w": principal},
        )
        doc_ids, version_ids = [], []
        for n in range(docs):
            doc = conn.execute(
                text("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id"),
                {"p": project, "t": f"Vertrag {n} ({label})"},
            ).scalar_one()
            version = conn.execute(
                text(
                    "INSERT INTO document_versions (document_id, version_no, status, text)"
                    " VALUES (:d, 1, 'draft', :t) RETURNING id"
                ),
                {"d": doc, "t": text_of(n)},
            ).scalar_one()
            obj = conn.execute(
                text("INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :r) RETURNING id"),
                {"s": source, "r": f"{label}-{n}"},
            ).scalar_one()
            conn.execute(
                text("INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o)"),
                {"v": version, "o": obj},
            )
            doc_ids.append(doc)
            version_ids.append(version)
    return BenchCorpus(project, doc_ids, version_ids)

"""Write small worlds of projects, documents, versions, sources and grants into the real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Connection, text


def _one(conn: Connection, sql: str, **params: object) -> int:
    return int(conn.execute(text(sql), params).scalar_one())


@dataclass
class World:
    conn: Connection
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def project(self, name: str = "Projekt") -> int:
        return _one(self.conn, "INSERT INTO projects (name) VALUES (:n) RETURNING id", n=f"{name} {self.tag}")

    def source(self, kind: str = "local_fs") -> int:
        return _one(
            self.conn, "INSERT INTO sources (kind, name) VALUES (:k, :n) RETURNING id", k=kind, n=f"{kind}-{self.tag}"
        )

    def source_object(self, source_id: int, *, acl_known: bool = False) -> int:
        return _one(
            self.conn,
            "INSERT INTO source_objects (source_id, external_ref, acl_known) VALUES (:s, :r, :a) RETURNING id",
            s=source_id,
            r=f"obj-{uuid.uuid4().hex[:10]}",
            a=acl_known,
        )

    def document(self, project_id: int, title: str, *, identifiers: list[str] | None = None) -> int:
        return _one(
            self.conn,
            "INSERT INTO documents (project_id, title, identifiers) VALUES (:p, :t, :i) RETURNING id",
            p=project_id,
            t=title,
            i=identifiers or [],
        )

    def version(
        self,
        document_id: int,
        body: str,
        *,
        version_no: int = 1,
        status: str = "final",
        clauses: list[dict] | None = None,
        latest: bool = True,
        doc_date: dt.date | None = dt.date(2024, 5, 17),
    ) -> int:
        version_id = _one(
            self.conn,
            "INSERT INTO document_versions (document_id, version_no, status, text, doc_date, notable_clauses) "
            "VALUES (:d, :n, :s, :t, :dt, CAST(:c AS jsonb)) RETURNING id",
            d=document_id,
            n=version_no,
            s=status,
            t=body,
            dt=doc_date,
            c=json.dumps(clauses or []),
        )
        if latest and status in ("final", "executed"):
            self.conn.execute(
                text("UPDATE documents SET latest_final_version_id = :v WHERE id = :d"),
                {"v": version_id, "d": document_id},
            )
        return version_id

    def observe(self, version_id: int, object_id: int) -> int:
        return _one(
            self.conn,
            "INSERT INTO source_observations (document_version_id, source_object_id) VALUES (:v, :o) RETURNING id",
            v=version_id,
            o=object_id,
        )

    def searchable(self, project_id: int, title: str, body: str, object_id: int, key: str) -> int:
        """A document with one final version observed at `object_id`, its title and an identifier tagged
        (`AZ-<key>-<tag>`): what a search test needs of each document. Answers the document's id."""
        document_id = self.document(project_id, f"{title} {self.tag}", identifiers=[f"AZ-{key}-{self.tag}"])
        self.observe(self.version(document_id, body), object_id)
        return document_id

    def grant(self, scope: str, target: int, principal: str, effect: str = "allow") -> int:
        column = {"project": "project_id", "document": "document_id", "source_object": "source_object_id"}[scope]
        return _one(
            self.conn,
            f"INSERT INTO grants (scope, {column}, principal, effect) VALUES (:s, :t, :p, :e) RETURNING id",
            s=scope,
            t=target,
            p=principal,
            e=effect,
        )

    def member(self, group: str, member: str, source_id: int | None = None) -> int:
        return _one(
            self.conn,
            "INSERT INTO group_memberships (source_id, group_principal, member_principal) "
            "VALUES (:s, :g, :m) RETURNING id",
            s=source_id,
            g=group,
            m=member,
        )

    def relation(self, kind: str, from_document: int, to_document: int) -> int:
        return _one(
            self.conn,
            "INSERT INTO relations (kind, from_document_id, to_document_id) VALUES (:k, :a, :b) RETURNING id",
            k=kind,
            a=from_document,
            b=to_document,
        )

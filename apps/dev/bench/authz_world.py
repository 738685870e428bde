"""The world `ki bench authz-timing` asks about, written to PostgreSQL in a few set-based statements.

Every project and the source carry the run's label (`apps.dev.bench.cleanup`): removing them removes, by
cascade, every document, version, observation, relation, decision, grant and group membership below; the one
alias it writes is named in its footprint.

Two parts:

* **SQL world** (the endpoints that read PostgreSQL only), a pool of `POOL` of each that pair i takes
  entry i mod `POOL` of (these endpoints cache nothing; ids that do not exist are fresh per pair): caller C's
  project with one visible document V; in another project hidden documents, each with a version, an
  observation, a relation from V and a decision record with a word of its own (documents, related,
  traverse, decisions, and what the 100-id batches are drawn from); in C's project a visible document whose
  only edge is a `references` edge from a hidden document, a visible document with no edges, and a visible
  document with one `references` edge to or from a hidden document.
* **Index world** (ranked search; `index_versions` are what must reach the index): caller B's project and
  colleague A's project (a few searchable documents each; A's also the documents titled `Zielfirma <word>
  Holding` B may not see, one per pair: a caller's name cache keeps a name it looked up, so a name is asked
  once; and the document whose new versions invalidate every cached scope); caller E, a member of group G,
  whose project holds 40 visible documents (more than a 256-byte scope filter lists) and documents denied
  to G that carry the secret words, one per pair; and an alias from G to a principal E does not hold (the
  principal projection cannot be used for E).

Few documents on purpose: the database is shared, and every identity look-up reads each document's title
and identifiers (no index takes `ki.acl._NAMED`'s conditions), so each document of the world costs every
named search on the stack a little while it exists.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text

#: Ids in one traversal's `start` (the limit: `api.limits.max_filter_values`).
BATCH = 100
#: Documents of each kind in the SQL world (a batch draws BATCH distinct hidden ids from POOL * 3).
POOL = 100
#: Caller E's visible documents: their exact scope filter is over the 256-byte minimum budget.
SUPERSET_VISIBLE = 40
#: Documents denied to E that carry the secret words (each carries its share of them).
SUPERSET_HIDDEN = 40
VOCABULARY = ("Kaution", "Miete", "Kündigung", "Frist", "Haftung", "Schaden", "Zahlung", "Verzug")
#: Documents of each side of the comparison case (pair i asks entry i mod COMPARE_POOL).
COMPARE_POOL = 20
#: Caller B's query in the invalidation case: words of B's own documents (hits to rank and re-verify).
COMMON_QUERY = "Kaution Frist"

_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


class Words:
    """Fresh words of letters only (no digits: nothing an identifier key would take), unique within a run.
    `prefix` keeps families apart (a word found nowhere never shares a stem with a secret word)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def fresh(self, prefix: str = "") -> str:
        while True:
            word = (prefix + "".join(self.rng.choice(_SYLLABLES) for _ in range(4))).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


def named_query(company: str) -> str:
    """The shape of the identity cases' query: it names `Zielfirma <company> Holding` (a title)."""
    return f"Übernahme Zielfirma {company} Holding"


@dataclass
class SqlWorld:
    tag: str
    caller: str  # C, principal user:<caller>
    # Pools (pair i takes entry i mod POOL); ids that do not exist are fresh per pair.
    hidden: list[int]  # hidden documents (version, observation, relation from V, decision)
    hidden_versions: list[int]  # each hidden document's version
    first_missing_version: int  # per pair i: first_missing_version + i does not exist
    words: list[str]  # each hidden document's decision word
    first_missing: int  # per pair i: first_missing + i does not exist
    batch_missing: int  # per pair i: batch_missing + BATCH * i + k (k < BATCH) do not exist
    incoming_only: list[int]  # visible, only edge a `references` edge from a hidden document
    no_edges: list[int]  # visible, no edges
    hidden_edge: list[int]  # visible, one `references` edge to (even entries) or from (odd) a hidden one
    hidden_pool: list[int] = field(default_factory=list)  # every hidden document (the batches' draw)
    expired: list[int] = field(default_factory=list)  # C's own, granted and observed, expiry passed


@dataclass
class IndexWorld:
    searcher: str  # B
    colleague: str  # A
    superset: str  # E
    group: str  # G (E is a member; allowed on E's project, denied on the secret documents)
    alias: str  # the alias row's alias (G), for the footprint
    named_titles: list[str]  # per pair: `Zielfirma <word> Holding`, a document A sees and B does not
    named_companies: list[str]  # the <word> of each title
    secret_words: list[str]  # per pair: a word found only in documents E may not see
    change_target: int  # a document B may not see: its new versions invalidate every cached scope
    # B's documents asked about in a comparison ("<word> vorherige Fassung"): each one's shown version is its
    # second; before it, the first is hidden from everyone (observed nowhere) -- or there is none.
    compare_hidden_words: list[str]
    compare_missing_words: list[str]
    index_versions: list[int]  # what must reach the index
    projects: list[int]


def _one(conn: Connection, sql: str, **params: object) -> int:
    return int(conn.execute(text(sql), params).scalar_one())


def _project(conn: Connection, label: str) -> int:
    return _one(conn, "INSERT INTO projects (name) VALUES (:n) RETURNING id", n=label)


def add_documents(
    conn: Connection, project: int, titles: Sequence[str], texts: Sequence[str], obj: int
) -> tuple[list[int], list[int]]:
    """Documents with one final version each, observed at `obj`: (document ids, version ids) in the order
    of `titles` (which must be distinct)."""
    if not titles:
        return [], []
    rows = conn.execute(
        text(
            "INSERT INTO documents (project_id, title) SELECT :p, t FROM unnest(CAST(:titles AS text[])) AS t"
            " RETURNING id, title"
        ),
        {"p": project, "titles": list(titles)},
    ).all()
    by_title = {r.title: int(r.id) for r in rows}
    documents = [by_title[t] for t in titles]
    rows = conn.execute(
        text(
            "INSERT INTO document_versions (document_id, version_no, status, text)"
            " SELECT d, 1, 'final', b FROM unnest(CAST(:docs AS bigint[]), CAST(:texts AS text[])) AS x(d, b)"
            " RETURNING id, document_id"
        ),
        {"docs": documents, "texts": list(texts)},
    ).all()
    by_document = {int(r.document_id): int(r.id) for r in rows}
    versions = [by_document[d] for d in documents]
    conn.execute(
        text(
            "UPDATE documents SET latest_final_version_id = x.v"
            " FROM unnest(CAST(:docs AS bigint[]), CAST(:versions AS bigint[])) AS x(d, v) WHERE documents.id = x.d"
        ),
        {"docs": documents, "versions": versions},
    )
    conn.execute(
        text(
            "INSERT INTO source_observations (document_version_id, source_object_id)"
            " SELECT v, :o FROM unnest(CAST(:versions AS bigint[])) AS v"
        ),
        {"versions": versions, "o": obj},
    )
    return documents, versions


def add_relations(conn: Connection, kind: str, pairs: Sequence[tuple[int, int]]) -> None:
    if pairs:
        conn.execute(
            text(
                "INSERT INTO relations (kind, from_document_id, to_document_id)"
                " SELECT :k, a, b FROM unnest(CAST(:froms AS bigint[]), CAST(:tos AS bigint[])) AS x(a, b)"
            ),
            {"k": kind, "froms": [a for a, _ in pairs], "tos": [b for _, b in pairs]},
        )


def _grant_project(conn: Connection, project: int, principal: str) -> None:
    conn.execute(
        text("INSERT INTO grants (scope, project_id, principal, effect) VALUES ('project', :p, :u, 'allow')"),
        {"p": project, "u": principal},
    )


def _source(conn: Connection, label: str, tag: str) -> tuple[int, int]:
    source = _one(conn, "INSERT INTO sources (kind, name) VALUES ('local_fs', :n) RETURNING id", n=label)
    obj = _one(conn, "INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :r) RETURNING id",
               s=source, r=f"authz-{tag}-{uuid.uuid4().hex[:6]}")  # fmt: skip
    return source, obj


def write_sql_world(engine: Engine, label: str, pairs: int) -> SqlWorld:
    """The SQL world for up to `pairs` pairs of each SQL case (see the module's docstring)."""
    tag = label.rsplit(" ", 1)[-1]
    caller = f"bench-authz-{tag}"
    pool = n = POOL
    with engine.begin() as conn:
        mine, theirs = _project(conn, label), _project(conn, label)
        _, obj = _source(conn, label, tag)
        (visible,), _ = add_documents(conn, mine, [f"Akte {tag}"], ["Vermerk."], obj)
        hidden, hidden_versions = add_documents(conn, theirs, [f"Akte {i} {tag}" for i in range(pool)],
                                  [f"Vermerk {i}." for i in range(pool)], obj)  # fmt: skip
        words = [f"fristwort{i}x{tag}" for i in range(pool)]
        add_relations(conn, "references", [(visible, doc) for doc in hidden])
        conn.execute(
            text(
                "INSERT INTO decision_records (project_id, document_id, rationale)"
                " SELECT :p, d, w || ' verlängert'"
                " FROM unnest(CAST(:docs AS bigint[]), CAST(:words AS text[])) AS x(d, w)"
            ),
            {"p": theirs, "docs": hidden, "words": words},
        )

        def documents(project: int, what: str) -> list[int]:
            ids, _ = add_documents(conn, project, [f"{what} {i} {tag}" for i in range(n)],
                                   [f"{what} {i}." for i in range(n)], obj)  # fmt: skip
            return ids

        incoming_only, no_edges = documents(mine, "Eingang"), documents(mine, "Ohne")
        hidden_edge = documents(mine, "Art")
        from_hidden, edge_hidden = documents(theirs, "Quelle"), documents(theirs, "Gegenstelle")
        add_relations(conn, "references", list(zip(from_hidden, incoming_only, strict=True)))
        edges = zip(hidden_edge, edge_hidden, strict=True)
        add_relations(conn, "references", [(v, h) if i % 2 == 0 else (h, v) for i, (v, h) in enumerate(edges)])
        expired = documents(mine, "Abgelaufen")
        conn.execute(text("UPDATE documents SET expires_at = now() - interval '1 day' WHERE id = ANY(:ids)"),
                     {"ids": expired})  # fmt: skip
        _grant_project(conn, mine, f"user:{caller}")
        first_missing = _one(conn, "SELECT coalesce(max(id), 0) + 1000000 FROM documents")
        first_missing_version = _one(conn, "SELECT coalesce(max(id), 0) + 1000000 FROM document_versions")
    return SqlWorld(
        tag=tag,
        caller=caller,
        hidden=hidden,
        hidden_versions=hidden_versions,
        first_missing_version=first_missing_version,
        words=words,
        first_missing=first_missing,
        batch_missing=first_missing + pairs + 1000,
        incoming_only=incoming_only,
        no_edges=no_edges,
        hidden_edge=hidden_edge,
        hidden_pool=hidden + from_hidden + edge_hidden,
        expired=expired,
    )


def add_compared_documents(
    conn: Connection, project: int, words: Sequence[str], obj: int, hidden_first: bool
) -> list[int]:
    """Documents whose shown version is their second (final, observed at `obj`, carrying its word); with
    `hidden_first` a first final version observed nowhere (hidden from everyone) comes before it. Answers the
    shown versions."""
    rows = conn.execute(
        text(
            "INSERT INTO documents (project_id, title)"
            " SELECT :p, 'Fassungen ' || w FROM unnest(CAST(:w AS text[])) AS w RETURNING id, title"
        ),
        {"p": project, "w": list(words)},
    ).all()
    by_word = {r.title.removeprefix("Fassungen "): int(r.id) for r in rows}
    documents = [by_word[w] for w in words]
    if hidden_first:
        conn.execute(
            text(
                "INSERT INTO document_versions (document_id, version_no, status, text)"
                " SELECT d, 1, 'final', 'Frühere Fassung.' FROM unnest(CAST(:docs AS bigint[])) AS d"
            ),
            {"docs": documents},
        )
    rows = conn.execute(
        text(
            "INSERT INTO document_versions (document_id, version_no, status, text)"
            " SELECT d, 2, 'final', w || ' Mietvertrag.'"
            " FROM unnest(CAST(:docs AS bigint[]), CAST(:w AS text[])) AS x(d, w) RETURNING id, document_id"
        ),
        {"docs": documents, "w": list(words)},
    ).all()
    shown = {int(r.document_id): int(r.id) for r in rows}
    versions = [shown[d] for d in documents]
    conn.execute(
        text(
            "UPDATE documents SET latest_final_version_id = x.v"
            " FROM unnest(CAST(:docs AS bigint[]), CAST(:versions AS bigint[])) AS x(d, v) WHERE documents.id = x.d"
        ),
        {"docs": documents, "versions": versions},
    )
    conn.execute(
        text(
            "INSERT INTO source_observations (document_version_id, source_object_id)"
            " SELECT v, :o FROM unnest(CAST(:versions AS bigint[])) AS v"
        ),
        {"versions": versions, "o": obj},
    )
    return versions


def write_index_world(engine: Engine, label: str, titles: int, n: int, words: Words) -> IndexWorld:
    """The index world for `titles` pairs of names-hidden and `n` of the other search cases (see the module's
    docstring)."""
    tag = label.rsplit(" ", 1)[-1]
    searcher, colleague, superset = f"bench-authz-b-{tag}", f"bench-authz-a-{tag}", f"bench-authz-e-{tag}"
    group, beyond = f"group:bench-authz-g-{tag}", f"group:bench-authz-beyond-{tag}"
    rng = random.Random(tag)
    companies = [words.fresh() for _ in range(titles)]
    secrets = [words.fresh("geh") for _ in range(n)]
    index_versions: list[int] = []
    with engine.begin() as conn:
        b_project, a_project, e_project = _project(conn, label), _project(conn, label), _project(conn, label)
        source, obj = _source(conn, label, tag)

        def searchable(project: int, what: str, count: int) -> None:
            texts = [f"{' '.join(rng.sample(VOCABULARY, 4))}. Vermerk {i} zur {rng.choice(VOCABULARY)}."
                     for i in range(count)]  # fmt: skip
            _, versions = add_documents(conn, project, [f"{what} {i} {tag}" for i in range(count)], texts, obj)
            index_versions.extend(versions)

        searchable(b_project, "Mandatsakte", 5)
        compare_hidden = [words.fresh("fas") for _ in range(COMPARE_POOL)]
        compare_missing = [words.fresh("fas") for _ in range(COMPARE_POOL)]
        for compared, hidden_first in ((compare_hidden, True), (compare_missing, False)):
            index_versions.extend(add_compared_documents(conn, b_project, compared, obj, hidden_first))
        searchable(a_project, "Wandakte", 5)
        searchable(e_project, "Vermerk", SUPERSET_VISIBLE)
        named = [f"Zielfirma {c} Holding" for c in companies]
        add_documents(conn, a_project, named, [f"Beteiligung {i}." for i in range(titles)], obj)
        (change_target,), _ = add_documents(conn, a_project, [f"Entwurfsakte {tag}"], ["Entwurf 1."], obj)
        share = -(-n // SUPERSET_HIDDEN)  # words per secret document
        chunks = [secrets[i : i + share] for i in range(0, n, share)]
        secret_docs, versions = add_documents(
            conn, e_project, [f"Verschlusssache {i} {tag}" for i in range(len(chunks))],
            [" ".join(chunk) + "." for chunk in chunks], obj,
        )  # fmt: skip
        index_versions.extend(versions)
        for project, principal in ((b_project, f"user:{searcher}"), (a_project, f"user:{colleague}"),
                                   (e_project, group)):  # fmt: skip
            _grant_project(conn, project, principal)
        conn.execute(
            text(
                "INSERT INTO grants (scope, document_id, principal, effect)"
                " SELECT 'document', d, :g, 'deny' FROM unnest(CAST(:docs AS bigint[])) AS d"
            ),
            {"g": group, "docs": secret_docs},
        )
        conn.execute(
            text("INSERT INTO group_memberships (source_id, group_principal, member_principal) VALUES (:s, :g, :m)"),
            {"s": source, "g": group, "m": f"user:{superset}"},
        )
        conn.execute(text("INSERT INTO principal_aliases (alias, principal) VALUES (:a, :p)"),
                     {"a": group, "p": beyond})  # fmt: skip
    return IndexWorld(
        searcher=searcher,
        colleague=colleague,
        superset=superset,
        group=group,
        alias=group,
        named_titles=named,
        named_companies=companies,
        secret_words=secrets,
        change_target=change_target,
        compare_hidden_words=compare_hidden,
        compare_missing_words=compare_missing,
        index_versions=index_versions,
        projects=[b_project, a_project, e_project],
    )


def add_hidden_version(engine: Engine, document: int) -> int:
    """A new draft version of `document` (not observed, not latest): invalidates every cached scope."""
    with engine.begin() as conn:
        return _one(
            conn,
            "INSERT INTO document_versions (document_id, version_no, status, text)"
            " SELECT :d, coalesce(max(version_no), 0) + 1, 'draft', 'Entwurf.' FROM document_versions"
            " WHERE document_id = :d RETURNING id",
            d=document,
        )

"""One identity key: `ki_identity_key(x)` in SQL (migration 0005) == `search.names.keys.identity_key(x)`,
and the preflight's look-up finds names through the indexes of that key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from ki.settings import load_settings
from search.names.keys import UNICODE_SEPARATORS, identity_key
from search.names.sql import named_documents
from tests.integration.world import World

pytestmark = pytest.mark.stack

_SQL_KEYS = text("SELECT x, ki_identity_key(x) AS key FROM unnest(CAST(:xs AS text[])) AS x")

#: Every code point except NUL and the surrogates (PostgreSQL text holds neither).
CODE_POINTS = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]


def _assert_sql_is_python(engine: Engine, values: list[str]) -> None:
    with engine.connect() as conn:
        keys = {row.x: row.key for row in conn.execute(_SQL_KEYS, {"xs": values})}
    wrong = [v for v in values if keys[v] != identity_key(v)]
    assert not wrong, [(v, keys[v], identity_key(v)) for v in wrong[:10]]


def test_sql_key_equals_python_on_every_code_point(engine: Engine) -> None:
    """Every code point between letters and digits (the digit boundary), next to a space, and after a
    base letter with a combining mark (NFC), 32 code points to a string (one string per code point took
    SQL four minutes)."""
    contexts = [f"a{c}1{c} X{c}ß a\u0308{c}" for c in CODE_POINTS]
    _assert_sql_is_python(engine, ["|".join(contexts[i : i + 32]) for i in range(0, len(contexts), 32)])


def test_sql_key_equals_python_on_legal_names(engine: Engine) -> None:
    names = [
        "§ 573 BGB",
        "§573a BGB",
        "Art. 6 Abs. 1 lit. f DSGVO",
        "5 U 123/22",
        "VII ZR 45/21",
        "1 BvR 2347/15",
        "V-2023-00417",
        "Mietvertrag Hauptstraße 5, Berlin – Müller GmbH",
        "Urteil LG Köln, Az. 3 O 12/24 – Schulz ./. Weber",
        "„Gutachten“ zur ‚Mietpreisbremse‘ …",
        "ΣΟΦΙΑ straße İstanbul ﬁnanz",
        UNICODE_SEPARATORS,
    ]
    _assert_sql_is_python(engine, names + [n.upper() for n in names] + [n.lower() for n in names])


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
NAME_LIKE = st.text(st.sampled_from("aZ09 /-.§–ßÄäöü„“\u00a0\u0308İſ"), max_size=20)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(values=st.lists(st.one_of(TEXT, NAME_LIKE), max_size=200))
def test_sql_key_equals_python_on_random_text(engine: Engine, values: list[str]) -> None:
    _assert_sql_is_python(engine, values)


def test_look_up_finds_titles_and_identifiers_by_key_and_skips_deleted(engine: Engine) -> None:
    with engine.connect() as conn, conn.begin() as transaction:  # rolled back: nothing to clean up
        w = World(conn)
        project = w.project("Schlüssel")
        a = w.document(project, f"Kaufvertrag Nordhafen {w.tag}", identifiers=[f"KV-{w.tag}-1", "§ 433 BGB"])
        b = w.document(project, f"Kaufvertrag Nordhafen {w.tag}", identifiers=[f"KV-{w.tag}-2"])
        gone = w.document(project, f"Kaufvertrag Nordhafen {w.tag}", identifiers=[f"KV-{w.tag}-1"])
        conn.execute(text("UPDATE documents SET deleted_at = now() WHERE id = :d"), {"d": gone})
        obj = w.source_object(w.source("local_fs"))
        for doc in (a, b, gone):
            w.observe(w.version(doc, "Kaufpreis."), obj)
        hidden = w.document(w.project("Wand"), f"Kaufvertrag Nordhafen {w.tag}", identifiers=[f"KV-{w.tag}-1"])
        w.observe(w.version(hidden, "Kaufpreis."), obj)
        reader = f"user:leser-{w.tag}"
        w.grant("project", project, reader)
        title_key = identity_key(f"Kaufvertrag Nordhafen {w.tag}")
        identifier_key = identity_key(f"kv {w.tag} 1")
        security = load_settings(environ={}).security
        found, saturated = named_documents(conn, [reader], security, [title_key], [identifier_key], per_name=10)
        assert sorted((n.document_id, n.why) for n in found) == sorted([(a, "title"), (b, "title"), (a, "identifier")])
        assert saturated == set()  # the hidden carrier is neither found nor counted
        found, saturated = named_documents(conn, [reader], security, [title_key], [], per_name=1)
        assert found == [] and saturated == {title_key}  # two visible documents carry it: more than one
        found, saturated = named_documents(conn, [reader], security, [], [identifier_key], per_name=1)
        assert [n.document_id for n in found] == [a] and saturated == set()  # the hidden one does not count
        assert named_documents(conn, [f"user:niemand-{w.tag}"], security, [title_key], [identifier_key], 10) == (
            [],
            set(),
        )
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plans = [
            "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN SELECT id FROM documents WHERE {where}"), params))
            for where, params in (
                (
                    "deleted_at IS NULL AND ki_identity_keys(identifiers) @> ARRAY[CAST(:k AS text)]",
                    {"k": identifier_key},
                ),
                ("deleted_at IS NULL AND left(ki_identity_key(title), 255) = :k", {"k": title_key}),
            )
        ]
        transaction.rollback()
    assert "ix_documents_identifiers_identity" in plans[0], plans[0]
    assert "ix_documents_title_identity" in plans[1], plans[1]

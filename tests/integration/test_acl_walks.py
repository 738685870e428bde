"""The re-verify's two walks of the memberships (`ki.acl.Walk`) give the same rows on the shapes random worlds
seldom draw: a grant reached through nested groups, a deny reached through them, a membership cycle, an alias
before the groups, an administrator only through an alias (never through a group). The property tests
(`test_acl_properties.py`) compare both walks on random worlds too."""

from __future__ import annotations

import typing
from collections.abc import Sequence

import pytest
from sqlalchemy import Connection, Engine, text

from ki.acl import Unresolved, Walk, visible_observations, walk_for
from ki.settings import SecuritySettings, Settings
from search.access.reverify import reverify
from tests.integration.world import World

pytestmark = pytest.mark.stack


def _visible(conn: Connection, caller: Sequence[str], security: SecuritySettings, versions: list[int]) -> set[int]:
    """The versions visible to `caller`, the same by both walks (asserted)."""
    found = {
        walk: {o.version_id for o in visible_observations(conn, Unresolved.of(caller), security, versions, walk=walk)}
        for walk in typing.get_args(Walk)
    }
    assert found["from_caller"] == found["from_grants"], found
    return found["from_caller"]


def test_both_walks_agree_on_nested_groups_cycles_aliases_and_admins(engine: Engine, settings: Settings) -> None:
    with engine.connect() as conn, conn.begin() as trans:
        w = World(conn)
        t = w.tag

        def p(name: str) -> str:
            return name.replace(":", f":{t}-")

        project, other_project = w.project("Walks"), w.project("Walks 2")
        obj = w.source_object(w.source())  # local_fs without a known ACL: a local allow decides

        def doc(project_id: int, title: str) -> int:
            version = w.version(w.document(project_id, f"{title} {t}"), f"{title} Text", status="final")
            w.observe(version, obj)
            return version

        nested, denied, cycle, nobody, by_project = (
            doc(project, "nested"), doc(project, "denied"), doc(project, "cycle"), doc(project, "nobody"),
            doc(other_project, "project"),
        )  # fmt: skip
        document_of = dict(
            conn.execute(
                text("SELECT id, document_id FROM document_versions WHERE id = ANY(:v)"),
                {"v": [nested, denied, cycle, nobody, by_project]},
            ).all()
        )
        # nina -> mid -> top; top is granted `nested` and the other project, mid `denied` where top is denied
        w.member(p("group:top"), p("group:mid"))
        w.member(p("group:mid"), p("user:nina"))
        w.grant("document", document_of[nested], p("group:top"))
        w.grant("project", other_project, p("group:top"))
        w.grant("document", document_of[denied], p("group:mid"))
        w.grant("document", document_of[denied], p("group:top"), "deny")
        # a cycle a <-> b, reached through an alias of nina: nina -> nina-alt, a member of b
        w.member(p("group:cycle-a"), p("group:cycle-b"))
        w.member(p("group:cycle-b"), p("group:cycle-a"))
        w.member(p("group:cycle-b"), p("user:nina-alt"))
        conn.execute(
            text("INSERT INTO principal_aliases (alias, principal) VALUES (:a, :p)"),
            {"a": p("user:nina"), "p": p("user:nina-alt")},
        )
        w.grant("document", document_of[cycle], p("group:cycle-a"))
        w.grant("document", document_of[nobody], p("group:elsewhere"))
        w.member(p("group:elsewhere"), p("user:someone"))
        # administrators: `boss` by name, and a group that names an administrator principal
        w.member(p("group:admins"), p("user:mallory"))
        conn.execute(
            text("INSERT INTO principal_aliases (alias, principal) VALUES (:a, :p)"),
            {"a": p("user:boss-login"), "p": p("user:boss")},
        )
        security = settings.security.model_copy(update={"admin_principals": [p("user:boss"), p("group:admins")]})
        versions = [nested, denied, cycle, nobody, by_project]

        assert _visible(conn, [p("user:nina")], security, versions) == {nested, cycle, by_project}
        assert _visible(conn, [p("user:nina-alt")], security, versions) == {cycle}  # an alias leads one way
        assert _visible(conn, [p("group:mid")], security, versions) == {nested, by_project}
        assert _visible(conn, [p("user:someone"), "no principal", " "], security, versions) == {nobody}
        assert _visible(conn, [p("user:boss-login")], security, versions) == set(versions)  # admin by alias
        assert _visible(conn, [p("user:mallory")], security, versions) == set()  # never admin by a group
        # The search's re-verify (every version of the asked documents): the same answers by both walks.
        for caller in ([p("user:nina")], [p("user:boss-login")], [p("user:mallory")]):
            answers = [reverify(conn, caller, settings, versions, walk=walk) for walk in typing.get_args(Walk)]
            assert answers[0] == answers[1]
        trans.rollback()


def test_the_walk_from_the_grants_is_chosen_only_for_callers_in_very_many_groups() -> None:
    assert walk_for(9) == "from_caller"
    assert walk_for(25_008) == "from_grants"

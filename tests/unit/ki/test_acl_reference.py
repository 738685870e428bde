"""Pin the ACL reference evaluator (`tests/acl_reference.py`) rule by rule on hand-made small worlds, so the
oracle of the property tests is itself checked against the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests import acl_reference as ref
from tests.acl_reference import (
    Alias,
    Caller,
    Document,
    Grant,
    Membership,
    Observation,
    Security,
    Source,
    SourceObject,
    Version,
    World,
    normalize,
    resolve,
    verdicts,
    visible,
)

SUFFICIENT = Security()
INTERSECT = Security(source_acl_mode="intersect")

# Project 1 with document 10 (version 100). Source 1 is local_fs, source 2 is sharepoint; object 11 is a
# local_fs object without a known ACL, 12 a local_fs object with one, 21 a sharepoint object.
BASE = World(
    projects=(1,),
    documents=(Document(10, 1),),
    versions=(Version(100, 10),),
    sources=(Source(1, "local_fs"), Source(2, "sharepoint")),
    objects=(SourceObject(11, 1), SourceObject(12, 1, acl_known=True), SourceObject(21, 2)),
)


def world(*observed_at: int, grants: tuple[Grant, ...] = (), **more: object) -> World:
    observations = tuple(Observation(100, o) for o in observed_at)
    return replace(BASE, observations=observations, grants=grants, **more)  # type: ignore[arg-type]


def sees(w: World, *principals: object, security: Security = SUFFICIENT) -> bool:
    return 100 in visible(w, resolve(w, principals, security), security)


def why(w: World, *principals: object, security: Security = SUFFICIENT) -> str:
    return verdicts(w, resolve(w, principals, security), security)[100]


# --- rule 1: normalisation --------------------------------------------------------------------------


def test_normalize_trims_and_casefolds_and_drops_non_principals() -> None:
    assert normalize("  User:Alice \t") == "user:alice"
    assert normalize("   ") is None
    assert normalize(None) is None
    assert normalize(42) is None


def test_normalize_folds_every_script_and_trims_every_kind_of_whitespace() -> None:
    assert normalize("\u3000User:JÜRGEN\t\xa0") == "user:jürgen"
    assert normalize("user:İ") == "user:i\u0307"  # full case folding: two code points
    assert normalize("group:ΟΔΟΣ") == normalize("group:οδος") == normalize("group:οδοσ") == "group:οδοσ"
    assert normalize("user:STRASSE") == normalize("user:Strasse") == "user:strasse"
    assert normalize("\t\u2028") is None


@pytest.mark.parametrize(
    "look_alike",
    ["user:Straße", "user:straẞe", "User:ﬁnn", "user:anna.ſchmidt", "user:\u212aai", "user:ju\u0308rgen"],  # fmt: skip
)
def test_normalize_drops_what_folding_would_merge_with_another_name(look_alike: str) -> None:
    assert normalize(look_alike) is None


def test_normalize_drops_what_is_not_kind_colon_name() -> None:
    assert normalize("anna.schmidt@kanzlei-demo.de") is None  # no kind
    assert normalize("user:") is None  # no name
    assert normalize(":anna") is None
    assert normalize("sp group:x") is None  # a kind is ASCII letters, digits, '_', '.', '-'
    assert normalize("jürgen:x") is None
    assert normalize("Local_FS.v2-x:a:b") == "local_fs.v2-x:a:b"  # the name may hold colons
    assert normalize("user:Anna Schmidt") == "user:anna schmidt"


def test_grant_and_caller_match_after_normalisation_on_both_sides() -> None:
    w = world(11, grants=(Grant("project", 1, "  GROUP:Legal "),))
    assert sees(w, "group:legal  ")
    assert not sees(w, "group:legal2")


# --- rule 2: aliases --------------------------------------------------------------------------------


def test_table_alias_adds_its_target_and_keeps_the_original() -> None:
    w = world(aliases=(Alias(" Mail:Anna@Kanzlei.de", "USER:anna"),))
    assert resolve(w, ["mail:anna@kanzlei.de"], SUFFICIENT).principals == {"mail:anna@kanzlei.de", "user:anna"}


def test_config_alias_adds_its_target() -> None:
    security = Security(aliases={"UPN:Anna": " user:anna "})
    assert resolve(World(), ["upn:anna"], security).principals == {"upn:anna", "user:anna"}


def test_aliases_chain_transitively_across_both_sources() -> None:
    w = world(aliases=(Alias("user:b", "user:c"), Alias("user:d", "user:e")))
    security = Security(aliases={"user:a": "user:b", "user:c": "user:d"})
    assert resolve(w, ["user:a"], security).principals == {"user:a", "user:b", "user:c", "user:d", "user:e"}


def test_aliases_apply_before_groups_not_after() -> None:
    # The caller's alias target is a group member; a group's alias is not followed.
    aliases = (Alias("mail:x", "user:x"), Alias("group:g", "group:other"))
    w = world(aliases=aliases, memberships=(Membership("group:g", "user:x"),))
    assert resolve(w, ["mail:x"], SUFFICIENT).principals == {"mail:x", "user:x", "group:g"}


# --- rule 3: administrators -------------------------------------------------------------------------


def test_admin_is_recognised_after_normalisation_and_aliases() -> None:
    w = world(aliases=(Alias("user:boss", "Role:Admin"),))
    assert resolve(w, [" ROLE:ADMIN "], SUFFICIENT).is_admin
    assert resolve(w, ["user:boss"], SUFFICIENT).is_admin
    assert resolve(World(), ["user:root"], Security(aliases={"user:root": "system:admin"})).is_admin


def test_group_membership_never_makes_an_admin() -> None:
    w = world(memberships=(Membership("role:admin", "user:x"),))
    caller = resolve(w, ["user:x"], SUFFICIENT)
    assert "role:admin" in caller.principals
    assert not caller.is_admin


def test_admin_bypasses_missing_grants_and_denies() -> None:
    w = world(21, grants=(Grant("project", 1, "role:admin", "deny"), Grant("document", 10, "role:admin", "deny")))
    assert why(w, "role:admin") == ref.ADMIN
    assert why(w, "role:admin", security=INTERSECT) == ref.ADMIN


def test_admin_still_needs_an_active_observation_and_a_live_document() -> None:
    assert not sees(world(), "role:admin")
    deleted_obs = replace(BASE, observations=(Observation(100, 11, deleted=True),))
    assert not sees(deleted_obs, "role:admin")
    deleted_doc = world(11, documents=(Document(10, 1, deleted=True),))
    assert not sees(deleted_doc, "role:admin")


# --- rule 4: groups ---------------------------------------------------------------------------------


def test_group_expansion_is_transitive_and_survives_cycles() -> None:
    w = world(
        memberships=(
            Membership("group:a", "user:x"),
            Membership("group:b", "GROUP:A"),
            Membership("group:a", "group:b"),  # cycle
            Membership("group:c", "user:other"),
        )
    )
    assert resolve(w, ["user:x"], SUFFICIENT).principals == {"user:x", "group:a", "group:b"}


def test_mirrored_grant_to_a_nested_group_reaches_the_member() -> None:
    w = world(
        21,
        grants=(Grant("source_object", 21, "sp:group-outer"),),
        memberships=(Membership("sp:group-inner", "user:x"), Membership("sp:group-outer", "sp:group-inner")),
    )
    assert sees(w, "user:x")


# --- rule 5: deleted documents and observations ----------------------------------------------------


def test_deleted_document_is_invisible_despite_grants() -> None:
    w = world(11, grants=(Grant("project", 1, "user:u"),), documents=(Document(10, 1, deleted=True),))
    assert why(w, "user:u") == ref.DELETED_DOCUMENT


def test_only_active_observations_count() -> None:
    grants = (Grant("source_object", 21, "user:u"),)
    deleted = replace(BASE, observations=(Observation(100, 21, deleted=True),), grants=grants)
    assert not sees(deleted, "user:u")
    assert sees(replace(deleted, observations=(*deleted.observations, Observation(100, 21))), "user:u")


def test_version_without_observation_is_invisible_despite_local_allow() -> None:
    assert why(world(grants=(Grant("project", 1, "user:u"),)), "user:u") == ref.NOT_OBSERVED


def test_nobody_sees_anything_without_principals() -> None:
    w = world(11, grants=(Grant("project", 1, "user:u"),))
    assert visible(w, resolve(w, ["  ", None], SUFFICIENT), SUFFICIENT) == frozenset()
    assert visible(w, Caller(frozenset()), SUFFICIENT) == frozenset()


# --- rule 6: deny wins ------------------------------------------------------------------------------


@pytest.mark.parametrize(("scope", "target"), [("project", 1), ("document", 10), ("source_object", 21)])
def test_deny_wins_at_every_scope(scope: str, target: int) -> None:
    allows = (Grant("project", 1, "user:u"), Grant("document", 10, "user:u"), Grant("source_object", 21, "user:u"))
    w = world(11, 21, grants=allows)
    assert sees(w, "user:u")
    assert why(replace(w, grants=(*allows, Grant(scope, target, "group:g", "deny"))), "user:u", "group:g") == ref.DENIED


def test_deny_through_a_group_wins() -> None:
    w = world(
        11,
        grants=(Grant("project", 1, "user:u"), Grant("document", 10, "group:blocked", "deny")),
        memberships=(Membership("group:blocked", "user:u"),),
    )
    assert why(w, "user:u") == ref.DENIED


def test_deny_on_an_object_observed_only_through_a_deleted_observation_does_not_count() -> None:
    w = replace(
        BASE,
        observations=(Observation(100, 11), Observation(100, 21, deleted=True)),
        grants=(Grant("project", 1, "user:u"), Grant("source_object", 21, "user:u", "deny")),
    )
    assert sees(w, "user:u")


def test_deny_for_someone_else_does_not_matter() -> None:
    w = world(11, grants=(Grant("project", 1, "user:u"), Grant("project", 1, "user:v", "deny")))
    assert sees(w, "user:u")


# --- rule 7: accessible observations ----------------------------------------------------------------


@pytest.mark.parametrize("scope,target", [("project", 1), ("document", 10)])
def test_local_fs_object_without_known_acl_delegates_to_the_project(scope: str, target: int) -> None:
    assert sees(world(11, grants=(Grant(scope, target, "user:u"),)), "user:u")
    assert not sees(world(11), "user:u")


def test_local_fs_object_without_known_acl_ignores_object_grants() -> None:
    assert why(world(11, grants=(Grant("source_object", 11, "user:u"),)), "user:u") == ref.NOT_ACCESSIBLE


def test_known_acl_on_local_fs_cannot_be_overridden_locally() -> None:
    assert (
        why(world(12, grants=(Grant("project", 1, "user:u"), Grant("document", 10, "user:u"))), "user:u")
        == ref.NOT_ACCESSIBLE
    )
    assert sees(world(12, grants=(Grant("source_object", 12, "user:u"),)), "user:u")


def test_external_object_without_mirrored_grants_fails_closed() -> None:
    assert (
        why(world(21, grants=(Grant("project", 1, "user:u"), Grant("document", 10, "user:u"))), "user:u")
        == ref.NOT_ACCESSIBLE
    )


def test_external_object_with_a_mirrored_allow_suffices() -> None:
    assert sees(world(21, grants=(Grant("source_object", 21, "user:u"),)), "user:u")


def test_allow_on_another_object_does_not_open_this_one() -> None:
    assert not sees(world(21, grants=(Grant("source_object", 12, "user:u"),)), "user:u")


def test_one_accessible_observation_is_enough() -> None:
    # Observed at a sharepoint object the caller can't open and at a local_fs object the project opens.
    assert sees(world(21, 11, grants=(Grant("project", 1, "user:u"),)), "user:u")


# --- rule 8: source_acl_mode -----------------------------------------------------------------------


def test_sufficient_mode_a_source_allow_alone_is_enough() -> None:
    assert sees(world(21, grants=(Grant("source_object", 21, "user:u"),)), "user:u", security=SUFFICIENT)


def test_intersect_mode_additionally_needs_a_local_allow() -> None:
    source_only = world(21, grants=(Grant("source_object", 21, "user:u"),))
    assert why(source_only, "user:u", security=INTERSECT) == ref.NO_LOCAL_ALLOW
    for local in (Grant("project", 1, "user:u"), Grant("document", 10, "user:u")):
        assert sees(replace(source_only, grants=(*source_only.grants, local)), "user:u", security=INTERSECT)


def test_intersect_mode_local_allow_alone_is_not_enough_for_an_external_object() -> None:
    assert why(world(21, grants=(Grant("project", 1, "user:u"),)), "user:u", security=INTERSECT) == ref.NOT_ACCESSIBLE


def test_intersect_mode_local_fs_delegation_still_works() -> None:
    assert sees(world(11, grants=(Grant("project", 1, "user:u"),)), "user:u", security=INTERSECT)


def test_visible_covers_every_version_of_a_world() -> None:
    w = World(
        projects=(1, 2),
        documents=(Document(10, 1), Document(20, 2), Document(30, 2, deleted=True)),
        versions=(Version(100, 10), Version(101, 10), Version(200, 20), Version(300, 30)),
        sources=(Source(1, "local_fs"),),
        objects=(SourceObject(11, 1),),
        observations=tuple(Observation(v, 11) for v in (100, 101, 200, 300)),
        grants=(Grant("project", 1, "user:u"), Grant("project", 2, "user:u"), Grant("document", 10, "user:u", "deny")),
    )
    assert visible(w, resolve(w, ["user:u"], SUFFICIENT), SUFFICIENT) == {200}


# --- rule 9: citations per source object ----------------------------------------------------------------


def test_citation_omits_an_inaccessible_object_of_a_visible_version() -> None:
    # Visible through local object 11 (project allow); sharepoint object 21 has no mirrored grant.
    w = world(11, 21, grants=(Grant("project", 1, "user:u"),))
    caller = resolve(w, ["user:u"], SUFFICIENT)
    assert visible(w, caller, SUFFICIENT) == {100}
    assert ref.citable(w, caller, SUFFICIENT) == {0}


def test_citations_of_an_invisible_version_are_empty_even_where_an_object_is_accessible() -> None:
    w = world(21, 12, grants=(Grant("source_object", 21, "user:u"), Grant("source_object", 12, "user:u", "deny")))
    caller = resolve(w, ["user:u"], SUFFICIENT)
    assert ref.citable(w, caller, SUFFICIENT) == set()


def test_admin_may_cite_every_active_observation() -> None:
    w = replace(world(11, 21), observations=(Observation(100, 11), Observation(100, 21), Observation(100, 12, True)))
    caller = resolve(w, ["role:admin"], SUFFICIENT)
    assert ref.citable(w, caller, SUFFICIENT) == {0, 1}


# --- the principal projection ---------------------------------------------------------------------------


def test_projection_names_members_and_alias_chains_of_granted_principals() -> None:
    w = world(
        21,
        grants=(
            Grant("project", 1, "Group:A"),
            Grant("source_object", 21, "user:u3", "deny"),
            Grant("project", 2, "user:x"),
        ),
        memberships=(Membership("group:a", "group:b"), Membership("group:b", "user:u1")),
        aliases=(Alias("user:u2", "user:u1"), Alias("user:u4", "user:u3")),
    )
    security = Security(aliases={"user:u0": "user:u2"})
    allowed, denied = ref.projection(w, security)[100]
    assert allowed == {"group:a", "group:b", "user:u1", "user:u2", "user:u0"}
    assert denied == {"user:u3", "user:u4"}

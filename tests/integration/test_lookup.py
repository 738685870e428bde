"""`POST /v1/lookup` on the live stack (issue 49, item 1): exactly one document and version by an identifier or an
exact title, `ambiguous` with the candidates, or `not_found` -- never a ranking -- under the per-version access
rules of every other read.

The world: anna may see project P, `nobody` project Q (behind the wall). In P: a statement of claim carrying a
file number and an ECLI, with two final versions (2020 and 2021); two documents sharing a second file number; the
statute `BGB` whose text holds `§ 535`; the provision `§ 536 BGB` as a document of its own. In Q: a twin carrying
the first file number, and documents whose names only Q carries. The lookup reads PostgreSQL only (the index only
for the chunk holding a provision's heading), so most tests need no sync; the provision's waits for the index.
"""

from __future__ import annotations

import datetime as dt
import random
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine

from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, remove_world, synced_api, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack

STATUTE = (
    "Bürgerliches Gesetzbuch\n\n"
    "§ 534 (weggefallen)\n\n"
    "§ 535 Inhalt und Hauptpflichten des Mietvertrags\n"
    "(1) Durch den Mietvertrag wird der Vermieter verpflichtet, dem Mieter den Gebrauch der Mietsache während der "
    "Mietzeit zu gewähren.\n"
    "(2) Der Mieter ist verpflichtet, dem Vermieter die vereinbarte Miete zu entrichten.\n\n"
    "§ 536 Mietminderung bei Sach- und Rechtsmängeln\n"
    "(1) Hat die Mietsache zur Zeit der Überlassung an den Mieter einen Mangel, so ist der Mieter von der "
    "Entrichtung der Miete befreit.\n"
)


@dataclass
class Scene:
    tag: str
    mine: int
    theirs: int
    source: int
    obj: int
    file_number: str  # carried by `akte` (P) and `twin` (Q)
    shared: str  # carried by `shared_a` and `shared_b` (P)
    ecli: str
    docs: dict[str, int]
    versions: dict[str, int]

    def token(self, settings: Settings, who: str) -> str:
        return mint_token(settings.api, f"{who}-{self.tag}")


@pytest.fixture(scope="module")
def stack(settings: Settings) -> Iterator[Server]:
    with synced_api(settings, "ki-lookup-test", "lookup-api") as (server, _worker, _isolation):
        yield server


@pytest.fixture(scope="module")
def scene(engine: Engine, stack: Server, settings: Settings) -> Iterator[Scene]:
    with engine.begin() as conn:
        w = World(conn)
        rng = random.Random(w.tag)
        # Chambers of three digits and running numbers of six: no demo corpus file number looks like these.
        file_number = f"{rng.randint(100, 999)} O {rng.randint(100_000, 999_999)}/21"
        shared = f"{rng.randint(100, 999)} U {rng.randint(100_000, 999_999)}/20"
        ecli = f"ECLI:DE:LGB:2021:{w.tag.upper()}.0"
        mine, theirs = w.project("Nachschlagen"), w.project("Nachschlagen Wand")
        source = w.source("local_fs")
        obj = w.source_object(source)
        docs: dict[str, int] = {}
        versions: dict[str, int] = {}

        def document(key: str, project: int, title: str, identifiers: list[str], body: str) -> None:
            docs[key] = w.document(project, title, identifiers=identifiers)
            versions[key] = w.version(docs[key], body)
            w.observe(versions[key], obj)

        docs["akte"] = w.document(mine, f"Klage Lindenallee {w.tag}", identifiers=[file_number, ecli, "V-2021-1"])
        versions["akte_2020"] = w.version(docs["akte"], "Klageschrift, erste Fassung.", doc_date=dt.date(2020, 3, 1),
                                          latest=False)  # fmt: skip
        versions["akte_draft"] = w.version(docs["akte"], "Entwurf.", version_no=2, status="draft",
                                           doc_date=dt.date(2020, 9, 1), latest=False)  # fmt: skip
        versions["akte"] = w.version(docs["akte"], "Klageschrift, geänderte Fassung.", version_no=3,
                                     doc_date=dt.date(2021, 6, 1))  # fmt: skip
        for v in (versions["akte_2020"], versions["akte_draft"], versions["akte"]):
            w.observe(v, obj)
        document("shared_a", mine, f"Berufung A {w.tag}", [shared], "Berufungsbegründung A.")
        document("shared_b", mine, f"Berufung B {w.tag}", [shared], "Berufungsbegründung B.")
        document("bgb", mine, "BGB", ["BGB"], STATUTE)
        document("p536", mine, "§ 536 BGB", [], "(1) Hat die Mietsache einen Mangel, ist der Mieter befreit.")
        # Behind the wall: a twin carrying the statement of claim's file number and title, and names only Q carries.
        document("twin", theirs, f"Klage Lindenallee {w.tag}", [file_number], "Zwilling.")
        document("secret", theirs, f"Vergleich Nordhafen {w.tag}", [f"AZ-geheim-{w.tag}"], "Geheim.")
        w.grant("project", mine, f"user:anna-{w.tag}")
        w.grant("project", theirs, f"user:nobody-{w.tag}")
        s = Scene(w.tag, mine, theirs, source, obj, file_number, shared, ecli, docs, versions)
    try:
        yield s
    finally:
        remove_world(engine, [s.mine, s.theirs], [s.source])


def lookup(server: Server, token: str, body: Any) -> tuple[int, Any]:
    return server.call("/v1/lookup", body, token)


def found(server: Server, token: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = lookup(server, token, body)
    assert status == 200 and answer["outcome"] == "found", (body, answer)
    return dict(answer)


def without_asked(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "asked"}


def test_a_file_number_is_found_exactly_whatever_its_spacing_case_and_unicode_form(
    stack: Server, scene: Scene, settings: Settings
) -> None:
    anna = scene.token(settings, "anna")
    chamber, _, rest = scene.file_number.partition(" O ")
    number, year = rest.split("/")
    wide = unicodedata.normalize("NFC", "".join(chr(ord(c) + 0xFEE0) if c.isdigit() else c for c in chamber))
    variants = [
        scene.file_number,
        scene.file_number.lower(),
        f"{chamber}O{number}/{year}",
        f"  {chamber}  O   {number} / {year} ",
        f"{chamber} O {number}-{year}",
        f"{wide} Ｏ {number}／{year}",  # full-width digits, letter and slash (NFKC)
        f"{chamber}\u00a0O\u2009{number}/{year}",
    ]
    answers = [found(stack, anna, {"identifier": v}) for v in variants]
    for answer in answers:
        assert answer["document_id"] == scene.docs["akte"]
        assert answer["matched"] == {"why": "identifier", "key": f"{chamber} o {number} {year}"}
        assert answer["version"]["version_id"] == scene.versions["akte"] and answer["version"]["latest_final"]
        assert answer["citation"]["version_id"] == scene.versions["akte"] and answer["citation"]["source_object_ids"]
        assert "score" not in answer and "hits" not in answer and "candidates" not in answer
        assert without_asked(answer) == without_asked(answers[0])
    assert answers[0]["asked"] == {"by": "identifier", "text": scene.file_number, "kind": "file_number", "as_of": None}
    # The version shown is the one GET /v1/documents/{id} cites, numbered among the caller's versions.
    status, document = stack.call(f"/v1/documents/{scene.docs['akte']}", token=anna)
    assert status == 200 and document["citation"] == answers[0]["citation"]
    assert answers[0]["version"]["version_no"] == 3


def test_an_ecli_and_a_title_are_found(stack: Server, scene: Scene, settings: Settings) -> None:
    anna = scene.token(settings, "anna")
    answer = found(stack, anna, {"identifier": scene.ecli})
    assert answer["document_id"] == scene.docs["akte"] and answer["asked"]["kind"] == "ecli"
    assert found(stack, anna, {"identifier": scene.ecli.lower()})["document_id"] == scene.docs["akte"]
    answer = found(stack, anna, {"title": f"  klage   LINDENALLEE {scene.tag}"})
    assert answer["document_id"] == scene.docs["akte"] and answer["matched"]["why"] == "title"
    # Any other identifier a document carries.
    assert found(stack, anna, {"identifier": "v 2021 1"})["document_id"] == scene.docs["akte"]
    # A title is a title: the file number is no title, and an identifier ask does not match half a title.
    status, answer = lookup(stack, anna, {"title": scene.file_number})
    assert status == 200 and answer["outcome"] == "not_found"
    status, answer = lookup(stack, anna, {"identifier": f"Klage {scene.tag}"})
    assert status == 200 and answer["outcome"] == "not_found"


def test_a_shared_identifier_is_ambiguous_with_its_candidates_in_id_order(
    stack: Server, scene: Scene, settings: Settings
) -> None:
    anna = scene.token(settings, "anna")
    status, answer = lookup(stack, anna, {"identifier": scene.shared})
    assert status == 200 and answer["outcome"] == "ambiguous" and answer["truncated"] is False
    candidates = answer["candidates"]
    assert [c["document_id"] for c in candidates] == sorted([scene.docs["shared_a"], scene.docs["shared_b"]])
    for c in candidates:
        assert c["version"]["version_id"] == scene.versions["shared_a" if c["document_id"] == scene.docs["shared_a"]
                                                             else "shared_b"]  # fmt: skip
        assert c["matched"]["why"] == "identifier" and "score" not in c
    assert "document_id" not in answer and "version" not in answer
    # Narrowed to projects: still both in P; none in Q.
    status, narrowed = lookup(stack, anna, {"identifier": scene.shared, "project_id": scene.mine})
    assert status == 200 and narrowed["candidates"] == candidates
    status, other = lookup(stack, anna, {"identifier": scene.shared, "project_id": [scene.theirs]})
    assert status == 200 and other["outcome"] == "not_found"


def test_a_hidden_second_carrier_does_not_make_a_visible_match_ambiguous(
    stack: Server, scene: Scene, settings: Settings
) -> None:
    anna, nobody = scene.token(settings, "anna"), scene.token(settings, "nobody")
    for body in ({"identifier": scene.file_number}, {"title": f"Klage Lindenallee {scene.tag}"}):
        answer = found(stack, anna, body)
        assert answer["document_id"] == scene.docs["akte"], body
        assert "candidates" not in answer and "truncated" not in answer
        # The twin is there: its own caller finds it, and only it.
        theirs = found(stack, nobody, body)
        assert theirs["document_id"] == scene.docs["twin"], body


def test_a_hidden_match_is_answered_exactly_like_a_missing_one(
    engine: Engine, stack: Server, scene: Scene, settings: Settings
) -> None:
    anna, nobody = scene.token(settings, "anna"), scene.token(settings, "nobody")
    name = f"AZ-neu-{scene.tag}"
    title = f"Vergleich Südhafen {scene.tag}"
    # Missing: nobody carries the name yet.
    before = [lookup(stack, anna, {"identifier": name}), lookup(stack, anna, {"title": title})]
    with engine.begin() as conn:
        w = World(conn, tag=scene.tag)
        hidden = w.document(scene.theirs, title, identifiers=[name])
        w.observe(w.version(hidden, "Nur für die andere Seite."), scene.obj)
    # Hidden: a document anna may not see carries it now.
    after = [lookup(stack, anna, {"identifier": name}), lookup(stack, anna, {"title": title})]
    assert before == after
    asked = {"by": "identifier", "text": name, "kind": "identifier", "as_of": None}
    assert after[0] == (200, {"outcome": "not_found", "asked": asked})
    assert after[1][1]["outcome"] == "not_found"
    # It is there for the caller who may see it.
    assert found(stack, nobody, {"identifier": name})["document_id"] == hidden
    # Names only Q carried from the start: not_found alike.
    status, answer = lookup(stack, anna, {"identifier": f"AZ-geheim-{scene.tag}"})
    assert (status, answer["outcome"]) == (200, "not_found") and set(answer) == {"outcome", "asked"}


def test_as_of_chooses_the_version_in_force(stack: Server, scene: Scene, settings: Settings) -> None:
    anna = scene.token(settings, "anna")
    body = {"identifier": scene.file_number}
    in_2020 = found(stack, anna, {**body, "as_of": "2020-12-31"})
    assert in_2020["version"]["version_id"] == scene.versions["akte_2020"]  # not the draft of September
    assert in_2020["version"]["latest_final"] is False and in_2020["asked"]["as_of"] == "2020-12-31"
    assert in_2020["citation"]["version_id"] == scene.versions["akte_2020"]
    on_the_day = found(stack, anna, {**body, "as_of": "2021-06-01"})
    assert on_the_day["version"]["version_id"] == scene.versions["akte"]
    status, before = lookup(stack, anna, {**body, "as_of": "2019-12-31"})
    assert status == 200 and before["outcome"] == "not_found"  # nothing in force yet


def test_a_provision_is_found_in_its_statute_with_its_span_and_chunk(
    stack: Server, scene: Scene, settings: Settings
) -> None:
    anna = scene.token(settings, "anna")
    heading = "§ 535 Inhalt und Hauptpflichten des Mietvertrags"
    start, end = STATUTE.index(heading), STATUTE.index("§ 536")
    for name in ("§ 535 BGB", "§535 Abs. 1 BGB", "§ 535 Absatz 1 Satz 1 bgb"):
        answer = found(stack, anna, {"identifier": name})
        assert answer["document_id"] == scene.docs["bgb"] and answer["matched"] == {"why": "statute", "key": "bgb"}
        assert answer["asked"]["kind"] == "provision"
        provision = answer["provision"]
        assert (provision["heading"], provision["start"], provision["end"]) == (heading, start, end), name
    # The span reads back through the text reader.
    status, read = stack.call(provision["permalink"], token=anna)
    assert status == 200 and read["text"] == STATUTE[start:end]
    # The chunk holding the heading, once the statute is indexed (one body chunk: its 491 characters are under
    # retrieval.chunk_chars and the embedder's window).
    wait_until_indexed(stack, settings, [scene.mine], {scene.docs["bgb"]}, "the statute in the index")
    answer = found(stack, anna, {"identifier": "§ 535 BGB"})
    assert answer["provision"]["chunk_id"] == f"{scene.versions['bgb']}:chunk:0"
    # The provision as a document of its own comes before its statute; its text has no heading.
    answer = found(stack, anna, {"identifier": "§ 536 BGB"})
    assert answer["document_id"] == scene.docs["p536"] and answer["matched"]["why"] == "title"
    assert answer["provision"] is None
    # A provision the statute does not hold: the statute, without a span.
    answer = found(stack, anna, {"identifier": "§ 537 BGB"})
    assert answer["document_id"] == scene.docs["bgb"] and answer["provision"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "identifier"),
        ({"identifier": "1 O 1/21", "title": "Klage"}, "title"),
        ({"identifier": "   "}, "identifier"),
        ({"identifier": 5}, "identifier"),
        ({"identifier": "§ –"}, "identifier"),
        ({"identifier": "1 O 1/21", "as_of": "2021-02-30"}, "as_of"),
        ({"identifier": "1 O 1/21", "project_id": "x"}, "project_id"),
        ({"identifier": "1 O 1/21", "query": "Miete"}, "query"),
        (["1 O 1/21"], "body"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(
    stack: Server, scene: Scene, settings: Settings, body: Any, field: str
) -> None:
    status, answer = lookup(stack, scene.token(settings, "anna"), body)
    assert status == 400 and answer["error"] == "invalid_request" and answer["field"] == field, answer


def test_not_json_and_no_token_are_refused(stack: Server, scene: Scene, settings: Settings) -> None:
    status, _, payload = stack.request("/v1/lookup", raw=b"{not json", token=scene.token(settings, "anna"))
    assert status == 400 and b'"field": "body"' in payload
    status, answer = lookup(stack, "", {"identifier": scene.file_number})
    assert status == 401 and answer["error"] == "unauthorized"


def test_the_openapi_document_describes_the_lookup(stack: Server) -> None:
    status, document = stack.call("/openapi.json")
    assert status == 200
    operation = document["paths"]["/v1/lookup"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/LookupRequest")
    schemas = document["components"]["schemas"]
    assert set(schemas["LookupRequest"]["properties"]) == {"identifier", "title", "as_of", "project_id"}
    assert schemas["LookupResponse"]["properties"]["outcome"]["enum"] == ["found", "ambiguous", "not_found"]

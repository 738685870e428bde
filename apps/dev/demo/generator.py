"""A deterministic generator of a German legal demo corpus.

The generator has two halves:

* **Pure row building** (`ontology_rows`, `plan_setup`, `build_document`, `iter_documents`): given a seed,
  a run label and the database ids of the rows it depends on, it returns plain dicts whose keys are the
  column names of the reference schema. Same seed and label -> same rows. No I/O.
* **Writing** (`generate`): inserts those rows with SQLAlchemy Core in batches of about `batch_size`
  versions, one transaction per batch, so every row travels the real CDC path (Debezium -> Kafka -> sync).

Every row a run creates is reachable from its label: project and source names end with
`· <label>` (the label starts with `DEMO_TAG`), and everything else hangs off those projects and
sources. Ontology nodes (fixed keys under `demo.`) and e-mail aliases are shared by all runs and
inserted with ON CONFLICT DO NOTHING; nothing is ever deleted or updated except the `documents`
rows a run has just inserted (their `latest_final_version_id`).
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Engine, Table, bindparam, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ki.db.models import (
    CLAUSE_TYPE,
    DOC_TYPE,
    Base,
    Document,
    DocumentVersion,
    Grant,
    GroupMembership,
    Matter,
    OntologyNode,
    PrincipalAlias,
    Project,
    Relation,
    Source,
    SourceObject,
    SourceObservation,
)

#: Every run label starts with this; `demo_data_exists` looks for it in project names.
DEMO_TAG = "ki-demo"
NAME_SEPARATOR = " · "
MIN_TEXT_CHARS = 1500
MAX_TEXT_CHARS = 6000
FINAL_STATUSES = frozenset({"final", "executed"})

Progress = Callable[[str], None]
Row = dict[str, Any]

# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------

#: (key, label, parent key or None). Parents come first.
DOC_TYPES: tuple[tuple[str, str, str | None], ...] = (
    ("demo.doc.vertrag", "Vertrag", None),
    ("demo.doc.vertrag.mietvertrag", "Mietvertrag", "demo.doc.vertrag"),
    ("demo.doc.vertrag.mietvertrag.gewerbe", "Gewerbemietvertrag", "demo.doc.vertrag.mietvertrag"),
    ("demo.doc.vertrag.arbeitsvertrag", "Arbeitsvertrag", "demo.doc.vertrag"),
    ("demo.doc.vertrag.kaufvertrag", "Kaufvertrag", "demo.doc.vertrag"),
    ("demo.doc.vertrag.nda", "Geheimhaltungsvereinbarung", "demo.doc.vertrag"),
    ("demo.doc.schriftsatz", "Schriftsatz", None),
    ("demo.doc.schriftsatz.klageschrift", "Klageschrift", "demo.doc.schriftsatz"),
    ("demo.doc.schriftsatz.klageerwiderung", "Klageerwiderung", "demo.doc.schriftsatz"),
    ("demo.doc.schriftsatz.berufungsbegruendung", "Berufungsbegründung", "demo.doc.schriftsatz"),
    ("demo.doc.urteil", "Urteil", None),
    ("demo.doc.gutachten", "Gutachten", None),
)

CLAUSE_TYPES: tuple[tuple[str, str, str | None], ...] = (
    ("demo.clause.haftung", "Haftung", None),
    ("demo.clause.haftung.beschraenkung", "Haftungsbeschränkung", "demo.clause.haftung"),
    ("demo.clause.kuendigung", "Kündigung", None),
    ("demo.clause.kuendigung.ausserordentlich", "Außerordentliche Kündigung", "demo.clause.kuendigung"),
    ("demo.clause.gerichtsstand", "Gerichtsstand", None),
    ("demo.clause.vertraulichkeit", "Vertraulichkeit", None),
    ("demo.clause.gewaehrleistung", "Gewährleistung", None),
    ("demo.clause.datenschutz", "Datenschutz", None),
    ("demo.clause.verguetung", "Vergütung", None),
)

#: Leaf doc types that documents get, with the family that picks their text.
DOC_TYPE_CHOICES: tuple[tuple[str, str, int], ...] = (
    # (doc type key, family, weight)
    ("demo.doc.vertrag.mietvertrag", "vertrag", 14),
    ("demo.doc.vertrag.mietvertrag.gewerbe", "vertrag", 6),
    ("demo.doc.vertrag.arbeitsvertrag", "vertrag", 12),
    ("demo.doc.vertrag.kaufvertrag", "vertrag", 10),
    ("demo.doc.vertrag.nda", "vertrag", 6),
    ("demo.doc.schriftsatz.klageschrift", "schriftsatz", 12),
    ("demo.doc.schriftsatz.klageerwiderung", "schriftsatz", 8),
    ("demo.doc.schriftsatz.berufungsbegruendung", "schriftsatz", 6),
    ("demo.doc.urteil", "urteil", 12),
    ("demo.doc.gutachten", "gutachten", 14),
)

DOC_TYPE_LABELS = {key: label for key, label, _ in DOC_TYPES}
CLAUSE_LABELS = {key: label for key, label, _ in CLAUSE_TYPES}

#: Status sequences (version 1, 2, ...). Contracts may be executed; everything else ends at final.
STATUS_SEQUENCES: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "vertrag": (
        (("draft", "final", "executed"), 30),
        (("draft", "draft", "final", "executed"), 12),
        (("draft", "final"), 20),
        (("final", "executed"), 12),
        (("final",), 10),
        (("draft",), 8),
        (("draft", "draft"), 8),
    ),
    "other": (
        (("draft", "final"), 40),
        (("draft", "draft", "final"), 15),
        (("final",), 30),
        (("draft",), 15),
    ),
}

FIRST_NAMES = (
    "anna", "jonas", "lea", "felix", "marie", "paul", "sophie", "lukas", "emma", "maximilian",
    "hannah", "leon", "laura", "tim", "julia", "david", "katharina", "moritz", "clara", "niklas",
)  # fmt: skip
LAST_NAMES = (
    "schmidt", "weber", "fischer", "meyer", "wagner", "becker", "hoffmann", "schulz", "koch", "richter",
    "klein", "wolf", "neumann", "schwarz", "zimmermann", "braun", "krueger", "hartmann", "lange", "werner",
)  # fmt: skip
OFFICES = ("berlin", "muenchen", "hamburg", "frankfurt")
TEAMS = ("mietrecht", "arbeitsrecht", "gesellschaftsrecht", "prozess", "datenschutz", "immobilien")

COMPANIES = (
    "Schulz Immobilien GmbH", "Brandt & Söhne KG", "Nordlicht Logistik AG", "Hanse Wohnbau eG",
    "Alpenblick Hotelbetriebs GmbH", "Rheinmetall Zulieferer GmbH", "Spree Software UG",
    "Isar Pharma GmbH", "Elbtal Energie AG", "Weser Bau GmbH & Co. KG", "Kranich Medien GmbH",
    "Falkenried Verwaltungs GmbH", "Lindenhof Pflege gGmbH", "Mainufer Capital GmbH",
)  # fmt: skip
PERSONS = (
    "Herr Dr. Thomas Berger", "Frau Sabine Krause", "Herr Michael Vogel", "Frau Petra Lorenz",
    "Herr Andreas Kühn", "Frau Dr. Monika Albrecht", "Herr Stefan Busch", "Frau Claudia Roth",
    "Herr Markus Engel", "Frau Ingrid Sommer", "Herr Jürgen Pohl", "Frau Nadine Franke",
)  # fmt: skip
CITIES = ("Berlin", "München", "Hamburg", "Frankfurt am Main", "Köln", "Leipzig", "Stuttgart", "Düsseldorf")
STREETS = (
    "Friedrichstraße", "Kastanienallee", "Leopoldstraße", "Jungfernstieg", "Zeil", "Königsallee",
    "Karl-Liebknecht-Straße", "Schlossstraße", "Hauptstraße", "Lindenstraße",
)  # fmt: skip
LANDGERICHTE = tuple(f"Landgericht {c}" for c in CITIES)
OLGS = ("Kammergericht", "Oberlandesgericht München", "Hanseatisches Oberlandesgericht", "Oberlandesgericht Köln")
STATUTES = (
    "§ 823 BGB", "§ 535 BGB", "§ 543 BGB", "§ 573 BGB", "§ 626 BGB", "§ 433 BGB", "§ 434 BGB",
    "§ 437 BGB", "§ 280 BGB", "§ 307 BGB", "§ 611a BGB", "§ 1 KSchG", "§ 29 ZPO", "§ 38 ZPO",
    "§ 253 ZPO", "§ 520 ZPO", "Art. 6 DSGVO", "Art. 28 DSGVO", "Art. 82 DSGVO", "§ 17 UWG",
    "§ 2 GeschGehG", "§ 249 BGB", "§ 276 BGB", "§ 314 BGB",
)  # fmt: skip
CLAUSE_STATUTES = {
    "demo.clause.haftung": ("§ 280 BGB", "§ 823 BGB", "§ 276 BGB", "§ 249 BGB"),
    "demo.clause.haftung.beschraenkung": ("§ 307 BGB", "§ 276 BGB"),
    "demo.clause.kuendigung": ("§ 573 BGB", "§ 1 KSchG", "§ 543 BGB"),
    "demo.clause.kuendigung.ausserordentlich": ("§ 626 BGB", "§ 314 BGB", "§ 543 BGB"),
    "demo.clause.gerichtsstand": ("§ 38 ZPO", "§ 29 ZPO"),
    "demo.clause.vertraulichkeit": ("§ 2 GeschGehG", "§ 17 UWG"),
    "demo.clause.gewaehrleistung": ("§ 434 BGB", "§ 437 BGB"),
    "demo.clause.datenschutz": ("Art. 6 DSGVO", "Art. 28 DSGVO", "Art. 82 DSGVO"),
    "demo.clause.verguetung": ("§ 611a BGB", "§ 433 BGB", "§ 535 BGB"),
}
FAMILY_CLAUSES = {
    "vertrag": tuple(CLAUSE_STATUTES),
    "schriftsatz": ("demo.clause.haftung", "demo.clause.kuendigung.ausserordentlich", "demo.clause.gerichtsstand",
                    "demo.clause.gewaehrleistung"),
    "urteil": ("demo.clause.haftung", "demo.clause.kuendigung", "demo.clause.gerichtsstand",
               "demo.clause.gewaehrleistung"),
    "gutachten": ("demo.clause.haftung.beschraenkung", "demo.clause.datenschutz", "demo.clause.vertraulichkeit",
                  "demo.clause.kuendigung"),
}  # fmt: skip

ADJ = ("wesentliche", "erhebliche", "nachhaltige", "unverzügliche", "schriftliche", "angemessene", "ordnungsgemäße")
NOUNS = ("Pflichtverletzung", "Vertragsverletzung", "Leistungsstörung", "Mängelanzeige", "Fristsetzung", "Abmahnung")
DEADLINES = ("vierzehn Tagen", "vier Wochen", "drei Monaten", "sechs Wochen zum Quartalsende", "zehn Werktagen")

#: Sentences every family can use. Slots: see `_fill`.
COMMON_SENTENCES = (
    "Die Parteien sind sich darüber einig, dass {adj} Änderungen dieser Regelung der Schriftform bedürfen.",
    "Eine {noun} ist der anderen Partei innerhalb von {frist} mitzuteilen.",
    "Maßgeblich ist insoweit die Rechtsprechung des Bundesgerichtshofs zu {statute}.",
    "Soweit {party_a} sich auf {statute} beruft, trägt {party_a} hierfür die Darlegungs- und Beweislast.",
    "Die Zahlung in Höhe von {amount} EUR ist bis zum {date} auf das bekannte Konto zu leisten.",
    "Der Sachverhalt betrifft die Liegenschaft {street} {number} in {city}.",
    "Ergänzend wird auf die Korrespondenz vom {date} Bezug genommen.",
    "{party_b} hat bereits mit Schreiben vom {date} eine {adj} {noun} gerügt.",
    "Nach Auffassung der Unterzeichnenden ist die Rechtslage insoweit eindeutig.",
    "Etwaige Nebenabreden bestehen nicht; mündliche Zusagen sind nicht getroffen worden.",
    "Die Frist beginnt mit Zugang der Erklärung bei {party_b}.",
    "Im Übrigen gelten die gesetzlichen Bestimmungen, insbesondere {statute}.",
)

CLAUSE_SENTENCES: dict[str, tuple[str, ...]] = {
    "demo.clause.haftung": (
        "{party_a} haftet für Schäden aus der Verletzung des Lebens, des Körpers oder der Gesundheit unbeschränkt.",
        "Ein Anspruch auf Schadensersatz nach {statute} setzt ein Verschulden voraus.",
        "Der Schaden beläuft sich nach derzeitigem Stand auf mindestens {amount} EUR.",
    ),
    "demo.clause.haftung.beschraenkung": (
        "Die Haftung für leichte Fahrlässigkeit ist auf den vertragstypischen, vorhersehbaren Schaden begrenzt.",
        "Die Haftungshöchstsumme beträgt {amount} EUR je Schadensfall.",
        "Eine Haftungsbeschränkung in Allgemeinen Geschäftsbedingungen ist an {statute} zu messen.",
    ),
    "demo.clause.kuendigung": (
        "Das Vertragsverhältnis kann von jeder Partei mit einer Frist von {frist} ordentlich gekündigt werden.",
        "Die Kündigung bedarf der Schriftform; eine Erklärung per E-Mail genügt nicht.",
        "Ein berechtigtes Interesse an der Beendigung im Sinne von {statute} liegt vor.",
    ),
    "demo.clause.kuendigung.ausserordentlich": (
        "Das Recht zur außerordentlichen Kündigung aus wichtigem Grund nach {statute} bleibt unberührt.",
        "Ein wichtiger Grund liegt insbesondere bei einem Zahlungsverzug von mehr als zwei Monatsmieten vor.",
        "Der Kündigung ging eine {adj} Abmahnung voraus.",
    ),
    "demo.clause.gerichtsstand": (
        "Ausschließlicher Gerichtsstand für alle Streitigkeiten aus diesem Vertrag ist {city}.",
        "Die Zuständigkeit des angerufenen Gerichts folgt aus {statute}.",
        "Es gilt das Recht der Bundesrepublik Deutschland unter Ausschluss des UN-Kaufrechts.",
    ),
    "demo.clause.vertraulichkeit": (
        "Die Parteien verpflichten sich, sämtliche vertraulichen Informationen geheim zu halten.",
        "Die Verpflichtung zur Vertraulichkeit besteht für {years} Jahre nach Vertragsende fort.",
        "Geschäftsgeheimnisse im Sinne von {statute} dürfen nur zweckgebunden verwendet werden.",
    ),
    "demo.clause.gewaehrleistung": (
        "Die Kaufsache weist bei Gefahrübergang einen Sachmangel im Sinne von {statute} auf.",
        "Die Gewährleistungsfrist beträgt {years} Jahre ab Übergabe.",
        "{party_b} hat Nacherfüllung innerhalb von {frist} verlangt.",
    ),
    "demo.clause.datenschutz": (
        "Die Verarbeitung personenbezogener Daten erfolgt ausschließlich auf Grundlage von {statute}.",
        "{party_a} verarbeitet die Daten als Auftragsverarbeiter nach Weisung.",
        "Ein Verstoß gegen die Datenschutzvorschriften kann Ansprüche nach Art. 82 DSGVO auslösen.",
    ),
    "demo.clause.verguetung": (
        "Die monatliche Vergütung beträgt {amount} EUR brutto und ist zum Monatsende fällig.",
        "Der Kaufpreis in Höhe von {amount} EUR ist Zug um Zug gegen Übergabe zu zahlen.",
        "Die Miete ist monatlich im Voraus, spätestens am dritten Werktag, zu entrichten.",
    ),
}

FAMILY_SENTENCES: dict[str, tuple[str, ...]] = {
    "vertrag": (
        "Dieser Vertrag tritt mit Unterzeichnung durch beide Parteien in Kraft.",
        "Sollte eine Bestimmung dieses Vertrages unwirksam sein, bleibt die Wirksamkeit im Übrigen unberührt.",
        "{party_b} ist berechtigt, die Leistung durch sachkundige Dritte erbringen zu lassen.",
        "Die Anlagen sind Bestandteil dieses Vertrages.",
    ),
    "schriftsatz": (
        "Die Klage ist zulässig und begründet.",
        "Der Vortrag der Gegenseite wird mit Nichtwissen bestritten.",
        "Beweis: Zeugnis {person}, zu laden über die Klägerin.",
        "Es wird beantragt, die Beklagte zu verurteilen, an die Klägerin {amount} EUR nebst Zinsen zu zahlen.",
        "Das angefochtene Urteil beruht auf einer Rechtsverletzung im Sinne von § 520 ZPO.",
    ),
    "urteil": (
        "Die Kosten des Rechtsstreits trägt die Beklagte.",
        "Das Urteil ist gegen Sicherheitsleistung in Höhe von 110 % des jeweils zu vollstreckenden Betrages "
        "vorläufig vollstreckbar.",
        "Die zulässige Klage hat in der Sache überwiegend Erfolg.",
        "Die Kammer folgt den überzeugenden Ausführungen des Sachverständigen.",
    ),
    "gutachten": (
        "Im Ergebnis ist das Risiko einer Inanspruchnahme als gering einzustufen.",
        "Wir empfehlen, die Regelung vor Unterzeichnung nachzuverhandeln.",
        "Die herrschende Meinung in der Literatur teilt diese Auffassung.",
        "Eine höchstrichterliche Klärung dieser Frage steht noch aus.",
    ),
}

FAMILY_HEADINGS: dict[str, tuple[str, ...]] = {
    "schriftsatz": ("Sachverhalt", "Rechtliche Würdigung", "Zur Zulässigkeit", "Zur Begründetheit", "Beweisangebote"),
    "urteil": ("Tatbestand", "Entscheidungsgründe", "Zur Zulässigkeit", "Zur Begründetheit", "Nebenentscheidungen"),
    "gutachten": ("Sachverhalt", "Fragestellung", "Rechtliche Bewertung", "Risikoeinschätzung", "Empfehlung"),
    "vertrag": ("Vertragsgegenstand", "Leistungen", "Laufzeit", "Mitwirkungspflichten", "Schlussbestimmungen"),
}

ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII")

# --------------------------------------------------------------------------------------------------
# Identifiers
# --------------------------------------------------------------------------------------------------

#: Patterns the identifiers the generator emits must match (the unit tests check them).
IDENTIFIER_PATTERNS = {
    "bverfg": r"^[12] BvR \d{1,4}/\d{2}$",
    "bgh": r"^(I|II|III|IV|V|VI|VII|VIII|IX|X|XI|XII) ZR \d{1,3}/\d{2}$",
    "olg": r"^\d{1,2} U \d{1,3}/\d{2}$",
    "lg": r"^\d{1,2} O \d{1,4}/\d{2}$",
    "statute": r"^(§ \d+[a-z]? [A-Za-zÄÖÜäöü]+|Art\. \d+ DSGVO)$",
    "contract": r"^V-\d{4}-\d{5}$",
}


def aktenzeichen(rng: random.Random, court: str) -> str:
    year = rng.randint(15, 25)
    if court == "bverfg":
        return f"{rng.choice((1, 2))} BvR {rng.randint(100, 2999)}/{year:02d}"
    if court == "bgh":
        return f"{rng.choice(ROMAN)} ZR {rng.randint(1, 399)}/{year:02d}"
    if court == "olg":
        return f"{rng.randint(1, 28)} U {rng.randint(1, 299)}/{year:02d}"
    return f"{rng.randint(1, 40)} O {rng.randint(1, 1999)}/{year:02d}"


# --------------------------------------------------------------------------------------------------
# Pure row building
# --------------------------------------------------------------------------------------------------


def ontology_rows() -> list[Row]:
    """The doc-type and clause-type taxonomy (parents before children), keyed by `key`."""
    rows = [{"kind": DOC_TYPE, "key": k, "label": lab, "parent_key": p} for k, lab, p in DOC_TYPES]
    rows += [{"kind": CLAUSE_TYPE, "key": k, "label": lab, "parent_key": p} for k, lab, p in CLAUSE_TYPES]
    return rows


def users() -> list[str]:
    return [f"user:{first}.{LAST_NAMES[i]}" for i, first in enumerate(FIRST_NAMES)]


@dataclass
class SetupPlan:
    """The rows written once per run, before any document."""

    label: str
    projects: list[Row]
    #: matters[i] belong to projects[i]
    matters: list[list[Row]]
    #: kind -> source row
    sources: dict[str, Row]
    #: (source kind, group, member)
    memberships: list[tuple[str, str, str]]
    aliases: list[Row]
    #: project grants: (project index, principal, effect)
    project_grants: list[tuple[int, str, str]]
    #: per project: (office, team) -- who works on it
    project_teams: list[tuple[str, str]]


@dataclass
class SetupIds:
    """Database ids of the setup rows, handed to `build_document`."""

    ontology: Mapping[str, int]
    projects: Sequence[int]
    matters: Sequence[Sequence[int]]
    sources: Mapping[str, int]


@dataclass
class DocumentBundle:
    """One document and everything that hangs off it, as column dicts. `versions[i]["_source_objects"]`
    are indices into `source_objects`; `_observations` are (version index, object index, active)."""

    document: Row
    versions: list[Row]
    source_objects: list[Row]
    observations: list[tuple[int, int, bool]]
    #: (scope, object index or None for the document, principal, effect)
    grants: list[tuple[str, int | None, str, str]]
    latest_final_index: int | None
    doc_type_key: str = ""  # what the relations between documents are planned from (`plan_relations`)


def _slug(value: str) -> str:
    table = str.maketrans({"ä": "ae", "ö": "oe", "ü": "ue", "ß": "ss", " ": "-", "&": "und", ".": ""})
    return "".join(c for c in value.lower().translate(table) if c.isalnum() or c == "-").strip("-")


def plan_setup(*, scale: int, seed: int, label: str) -> SetupPlan:
    rng = random.Random(f"{seed}:setup")
    n_projects = max(2, min(300, scale // 400 + 2))
    projects: list[Row] = []
    matters: list[list[Row]] = []
    teams: list[tuple[str, str]] = []
    for p in range(n_projects):
        client = rng.choice(COMPANIES)
        team = rng.choice(TEAMS)
        office = rng.choice(OFFICES)
        teams.append((office, team))
        projects.append({"name": f"{team.capitalize()} – {client} (P{p + 1:03d}){NAME_SEPARATOR}{label}"})
        rows = []
        for m in range(rng.randint(2, 6)):
            year = rng.randint(2019, 2025)
            topic = rng.choice(("Räumungsklage", "Kündigungsschutz", "Kaufpreisforderung", "Mieterhöhung",
                                "Datenschutzvorfall", "Gewährleistungsstreit", "Vertragsverhandlung"))  # fmt: skip
            rows.append(
                {
                    "title": f"{topic} {rng.choice(STREETS)} {rng.randint(1, 120)}, {rng.choice(CITIES)}",
                    "reference": f"M-{year}-{p + 1:03d}{m + 1:02d}",
                }
            )
        matters.append(rows)

    sources = {
        "local_fs": {"kind": "local_fs", "name": f"Kanzlei-Fileserver{NAME_SEPARATOR}{label}"},
        "sharepoint": {"kind": "sharepoint", "name": f"SharePoint Mandate{NAME_SEPARATOR}{label}"},
        "dms": {"kind": "dms", "name": f"iManage DMS{NAME_SEPARATOR}{label}"},
    }

    people = users()
    memberships: list[tuple[str, str, str]] = []
    for i, user in enumerate(people):
        memberships.append(("dms", f"group:kanzlei-{OFFICES[i % len(OFFICES)]}", user))
        memberships.append(("dms", f"group:team-{TEAMS[i % len(TEAMS)]}", user))
        if i % 5 == 0:
            memberships.append(("dms", "group:partner", user))
        if i % 7 == 3:
            memberships.append(("dms", "group:sekretariat", user))
        memberships.append(("sharepoint", f"group:sp-{TEAMS[(i + 1) % len(TEAMS)]}", user))
    # Nested groups: every team belongs to the all-staff group.
    memberships += [("dms", "group:kanzlei-alle", f"group:kanzlei-{office}") for office in OFFICES]
    memberships += [("sharepoint", f"group:sp-{team}", f"group:team-{team}") for team in TEAMS]

    run_rid = int.from_bytes(label.encode(), "little") % 900_000_000 + 100_000_000
    # Canonical principals (`kind:name`): a login whose subject is the e-mail address is `user:<address>`.
    aliases = [{"alias": f"{u}@kanzlei-demo.de", "principal": u} for u in people]
    aliases += [{"alias": f"sid:s-1-5-21-{run_rid}-{1100 + i}", "principal": u} for i, u in enumerate(people)]

    grants: list[tuple[int, str, str]] = []
    for p, (office, team) in enumerate(teams):
        grants.append((p, f"group:kanzlei-{office}", "allow"))
        grants.append((p, f"group:team-{team}", "allow"))
        grants.append((p, "group:partner", "allow"))
        if rng.random() < 0.25:  # conflict of interest: somebody in the office must not see the project
            grants.append((p, rng.choice(people), "deny"))
    return SetupPlan(label, projects, matters, sources, memberships, aliases, grants, teams)


def _weighted(rng: random.Random, options: Sequence[tuple[Any, int]]) -> Any:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options], k=1)[0]


@dataclass
class _Context:
    party_a: str
    party_b: str
    city: str
    street: str
    number: int
    statutes: list[str]
    dates: list[str] = field(default_factory=list)


def _fill(rng: random.Random, template: str, ctx: _Context, statute: str | None = None) -> str:
    return template.format(
        adj=rng.choice(ADJ),
        noun=rng.choice(NOUNS),
        frist=rng.choice(DEADLINES),
        statute=statute or rng.choice(ctx.statutes),
        party_a=ctx.party_a,
        party_b=ctx.party_b,
        amount=f"{rng.randint(2, 950) * 100 + rng.choice((0, 50)):,}".replace(",", "."),
        date=f"{rng.randint(1, 28):02d}.{rng.randint(1, 12):02d}.{rng.randint(2019, 2025)}",
        street=ctx.street,
        number=ctx.number,
        city=ctx.city,
        person=rng.choice(PERSONS),
        years=rng.choice(("zwei", "drei", "fünf")),
    )


def _paragraph(rng: random.Random, family: str, ctx: _Context, clause: str | None) -> str:
    pool = list(COMMON_SENTENCES) + list(FAMILY_SENTENCES[family])
    sentences = []
    if clause:
        clause_pool = list(CLAUSE_SENTENCES[clause])
        rng.shuffle(clause_pool)
        sentences += [_fill(rng, s, ctx, rng.choice(CLAUSE_STATUTES[clause])) for s in clause_pool[:2]]
    sentences += [_fill(rng, s, ctx) for s in rng.sample(pool, rng.randint(3, 5))]
    if clause:
        rng.shuffle(sentences)
    return " ".join(sentences)


def _sections(rng: random.Random, family: str, ctx: _Context) -> list[tuple[str, str | None, str]]:
    """(heading, clause key or None, body) for a document, long enough for MIN..MAX_TEXT_CHARS."""
    target = rng.randint(MIN_TEXT_CHARS + 300, MAX_TEXT_CHARS - 900)
    clauses = list(FAMILY_CLAUSES[family])
    rng.shuffle(clauses)
    clauses = clauses[: rng.randint(2, min(5, len(clauses)))]
    headings = list(FAMILY_HEADINGS[family])
    plan: list[tuple[str, str | None]] = [(h, None) for h in headings[:2]]
    plan += [(CLAUSE_LABELS[c], c) for c in clauses]
    plan += [(h, None) for h in headings[2:]]
    out: list[tuple[str, str | None, str]] = []
    length = 0
    for heading, clause in plan:
        body = _paragraph(rng, family, ctx, clause)
        if length + len(body) > MAX_TEXT_CHARS - 700 and length >= MIN_TEXT_CHARS:
            break
        out.append((heading, clause, body))
        length += len(body) + len(heading) + 10
        if length >= target and all(c in {x[1] for x in out} for c in clauses):
            break
    while length < MIN_TEXT_CHARS:
        body = _paragraph(rng, family, ctx, None)
        out.append(("Ergänzende Ausführungen", None, body))
        length += len(body) + 40
    return out


def _render(
    family: str, title: str, header: str, sections: list[tuple[str, str | None, str]], footer: str
) -> tuple[str, list[Row]]:
    parts = [title, header]
    loci: list[Row] = []
    for i, (heading, clause, body) in enumerate(sections):
        locus = f"§ {i + 1}" if family == "vertrag" else f"{ROMAN[i % len(ROMAN)]}."
        parts.append(f"{locus} {heading}\n{body}")
        if clause:
            loci.append({"clause_key": clause, "locus": locus, "text": body[:600]})
    parts.append(footer)
    return "\n\n".join(p for p in parts if p), loci


def build_document(seed: int, index: int, setup: SetupPlan, ids: SetupIds, *, max_versions: int) -> DocumentBundle:
    """Document number `index` of the run: pure, determined by (seed, index, label)."""
    rng = random.Random(f"{seed}:{setup.label}:doc:{index}")
    doc_type = _weighted(rng, [((k, f), w) for k, f, w in DOC_TYPE_CHOICES])
    doc_type_key, family = doc_type
    sequences = STATUS_SEQUENCES["vertrag" if family == "vertrag" else "other"]
    statuses = list(_weighted(rng, sequences))[: max(1, max_versions)]

    project_index = rng.randrange(len(ids.projects))
    office, team = setup.project_teams[project_index]
    matter_ids = ids.matters[project_index]
    matter_id = rng.choice(matter_ids) if matter_ids and rng.random() < 0.9 else None

    party_a, party_b = rng.sample(COMPANIES + PERSONS, 2)
    clauses_statutes = [s for c in FAMILY_CLAUSES[family] for s in CLAUSE_STATUTES[c]]
    statutes = sorted(set(rng.sample(STATUTES, 3) + rng.sample(clauses_statutes, 2)))
    ctx = _Context(party_a, party_b, rng.choice(CITIES), rng.choice(STREETS), rng.randint(1, 140), statutes)

    identifiers: list[str] = []
    type_label = DOC_TYPE_LABELS[doc_type_key]
    if family == "vertrag":
        identifiers.append(f"V-{rng.randint(2018, 2025)}-{index % 100000:05d}")
        title = f"{type_label} {ctx.street} {ctx.number}, {ctx.city} – {party_a}"
    elif family == "gutachten":
        title = f"Gutachten zu {rng.choice(statutes)} – {party_a}"
    else:
        courts = {
            "demo.doc.schriftsatz.klageschrift": (("lg", 1),),
            "demo.doc.schriftsatz.klageerwiderung": (("lg", 3), ("olg", 1)),
            "demo.doc.schriftsatz.berufungsbegruendung": (("olg", 1),),
        }.get(doc_type_key, (("lg", 50), ("olg", 25), ("bgh", 18), ("bverfg", 7)))
        court_kind = _weighted(rng, courts)
        az = aktenzeichen(rng, court_kind)
        identifiers.append(az)
        court = {
            "lg": rng.choice(LANDGERICHTE),
            "olg": rng.choice(OLGS),
            "bgh": "Bundesgerichtshof",
            "bverfg": "Bundesverfassungsgericht",
        }[court_kind]
        title = f"{type_label} {court}, Az. {az} – {party_a} ./. {party_b}"
        ctx.city = court.split()[-1] if court_kind == "lg" else ctx.city
    identifiers += statutes

    sections = _sections(rng, family, ctx)
    start = dt.date(2019, 1, 1) + dt.timedelta(days=rng.randint(0, 365 * 6))
    versions: list[Row] = []
    latest_final: int | None = None
    for v, status in enumerate(statuses):
        doc_date = start + dt.timedelta(days=21 * v + rng.randint(0, 10))
        vrng = random.Random(f"{seed}:{setup.label}:doc:{index}:v:{v}")
        secs = list(sections)
        if status == "draft":
            # A draft differs from the final text: one section is still under negotiation.
            k = vrng.randrange(len(secs))
            heading, clause, body = secs[k]
            secs[k] = (heading, clause, body + " [Anmerkung: Formulierung mit Mandant noch abzustimmen.]")
            header = f"ENTWURF – Stand {doc_date:%d.%m.%Y} – Version {v + 1}"
        else:
            header = f"{ctx.city}, den {doc_date:%d.%m.%Y}"
        footer = ""
        if status == "executed":
            footer = (f"Unterschrieben in {ctx.city} am {doc_date:%d.%m.%Y}\n\n"
                      f"______________________\n{party_a}\n\n______________________\n{party_b}")  # fmt: skip
        elif family in ("schriftsatz", "gutachten"):
            footer = f"Rechtsanwältin/Rechtsanwalt, Kanzlei {office.capitalize()}"
        body, loci = _render(family, title, header, secs, footer)
        notable = []
        if status in FINAL_STATUSES:
            notable = [
                {"clause_type_id": ids.ontology[x["clause_key"]], "locus": x["locus"], "text": x["text"]} for x in loci
            ]
            latest_final = v
        versions.append(
            {
                "version_no": v + 1,
                "status": status,
                "language": "de",
                "doc_date": doc_date,
                "text": body,
                "notable_clauses": notable,
            }
        )

    # Where the document lives: one source object per version (DMS and SharePoint version their files),
    # sometimes an extra copy elsewhere, sometimes an old, inactive sighting.
    source_kind = _weighted(rng, (("dms", 45), ("sharepoint", 25), ("local_fs", 30)))
    objects: list[Row] = []
    observations: list[tuple[int, int, bool]] = []
    grants: list[tuple[str, int | None, str, str]] = []
    base = f"{_slug(team)}/{index:07d}-{_slug(type_label)}"

    def add_object(kind: str, ref: str, acl_known: bool) -> int:
        objects.append({"source_kind": kind, "external_ref": ref, "acl_known": acl_known})
        obj = len(objects) - 1
        if acl_known:  # mirrored ACL of the object
            grants.append(("source_object", obj, f"group:team-{team}", "allow"))
            if kind == "sharepoint":
                grants.append(("source_object", obj, f"group:sp-{team}", "allow"))
            if rng.random() < 0.05:
                grants.append(("source_object", obj, rng.choice(users()), "deny"))
        return obj

    for v in range(len(versions)):
        if source_kind == "local_fs":
            obj = add_object("local_fs", f"/srv/mandate/{base}_v{v + 1}.docx", rng.random() < 0.1)
        elif source_kind == "dms":
            obj = add_object("dms", f"DMS!{index:07d};{v + 1}", rng.random() < 0.9)
        else:
            obj = add_object("sharepoint", f"sites/{_slug(team)}/Dokumente/{base}_v{v + 1}.docx", rng.random() < 0.85)
        observations.append((v, obj, True))
        if rng.random() < 0.08:
            copy = add_object("local_fs", f"/srv/ablage/{base}_v{v + 1}_kopie.pdf", False)
            observations.append((v, copy, rng.random() < 0.5))

    if rng.random() < 0.04:
        grants.append(("document", None, rng.choice(users()), "allow"))
    if rng.random() < 0.03:
        grants.append(("document", None, "group:sekretariat", "deny"))

    document = {
        "project_id": ids.projects[project_index],
        "matter_id": matter_id,
        "title": title,
        "doc_type_id": ids.ontology[doc_type_key],
        "identifiers": identifiers,
    }
    return DocumentBundle(document, versions, objects, observations, grants, latest_final, doc_type_key)


def iter_documents(seed: int, setup: SetupPlan, ids: SetupIds, scale: int) -> Iterator[DocumentBundle]:
    """Documents until exactly `scale` versions exist (the last one may be cut short, keeping a valid
    status prefix)."""
    remaining = scale
    index = 0
    while remaining > 0:
        bundle = build_document(seed, index, setup, ids, max_versions=remaining)
        remaining -= len(bundle.versions)
        index += 1
        yield bundle


@dataclass(frozen=True)
class Placed:
    """A written document, as far as relations between documents care."""

    document_id: int
    doc_type_key: str
    project_id: int
    matter_id: int | None


def _family(doc_type_key: str) -> str:
    return next(f for k, f, _ in DOC_TYPE_CHOICES if k == doc_type_key)


def plan_relations(seed: int, label: str, placed: Sequence[Placed]) -> list[tuple[str, int, int]]:
    """(kind, from document, to document) among documents of one matter, in the order they were written:
    a later contract supersedes an earlier one or is its annex; opinions and pleadings reference the
    matter's contracts; a statement of defence responds to the statement of claim; a matter's pleadings
    and judgments form a thread (each one points to the one before). Pure: decided by (seed, label)."""
    rng = random.Random(f"{seed}:{label}:relations")
    by_matter: dict[int, list[Placed]] = {}
    for doc in placed:
        if doc.matter_id is not None:
            by_matter.setdefault(doc.matter_id, []).append(doc)
    out: set[tuple[str, int, int]] = set()
    for docs in by_matter.values():
        contracts = [d for d in docs if _family(d.doc_type_key) == "vertrag"]
        for earlier, later in zip(contracts, contracts[1:], strict=False):
            roll = rng.random()
            if roll < 0.35:
                out.add(("supersedes", later.document_id, earlier.document_id))
            elif roll < 0.55:
                out.add(("annex_of", later.document_id, earlier.document_id))
        for doc in docs:
            if _family(doc.doc_type_key) in ("gutachten", "schriftsatz") and contracts and rng.random() < 0.6:
                out.add(("references", doc.document_id, rng.choice(contracts).document_id))
        claims = [d for d in docs if d.doc_type_key == "demo.doc.schriftsatz.klageschrift"]
        for doc in docs:
            if doc.doc_type_key == "demo.doc.schriftsatz.klageerwiderung" and claims:
                out.add(("responds_to", doc.document_id, rng.choice(claims).document_id))
        thread = [d for d in docs if _family(d.doc_type_key) in ("schriftsatz", "urteil")]
        for earlier, later in zip(thread, thread[1:], strict=False):
            out.add(("thread", later.document_id, earlier.document_id))
    return sorted(out)


def run_label(seed: int, scale: int, now: dt.datetime | None = None) -> str:
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%S")
    return f"{DEMO_TAG}-s{seed}-n{scale}-{stamp}"


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


@dataclass
class GenerationSummary:
    label: str
    seed: int
    scale: int
    projects: int = 0
    matters: int = 0
    documents: int = 0
    versions: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    source_objects: int = 0
    observations: int = 0
    grants: int = 0
    relations: int = 0
    memberships: int = 0
    aliases: int = 0
    text_chars: int = 0
    seconds: float = 0.0

    def lines(self) -> list[str]:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        return [
            f"demo corpus {self.label} (seed {self.seed}) in {self.seconds:.1f}s:",
            f"  {self.projects} projects, {self.matters} matters, {self.documents} documents, "
            f"{self.versions} versions ({statuses}), {self.text_chars / 1e6:.1f} M chars of text",
            f"  {self.source_objects} source objects, {self.observations} observations, {self.grants} grants, "
            f"{self.memberships} group memberships, {self.aliases} new aliases, {self.relations} relations",
        ]


def _table(model: type[Base]) -> Table:
    # Every model is declared with a `__tablename__`, so `__table__` is a `Table`; the stubs only promise the
    # wider `FromClause`, which `insert()` does not accept.
    return cast(Table, model.__table__)


def _insert_returning(conn: Any, table: Table, rows: list[Row]) -> list[int]:
    if not rows:
        return []
    stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
    return [int(r[0]) for r in conn.execute(stmt, rows)]


def _ensure_ontology(conn: Any) -> dict[str, int]:
    nodes = _table(OntologyNode)
    ids: dict[str, int] = {}
    for row in ontology_rows():
        parent = ids.get(row["parent_key"]) if row["parent_key"] else None
        conn.execute(
            pg_insert(nodes)
            .values(kind=row["kind"], key=row["key"], label=row["label"], parent_id=parent)
            .on_conflict_do_nothing(index_elements=["key"])
        )
        ids[row["key"]] = int(conn.execute(select(nodes.c.id).where(nodes.c.key == row["key"])).scalar_one())
    return ids


def _write_setup(conn: Any, plan: SetupPlan, summary: GenerationSummary) -> SetupIds:
    ontology = _ensure_ontology(conn)
    project_ids = _insert_returning(conn, _table(Project), plan.projects)
    matter_ids = [
        _insert_returning(conn, _table(Matter), [{**m, "project_id": pid} for m in rows])
        for pid, rows in zip(project_ids, plan.matters, strict=True)
    ]
    kinds = list(plan.sources)
    source_ids = dict(zip(kinds, _insert_returning(conn, _table(Source), [plan.sources[k] for k in kinds]),
                          strict=True))  # fmt: skip
    conn.execute(
        insert(_table(GroupMembership)),
        [{"source_id": source_ids[k], "group_principal": g, "member_principal": m} for k, g, m in plan.memberships],
    )
    aliases = conn.execute(
        pg_insert(_table(PrincipalAlias))
        .on_conflict_do_nothing(index_elements=["alias"])
        .returning(_table(PrincipalAlias).c.id),
        plan.aliases,
    ).all()
    conn.execute(
        insert(_table(Grant)),
        [
            {"scope": "project", "project_id": project_ids[p], "principal": who, "effect": effect}
            for p, who, effect in plan.project_grants
        ],
    )
    summary.projects = len(project_ids)
    summary.matters = sum(len(m) for m in matter_ids)
    summary.memberships = len(plan.memberships)
    summary.aliases = len(aliases)
    summary.grants += len(plan.project_grants)
    return SetupIds(ontology, project_ids, matter_ids, source_ids)


_SET_LATEST = text(
    "UPDATE documents AS d SET latest_final_version_id = u.version_id "
    "FROM unnest(CAST(:doc_ids AS bigint[]), CAST(:version_ids AS bigint[])) AS u(document_id, version_id) "
    "WHERE d.id = u.document_id"
).bindparams(bindparam("doc_ids"), bindparam("version_ids"))


def _write_batch(conn: Any, batch: list[DocumentBundle], ids: SetupIds, summary: GenerationSummary) -> list[Placed]:
    doc_ids = _insert_returning(conn, _table(Document), [b.document for b in batch])
    version_rows: list[Row] = []
    for doc_id, bundle in zip(doc_ids, batch, strict=True):
        version_rows += [{**v, "document_id": doc_id} for v in bundle.versions]
    version_ids = _insert_returning(conn, _table(DocumentVersion), version_rows)

    object_rows: list[Row] = []
    for bundle in batch:
        object_rows += [
            {"source_id": ids.sources[o["source_kind"]], "external_ref": o["external_ref"], "acl_known": o["acl_known"]}
            for o in bundle.source_objects
        ]
    object_ids = _insert_returning(conn, _table(SourceObject), object_rows)

    observations: list[Row] = []
    grants: list[Row] = []
    latest_docs: list[int] = []
    latest_versions: list[int] = []
    now = dt.datetime.now(dt.UTC)
    v_off = o_off = 0
    for doc_id, bundle in zip(doc_ids, batch, strict=True):
        for version_index, object_index, active in bundle.observations:
            observations.append(
                {
                    "document_version_id": version_ids[v_off + version_index],
                    "source_object_id": object_ids[o_off + object_index],
                    "deleted_at": None if active else now,
                }
            )
        for scope, grant_object, who, effect in bundle.grants:
            row: Row = {"scope": scope, "principal": who, "effect": effect}
            if scope == "document":
                row["document_id"] = doc_id
            else:
                assert grant_object is not None, "object grants always carry an object index"
                row["source_object_id"] = object_ids[o_off + grant_object]
            grants.append(row)
        if bundle.latest_final_index is not None:
            latest_docs.append(doc_id)
            latest_versions.append(version_ids[v_off + bundle.latest_final_index])
        for version in bundle.versions:
            summary.statuses[version["status"]] = summary.statuses.get(version["status"], 0) + 1
            summary.text_chars += len(version["text"])
        v_off += len(bundle.versions)
        o_off += len(bundle.source_objects)

    conn.execute(insert(_table(SourceObservation)), observations)
    # Uniform keys per executemany: document grants and object grants go separately.
    for scope in ("document", "source_object"):
        rows = [g for g in grants if g["scope"] == scope]
        if rows:
            conn.execute(insert(_table(Grant)), rows)
    if latest_docs:
        conn.execute(_SET_LATEST, {"doc_ids": latest_docs, "version_ids": latest_versions})

    summary.documents += len(doc_ids)
    summary.versions += len(version_ids)
    summary.source_objects += len(object_ids)
    summary.observations += len(observations)
    summary.grants += len(grants)
    return [
        Placed(doc_id, b.doc_type_key, b.document["project_id"], b.document["matter_id"])
        for doc_id, b in zip(doc_ids, batch, strict=True)
    ]


def generate(
    engine: Engine,
    *,
    scale: int,
    seed: int = 7,
    progress: Progress = print,
    batch_size: int = 500,
    label: str | None = None,
) -> GenerationSummary:
    """Write a corpus of exactly `scale` document versions; one transaction per batch."""
    if scale < 1:
        raise ValueError("scale must be at least 1")
    began = time.monotonic()
    label = label or run_label(seed, scale)
    summary = GenerationSummary(label=label, seed=seed, scale=scale)
    plan = plan_setup(scale=scale, seed=seed, label=label)
    with engine.begin() as conn:
        ids = _write_setup(conn, plan, summary)
    progress(f"demo: {label}: {summary.projects} projects, {summary.matters} matters, 3 sources written")

    batch: list[DocumentBundle] = []
    batch_versions = 0
    last_report = 0
    placed: list[Placed] = []

    def flush() -> None:
        nonlocal batch, batch_versions, last_report
        with engine.begin() as conn:
            placed.extend(_write_batch(conn, batch, ids, summary))
        batch, batch_versions = [], 0
        if summary.versions - last_report >= 2000 or summary.versions == scale or summary.versions < 2000:
            last_report = summary.versions
            elapsed = time.monotonic() - began
            progress(f"demo: {summary.versions}/{scale} versions, {summary.documents} documents "
                     f"({elapsed:.1f}s, {summary.versions / max(elapsed, 1e-6):.0f} versions/s)")  # fmt: skip

    for bundle in iter_documents(seed, plan, ids, scale):
        batch.append(bundle)
        batch_versions += len(bundle.versions)
        if batch_versions >= batch_size:
            flush()
    if batch:
        flush()
    relations = plan_relations(seed, label, placed)
    if relations:
        with engine.begin() as conn:
            conn.execute(
                insert(_table(Relation)),
                [{"kind": k, "from_document_id": a, "to_document_id": b} for k, a, b in relations],
            )
    summary.relations = len(relations)
    progress(f"demo: {len(relations)} relations between documents of a matter")
    summary.seconds = time.monotonic() - began
    return summary


def demo_data_exists(engine: Engine) -> bool:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT 1 FROM projects WHERE name LIKE :pattern LIMIT 1"),
            {"pattern": f"%{NAME_SEPARATOR}{DEMO_TAG}-%"},
        ).first()
    return found is not None

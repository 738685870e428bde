"""The query's own words (search.query_words): German and English phrasings that must parse, as a table of what
each yields; phrasings that must not parse (file numbers, quoted titles, statute names, money, version numbers...);
and properties every parse keeps (spans point into the query, `remaining` holds no parsed date phrase, parsing
`remaining` again changes nothing, time linear in the query's length)."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.query_words import REMOVED_KINDS, Comparison, ParsedQuery, Provision, parse_query

TODAY = dt.date(2024, 6, 15)


@dataclass(frozen=True)
class Case:
    """A query and everything it must yield; what is not given must come out empty (None, ()), and `remaining`
    defaults to the query itself."""

    query: str
    as_of: str | None = None
    range: tuple[str, str] | None = None
    compare: tuple[str, str] | None = None  # dates as ISO strings, or "previous" / "current"
    provisions: tuple[str, ...] = ()  # as `_render` writes them
    identifiers: tuple[str, ...] = ()
    remaining: str | None = None


_SIGNS = {"paragraph": "§", "article": "Art.", "section": "Sec."}


def _render(p: Provision) -> str:
    """One provision in a fixed short form: "§ 5 Abs. 2 S. 1 Nr. 3 lit. a BGB"."""
    parts = [_SIGNS[p.kind], p.number]
    for label, value in (("Abs.", p.subsection), ("S.", p.sentence), ("Nr.", p.item), ("lit.", p.letter)):
        if value is not None:
            parts += [label, value]
    if p.law:
        parts.append(p.law)
    return " ".join(parts)


def _side(value: dt.date | str) -> str:
    return value.isoformat() if isinstance(value, dt.date) else value


def _observed(parsed: ParsedQuery) -> dict[str, object]:
    compare = parsed.compare
    return {
        "as_of": parsed.as_of.isoformat() if parsed.as_of else None,
        "range": tuple(d.isoformat() for d in parsed.date_range) if parsed.date_range else None,
        "compare": (_side(compare.earlier), _side(compare.later)) if compare else None,
        "provisions": tuple(_render(p) for p in parsed.provisions),
        "identifiers": tuple(i.text for i in parsed.identifiers),
        "remaining": parsed.remaining,
    }


def _expected(case: Case) -> dict[str, object]:
    return {
        "as_of": case.as_of,
        "range": case.range,
        "compare": case.compare,
        "provisions": case.provisions,
        "identifiers": case.identifiers,
        "remaining": case.query if case.remaining is None else case.remaining,
    }


PREV_CUR = ("previous", "current")

# --- German ----------------------------------------------------------------------------------------------------

GERMAN = [
    # points in time: "in der Fassung vom", "Stand", "vom", "gültig ab", "... geltende Fassung"
    Case("Mietvertrag in der Fassung vom 1. März 2020", as_of="2020-03-01", remaining="Mietvertrag"),
    Case(
        "Kündigungsfrist Arbeitsvertrag, Stand: 1.1.2019",
        as_of="2019-01-01",
        remaining="Kündigungsfrist Arbeitsvertrag",
    ),
    Case("Kündigungsfrist Stand 2019", as_of="2019-12-31", remaining="Kündigungsfrist"),
    Case("Gesellschaftsvertrag vom 03.03.2021", as_of="2021-03-03", remaining="Gesellschaftsvertrag"),
    Case("Mietvertrag Fassung 2019", as_of="2019-12-31", remaining="Mietvertrag"),
    Case("BGB in der Fassung vom 2. Januar 2002", as_of="2002-01-02", remaining="BGB"),
    Case("HGB i.d.F. v. 10.08.2021", as_of="2021-08-10", remaining="HGB"),
    Case("ZPO idF vom 1.7.2020", as_of="2020-07-01", remaining="ZPO"),
    Case("Arbeitsvertrag Stand März 2020", as_of="2020-03-31", remaining="Arbeitsvertrag"),
    Case("Mietvertrag Stand Jänner 2021", as_of="2021-01-31", remaining="Mietvertrag"),
    Case("Gesellschaftsvertrag Stand Febr. 2019", as_of="2019-02-28", remaining="Gesellschaftsvertrag"),
    Case("Satzung in der Fassung vom 15. Sept. 2018", as_of="2018-09-15", remaining="Satzung"),
    Case("DSGVO Stand 25.05.2018", as_of="2018-05-25", remaining="DSGVO"),
    Case("Mietvertrag gültig ab 1.1.2021", as_of="2021-01-01", remaining="Mietvertrag"),
    Case("Arbeitsvertrag gültig ab 2021", as_of="2021-01-01", remaining="Arbeitsvertrag"),
    Case("AGB gültig bis 31.12.2020", as_of="2020-12-31", remaining="AGB"),
    Case(
        "die am 1.1.2020 geltende Fassung des § 573 BGB",
        as_of="2020-01-01",
        provisions=("§ 573 BGB",),
        remaining="des § 573 BGB",
    ),
    Case(
        "§ 5 Mietvertrag in der am 1. April 2021 geltenden Fassung",
        as_of="2021-04-01",
        provisions=("§ 5",),
        remaining="§ 5 Mietvertrag",
    ),
    Case(
        "Kündigungsschutzgesetz in der 2019 geltenden Fassung", as_of="2019-12-31", remaining="Kündigungsschutzgesetz"
    ),
    Case("Kündigungsfristen nach der 2019-Fassung", as_of="2019-12-31", remaining="Kündigungsfristen nach"),
    Case("Mietrecht Rechtsstand 1.7.2022", as_of="2022-07-01", remaining="Mietrecht"),
    Case("Gesellschaftsvertrag mit Stand vom 30.06.2020", as_of="2020-06-30", remaining="Gesellschaftsvertrag"),
    Case("Arbeitsvertrag zum Stichtag 31.12.2019", as_of="2019-12-31", remaining="Arbeitsvertrag"),
    Case("Stichtag 1.1.2020 Betriebsvereinbarung", as_of="2020-01-01", remaining="Betriebsvereinbarung"),
    Case("Mietvertrag vom 1.3.20", as_of="2020-03-01", remaining="Mietvertrag"),
    Case("Pachtvertrag vom 1.3.99", as_of="1999-03-01", remaining="Pachtvertrag"),
    Case("Kaufvertrag vom 01. 03. 2020", as_of="2020-03-01", remaining="Kaufvertrag"),
    Case(
        "Urteil vom 3.3.2021 VIII ZR 123/20",
        as_of="2021-03-03",
        identifiers=("VIII ZR 123/20",),
        remaining="Urteil VIII ZR 123/20",
    ),
    Case(
        "Beschluss v. 12.05.2020 1 BvR 2011/16",
        as_of="2020-05-12",
        identifiers=("1 BvR 2011/16",),
        remaining="Beschluss 1 BvR 2011/16",
    ),
    Case(
        "Gesellschaftsvertrag GmbH Neufassung vom 12. Dezember 2019",
        as_of="2019-12-12",
        remaining="Gesellschaftsvertrag GmbH",
    ),
    Case("Mietvertrag Version vom 1.2.2022", as_of="2022-02-01", remaining="Mietvertrag"),
    Case("Arbeitsvertrag Fassung aus dem Jahr 2018", as_of="2018-12-31", remaining="Arbeitsvertrag"),
    Case("Satzung Fassung ab 1. Juli 2021", as_of="2021-07-01", remaining="Satzung"),
    Case(
        "Kündigungsfrist § 622 BGB Stand 2020",
        as_of="2020-12-31",
        provisions=("§ 622 BGB",),
        remaining="Kündigungsfrist § 622 BGB",
    ),
    Case(
        "§ 573c BGB in der Fassung vom 1.9.2001", as_of="2001-09-01", provisions=("§ 573c BGB",), remaining="§ 573c BGB"
    ),
    Case("Mietpreisbremse Stand heute", as_of="2024-06-15", remaining="Mietpreisbremse"),
    Case("heute geltende Fassung § 556d BGB", as_of="2024-06-15", provisions=("§ 556d BGB",), remaining="§ 556d BGB"),
    Case("Datenschutzerklärung Stand: 05/2018", as_of="2018-05-31", remaining="Datenschutzerklärung"),
    Case("Arbeitsvertrag Stand 03.2021", as_of="2021-03-31", remaining="Arbeitsvertrag"),
    Case("Mietvertrag in Kraft seit 1.4.2019", as_of="2019-04-01", remaining="Mietvertrag"),
    Case("Gesellschaftsvertrag wirksam ab 2020", as_of="2020-01-01", remaining="Gesellschaftsvertrag"),
    Case("Betriebsvereinbarung gilt ab 1. Oktober 2022", as_of="2022-10-01", remaining="Betriebsvereinbarung"),
    Case("Mietvertrag Stand 29.02.2020", as_of="2020-02-29", remaining="Mietvertrag"),
    Case("Mietvertrag Stand 1.März 2020", as_of="2020-03-01", remaining="Mietvertrag"),
    Case("Mietvertrag Stand Maerz 2020", as_of="2020-03-31", remaining="Mietvertrag"),
    Case("Arbeitsvertrag Stand Dez. 2022", as_of="2022-12-31", remaining="Arbeitsvertrag"),
    Case("Geschäftsordnung, Stand 2023", as_of="2023-12-31", remaining="Geschäftsordnung"),
    Case("Rahmenvertrag Stand 1. Jan. 2020", as_of="2020-01-01", remaining="Rahmenvertrag"),
    Case(
        "Mietvertrag (Stand: 01.04.2022) Schönheitsreparaturen",
        as_of="2022-04-01",
        remaining="Mietvertrag Schönheitsreparaturen",
    ),
    Case("Wohnungseigentumsgesetz Stand 1. Dezember 2020", as_of="2020-12-01", remaining="Wohnungseigentumsgesetz"),
    Case("Arbeitsvertrag Stand 01.03.2020 14:30 Uhr", as_of="2020-03-01", remaining="Arbeitsvertrag 14:30 Uhr"),
    Case("Mietvertrag in der bis 31.12.2019 geltenden Fassung", as_of="2019-12-31", remaining="Mietvertrag"),
    # ranges
    Case("Mieterhöhungen vom 1.3.2020 bis 31.12.2020", range=("2020-03-01", "2020-12-31"), remaining="Mieterhöhungen"),
    Case(
        "Urteile zwischen 2019 und 2021 zur Eigenbedarfskündigung",
        range=("2019-01-01", "2021-12-31"),
        remaining="Urteile zur Eigenbedarfskündigung",
    ),
    Case("Kündigungen von 2018 bis 2020", range=("2018-01-01", "2020-12-31"), remaining="Kündigungen"),
    Case("Abmahnungen vom 1.3. bis 31.12.2021", range=("2021-03-01", "2021-12-31"), remaining="Abmahnungen"),
    Case(
        "Betriebskostenabrechnung von März bis Mai 2020",
        range=("2020-03-01", "2020-05-31"),
        remaining="Betriebskostenabrechnung",
    ),
    Case("Arbeitszeit 01.01.2020 - 30.06.2020", range=("2020-01-01", "2020-06-30"), remaining="Arbeitszeit"),
    Case("Urlaubsanspruch 1.1.2021–31.12.2021", range=("2021-01-01", "2021-12-31"), remaining="Urlaubsanspruch"),
    Case("Nebenkosten 01.01.2020-31.12.2020", range=("2020-01-01", "2020-12-31"), remaining="Nebenkosten"),
    Case(
        "Rechtsprechung seit 2019 zum Widerrufsrecht",
        range=("2019-01-01", "2024-06-15"),
        remaining="Rechtsprechung zum Widerrufsrecht",
    ),
    Case("Kündigungen ab Januar 2020 bis Juni 2020", range=("2020-01-01", "2020-06-30"), remaining="Kündigungen"),
    Case("Mietvertrag vom 1.12. bis 28.2.2021", range=("2020-12-01", "2021-02-28"), remaining="Mietvertrag"),
    Case(
        "Arbeitsunfähigkeit vom 1. März bis 15. April 2021",
        range=("2021-03-01", "2021-04-15"),
        remaining="Arbeitsunfähigkeit",
    ),
    # comparisons
    Case(
        "Unterschied zwischen der alten und der neuen Fassung von § 5 BGB",
        compare=PREV_CUR,
        provisions=("§ 5 BGB",),
        remaining="von § 5 BGB",
    ),
    Case("Was hat sich geändert?", compare=PREV_CUR, remaining=""),
    Case("Was hat sich im Mietrecht geändert", compare=PREV_CUR, remaining="im Mietrecht"),
    Case(
        "Was hat sich seit 2019 im Arbeitszeitgesetz geändert",
        compare=("2019-01-01", "current"),
        remaining="im Arbeitszeitgesetz",
    ),
    Case("vorherige Fassung des § 573c BGB", compare=PREV_CUR, provisions=("§ 573c BGB",), remaining="des § 573c BGB"),
    Case("alte Fassung Mietvertrag", compare=PREV_CUR, remaining="Mietvertrag"),
    Case("alte Fassung vs. neue Fassung Gesellschaftsvertrag", compare=PREV_CUR, remaining="Gesellschaftsvertrag"),
    Case(
        "Vergleich der Fassungen 2019 und 2021 des Arbeitsvertrags",
        compare=("2019-12-31", "2021-12-31"),
        remaining="des Arbeitsvertrags",
    ),
    Case(
        "Unterschied zwischen der Fassung vom 1.3.2020 und der Fassung vom 1.1.2021",
        compare=("2020-03-01", "2021-01-01"),
        remaining="",
    ),
    Case("§ 573c BGB a.F.", compare=PREV_CUR, provisions=("§ 573c BGB",), remaining="§ 573c BGB"),
    Case("Synopse Mietvertrag 2020 2022", compare=("2020-12-31", "2022-12-31"), remaining="Mietvertrag"),
    Case("Was ist neu in der DSGVO", compare=PREV_CUR, remaining="in der DSGVO"),
    Case("Welche Änderungen gab es im Kündigungsschutz", compare=PREV_CUR, remaining="im Kündigungsschutz"),
    Case("Änderungen seit 1.1.2020 im Mietrecht", compare=("2020-01-01", "current"), remaining="im Mietrecht"),
    Case(
        "Unterschied zur vorherigen Fassung § 622 BGB",
        compare=PREV_CUR,
        provisions=("§ 622 BGB",),
        remaining="§ 622 BGB",
    ),
    Case("Vergleich der aktuellen Fassung mit der Fassung von 2018", compare=("2018-12-31", "current"), remaining=""),
    Case("frühere Fassung der Satzung", compare=PREV_CUR, remaining="der Satzung"),
    Case("ursprüngliche Fassung des Gesellschaftsvertrags", compare=PREV_CUR, remaining="des Gesellschaftsvertrags"),
    Case("bisherige Fassung § 14 TzBfG", compare=PREV_CUR, provisions=("§ 14 TzBfG",), remaining="§ 14 TzBfG"),
    Case("Gegenüberstellung alte und neue Fassung Arbeitsvertrag", compare=PREV_CUR, remaining="Arbeitsvertrag"),
    Case(
        "Mietvertrag Fassung 2019 gegenüber Fassung 2023", compare=("2019-12-31", "2023-12-31"), remaining="Mietvertrag"
    ),
    Case("Was wurde am Arbeitsvertrag geändert", compare=PREV_CUR, remaining="am Arbeitsvertrag"),
    Case(
        "Unterschiede zwischen der Fassung 2020 und der aktuellen Fassung der AGB",
        compare=("2020-12-31", "current"),
        remaining="der AGB",
    ),
    Case("Änderungen gegenüber der vorherigen Fassung", compare=PREV_CUR, remaining=""),
    Case(
        "Was hat sich zwischen 2019 und 2021 im BetrVG geändert",
        compare=("2019-12-31", "2021-12-31"),
        remaining="im BetrVG",
    ),
    Case("Neue Fassung und alte Fassung im Vergleich", compare=PREV_CUR, remaining=""),
    Case(
        "Was hat sich zwischen der Fassung von März 2020 und heute geändert",
        compare=("2020-03-31", "current"),
        remaining="",
    ),
    Case(
        "Unterschied § 5 Abs. 2 alte und neue Fassung",
        compare=PREV_CUR,
        provisions=("§ 5 Abs. 2",),
        remaining="§ 5 Abs. 2",
    ),
    Case(
        "Unterschied zwischen 2019 und heute Fassung Mietvertrag",
        compare=("2019-12-31", "current"),
        remaining="Mietvertrag",
    ),
    Case("Kündigungsfrist alte Rechtslage", compare=PREV_CUR, remaining="Kündigungsfrist"),
    # provisions (they stay in `remaining`: they are searchable words)
    Case("§ 5 Abs. 2 S. 1 BGB", provisions=("§ 5 Abs. 2 S. 1 BGB",)),
    Case("§§ 535, 536 BGB Mietmangel", provisions=("§ 535 BGB", "§ 536 BGB")),
    Case("Art. 3 Abs. 1 GG Gleichheitssatz", provisions=("Art. 3 Abs. 1 GG",)),
    Case("§ 573 Abs. 2 Nr. 2 BGB Eigenbedarf", provisions=("§ 573 Abs. 2 Nr. 2 BGB",)),
    Case("§ 622 Abs. 2 Satz 1 Nr. 3 BGB", provisions=("§ 622 Abs. 2 S. 1 Nr. 3 BGB",)),
    Case("Art. 6 Abs. 1 lit. f DSGVO berechtigtes Interesse", provisions=("Art. 6 Abs. 1 lit. f DSGVO",)),
    Case("§ 1 KSchG Sozialauswahl", provisions=("§ 1 KSchG",)),
    Case("§ 15 Abs. 4 GmbHG Beurkundung", provisions=("§ 15 Abs. 4 GmbHG",)),
    Case("§ 5a UWG Irreführung", provisions=("§ 5a UWG",)),
    Case("§§ 280, 281 BGB Schadensersatz", provisions=("§ 280 BGB", "§ 281 BGB")),
    Case("§ 573 II Nr. 2 BGB", provisions=("§ 573 Abs. 2 Nr. 2 BGB",)),
    Case("§§ 535 ff. BGB", provisions=("§ 535 BGB",)),
    Case("§ 543 Abs. 2 und 3 BGB", provisions=("§ 543 Abs. 2 BGB", "§ 543 Abs. 3 BGB")),
    Case("§ 91 ZPO Kostenentscheidung", provisions=("§ 91 ZPO",)),
    Case("§ 25 HGB Firmenfortführung", provisions=("§ 25 HGB",)),
    Case("Artikel 17 DSGVO Recht auf Löschung", provisions=("Art. 17 DSGVO",)),
    Case("§ 87 Abs. 1 Nr. 6 BetrVG", provisions=("§ 87 Abs. 1 Nr. 6 BetrVG",)),
    Case("§ 14 Abs. 2 TzBfG sachgrundlose Befristung", provisions=("§ 14 Abs. 2 TzBfG",)),
    Case("§ 3 Nr. 1 UStG", provisions=("§ 3 Nr. 1 UStG",)),
    Case("§ 626 BGB fristlose Kündigung Arbeitsvertrag", provisions=("§ 626 BGB",)),
    Case("§ 5 des Mietvertrags", provisions=("§ 5",)),
    Case("Art. 12 Abs. 1 S. 2 GG", provisions=("Art. 12 Abs. 1 S. 2 GG",)),
    Case("§ 1 SGB V Solidarität", provisions=("§ 1 SGB V",)),
    Case("§ 307 Abs. 1 Satz 2 BGB Transparenzgebot", provisions=("§ 307 Abs. 1 S. 2 BGB",)),
    Case("§ 823 I BGB", provisions=("§ 823 Abs. 1 BGB",)),
    Case("§ 812 Abs. 1 S. 1 Alt. 1 BGB", provisions=("§ 812 Abs. 1 S. 1 BGB",)),
    Case("§ 5 Abs. 2 des Gesellschaftsvertrags", provisions=("§ 5 Abs. 2",)),
    Case("§573 BGB Eigenbedarf", provisions=("§ 573 BGB",)),
    Case("§ 573 Abs. 2 Nr. 1 und 2 BGB", provisions=("§ 573 Abs. 2 Nr. 1 BGB", "§ 573 Abs. 2 Nr. 2 BGB")),
    Case("§ 5 und 6 des Arbeitsvertrags", provisions=("§ 5", "§ 6")),
    Case("Art. 14 Abs. 3 GG Enteignung", provisions=("Art. 14 Abs. 3 GG",)),
    Case("§ 242 BGB Treu und Glauben", provisions=("§ 242 BGB",)),
    Case("§ 1922 BGB Gesamtrechtsnachfolge", provisions=("§ 1922 BGB",)),
    Case("§§ 1922, 1924 BGB Erbfolge", provisions=("§ 1922 BGB", "§ 1924 BGB")),
    # identifiers (they stay in `remaining`)
    Case("BGH VIII ZR 123/20 Eigenbedarf", identifiers=("VIII ZR 123/20",)),
    Case("LG Berlin 29 O 167/21", identifiers=("29 O 167/21",)),
    Case("Az. 5 U 12/19 OLG Köln", identifiers=("5 U 12/19",)),
    Case("BVerfG 1 BvR 2011/16", identifiers=("1 BvR 2011/16",)),
    Case("BAG 6 AZR 123/19 Kündigung", identifiers=("6 AZR 123/19",)),
    Case("BSG B 1 KR 12/19 R Krankengeld", identifiers=("B 1 KR 12/19 R",)),
    Case("OLG Düsseldorf I-5 U 12/19", identifiers=("I-5 U 12/19",)),
]

# --- English ---------------------------------------------------------------------------------------------------

ENGLISH = [
    # points in time
    Case("tenancy agreement as of 2020-03-01", as_of="2020-03-01", remaining="tenancy agreement"),
    Case("lease as at 1 March 2020", as_of="2020-03-01", remaining="lease"),
    Case("employment contract as of March 1, 2020", as_of="2020-03-01", remaining="employment contract"),
    Case(
        "version of March 2020 of the shareholders' agreement",
        as_of="2020-03-31",
        remaining="of the shareholders' agreement",
    ),
    Case("GDPR as of 2018", as_of="2018-12-31", remaining="GDPR"),
    Case("articles of association in force in 2019", as_of="2019-12-31", remaining="articles of association"),
    Case(
        "Section 21 as it stood on 1 January 2015", as_of="2015-01-01", provisions=("Sec. 21",), remaining="Section 21"
    ),
    Case("the 2019 version of the lease", as_of="2019-12-31", remaining="of the lease"),
    Case("terms and conditions effective from 1 April 2021", as_of="2021-04-01", remaining="terms and conditions"),
    Case("privacy policy valid from 2020", as_of="2020-01-01", remaining="privacy policy"),
    Case("lease in force on 31 December 2020", as_of="2020-12-31", remaining="lease"),
    Case("contract dated 1 March 2020", as_of="2020-03-01", remaining="contract"),
    Case("employment contract dated March 1st, 2020", as_of="2020-03-01", remaining="employment contract"),
    Case("company law as of today", as_of="2024-06-15", remaining="company law"),
    Case(
        "Article 6 GDPR as of 25 May 2018", as_of="2018-05-25", provisions=("Art. 6 GDPR",), remaining="Article 6 GDPR"
    ),
    Case("lease as of 1st of March 2020", as_of="2020-03-01", remaining="lease"),
    Case("NDA text as of Sept. 2021", as_of="2021-09-30", remaining="NDA"),
    Case("supply agreement version dated 15 June 2022", as_of="2022-06-15", remaining="supply agreement"),
    Case("data protection: the law in force at 1 July 2021", as_of="2021-07-01", remaining="data protection"),
    Case("terms effective 1 January 2022", as_of="2022-01-01", remaining="terms"),
    Case("privacy notice valid on 1 May 2021", as_of="2021-05-01", remaining="privacy notice"),
    Case("GDPR Article 28 as at 2021-06-30", as_of="2021-06-30", provisions=("Art. 28",), remaining="GDPR Article 28"),
    Case("lease as of 1 March 2020 section 3", as_of="2020-03-01", provisions=("Sec. 3",), remaining="lease section 3"),
    Case("service agreement as of Dec 2022", as_of="2022-12-31", remaining="service agreement"),
    Case(
        "Companies Act section 994 as at 2020-10-01",
        as_of="2020-10-01",
        provisions=("Sec. 994",),
        remaining="Companies Act section 994",
    ),
    Case("the wording as of January 2021 of clause 4", as_of="2021-01-31", remaining="of clause 4"),
    # ranges
    Case(
        "judgments between 1 March 2020 and 31 December 2020", range=("2020-03-01", "2020-12-31"), remaining="judgments"
    ),
    Case("case law from 2019 to 2021", range=("2019-01-01", "2021-12-31"), remaining="case law"),
    Case("decisions from March to May 2020", range=("2020-03-01", "2020-05-31"), remaining="decisions"),
    Case(
        "rent increases from 1 March 2020 until 30 June 2020",
        range=("2020-03-01", "2020-06-30"),
        remaining="rent increases",
    ),
    Case("employment decisions since 2020", range=("2020-01-01", "2024-06-15"), remaining="employment decisions"),
    Case("tribunal rulings between 2018 and 2020", range=("2018-01-01", "2020-12-31"), remaining="tribunal rulings"),
    # comparisons
    Case("compare the 2019 and current versions", compare=("2019-12-31", "current"), remaining=""),
    Case(
        "what changed between 2019 and 2021 in the GDPR", compare=("2019-12-31", "2021-12-31"), remaining="in the GDPR"
    ),
    Case("previous version of the lease", compare=PREV_CUR, remaining="of the lease"),
    Case("What has changed in section 5?", compare=PREV_CUR, provisions=("Sec. 5",), remaining="in section 5?"),
    Case("difference between the old and new version of clause 7", compare=PREV_CUR, remaining="of clause 7"),
    Case(
        "compare the version as of 1 March 2020 with the current version",
        compare=("2020-03-01", "current"),
        remaining="",
    ),
    Case("what's new in the 2023 version", compare=("2023-12-31", "current"), remaining=""),
    Case(
        "changes since 2020 to the employment contract",
        compare=("2020-01-01", "current"),
        remaining="to the employment contract",
    ),
    Case("old version vs new version of the NDA", compare=PREV_CUR, remaining="of the NDA"),
    Case("original version of the shareholders agreement", compare=PREV_CUR, remaining="of the shareholders agreement"),
    Case("prior version Article 17 GDPR", compare=PREV_CUR, provisions=("Art. 17 GDPR",), remaining="Article 17 GDPR"),
    Case("how has Article 6 GDPR changed", compare=PREV_CUR, provisions=("Art. 6 GDPR",), remaining="Article 6 GDPR"),
    Case(
        "compare the 2018 and 2021 versions of the privacy policy",
        compare=("2018-12-31", "2021-12-31"),
        remaining="of the privacy policy",
    ),
    Case(
        "differences between the 2019 version and the current version", compare=("2019-12-31", "current"), remaining=""
    ),
    Case("what was changed in the terms and conditions", compare=PREV_CUR, remaining="in the terms and conditions"),
    Case("earlier version of section 12", compare=PREV_CUR, provisions=("Sec. 12",), remaining="of section 12"),
    # provisions
    Case("Section 5(2) Employment Rights Act", provisions=("Sec. 5 Abs. 2",)),
    Case("Article 12 GDPR", provisions=("Art. 12 GDPR",)),
    Case("Article 6(1)(f) GDPR legitimate interest", provisions=("Art. 6 Abs. 1 lit. f GDPR",)),
    Case("Sections 5 and 6 of the lease", provisions=("Sec. 5", "Sec. 6")),
    Case("Art. 17(3) GDPR", provisions=("Art. 17 Abs. 3 GDPR",)),
    Case("section 21 notice", provisions=("Sec. 21",)),
    Case("Articles 12 to 14 GDPR", provisions=("Art. 12 GDPR", "Art. 14 GDPR")),
    Case("Section 994 Companies Act 2006", provisions=("Sec. 994",)),
    Case("sec. 3(1)(a) Data Protection Act", provisions=("Sec. 3 Abs. 1 lit. a",)),
    Case("Article 5(1)(e) GDPR storage limitation", provisions=("Art. 5 Abs. 1 lit. e GDPR",)),
    # identifiers
    Case("CJEU C-311/18 Schrems II", identifiers=("C-311/18",)),
    Case("ECLI:EU:C:2020:559 data transfers", identifiers=("ECLI:EU:C:2020:559",)),
]

# --- Must not parse --------------------------------------------------------------------------------------------
# Each yields no date, range or comparison (and only the provisions / identifiers given); `remaining` is the query.

MUST_NOT_PARSE = [
    # a date or number that is part of a file number or an ECLI
    Case("29 O 167/21", identifiers=("29 O 167/21",)),
    Case("VIII ZR 123/20", identifiers=("VIII ZR 123/20",)),
    Case("1 BvR 2011/16", identifiers=("1 BvR 2011/16",)),
    Case("Az. 5 U 12/19", identifiers=("5 U 12/19",)),
    Case("ECLI:DE:BGH:2020:010320UVIIIZR123.19.0", identifiers=("ECLI:DE:BGH:2020:010320UVIIIZR123.19.0",)),
    Case("Beschluss vom 1 BvR 2011/16", identifiers=("1 BvR 2011/16",)),
    Case("Stand ECLI:DE:BGH:2020:010320UVIIIZR123.19.0", identifiers=("ECLI:DE:BGH:2020:010320UVIIIZR123.19.0",)),
    Case("Fassung 1 BvR 2011/16", identifiers=("1 BvR 2011/16",)),
    Case("Urteil 3 StR 2019/20 Fassung", identifiers=("3 StR 2019/20",)),
    Case("Vertrag Nr. 2020-03-01 Fassung"),
    Case("Kundennummer 01.03.2020 Stand"),
    Case("Vertrag VN-2020-03-01"),
    Case("Aktenzeichen 2020/0301 vom"),
    # "§ 5" and version words inside a quoted title
    Case('"Vertrag nach § 5"'),
    Case("„Kündigung nach § 573 BGB“ Muster"),
    Case('"Die alte Fassung" Gutachten'),
    Case('"Mietvertrag in der Fassung vom 1. März 2020"'),
    Case('"Was hat sich geändert" Podcast'),
    # a year in a statute's name or a title
    Case("Mietrechtsänderungsgesetz 2013"),
    Case("Fassung des Mietrechtsänderungsgesetzes 2013"),
    Case("BGB 2002"),
    Case("Stand BGB 2002"),
    Case("Companies Act 2006"),
    Case("as of Companies Act 2006"),
    Case("Schuldrechtsreform 2002 Stand"),
    Case("Gesetz zur Änderung des BGB vom 21.12.2021"),
    Case("Verordnung über die Heizkostenabrechnung vom 5. Oktober 2009"),
    Case("Mietrechtsänderungsgesetz vom 11.03.2013"),
    # money
    Case("Miete 1.000,00 EUR"),
    Case("EUR 2.020 Kaution"),
    Case("Kaution 2.020 € Stand"),
    Case("Stand EUR 2019"),
    # a bare year or date without a cue
    Case("Kündigung 2019"),
    Case("Jahresabschluss 2019"),
    Case("Bilanz zum 31.12.2019"),
    Case("Kündigung zum 31.12.2020"),
    Case("Frist bis 30.06.2021"),
    Case("May 2020 board minutes"),
    Case("Stand der Technik 2019"),
    Case("Bestand 2019"),
    Case("Geschäftsbericht Fassung 2019/2020"),
    Case("Mietvertrag vom 2019"),
    Case("contract dated 2019"),
    # "Fassung" / "version" without a date, versions that are not comparisons
    Case("in der geänderten Fassung"),
    Case("Gesetz in der jeweils geltenden Fassung"),
    Case("aktuelle Fassung des Mietvertrags"),
    Case("current version of the lease"),
    Case("Version 2.1 des Mietvertrags"),
    Case("Stand Version 2.1"),
    Case("Vertragsmuster v1.3.20"),
    Case("version 2 of the contract"),
    # comparison words without versions
    Case("Unterschied zwischen Kündigung und Aufhebungsvertrag"),
    Case("Vergleich vor dem Arbeitsgericht 2019"),
    Case("Prozessvergleich Mietrecht"),
    Case("what is the difference between a lease and a licence"),
    Case("compare rent and service charge"),
    Case("Mietvertrag vs. Pachtvertrag"),
    # times, phone numbers, IBANs
    Case("Besprechung am 1.3. um 14.30 Uhr"),
    Case("Termin Stand 14:30"),
    Case("Tel. 030 2019 2020"),
    Case("+49 30 2019 2021"),
    Case("IBAN DE89 3704 0044 0532 0130 00"),
    # invalid or ambiguous dates
    Case("Stand 31.02.2020"),
    Case("Stand 31. Februar 2020"),
    Case("as of 30 February 2021"),
    Case("Fassung vom 1.13.2020"),
    Case("lease as of 03/01/2020"),
    # the paragraph sign inside a word, "Art" without a number
    Case("Vertrag§5 Klausel"),
    Case("Abs. 2 Satz 1"),
    Case("Art und Weise der Kündigung"),
    Case("§ Mietrecht"),
]

# Two different points in time without a range or comparison cue: neither is taken (see the module doc).
AMBIGUOUS = [
    "Vergleich vom 1.3.2020 und Urteil vom 5.5.2021",
    "Vertrag vom 1.3.2020, Nachtrag vom 1.6.2020",
    "Stand 2019 oder Stand 2020",
    "lease as of 2019 and GDPR as of 2021",
]

ALL = GERMAN + ENGLISH + MUST_NOT_PARSE


def test_the_tables_are_as_large_as_promised():
    assert len(GERMAN) >= 100, len(GERMAN)
    assert len(ENGLISH) >= 50, len(ENGLISH)
    assert len(MUST_NOT_PARSE) >= 50, len(MUST_NOT_PARSE)
    queries = [c.query for c in ALL]
    assert len(set(queries)) == len(queries), "a phrasing is listed twice"


@pytest.mark.parametrize("case", GERMAN, ids=lambda c: c.query)
def test_german_phrasings(case: Case):
    assert _observed(parse_query(case.query, today=TODAY)) == _expected(case)


@pytest.mark.parametrize("case", ENGLISH, ids=lambda c: c.query)
def test_english_phrasings(case: Case):
    assert _observed(parse_query(case.query, today=TODAY)) == _expected(case)


@pytest.mark.parametrize("case", MUST_NOT_PARSE, ids=lambda c: c.query)
def test_must_not_parse(case: Case):
    assert case.as_of is None and case.range is None and case.compare is None and case.remaining is None
    assert _observed(parse_query(case.query, today=TODAY)) == _expected(case)


@pytest.mark.parametrize("query", AMBIGUOUS)
def test_two_points_in_time_without_a_cue_joining_them_are_left_alone(query: str):
    parsed = parse_query(query, today=TODAY)
    assert (parsed.as_of, parsed.date_range, parsed.compare) == (None, None, None)
    assert parsed.remaining == query
    assert sum(s.kind == "ambiguous_date" for s in parsed.spans) == 2


# --- Decisions, one by one ---------------------------------------------------------------------------------------


def test_a_year_or_month_is_its_last_day_but_its_first_after_ab_seit_from():
    assert parse_query("Stand 2019").as_of == dt.date(2019, 12, 31)
    assert parse_query("Stand Februar 2024").as_of == dt.date(2024, 2, 29)
    assert parse_query("Stand Dezember 2024").as_of == dt.date(2024, 12, 31)
    assert parse_query("gültig ab 2019").as_of == dt.date(2019, 1, 1)
    assert parse_query("in force from March 2020").as_of == dt.date(2020, 3, 1)


@pytest.mark.parametrize(
    ("query", "year"),
    [("vom 1.3.00", 2000), ("vom 1.3.20", 2020), ("vom 1.3.68", 2068), ("vom 1.3.69", 1969), ("vom 1.3.99", 1999)],
)
def test_two_digit_years_follow_strptime(query: str, year: int):
    assert parse_query(query).as_of == dt.date(year, 3, 1)


def test_two_digit_years_only_in_the_dotted_german_form():
    assert parse_query("as of March 20").as_of is None
    assert parse_query("Stand 03/20").as_of is None
    assert parse_query("as of 20-03-01").as_of is None


def test_without_today_relative_words_are_not_read():
    assert parse_query("Stand heute").as_of is None
    assert parse_query("Rechtsprechung seit 2019").date_range is None
    assert parse_query("Stand heute").remaining == "Stand heute"
    # ... but "heute" as a side of a comparison is the current version, with or without today
    assert parse_query("Unterschied zwischen Fassung 2019 und heute").compare == Comparison(
        dt.date(2019, 12, 31), "current"
    )


def test_a_single_dated_side_is_compared_with_the_current_version_unless_named_previous():
    assert parse_query("Was hat sich seit dem 1.3.2020 geändert").compare == Comparison(dt.date(2020, 3, 1), "current")
    assert parse_query("vorherige Fassung und die Fassung vom 1.1.2021").compare == Comparison(
        "previous", dt.date(2021, 1, 1)
    )


def test_sides_come_earlier_first_whatever_their_order_in_the_query():
    parsed = parse_query("Unterschied zwischen der neuen und der alten Fassung")
    assert parsed.compare == Comparison("previous", "current")
    parsed = parse_query("compare the 2021 and 2019 versions")
    assert parsed.compare == Comparison(dt.date(2019, 12, 31), dt.date(2021, 12, 31))


def test_a_comparison_takes_the_dates_it_compares_not_as_of():
    parsed = parse_query("Unterschied zwischen der Fassung vom 1.3.2020 und der aktuellen Fassung", today=TODAY)
    assert parsed.compare == Comparison(dt.date(2020, 3, 1), "current")
    assert parsed.as_of is None and parsed.date_range is None


def test_a_range_with_a_cue_before_it_takes_the_cue_with_it():
    parsed = parse_query("Mietvertrag in der Fassung vom 1.3.2020 bis 31.12.2020")
    assert parsed.date_range == (dt.date(2020, 3, 1), dt.date(2020, 12, 31)) and parsed.as_of is None
    assert parsed.remaining == "Mietvertrag"


def test_a_range_that_runs_backwards_is_no_range():
    parsed = parse_query("vom 31.12.2020 bis 1.3.2020")
    assert parsed.date_range is None


def test_provision_parts_and_the_explain_form():
    parsed = parse_query("§ 5 Abs. 2 S. 1 Nr. 3 lit. a BGB in der Fassung vom 1.3.2020")
    assert parsed.provisions == (Provision("paragraph", "5", "BGB", "2", "1", "3", "a"),)
    assert parsed.to_json() == {
        "as_of": "2020-03-01",
        "date_range": None,
        "compare": None,
        "provisions": [
            {
                "kind": "paragraph",
                "number": "5",
                "law": "BGB",
                "subsection": "2",
                "sentence": "1",
                "item": "3",
                "letter": "a",
            }
        ],
        "identifiers": [],
        "spans": [
            {"kind": "provision", "start": 0, "end": 32, "text": "§ 5 Abs. 2 S. 1 Nr. 3 lit. a BGB"},
            {"kind": "as_of", "start": 33, "end": 60, "text": "in der Fassung vom 1.3.2020"},
        ],
        "remaining": "§ 5 Abs. 2 S. 1 Nr. 3 lit. a BGB",
    }


def test_nothing_to_read_leaves_the_query_as_it_is():
    for query in ("", "   ", "Mietvertrag  Kündigung ", "?"):
        parsed = parse_query(query)
        assert parsed == ParsedQuery(remaining=query)


# --- Properties --------------------------------------------------------------------------------------------------


def _check_properties(query: str, *, phrases_gone: bool = True) -> None:
    """Every span is the query's text at its offsets; the phrases taken out are not in `remaining` (checked as
    substrings where the query is a written one: in random text the same characters may occur elsewhere); and
    `remaining` parses to itself, with nothing more to take out."""
    parsed = parse_query(query, today=TODAY)
    for span in parsed.spans:
        assert query[span.start : span.end] == span.text, span
        if span.kind in REMOVED_KINDS and phrases_gone:
            assert span.text not in parsed.remaining, (span, parsed.remaining)
    again = parse_query(parsed.remaining, today=TODAY)
    assert again.remaining == parsed.remaining, (query, parsed.remaining, again.remaining)
    assert not any(s.kind in REMOVED_KINDS for s in again.spans), (query, again)


@pytest.mark.parametrize("query", [c.query for c in ALL] + AMBIGUOUS)
def test_spans_point_into_the_query_and_remaining_is_a_fixed_point(query: str):
    _check_properties(query)


FRAGMENTS = [
    "Mietvertrag", "Kündigung", "in der Fassung vom", "Stand", "Stand:", "vom", "bis", "zwischen", "und", "seit",
    "1. März 2020", "1.3.2020", "31.12.2020", "2019", "2021", "März 2020", "2020-03-01", "1.3.", "heute", "as of",
    "version", "versions", "the", "and", "compare", "Unterschied", "alte", "neue", "Fassung", "Fassungen",
    "vorherige Fassung", "Was hat sich", "geändert", "a.F.", "§ 5", "Abs. 2", "BGB", "Art. 6", "GG", "VIII ZR 123/20",
    '"', "„", "“", ",", "-", "–", "(", ")", "EUR", "1.000,00", "Version 2.1", "Nr.", "14:30", "vs.", "gültig ab",
    "in force on", "previous version", "what changed", "between", "from", "to",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.sampled_from([" ", "", "  "]))
def test_properties_hold_for_any_mix_of_the_words_the_parser_reads(words: list[str], separator: str):
    _check_properties(separator.join(words), phrases_gone=False)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_parses(text: str):
    _check_properties(text, phrases_gone=False)


@pytest.mark.parametrize(
    "query",
    [
        "§ " * 1000,
        "1." * 2000,
        "Fassung vom " * 400,
        "Stand 2019 " * 400,
        "a" * 5000,
        "12/" * 1500,
        "ECLI:DE:" * 500,
        "Was hat sich " * 300 + "x",
        "alte und " * 500,
        "1 " * 2500,
        "Tel. " + "1 " * 2000,
    ],
    ids=lambda q: q[:12],
)
def test_parsing_time_grows_linearly(query: str):
    start = time.perf_counter()
    parse_query(query, today=TODAY)
    assert time.perf_counter() - start < 2.0

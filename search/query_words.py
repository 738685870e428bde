"""The query's own words: explicit dates, date ranges, the intent to compare two versions, statute provisions and
court file numbers, read from a German or English search query (issue 49, item 2). Pure: no I/O, no clock (the
caller passes `today`), the standard library only.

`parse_query(text)` answers a `ParsedQuery`:

- `as_of`: the point in time the query asks for ("in der Fassung vom 1. März 2020", "Stand: 1.1.2019",
  "vom 03.03.2021", "as of 2020-03-01", "the version in force in 2019", "die 2019 geltende Fassung").
- `date_range`: two dates joined as a range ("vom 1.3.2020 bis 31.12.2020", "zwischen 2019 und 2021",
  "from March to May 2020"); with `today`, also "seit 2019" / "since 2019" (up to today).
- `compare`: the intent to compare two versions ("Unterschied zwischen der alten und der neuen Fassung",
  "Was hat sich seit 2019 geändert", "vorherige Fassung", "§ 573c BGB a.F.", "compare the 2019 and current
  versions"), its two sides as dates or the markers "previous" / "current", earlier side first.
- `provisions`: "§ 5 Abs. 2 S. 1 BGB", "§§ 535, 536 BGB", "Art. 6 Abs. 1 lit. f DSGVO", "Section 5(2)(a)".
- `identifiers`: court file numbers ("VIII ZR 123/20", "29 O 167/21", "C-311/18") and ECLIs.
- `spans`: which words each of these came from (`text[start:end]`), for `explain`.
- `remaining`: the query without the date and comparison phrases (the text legs should not search for
  "Fassung vom"); provisions and identifiers stay in it, they are searchable words.

How: readers run one after another over the text; each claims the characters it read, and later readers skip
anything overlapping a claim. Quoted phrases are claimed first and never read (a quoted phrase is a title or an
exact phrase: `"Vertrag nach § 5"` holds no provision, `"Die alte Fassung"` no comparison). Then file numbers
and ECLIs, then provisions, then things that look like dates or years but are not (money, IBANs, phone numbers,
version numbers, times of day, a number after "Nr." / "Az.", the year in a statute's name), then dates.

Decisions
- A date counts only with a cue: a word before it that asks for a point in time ("Fassung", "Stand", "vom",
  "gültig ab", "as of", "in force on", "version of", ...) or one after it ("... geltende Fassung",
  "the 2019 version"). A bare date or year is a searchable word ("Kündigung 2019", "Bilanz zum 31.12.2019",
  "Kündigung zum 31.12.2020": the date is the subject, not the version asked for).
- A bare year needs a version cue: "Stand 2019", "Fassung 2019", "as of 2019", "in force in 2019"; not "vom
  2019" or "dated 2019".
- A year or a month as a point in time is its last day: "Stand 2019" -> 2019-12-31, "version of March 2020" ->
  2020-03-31 (the version in force at the end of that period, which covers every change made during it). After
  "ab", "seit", "since", "from", "gültig ab", "in force from" it is the first day ("gültig ab 2021" ->
  2021-01-01). A range runs from the first day of its start to the last day of its end.
- Two different points in time without a range or comparison cue are ambiguous: no `as_of`, the dates stay in
  `remaining` and are reported as spans of kind "ambiguous_date". Two dates joined as a range ("vom ... bis",
  "zwischen ... und", "from ... to", "1.3.2020 - 31.12.2020") are `date_range`, not `as_of`; years and months
  need a word before them ("von 2019 bis 2021"), and the start may lack its year ("vom 1.12. bis 28.2.2021":
  the year before the end's if need be).
- A plain "vom" after a statute's title belongs to the title ("Gesetz zur Änderung des BGB vom 21.12.2021");
  "in der Fassung ... vom" still asks for that version.
- Two-digit years only in the German form dd.mm.yy, read as strptime's %y: 00-68 -> 2000-2068, 69-99 ->
  1969-1999 (fixed, not relative to today, so a query parses the same every day).
- Numeric dates are German (day first: 1.3.2020 is 1 March) or ISO (2020-03-01); "03/01/2020" is ambiguous
  between the US and the UK and not read. "03/2020" and "03.2020" are months.
- A comparison needs a version word, not just "Unterschied" / "Vergleich" / "compare": "Unterschied zwischen
  Kündigung und Aufhebungsvertrag" and "Vergleich vom 1.3.2020" (a court settlement) compare nothing. Strong cues
  compare on their own ("Was hat sich geändert", "vorherige Fassung", "a.F.", "previous version", "Synopse");
  weak ones ("Unterschied", "Vergleich", "compare", "vs.") need two sides, a version marker ("aktuelle Fassung")
  or a date with a version cue. "alte Fassung" unquoted is intent (the previous version, compared with the
  current one); quoted it is a title. A single dated side is compared with the current version ("Was hat sich
  seit 2019 geändert" -> 2019-01-01 vs current), unless the other side is named "previous".
- With a comparison, `as_of` and `date_range` come only from dates that are not its sides.
- "heute" / "today" is a day only when the caller passes `today` ("Stand heute"); as a side of a comparison it
  is the current version.
- Invalid dates (31.02.2020) are not read, and their text is not read again as a shorter date ("Februar 2020").

Every pattern is free of nested quantifiers and each gap in it is bounded, so parsing takes time linear in the
query's length (times the longest gap).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Literal

Marker = Literal["previous", "current"]
Side = dt.date | Marker
ProvisionKind = Literal["paragraph", "article", "section"]  # §, Art./Article, Section
IdentifierKind = Literal["file_number", "ecli"]
SpanKind = Literal["as_of", "date_range", "compare", "provision", "identifier", "ambiguous_date"]
Edge = Literal["start", "end"]  # which day of a year or month a point in time is

#: Span kinds whose words leave `remaining`.
REMOVED_KINDS = frozenset({"as_of", "date_range", "compare"})


@dataclass(frozen=True, slots=True)
class Provision:
    """A paragraph, article or section reference; parts not given are None."""

    kind: ProvisionKind
    number: str  # "5", "573c"
    law: str | None = None  # "BGB", "DSGVO", "SGB V"
    subsection: str | None = None  # Absatz, "(2)"; a Roman numeral as Arabic digits ("§ 573 II" -> "2")
    sentence: str | None = None  # Satz
    item: str | None = None  # Nummer, Nr., Ziffer; a second "(3)"
    letter: str | None = None  # Buchstabe, lit., "(a)"


@dataclass(frozen=True, slots=True)
class Identifier:
    kind: IdentifierKind
    text: str


@dataclass(frozen=True, slots=True)
class Comparison:
    """The two versions to compare: dates, or the markers "previous" and "current"; the earlier one first."""

    earlier: Side
    later: Side


@dataclass(frozen=True, slots=True)
class ParsedSpan:
    """What was read from `text[start:end]` of the query (code-point offsets)."""

    kind: SpanKind
    start: int
    end: int
    text: str


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    as_of: dt.date | None = None
    date_range: tuple[dt.date, dt.date] | None = None
    compare: Comparison | None = None
    provisions: tuple[Provision, ...] = ()
    identifiers: tuple[Identifier, ...] = ()
    spans: tuple[ParsedSpan, ...] = ()
    remaining: str = ""

    def to_json(self) -> dict[str, object]:
        """For `explain`: what was parsed and from which words."""

        def side(value: Side) -> str:
            return value.isoformat() if isinstance(value, dt.date) else value

        return {
            "as_of": self.as_of.isoformat() if self.as_of else None,
            "date_range": [d.isoformat() for d in self.date_range] if self.date_range else None,
            "compare": [side(self.compare.earlier), side(self.compare.later)] if self.compare else None,
            "provisions": [_provision_json(p) for p in self.provisions],
            "identifiers": [{"kind": i.kind, "text": i.text} for i in self.identifiers],
            "spans": [{"kind": s.kind, "start": s.start, "end": s.end, "text": s.text} for s in self.spans],
            "remaining": self.remaining,
        }


def _provision_json(provision: Provision) -> dict[str, str]:
    return {f.name: value for f in fields(provision) if (value := getattr(provision, f.name)) is not None}


# --- Claims: what has been read ---------------------------------------------------------------------------------


class _Claims:
    """Character ranges already read or protected; a later reader skips anything overlapping one."""

    def __init__(self) -> None:
        self._taken: list[tuple[int, int]] = []

    def free(self, start: int, end: int) -> bool:
        return all(end <= s or start >= e for s, e in self._taken)

    def take(self, start: int, end: int) -> None:
        self._taken.append((start, end))


def _free_matches(pattern: re.Pattern[str], text: str, claims: _Claims) -> Iterator[re.Match[str]]:
    """Matches of `pattern` that overlap no claim, each claimed as it is answered."""
    for match in pattern.finditer(text):
        if match.end() > match.start() and claims.free(match.start(), match.end()):
            claims.take(match.start(), match.end())
            yield match


# --- Protected text: quotes, identifiers, things that only look like dates ----------------------------------------

# A quoted phrase is a title or an exact phrase: nothing inside it is read.
_QUOTED = re.compile(r'"[^"\n]{1,300}"|„[^“”"\n]{1,300}[“”"]|“[^”\n]{1,300}”|«[^»\n]{1,300}»|»[^«\n]{1,300}«')

_FILE_NUMBER = re.compile(
    r"(?<![\w/.-])"
    r"(?:[A-Z] )?"  # the letter of a social court's file number: L 5 KR 123/20, B 1 KR 12/19 R
    r"(?:[IVX]{1,6}|\d{1,3})(?:-\d{1,3})?"  # senate or chamber: VIII, 29, I-5
    r" ?[A-Z][A-Za-z]{0,4}(?: [A-Z][A-Za-z]{1,4})?"  # register: O, U, ZR, BvR, AZR, StR, Ss OWi
    r"(?: ?\([a-z]{1,5}\))?"  # 12 W (pat) 5/19
    r" ?\d{1,6}/\d{2}(?:\d{2})?[a-z]?"  # running number / year: 167/21, 12/2019, 12/20a (Austria)
    r"(?: [A-Z](?!\w))?"  # B 1 KR 12/19 R
    r"(?![\w/])"
    r"|(?<![\w/-])[CTF]-\d{1,4}/\d{2}(?![\w/])"  # EU courts: C-311/18
)
_ECLI = re.compile(r"(?<!\w)ECLI:[A-Z]{2}:[A-Za-z0-9.]{1,10}:\d{4}:[A-Za-z0-9.]{1,30}(?<!\.)")

_MONTHS: dict[str, int] = {
    "januar": 1, "jänner": 1, "jaenner": 1, "january": 1, "jan": 1,
    "februar": 2, "feber": 2, "february": 2, "febr": 2, "feb": 2,
    "märz": 3, "maerz": 3, "march": 3, "mrz": 3, "mär": 3, "mar": 3,
    "april": 4, "apr": 4,
    "mai": 5, "may": 5,
    "juni": 6, "june": 6, "jun": 6,
    "juli": 7, "july": 7, "jul": 7,
    "august": 8, "aug": 8,
    "september": 9, "sept": 9, "sep": 9,
    "oktober": 10, "october": 10, "okt": 10, "oct": 10,
    "november": 11, "nov": 11,
    "dezember": 12, "december": 12, "dez": 12, "dec": 12,
}  # fmt: skip
_CURRENCY = r"(?:EUR|€|Euro|USD|CHF|GBP|£|\$)"

# Text that looks like a date, a year or a provision but is none; claimed (so never read), not reported.
_PROTECTED = tuple(
    re.compile(p)
    for p in (
        # money: an amount beside its currency ("1.000,00 EUR", "EUR 2.020", "€ 500")
        _CURRENCY + r" ?\d[\d.,']{0,20}",
        r"(?<![\w.,])\d[\d.,']{0,20} ?(?:" + _CURRENCY[3:-1] + r"|Mio\.|Mrd\.|Millionen|Milliarden|Tsd\.)(?!\w)",
        # IBANs as Germany, Austria and Switzerland write them (digits after the country and check digits)
        r"\b[A-Z]{2}\d{2} ?\d{4}[\d ]{6,30}\d(?!\d)",
        # phone numbers: after a label, or in international form
        r"(?i:\b(?:Tel|Telefon|Fax|Mobil|Handy|phone|mobile))\.?:? ?\+?\d[\d /()-]{4,25}\d",
        r"\+\d{1,3}[\d /()-]{5,25}\d",
        # version numbers ("Version 2.1", "v1.3.20" is no date)
        r"(?i:\b(?:Version|Vers\.|Release|Rel\.|v) ?)\d{1,4}\.\d{1,4}(?:\.\d{1,4})?(?!\.?\d)",
        # times of day
        r"(?<![\d.:])\d{1,2}:\d{2}(?::\d{2})?(?: ?Uhr)?(?![\d:])",
        r"(?<![\d.])\d{1,2}\.\d{2} ?Uhr\b",
        r"(?<![\d.])\d{1,2}(?:[.:]\d{2})? ?[ap]\.m\.",
        # a number a label names: "Nr. 2020-03-01", "Az. 2020/17", "HRB 12345"
        r"(?i:\b(?:Nr\.|No\.|Nummer|Az\.|Gz\.|Ref\.|Aktenzeichen|Geschäftszeichen|Vertragsnummer|Rechnungsnummer"
        r"|Kundennummer|HRB|HRA)) ?:? ?[\w./-]{1,40}",
        # the year in a statute's or an act's name: "Mietrechtsänderungsgesetz 2013", "Companies Act 2006"
        r"(?i:gesetz|gesetzes|verordnung|ordnung|novelle|reform|richtlinie|\bact|\bregulation|\bdirective|\bcode)"
        r" (?:19|20)\d{2}(?!\d)",
    )
)
# ... and after a statute's abbreviation: "BGB 2002", "EStG 2020" (month names in capitals excepted, in code).
_ABBREVIATION_YEAR = re.compile(r"\b(?P<word>[A-ZÄÖÜ][A-Za-zÄÖÜäöü]{0,8}[A-Z]) (?:19|20)\d{2}(?!\d)")
_NOT_ABBREVIATIONS = frozenset({"stand", "vom", "von", "fassung", "version", "as", "of", "at", "on", "in"})


def _protect(text: str, claims: _Claims) -> None:
    for match in _QUOTED.finditer(text):
        claims.take(match.start(), match.end())


_IDENTIFIERS: tuple[tuple[IdentifierKind, re.Pattern[str]], ...] = (("ecli", _ECLI), ("file_number", _FILE_NUMBER))


def _identifiers(text: str, claims: _Claims) -> list[tuple[Identifier, ParsedSpan]]:
    found = []
    for kind, pattern in _IDENTIFIERS:
        for match in _free_matches(pattern, text, claims):
            span = ParsedSpan("identifier", match.start(), match.end(), match.group())
            found.append((Identifier(kind, match.group()), span))
    return found


def _mask_lookalikes(text: str, claims: _Claims) -> None:
    for pattern in _PROTECTED:
        list(_free_matches(pattern, text, claims))  # claimed as they are found
    for match in _ABBREVIATION_YEAR.finditer(text):
        word = match.group("word").casefold()
        if word not in _MONTHS and word not in _NOT_ABBREVIATIONS and claims.free(match.start(), match.end()):
            claims.take(match.start(), match.end())


# --- Provisions ------------------------------------------------------------------------------------------------

_ROMAN_NUMERAL = r"(?=[IVX])X{0,2}(?:IX|IV|V?I{0,3})"  # I to XXIX
_PROVISION_HEAD = re.compile(
    r"(?<![\w§])(?P<paragraph>§§?)\s{0,2}(?=\d)"
    r"|(?<!\w)(?P<article>(?i:artt?\.|artikel|articles?|art))\s{0,2}(?=\d)"
    r"|(?<!\w)(?P<section>(?i:sections?|secs?\.|sect\.))\s{0,2}(?=\d)"
)
_PLURAL_HEADS = frozenset({"§§", "artt.", "articles", "sections", "secs."})
_NUMBER = re.compile(r"\d{1,4}[a-z]?(?!\w)")
# The parts after the number, in any order, each at most once: (field, pattern with group v).
_DETAILS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(p))
    for name, p in (
        ("subsection", r"\s{0,2}(?i:Abs\.|Absatz|Abs(?!\w))\s{0,2}(?P<v>\d{1,3}[a-z]?)(?!\w)"),
        ("subsection", r"\s{0,2}\((?P<v>\d{1,3}[a-z]?)\)"),  # Section 5(2), Art. 6 (1)
        ("roman", r"\s{1,2}(?P<v>" + _ROMAN_NUMERAL + r")(?!\w)"),  # § 573 II BGB: the second Absatz
        ("sentence", r"\s{0,2}(?:S\.|Satz|(?i:sentence))\s{0,2}(?P<v>\d{1,2})(?!\w)"),
        ("item", r"\s{0,2}(?i:Nr\.|Nummer|Ziff\.|Ziffer|no\.)\s{0,2}(?P<v>\d{1,3}[a-z]?)(?!\w)"),
        ("letter", r"\s{0,2}(?i:lit\.|Buchst\.|Buchstabe)\s{0,2}(?P<v>[a-z]{1,2})(?!\w)"),
        ("letter", r"\s{0,2}\((?P<v>[a-z]{1,4})\)"),  # (a), (iv)
        ("following", r"\s{0,2}ff?\.(?!\w)"),  # "§ 5 ff.": read over, not kept
        # "Alt. 1", "Var. 2", "Hs. 1", "UAbs. 2": read over (so the law after them is found), not kept
        (
            "following",
            r"\s{0,2}(?i:Alt\.|Alternative|Var\.|Variante|Hs\.|Halbs\.|Halbsatz|UAbs\.|Unterabs\.)"
            r"\s{0,2}\d{1,2}(?!\w)",
        ),
    )
)
_ROMAN_SENTENCE = re.compile(r"\s{1,3}(?P<v>\d{1,2})(?![\w.])")  # § 573 II 1 BGB: Satz 1
_LIST_JOIN = re.compile(
    r"\s{0,2}(?:,|(?i:und|and|sowie|oder|or|bis|to)(?!\w)|[–-])\s{0,2}(?P<sign>§\s?|(?i:art\.)\s?)?(?=\d)"
)
_LAW = re.compile(r"\s{1,2}(?:(?i:des|der|dem|of the|of)\s{1,2})?(?P<law>[A-ZÄÖÜ][A-Za-zÄÖÜäöü]{1,11})(?!\w)")
_LAW_BOOK = re.compile(r" (?P<book>" + _ROMAN_NUMERAL + r")(?!\w)")  # SGB V, SGB XII
_NOT_LAWS = frozenset({"UND", "ODER", "AND", "OR", "VOM", "VON", "STAND", "IN", "AM", "OF", "AT", "ON", "BIS", "TO"})
_ROMAN = {"I": 1, "V": 5, "X": 10}
_YEAR_LIKE = re.compile(r"(?:19|20)\d{2}")


def _roman(numeral: str) -> int:
    values = [_ROMAN[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def _is_law(word: str) -> bool:
    """A statute's abbreviation: two capitals at least (BGB, GmbHG, DSGVO), not a word in capitals."""
    return sum(c.isupper() for c in word) >= 2 and word.upper() not in _NOT_LAWS and word.casefold() not in _MONTHS


def _details(text: str, pos: int) -> tuple[dict[str, str], int]:
    """The parts after a provision's number, from `pos`: Absatz, Satz, Nummer, Buchstabe."""
    parts: dict[str, str] = {}
    progressed = True
    while progressed:
        progressed = False
        for name, pattern in _DETAILS:
            match = pattern.match(text, pos)
            if match is None or not _detail_fits(name, parts):
                continue
            value = match.groupdict().get("v")
            if name == "roman":
                value, name = str(_roman(match.group("v"))), "subsection"
                sentence = _ROMAN_SENTENCE.match(text, match.end())
                if sentence and "sentence" not in parts:
                    parts["sentence"] = sentence.group("v")
                    match = sentence
            elif name == "subsection" and "subsection" in parts:
                name = "item"  # Section 5(2)(3): the second number in brackets
            if value is not None:
                parts[name] = value
            pos, progressed = match.end(), True
            break
    return parts, pos


def _detail_fits(name: str, parts: dict[str, str]) -> bool:
    if name == "roman":
        return not parts  # only right after the number
    if name == "subsection":
        return "item" not in parts and "sentence" not in parts
    return name == "following" or name not in parts


def _head_kind(head: re.Match[str]) -> ProvisionKind:
    return "paragraph" if head.group("paragraph") else "article" if head.group("article") else "section"


def _provisions(text: str, claims: _Claims) -> list[tuple[Provision, ParsedSpan]]:
    found: list[tuple[Provision, ParsedSpan]] = []
    for head in _PROVISION_HEAD.finditer(text):
        if not claims.free(head.start(), head.end() + 1):
            continue
        kind: ProvisionKind = _head_kind(head)
        plural = head.group().strip().casefold() in _PLURAL_HEADS
        numbers, end = _numbered_list(text, head.end(), plural)
        law, end = _law(text, end)
        if not numbers or not claims.free(head.start(), end):
            continue
        claims.take(head.start(), end)
        span = ParsedSpan("provision", head.start(), end, text[head.start() : end])
        found.extend((Provision(kind, number, law, **parts), span) for number, parts in numbers)
    return found


def _numbered_list(text: str, pos: int, plural: bool) -> tuple[list[tuple[str, dict[str, str]]], int]:
    """Each number of "§§ 535, 536 Abs. 1 und 537" with its parts, and where the list ends. After a single "§"
    whose number has parts, a number joined on is the same part's next value: "§ 5 Abs. 2 und 3" is Abs. 2 and
    Abs. 3 of § 5; after "§§" (or a repeated "§") it is the next paragraph."""
    numbers: list[tuple[str, dict[str, str]]] = []
    sibling = False
    while True:
        number = _NUMBER.match(text, pos)
        if number is None or (numbers and not plural and not sibling and _YEAR_LIKE.fullmatch(number.group())):
            return numbers, pos
        if sibling:
            previous, parts = numbers[-1]
            last_part = next(reversed(parts))
            numbers.append((previous, {**parts, last_part: number.group()}))
            pos = number.end()
        else:
            parts, pos = _details(text, number.end())
            numbers.append((number.group(), parts))
        join = _LIST_JOIN.match(text, pos)
        if join is None:
            return numbers, pos
        sibling = not plural and not join.group("sign") and bool(numbers[-1][1])
        pos = join.end()


def _law(text: str, pos: int) -> tuple[str | None, int]:
    match = _LAW.match(text, pos)
    if match is None or not _is_law(match.group("law")):
        return None, pos
    law, end = match.group("law"), match.end()
    book = _LAW_BOOK.match(text, end) if law == "SGB" else None
    if book:
        return f"{law} {book.group('book')}", book.end()
    return law, end


# --- Dates -----------------------------------------------------------------------------------------------------

_MONTH = "(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")(?:\.|(?!\w))"
# Not inside a longer token: no letter, digit or joining punctuation before ("VN-2020-03-01", "ECLI:...:2020");
# after it, a hyphen only before a word ("2019-Fassung") or a second German date ("1.3.2020-31.12.2020").
_LEFT = r"(?<![\w.,:/§])(?<![^\W\d_]-)"
_RIGHT = r"(?![\w/]|[.,]\d|-(?![^\W\d_]|\d{1,2}\.\d{1,2}\.\d))"


@dataclass(frozen=True, slots=True)
class _When:
    """A date-shaped token: a day, a month or a year (`day`/`month` None), or a day or month without a year
    (`year` None: only the start of a range whose end has one)."""

    start: int
    end: int
    year: int | None
    month: int | None
    day: int | None
    valid: bool = True
    is_today: bool = False  # "heute", "today"

    def first_day(self, year: int | None = None) -> dt.date:
        return dt.date(year or self.year or 1, self.month or 1, self.day or 1)

    def last_day(self) -> dt.date:
        year = self.year or 1
        if self.day is not None and self.month is not None:
            return dt.date(year, self.month, self.day)
        if self.month is not None:
            return dt.date(year + self.month // 12, self.month % 12 + 1, 1) - dt.timedelta(days=1)
        return dt.date(year, 12, 31)

    def point(self, edge: Edge) -> dt.date:
        return self.first_day() if edge == "start" else self.last_day()

    @property
    def is_year(self) -> bool:
        return self.month is None


@dataclass(frozen=True)
class _DateForm:
    pattern: re.Pattern[str]

    def read(self, text: str) -> Iterator[_When]:
        for match in self.pattern.finditer(text):
            yield _when(match)


def _form(body: str, right: str = _RIGHT) -> _DateForm:
    return _DateForm(re.compile(_LEFT + body + right, re.IGNORECASE))


_DATE_FORMS = (
    _form(r"(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})"),  # 2020-03-01
    _form(r"(?P<d>\d{1,2})\.\s?(?P<m>\d{1,2})\.\s?(?P<y>\d{4})"),  # 1.3.2020, 01. 03. 2020
    _form(r"(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.(?P<yy>\d{2})"),  # 1.3.20 (the century: see the module doc)
    _form(r"(?P<d>\d{1,2})(?:\.|st|nd|rd|th)?\s{0,2}(?:of\s)?" + _MONTH + r",?\s{1,2}(?P<y>\d{4})"),  # 1. März 2020
    _form(_MONTH + r"\s{1,2}(?P<d>\d{1,2})(?:st|nd|rd|th)?,?\s{1,2}(?P<y>\d{4})"),  # March 1, 2020
    _form(_MONTH + r",?\s{1,2}(?P<y>\d{4})"),  # März 2020, March 2020
    _form(r"(?P<m>0[1-9]|1[0-2])[./](?P<y>\d{4})"),  # 03/2020, 03.2020
    _form(r"(?P<y>(?:19|20)\d{2})"),  # 2019
    # without a year: only the start of a range ("vom 1.3. bis 31.12.2020", "von März bis Mai 2020")
    _form(r"(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.", right=r"(?![\d.])"),
    _form(r"(?P<d>\d{1,2})(?:\.|st|nd|rd|th)?\s{0,2}(?:of\s)?" + _MONTH),
    _form(_MONTH),
)


def _when(match: re.Match[str]) -> _When:
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    year = int(groups["y"]) if "y" in groups else None
    if "yy" in groups:  # strptime's %y: 00-68 -> 20xx, 69-99 -> 19xx
        year = int(groups["yy"]) + (2000 if int(groups["yy"]) <= 68 else 1900)
    month = _MONTHS[groups["mon"].casefold()] if "mon" in groups else int(groups["m"]) if "m" in groups else None
    day = int(groups["d"]) if "d" in groups else None
    when = _When(match.start(), match.end(), year, month, day)
    try:
        when.first_day(year or 2000)  # 29 February without a year: let a leap year decide
        valid = year is None or 1800 <= year <= 2199
    except ValueError:
        valid = False
    return _When(when.start, when.end, year, month, day, valid)


_TODAY = re.compile(r"(?<!\w)(?:heute|today)(?!\w)", re.IGNORECASE)


def _date_tokens(text: str, claims: _Claims, today: dt.date | None) -> list[_When]:
    """Every date-shaped token outside the claims, the longest reading of each stretch of text; an invalid date
    blocks shorter readings of its text and is dropped."""
    found = sorted((when for form in _DATE_FORMS for when in form.read(text)), key=lambda w: (w.start - w.end, w.start))
    chosen: list[_When] = []
    for when in found:
        if claims.free(when.start, when.end) and all(when.end <= c.start or when.start >= c.end for c in chosen):
            chosen.append(when)
    if today is not None:
        for match in _TODAY.finditer(text):
            if claims.free(match.start(), match.end()):
                chosen.append(_When(match.start(), match.end(), today.year, today.month, today.day, is_today=True))
    return sorted((w for w in chosen if w.valid), key=lambda w: w.start)


# --- Cues: what makes a date a point in time -------------------------------------------------------------------


@dataclass(frozen=True)
class _Cue:
    pattern: str  # case-insensitive; ends where the date begins (spaces and a colon may come between)
    edge: Edge = "end"
    years: bool = True  # a bare year is enough ("Stand 2019"); False: only a day or a month ("vom 1.3.2020")
    version: bool = True  # names a version ("Fassung", "as of"); False: a document's date ("vom", "dated")


def _phrase(pattern: str) -> re.Pattern[str]:
    """A case-insensitive pattern whose spaces stand for one to three whitespace characters (patterns of words
    are written with plain spaces; queries have tabs, double spaces, line breaks)."""
    return re.compile(pattern.replace(" ", r"\s{1,3}"), re.IGNORECASE)


_ARTICLE = r"(?:(?:in )?(?:der|die|den|das|dem|the) )?"
_IN_FORCE = r"\b(?:gültig|gueltig|geltend|in Kraft(?: getreten)?|wirksam|anwendbar|maßgeblich|gilt|galt)"
_CUES = (
    # in der Fassung vom / von / aus dem Jahr / der Bekanntmachung vom / bis; Fassung 2019; Neufassung vom
    _Cue(
        _ARTICLE + r"\b(?:neu|gesetzes|vertrags|satzungs|ursprungs)?fassung(?: der Bekanntmachung)?"
        r"(?: (?:vom|von|v\.|aus(?: dem Jahre?)?|des Jahres|bis(?: zum)?|zum|mit Stand(?: vom)?))?"
    ),
    _Cue(_ARTICLE + r"\b(?:neu)?fassung (?:ab|seit)", edge="start"),
    _Cue(r"\bi\.?\s?d\.?\s?F(?:\.|(?!\w))(?: (?:v\.|vom|von))?"),  # i.d.F. v., idF vom
    # Stand 2019, Stand: 1.1.2019, mit Stand vom, Rechtsstand
    _Cue(r"\b(?:mit |nach dem )?(?:rechts|gesetzes|bearbeitungs)?stand(?: (?:vom|von|per|zum|am))?"),
    _Cue(r"\bversion(?: (?:vom|von|v\.|aus(?: dem Jahre?)?))?"),
    _Cue(_IN_FORCE + r" (?:am|zum|per|im(?: Jahre?)?|in)"),
    _Cue(_IN_FORCE + r" (?:ab|seit)", edge="start"),
    _Cue(_IN_FORCE + r" bis(?: (?:zum|einschließlich))?"),
    _Cue(r"\b(?:zum )?Stichtag"),
    _Cue(r"\b(?:vom|v\.)", years=False, version=False),  # Urteil vom 3.3.2021
    # English
    _Cue(r"\b(?:(?:the )?(?:version|text|wording) )?as (?:of|at|on)"),
    _Cue(r"\bas from", edge="start"),
    _Cue(
        r"\b(?:(?:the )?(?:version|text|wording|law) )?(?:in force|in effect|valid|applicable|applying|current)"
        r" (?:on|in|at|as of|during)"
    ),
    _Cue(
        r"\b(?:(?:the )?(?:version|text|wording|law) )?(?:in force|in effect|valid|applicable|effective)"
        r" (?:from|since)",
        edge="start",
    ),
    _Cue(r"\beffective(?: date)?", edge="start"),
    _Cue(r"\b(?:the )?(?:version|text|wording) (?:of|from|dated)"),
    _Cue(r"\bas (?:it )?(?:stood|read|was|applied|amended) (?:on|in|at|as of)"),
    _Cue(r"\bdated", years=False, version=False),
)
_CUE_BEFORE = _phrase(
    r"(?<!\w)(?:" + "|".join(f"(?P<c{i}>{cue.pattern})" for i, cue in enumerate(_CUES)) + r")\s{0,3}:?\s{0,3}$",
)
# After the date: "die 2019 geltende Fassung", "der 2019-Fassung", "the 2019 version".
_CUE_AFTER = _phrase(
    r"(?:-| )(?P<adj>(?:geltende|gültige|gueltige|maßgebliche|anwendbare|aktuelle)[nrs]? )?"
    r"(?:Fassung|Version|Gesetzesfassung|(?P<law>Rechtslage|Recht))(?!\w)"
    r"|(?:-| )(?:version|wording)s?(?!\w)",
)
# Words before a date followed by a cue: "in der am 1.1.2020 geltenden Fassung", "the 2019 version".
_LEAD = _phrase(
    r"(?<!\w)" + _ARTICLE + r"(?:(?P<start>ab|seit|since|from)|am|zum|im(?: Jahre?)?|bis|in|on) $"
    r"|(?<!\w)(?:in )?(?:der|die|den|das|dem|the) $",
)
_WINDOW = 80  # characters before a date searched for its cue
# A statute's title before "vom": the date is part of the title ("Gesetz zur Änderung des BGB vom 21.12.2021"),
# not the version asked for (that takes "Fassung": "in der Fassung der Bekanntmachung vom 2. Januar 2002").
_TITLE_BEFORE = _phrase(
    r"(?:gesetz|gesetzes|verordnung|richtlinie|bekanntmachung|erlass|erlasses|staatsvertrag)\b[^,;.()\n]{0,60}$"
)


@dataclass(frozen=True)
class _Cued:
    """A date with the words that make it a point in time, and what the words say."""

    when: _When
    start: int  # of the cue (or the date, if none)
    end: int  # of the date or the cue after it
    edge: Edge
    years: bool
    version: bool

    @property
    def point(self) -> dt.date:
        return self.when.point(self.edge)


def _cue_before(text: str, when: _When, claims: _Claims) -> tuple[int, _Cue] | None:
    """Where the cue before the date starts, and which it is; none inside a claim, and no plain "vom" after a
    statute's title."""
    before = _CUE_BEFORE.search(text, max(0, when.start - _WINDOW), when.start)
    if before is None or before.lastgroup is None or not claims.free(before.start(), when.start):
        return None
    cue = _CUES[int(before.lastgroup[1:])]
    if not cue.version and _TITLE_BEFORE.search(text, max(0, before.start() - 80), before.start()):
        return None
    return before.start(), cue


def _cue_after(text: str, when: _When, claims: _Claims) -> re.Match[str] | None:
    after = _CUE_AFTER.match(text, when.end)
    # "2019 Recht" is no cue; "das 2019 geltende Recht" is
    if after is None or (after.group("law") and not after.group("adj")) or not claims.free(when.end, after.end()):
        return None
    return after


def _cued(text: str, when: _When, claims: _Claims) -> _Cued | None:
    """The date with its cue, if it has one outside the claims."""
    before = _cue_before(text, when, claims)
    after = _cue_after(text, when, claims)
    if before is not None:
        start, cue = before
        return _Cued(when, start, after.end() if after else when.end, cue.edge, cue.years, cue.version)
    if after is None:
        return None
    lead = _LEAD.search(text, max(0, when.start - 40), when.start)
    if lead is not None and not claims.free(lead.start(), when.start):
        lead = None
    edge: Edge = "start" if lead is not None and lead.group("start") else "end"
    return _Cued(when, lead.start() if lead else when.start, after.end(), edge, True, True)


def _as_of_cue(text: str, when: _When, claims: _Claims) -> _Cued | None:
    cued = _cued(text, when, claims)
    if cued is None or when.year is None or (when.is_year and not cued.years):
        return None
    return cued


# --- Ranges ----------------------------------------------------------------------------------------------------

_RANGE_JOIN = _phrase(
    r"\s{0,3}(?:(?P<word>bis(?: (?:zum|einschließlich|einschl\.))?|to|until|till|through)"
    r"|(?P<and>und|and)|(?P<dash>[-–—]))\s{0,3}",
)
_RANGE_LEAD = _phrase(r"(?<!\w)(?:(?P<from>vom|von|ab|from)|(?P<between>zwischen|between))(?: (?:dem|the))? $")
_SINCE = _phrase(r"(?<!\w)(?:seit|since)(?: (?:dem|the))? $")


@dataclass(frozen=True)
class _Range:
    start: int  # of the words read
    end: int
    dates: tuple[dt.date, dt.date]


def _range(text: str, first: _When, last: _When, claims: _Claims) -> _Range | None:
    """`first` and `last` joined as a range ("vom 1.3. bis 31.12.2020", "zwischen 2019 und 2021"), if they are."""
    join = _RANGE_JOIN.fullmatch(text, first.end, last.start)
    if join is None or last.year is None or not claims.free(first.end, last.start):
        return None
    lead = _RANGE_LEAD.search(text, max(0, first.start - 20), first.start)
    if lead is not None and not claims.free(lead.start(), first.start):
        lead = None
    needs_lead = join.group("and") or first.is_year or last.is_year
    if (needs_lead and lead is None) or (join.group("and") and not (lead and lead.group("between"))):
        return None
    start = first.first_day(last.year) if first.year is None else first.first_day()
    if first.year is None and start > last.last_day():
        start = first.first_day(last.year - 1)
    if start > last.last_day():
        return None
    begin = lead.start() if lead else first.start
    cue = _cued(text, first, claims)  # "Fassung vom 1.3.2020 bis 31.12.2020": the cue goes with it
    if cue is not None and cue.start < begin:
        begin = cue.start
    return _Range(begin, last.end, (start, last.last_day()))


def _since(text: str, when: _When, today: dt.date | None, claims: _Claims) -> _Range | None:
    """ "seit 2019" / "since March 2020": from then up to today (only when the caller says which day that is)."""
    lead = _SINCE.search(text, max(0, when.start - 20), when.start)
    if today is None or lead is None or when.year is None or not claims.free(lead.start(), when.start):
        return None
    if when.first_day() > today:
        return None
    return _Range(lead.start(), when.end, (when.first_day(), today))


# --- Comparisons -----------------------------------------------------------------------------------------------

_INFLECTION = r"(?:e|en|er|es|em)?"
_PREVIOUS = r"(?:alt|vorherig|vorig|früher|frueher|bisherig|ursprünglich|vorangegangen|vorhergehend|ehemalig)"
_PREVIOUS_EN = r"(?:previous|prior|earlier|old|older|original|former|superseded)"
_CURRENT = r"(?:neu|aktuell|geltend|gültig|heutig|jetzig|derzeitig|gegenwärtig|neuest|neust|aktualisiert)"
_CURRENT_EN = r"(?:current|new|newer|newest|latest|present|amended|updated)"
_ADJECTIVE = rf"(?:(?P<prev>{_PREVIOUS}{_INFLECTION}|{_PREVIOUS_EN})|(?P<cur>{_CURRENT}{_INFLECTION}|{_CURRENT_EN}))"
_VERSION_NOUN = r"(?:(?:Gesetzes|Vertrags)?Fassung(?:en)?|Version(?:en)?|versions?|Rechtslage|wording)"
_DETERMINER = r"(?:(?:der|die|das|dem|den|zur|zum|the) )?"
_CONJUNCTION = r" (?:und|and|or|oder|vs\.?|versus|mit|with|zur|zum|to) "

# "der alten und der neuen Fassung", "previous and current versions": two sides, one noun.
_MARKER_PAIR = _phrase(
    rf"(?<!\w){_DETERMINER}(?P<a>{_PREVIOUS}{_INFLECTION}|{_PREVIOUS_EN}|{_CURRENT}{_INFLECTION}|{_CURRENT_EN})"
    rf"{_CONJUNCTION}{_DETERMINER}(?P<b>{_PREVIOUS}{_INFLECTION}|{_PREVIOUS_EN}|{_CURRENT}{_INFLECTION}|{_CURRENT_EN})"
    rf" {_VERSION_NOUN}(?!\w)",
)
# "die vorherige Fassung", "the current version"; "a.F." / "n.F." (alte / neue Fassung).
_MARKER = _phrase(
    rf"(?<!\w){_DETERMINER}{_ADJECTIVE} {_VERSION_NOUN}(?!\w)|(?<!\w)(?:(?P<aF>a\.\s?F\.)|(?P<nF>n\.\s?F\.))"
    r"|(?<!\w)(?P<today>heute|today)(?!\w)",  # "zwischen 2019 und heute": the current version
)
_PREVIOUS_WORD = _phrase(rf"{_PREVIOUS}{_INFLECTION}|{_PREVIOUS_EN}")

_GEAENDERT = r"(?P<tail>\bge(?:ä|ae)ndert)"
_GAP = r"[^?!;\n]{0,80}?"  # between a cue's head and tail: within the question, bounded
# Cues that ask for a comparison by themselves; a head and a tail are read, the words between them are not.
_STRONG = _phrase(
    "|".join(
        (
            r"(?P<head>\bwas (?:hat|haben) sich)\b" + _GAP + _GEAENDERT,
            r"(?P<head2>\bwas (?:wurde|wurden|ist|sind|wird))\b" + _GAP + r"(?P<tail2>\bge(?:ä|ae)ndert)",
            r"\bwas ist neu\b",
            r"\bwelche (?:Änderungen|Aenderungen|Neuerungen)(?: (?:gab|gibt) es)?",
            r"\b(?:Änderungen|Aenderungen|Neuerungen) (?:seit|gegenüber|zwischen|zur|zum|im Vergleich zu[rm]?)",
            r"\bSynopse\b",
            r"\bwhat(?:'s|’s| has| have| was| were)? (?:been )?changed\b",
            r"\bwhat(?:'s|’s| is) new\b",
            r"(?P<head3>\bhow (?:has|have|did))\b" + _GAP + r"(?P<tail3>\bchanged?\b)",
            r"\b(?:changes|amendments) (?:since|between|from|compared (?:to|with))",
        )
    ),
)
# Cues that ask for a comparison only with a version side (a marker, a dated version, or two sides).
_WEAK = _phrase(
    "(?:"
    + "|".join(
        (
            r"\b(?:was (?:ist|sind) )?(?:der |die )?Unterschiede?(?: (?:zwischen|zur|zum|gegenüber))?",
            r"\bunterscheide[nt]?(?: sich)?",
            r"\b(?:im )?Vergleich(?: (?:zwischen|zur|zum|zu|mit|der|des|von))?",
            r"\bvergleiche?n?\b",
            r"\bGegenüberstellung(?: (?:der|von))?",
            r"\bgegenüber\b",
            r"\b(?:Änderungen|Aenderungen)\b",
            r"(?<!\w)(?:vs\.|vs\b|versus\b)",
            r"\b(?:what(?:'s|’s| is| are) the )?differences?(?: (?:between|from|to))?(?: the)?",
            r"\bcompar(?:e|ed|ing|ison)(?: (?:of|between|with|to))?(?: the)?",
            r"\bdiffer(?:s|ent)?\b",
            r"\bchanges\b",
        )
    )
    + r")(?!\w)",
)
_HAS_VERSION_NOUN = _phrase(r"\b(?:Fassung(?:en)?|Version(?:en)?|versions?|wording|Synopse)\b")
# A word before a date that makes it a side of a comparison ("zwischen 2019 und 2021", "seit 2019").
_CONNECTOR = _phrase(
    r"(?<!\w)(?:(?P<since>seit|since)|zwischen|between|ab|bis|until|to|und|and|vs\.?|versus|gegenüber|zu|zur|zum"
    r"|mit|with|or|oder) (?:(?:der|die|dem|den|the) )?$",
)


@dataclass(frozen=True)
class _SideAt:
    value: Side
    spans: tuple[tuple[int, int], ...]
    token: _When | None = None  # the date it was read from


def _markers(text: str, claims: _Claims) -> tuple[list[_SideAt], bool]:
    """The sides a comparison's words name ("alte Fassung", "a.F.", "heute"), and whether two of them were named
    together ("der alten und der neuen Fassung")."""
    sides: list[_SideAt] = []
    taken: list[tuple[int, int]] = []

    def fresh(match: re.Match[str]) -> bool:
        return claims.free(match.start(), match.end()) and all(match.end() <= s or match.start() >= e for s, e in taken)

    for match in _MARKER_PAIR.finditer(text):
        if fresh(match):
            taken.append(match.span())
            for word in (match.group("a"), match.group("b")):
                value: Marker = "previous" if _PREVIOUS_WORD.fullmatch(word) else "current"
                sides.append(_SideAt(value, (match.span(),)))
    for match in _MARKER.finditer(text):
        if fresh(match):
            taken.append(match.span())
            marker: Marker = "previous" if match.group("prev") or match.group("aF") else "current"
            sides.append(_SideAt(marker, (match.span(),)))
    return sides, bool(sides) and len(taken) < len(sides)


def _cue_spans(
    pattern: re.Pattern[str], text: str, claims: _Claims, start: int = 0, end: int | None = None
) -> list[tuple[int, int]]:
    """The words of each match that are read: its head and tail if it has them, else all of it. The words between
    a head and its tail are searched for cues too ("Was hat sich what changed geändert": both are cues), so what
    is left of a query holds no cue a second reading would find."""
    spans: list[tuple[int, int]] = []
    for match in pattern.finditer(text, start, len(text) if end is None else end):
        parts = [
            match.span(name)
            for name, value in match.groupdict().items()
            if value is not None and name.startswith(("head", "tail"))
        ]
        if parts:
            spans.extend(_cue_spans(pattern, text, claims, min(e for _, e in parts), max(s for s, _ in parts)))
        parts = parts or [match.span()]
        if all(claims.free(s, e) for s, e in parts):
            spans.extend(parts)
    return spans


def _date_sides(
    text: str, tokens: Sequence[_When], claims: _Claims, strong: bool, version_noun: bool
) -> list[tuple[_SideAt, bool]]:
    """The dates that are sides of a comparison, each with whether a version cue names it."""
    sides = []
    for when in tokens:
        if when.year is None or when.is_today:  # "heute" is a marker here: the current version
            continue
        cued = _cued(text, when, claims)
        connector = _CONNECTOR.search(text, max(0, when.start - 30), when.start)
        version_cued = cued is not None and cued.version and (cued.years or not when.is_year)
        if not (version_cued or connector or version_noun or (strong and not when.is_year)):
            continue
        since = (connector and connector.group("since")) or (cued is not None and cued.edge == "start")
        value: Side = when.first_day() if since else when.last_day()
        spans = ((cued.start, cued.end),) if cued is not None else ((when.start, when.end),)
        sides.append((_SideAt(value, spans, when), version_cued))
    return sides


def _comparison(
    text: str, tokens: Sequence[_When], claims: _Claims
) -> tuple[Comparison, list[tuple[int, int]], set[_When]] | None:
    """The comparison asked for, the words it was read from, and the dates that are its sides."""
    markers, has_pair = _markers(text, claims)
    strong = _cue_spans(_STRONG, text, claims)
    weak = _cue_spans(_WEAK, text, claims)
    previous = any(m.value == "previous" for m in markers)
    version_noun = any(claims.free(m.start(), m.end()) for m in _HAS_VERSION_NOUN.finditer(text))
    if not (strong or weak or previous or has_pair):
        return None
    dated = _date_sides(text, tokens, claims, bool(strong or previous or has_pair), version_noun)
    sides = markers + [side for side, _ in dated]
    wanted = strong or previous or has_pair or (weak and (len(sides) >= 2 or markers or any(v for _, v in dated)))
    if not wanted:
        return None
    # The version words go too ("Vergleich der Fassungen 2019 und 2021"): the text legs should not search for them.
    nouns = [m.span() for m in _HAS_VERSION_NOUN.finditer(text) if claims.free(m.start(), m.end())]
    spans = strong + weak + nouns + [span for side in sides for span in side.spans]
    return _pick_sides(sides), spans, {side.token for side in sides if side.token is not None}


def _pick_sides(sides: Iterable[_SideAt]) -> Comparison:
    dates = sorted({s.value for s in sides if isinstance(s.value, dt.date)})
    markers = {s.value for s in sides if not isinstance(s.value, dt.date)}
    if len(dates) >= 2:
        return Comparison(dates[0], dates[-1])
    if dates:
        if "previous" in markers and "current" not in markers:
            return Comparison("previous", dates[0])
        return Comparison(dates[0], "current")
    return Comparison("previous", "current")


# --- Remaining text --------------------------------------------------------------------------------------------

# Words left over between or beside the phrases taken out ("Unterschied zwischen der [alten] und der [neuen]").
_GLUE = frozenset(
    {
        *("der", "die", "das", "dem", "den", "des", "ein", "eine", "und", "oder", "sowie", "zwischen", "zur", "zum"),
        *("zu", "von", "vom", "mit", "seit", "bis", "gegenüber", "in", "im", "am", "als"),
        *("the", "a", "an", "and", "or", "of", "between", "to", "from", "with", "since", "vs", "vs.", "versus", "than"),
    }
)
_GAP_PUNCTUATION = ",;:–—-"


def _only_glue(gap: str) -> bool:
    words = gap.translate({ord(c): " " for c in _GAP_PUNCTUATION}).split()
    return all(w.casefold() in _GLUE for w in words)


def _merge(text: str, spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans to take out, with the glue words between two of them or between one and an end of the text."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and (start <= merged[-1][1] or _only_glue(text[merged[-1][1] : start])):
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    if merged and _only_glue(text[: merged[0][0]]):
        merged[0] = (0, merged[0][1])
    if merged and _only_glue(text[merged[-1][1] :]):
        merged[-1] = (merged[-1][0], len(text))
    return merged


_CUT_END = " \t\n" + _GAP_PUNCTUATION  # stripped where a phrase was cut out


def _remaining(text: str, removed: Iterable[tuple[int, int]], joint: str = " ") -> str:
    """`text` without the `removed` spans (and the glue words beside them): the pieces left, stripped of spaces
    and joining punctuation where they were cut, joined by `joint`; elsewhere the text is as it was."""
    spans = _merge(text, removed)
    if not spans:
        return text
    bounds = [0] + [edge for span in spans for edge in span] + [len(text)]
    pieces = [text[bounds[i] : bounds[i + 1]].strip(_CUT_END) for i in range(0, len(bounds), 2)]
    for i in range(len(pieces) - 1):  # "Mietvertrag (Stand: 1.4.2022) Klausel": the brackets go with it
        if pieces[i].endswith("(") and pieces[i + 1].startswith(")"):
            pieces[i], pieces[i + 1] = pieces[i][:-1].rstrip(_CUT_END), pieces[i + 1][1:].lstrip(_CUT_END)
    kept = joint.join(piece for piece in pieces if piece)
    return kept if any(c.isalnum() for c in kept) else ""


#: A word that asks for a version of a document, not just a day: what makes a parsed date or comparison apply to
#: the search (search.plan). A plain "vom 6. Juli 2009" dates a statute's title or a letter far more often (all 15
#: such phrases among 8,705 gesetze-headings queries were titles); "zwischen 1980 und 1984" is a question's subject.
_VERSION_CUE = re.compile(
    r"fassung|\bstand\b|version|geltend|gültig|in kraft|in force|\bvalid|\bas of\b|\b[an]\.\s?f\.|geändert|änderung"
    r"|\bchanged|\bamended|synopse|aktuell|\bcurrent|vorherig|previous|früher|\balte|\bneue",
    re.IGNORECASE,
)


def version_cued(parsed: ParsedQuery, kind: SpanKind) -> bool:
    """Whether the words read as `kind` (as_of, compare) name a version ("in der Fassung vom", "Stand",
    "vorherige Fassung", "seit 2019 geändert", "as of"), not only a day."""
    return any(s.kind == kind and _VERSION_CUE.search(s.text) for s in parsed.spans)


def without_spans(text: str, spans: Iterable[ParsedSpan]) -> str:
    """`text` without these parsed spans (and the glue words beside them), as `remaining` is made."""
    return _remaining(text, [(s.start, s.end) for s in spans])


# --- The parser ------------------------------------------------------------------------------------------------


def parse_query(text: str, *, today: dt.date | None = None) -> ParsedQuery:
    """What the query's own words say (see the module doc). `today` resolves "heute" / "today" and the open end of
    "seit 2019" / "since 2019"; without it those are not read."""
    parsed = _read(text, today)
    removed = [(s.start, s.end) for s in parsed.spans if s.kind in REMOVED_KINDS]
    remaining = _remaining(text, removed)
    if remaining != text and any(s.kind in REMOVED_KINDS for s in _read(remaining, today).spans):
        # Taking the phrases out brought words together that read as a new one ("Stand [what changed] 2019"):
        # a semicolon keeps them apart (nothing reads across one), so parsing `remaining` again reads nothing.
        remaining = _remaining(text, removed, joint="; ")
    return replace(parsed, remaining=remaining)


def _read(text: str, today: dt.date | None) -> ParsedQuery:
    """Everything but `remaining`."""
    claims = _Claims()
    _protect(text, claims)
    identifiers = _identifiers(text, claims)
    provisions = _provisions(text, claims)
    _mask_lookalikes(text, claims)
    tokens = _date_tokens(text, claims, today)
    spans = list(dict.fromkeys([span for _, span in identifiers] + [span for _, span in provisions]))
    found = _comparison(text, tokens, claims)
    compare: Comparison | None = None
    if found is not None:
        compare, compare_spans, sides = found
        spans += [ParsedSpan("compare", s, e, text[s:e]) for s, e in _distinct(compare_spans)]
        tokens = [t for t in tokens if t not in sides and not t.is_today]  # "heute" was a side: current
    # With a comparison, only the dates that are not its sides can say as_of or a range.
    as_of, date_range, date_spans = _points_in_time(text, tokens, claims, today)
    spans += date_spans
    spans.sort(key=lambda s: (s.start, s.end))
    return ParsedQuery(
        as_of=as_of,
        date_range=date_range,
        compare=compare,
        provisions=tuple(p for p, _ in provisions),
        identifiers=tuple(i for i, _ in identifiers),
        spans=tuple(spans),
    )


def _distinct(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans without duplicates or spans inside another one."""
    ordered = sorted(set(spans), key=lambda s: (s[0], -s[1]))
    kept: list[tuple[int, int]] = []
    for start, end in ordered:
        if not kept or end > kept[-1][1]:
            kept.append((start, end))
    return kept


def _points_in_time(
    text: str, tokens: Sequence[_When], claims: _Claims, today: dt.date | None
) -> tuple[dt.date | None, tuple[dt.date, dt.date] | None, list[ParsedSpan]]:
    """as_of and date_range from the dates with cues (with a comparison, the dates that are not its sides)."""
    ranges: list[_Range] = []
    in_range: set[_When] = set()
    for first, last in zip(tokens, tokens[1:], strict=False):
        if first in in_range:
            continue
        found = _range(text, first, last, claims)
        if found is not None:
            ranges.append(found)
            in_range.update((first, last))
    for when in tokens:
        if when in in_range or _as_of_cue(text, when, claims) is not None:  # "in Kraft seit 1.4.2019": as_of
            continue
        since = _since(text, when, today, claims)
        if since is not None:
            ranges.append(since)
            in_range.add(when)
    points = [c for w in tokens if w not in in_range and (c := _as_of_cue(text, w, claims)) is not None]
    spans: list[ParsedSpan] = []
    date_range = None
    if len({r.dates for r in ranges}) == 1:
        date_range = ranges[0].dates
        spans += [ParsedSpan("date_range", r.start, r.end, text[r.start : r.end]) for r in ranges]
    else:
        spans += [ParsedSpan("ambiguous_date", r.start, r.end, text[r.start : r.end]) for r in ranges]
    as_of = None
    if len({p.point for p in points}) == 1:
        as_of = points[0].point
        spans += [ParsedSpan("as_of", p.start, p.end, text[p.start : p.end]) for p in points]
    else:
        spans += [ParsedSpan("ambiguous_date", p.start, p.end, text[p.start : p.end]) for p in points]
    return as_of, date_range, spans

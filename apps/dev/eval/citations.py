"""Section citations in German statute text, as `references` relations between corpus documents.

`ki eval` derives them for a corpus whose documents are statute sections titled `§ 573 BGB` / `Art. 20 GG`
(gesetze-headings-dev), so graph augmentation can be measured there: "nach § 573 Abs. 2 BGB" cites § 573
BGB; "die §§ 664 bis 670" cites §§ 664-670 of the citing section's own law; "§ 5 Satz 2 und § 7" cites
§ 5 and § 7 (a number after Absatz/Abs./Satz/Nr. is no section); a law abbreviation right after the
numbers ("§ 15 SGB 5", "§ 1 KSchG") names the law, else the citing section's own law is meant. Only
citations that resolve to a document of the corpus become relations; a section citing itself does not.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

MAX_RANGE = 12  # "§§ 1 bis 400" is a whole part of a law, not a citation worth an edge each
_TOKEN = re.compile(r"§§?|Art\.|Artikel|\d+[a-z]?\b|[A-Za-zÄÖÜäöüß]+\.?|,|;|\(|\)")
_QUALIFIERS = {"Absatz", "Abs.", "Satz", "Nr.", "Nummer", "Buchstabe", "Halbsatz", "Unterabsatz"}
_CONNECTORS = {",", "und", "oder", "bis", "sowie", "der", "des", "die", "den", "dem", "in", "Verbindung", "mit"}


def _number(token: str) -> tuple[int, str] | None:
    m = re.fullmatch(r"(\d+)([a-z]?)", token)
    return (int(m.group(1)), m.group(2)) if m else None


def _law_at(tokens: Sequence[str], i: int, laws: set[str]) -> str | None:
    """A law abbreviation starting at token i (one token, or two as in `SGB 5`)."""
    if i < len(tokens) and i + 1 < len(tokens) and f"{tokens[i]} {tokens[i + 1]}" in laws:
        return f"{tokens[i]} {tokens[i + 1]}"
    if i < len(tokens) and tokens[i] in laws:
        return tokens[i]
    return None


def cited_sections(text: str, own_law: str, laws: set[str]) -> list[tuple[str, str, str]]:
    """(marker `§`/`Art.`, section number as written, law) of every section the text cites."""
    tokens = _TOKEN.findall(text)
    out: list[tuple[str, str, str]] = []
    i = 0
    while i < len(tokens):
        if tokens[i] not in ("§", "§§", "Art.", "Artikel"):
            i += 1
            continue
        marker = "§" if tokens[i].startswith("§") else "Art."
        i += 1
        numbers: list[str] = []
        qualified = False  # the next number belongs to Absatz/Satz/...
        after_qualifier = False  # the last number was one (so "Satz 2 bis 4" ranges over sentences)
        ranging = False
        while i < len(tokens):
            token = tokens[i]
            if token in _QUALIFIERS:
                qualified = True
            elif _number(token) is not None:
                after_qualifier = qualified
                if qualified:
                    qualified = False
                elif ranging and numbers:
                    start, end = _number(numbers[-1]), _number(token)
                    assert start is not None and end is not None
                    if 0 < end[0] - start[0] <= MAX_RANGE:
                        numbers += [str(n) for n in range(start[0] + 1, end[0])]
                    numbers.append(token)
                    ranging = False
                else:
                    numbers.append(token)
            elif token == "bis":
                qualified, ranging = after_qualifier, not after_qualifier
            elif token in _CONNECTORS or token in ("§", "§§"):
                qualified = after_qualifier = False
            else:
                break
            i += 1
        law = _law_at(tokens, i, laws) or own_law
        out += [(marker, n, law) for n in numbers]
    return out


def derive_references(docs: Iterable[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(citing corpus id, cited corpus id) from (corpus id, title, text) of statute sections."""
    items = list(docs)
    by_title: dict[str, str] = {}
    own_law: dict[str, str] = {}
    for doc_id, title, _ in items:
        m = re.fullmatch(r"(§|Art\.) (\d+[a-z]?) (.+)", title.strip())
        if m:
            by_title[f"{m.group(1)} {m.group(2)} {m.group(3)}"] = doc_id
            own_law[doc_id] = m.group(3)
    laws = set(own_law.values())
    edges: set[tuple[str, str]] = set()
    for doc_id, _, text in items:
        if doc_id not in own_law:
            continue
        for marker, number, law in cited_sections(text, own_law[doc_id], laws):
            cited = by_title.get(f"{marker} {number} {law}")
            if cited is not None and cited != doc_id:
                edges.add((doc_id, cited))
    return sorted(edges)

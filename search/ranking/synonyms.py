"""Synonyms: everyday and legal wording of the same thing, added to a query so that either finds both.

A group lists phrases that mean the same (`["Kündigung", "Beendigung des Vertragsverhältnisses"]`). When a
phrase of a group occurs in the query -- compared as identity keys, whole tokens (search.names.keys), so
case, `ß`/`ss` and punctuation do not matter -- the group's other phrases are appended to the text the
lexical leg matches and the semantic leg embeds. Additive: the query's own words stay, so both registers
count. The identifier leg and the identity preflight see the query as typed. Applied at query time only,
so the list can change without a reindex (`retrieval.synonyms`, on with `retrieval.synonyms_enabled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from search.names.keys import contains, identity_key

#: The shipped list (German legal register <-> everyday wording); replace it with `retrieval.synonyms`.
DEFAULT_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("Kündigung", "Beendigung des Vertragsverhältnisses", "Vertragsbeendigung"),
    ("Rücktritt", "Rückgängigmachung des Vertrags"),
    ("Schadensersatz", "Schadenersatz", "Entschädigung"),
    ("Schmerzensgeld", "Entschädigung für Schmerzen"),
    ("Arbeitnehmer", "Angestellter", "Beschäftigter"),
    ("Arbeitsentgelt", "Lohn", "Gehalt", "Vergütung"),
    ("Mietsicherheit", "Kaution"),
    ("Betriebskosten", "Nebenkosten"),
    ("Räumung", "Auszug aus der Wohnung"),
    ("Mangel", "Defekt"),
    ("Gewährleistung", "Mängelhaftung"),
    ("Vertragsstrafe", "Konventionalstrafe"),
    ("Zahlungsunfähigkeit", "Insolvenz", "Pleite"),
    ("Erblasser", "Verstorbener"),
    ("letztwillige Verfügung", "Testament"),
    ("Ehescheidung", "Scheidung"),
    ("Abmahnung", "Verwarnung"),
    ("Verjährung", "Verfall von Ansprüchen"),
)


@dataclass(frozen=True)
class Expansion:
    text: str  # the query with the added phrases
    added: tuple[str, ...]


def expand_query(query: str, groups: Sequence[Sequence[str]]) -> Expansion:
    """The query plus the other phrases of every group one of whose phrases it contains."""
    key = identity_key(query)
    added: list[str] = []
    seen = {key}
    for group in groups:
        keys = [identity_key(phrase) for phrase in group]
        if not any(k and contains(key, k) for k in keys):
            continue
        for phrase, k in zip(group, keys, strict=True):
            if k and not contains(key, k) and k not in seen:
                seen.add(k)
                added.append(phrase)
    if not added:
        return Expansion(query, ())
    return Expansion(f"{query} {' '.join(added)}", tuple(added))

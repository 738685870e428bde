"""Section citations in statute text (apps.dev.eval.citations), written by hand from how German laws cite."""

from __future__ import annotations

from apps.dev.eval.citations import cited_sections, derive_references

LAWS = {"BGB", "SGB 5", "KSchG", "GG", "ZPO"}


def sections(text: str, own: str = "BGB") -> list[str]:
    return [f"{m} {n} {law}" for m, n, law in cited_sections(text, own, LAWS)]


def test_a_single_citation_with_qualifiers_and_a_law() -> None:
    assert sections("nach § 573 Abs. 2 Nr. 3 BGB kündigen") == ["§ 573 BGB"]
    assert sections("gemäß § 31a Absatz 1 Satz 3 ist entsprechend anzuwenden") == ["§ 31a BGB"]
    assert sections("nach § 1 KSchG", own="ZPO") == ["§ 1 KSchG"]
    assert sections("Leistungen nach § 15 SGB 5") == ["§ 15 SGB 5"]
    assert sections("Art. 20 Abs. 3 GG bindet", own="GG") == ["Art. 20 GG"]


def test_lists_and_ranges_of_sections() -> None:
    assert sections("Die §§ 664 bis 670 finden entsprechende Anwendung") == [f"§ {n} BGB" for n in range(664, 671)]
    assert sections("die §§ 32, 33 und 38 finden insoweit keine Anwendung") == ["§ 32 BGB", "§ 33 BGB", "§ 38 BGB"]
    assert sections("§ 83 Satz 2 bis 4 entsprechende Anwendung") == ["§ 83 BGB"]  # a range of sentences
    assert sections("des § 75 Absatz 2 und des § 76 durch Festsetzung") == ["§ 75 BGB", "§ 76 BGB"]
    assert sections("§§ 1 bis 400") == ["§ 1 BGB", "§ 400 BGB"]  # too long a range: its ends only


def test_only_citations_of_corpus_documents_become_relations() -> None:
    docs = [
        ("bgb-p573", "§ 573 BGB", "Der Vermieter kann nach § 573a oder § 574 kündigen; § 573 gilt."),
        ("bgb-p574", "§ 574 BGB", "Widerspruch nach § 1 KSchG und § 999 BGB."),
        ("kschg-p1", "§ 1 KSchG", "Keine Verweise."),
    ]
    assert derive_references(docs) == [("bgb-p573", "bgb-p574"), ("bgb-p574", "kschg-p1")]

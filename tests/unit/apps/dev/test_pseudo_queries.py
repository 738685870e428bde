"""Pseudo-queries for `ki eval --self` (apps.dev.eval.pseudo): headings and sentences of a document, identifiers
stripped, each document in one half."""

from __future__ import annotations

from apps.dev.eval.pseudo import MAX_SENTENCE_WORDS, half_of, headings, queries_for, sentences, strip_identifiers

CONTRACT = """§ 5 Kündigung des Mietverhältnisses
Der Mieter kann das Mietverhältnis mit einer Frist von drei Monaten kündigen.
Die Kündigung bedarf der Schriftform nach § 568 BGB.
II. Haftung des Vermieters
Der Vermieter haftet für Schäden nur bei Vorsatz und grober Fahrlässigkeit, soweit gesetzlich zulässig.
"""


def test_headings_lose_their_numbering_and_sentences_skip_them() -> None:
    assert headings(CONTRACT) == ["Kündigung des Mietverhältnisses", "Haftung des Vermieters"]
    found = sentences(CONTRACT)
    assert found[0].startswith("Der Mieter kann") and all("Haftung des Vermieters" not in s for s in found)
    # A last line is no heading (nothing follows it), nor is a line that ends a sentence.
    assert headings("Nur ein Satz ohne Punkt") == [] and headings("Ein Satz.\nNoch einer.") == []


def test_identifiers_section_signs_and_numbers_are_stripped() -> None:
    assert strip_identifiers("Urteil des OLG München vom 3. Mai, Az. 7 U 12/20", ["OLG München"]) == (
        "Urteil des vom Mai"
    )
    assert strip_identifiers("§§ 535, 536 BGB Mangel", ["BGB"]) == "Mangel"
    assert strip_identifiers("12/2020 4711") == ""


def test_at_most_a_heading_and_a_sentence_per_document_in_one_half() -> None:
    found = queries_for(41, CONTRACT, ["BGB"], salt="s")
    assert [q.kind for q in found] == ["heading", "sentence"]
    assert {q.half for q in found} == {half_of(41, "s")} and {q.qid for q in found} == {"41:heading", "41:sentence"}
    assert all("§" not in q.text and "568" not in q.text and "BGB" not in q.text for q in found)
    assert all(len(q.text.split()) <= MAX_SENTENCE_WORDS for q in found)
    assert queries_for(41, CONTRACT, ["BGB"], salt="s") == found  # the same questions on a re-run


def test_short_texts_give_fewer_queries_and_halves_split_the_corpus() -> None:
    assert queries_for(1, "") == [] and queries_for(2, "Zu kurz.") == []
    sentence = "Die Rechtsfähigkeit des Menschen beginnt mit der Vollendung der Geburt"
    plain = queries_for(3, sentence + ".")
    assert [(q.kind, q.text) for q in plain] == [("sentence", sentence)]
    halves = [half_of(i, "salt") for i in range(1000)]
    assert 400 < halves.count("tuning") < 600

"""The one text normalisation (projections.text): each rule, what it must leave alone, idempotence."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from projections.text import _TABLE, normalise_text, reading_offsets


def test_decomposed_umlauts_are_composed() -> None:
    decomposed = "Ku\u0308ndigung des Mietverha\u0308ltnisses, Gro\u00dfbuchstaben, A\u0308nderung"
    assert normalise_text(decomposed) == "Kündigung des Mietverhältnisses, Großbuchstaben, Änderung"
    assert unicodedata.is_normalized("NFC", normalise_text(decomposed))


def test_soft_hyphens_and_zero_width_characters_are_dropped() -> None:
    assert normalise_text("Kündi\u00adgungs\u00adfrist") == "Kündigungsfrist"
    assert normalise_text("Miet\u200bvertrag\ufeff \u2060BGB") == "Mietvertrag BGB"


def test_space_variants_become_plain_spaces_and_paragraph_sign_is_kept() -> None:
    assert normalise_text("§\u00a0573 Abs.\u202f2 BGB") == "§ 573 Abs. 2 BGB"
    assert normalise_text("§§\u2009573,\u2007574") == "§§ 573, 574"
    assert normalise_text("Satz 1\u2028Satz 2") == "Satz 1\nSatz 2"


def test_hyphen_variants_become_ascii_hyphen_but_dashes_stay() -> None:
    assert normalise_text("Kündigungs\u2011Frist und Miet\u2010recht") == "Kündigungs-Frist und Miet-recht"
    assert normalise_text("1990 \u2013 2000 \u2014 Ende") == "1990 \u2013 2000 \u2014 Ende"


def test_look_only_compatibility_forms_are_plain_letters() -> None:
    assert normalise_text("Au\ufb00assung, ﬁnanziell, Pﬂicht") == "Auffassung, finanziell, Pflicht"
    assert normalise_text("Geſetz") == "Gesetz"
    assert normalise_text("ＢＧＢ　§") == "BGB §"  # full-width letters and the ideographic space
    assert normalise_text("Teil Ⅳ") == "Teil IV"


def test_meaningful_compatibility_characters_are_kept() -> None:
    # Full NFKC would rewrite these; a lawyer's text must keep them.
    for text in ("100 m²", "½ Anteil", "Marke™", "10 €", "§ 1 Nr. 2", "Straße"):
        assert normalise_text(text) == text


def test_newlines_and_other_whitespace_are_kept() -> None:
    assert normalise_text("  Absatz 1\n\n  Absatz 2\t") == "  Absatz 1\n\n  Absatz 2\t"


def test_ascii_is_returned_unchanged() -> None:
    text = "BGB section 573 (2) tenancy"
    assert normalise_text(text) is text


@given(st.text())
def test_idempotent_and_nfc(text: str) -> None:
    once = normalise_text(text)
    assert normalise_text(once) == once
    assert unicodedata.is_normalized("NFC", once)


@given(st.text())
def test_no_format_character_or_space_variant_survives(text: str) -> None:
    out = normalise_text(text)
    assert not set(out) & set("\u00ad\u200b\u200c\u2060\ufeff\u00a0\u202f\u2009\u2011\u2028")


@given(st.text(alphabet=st.sampled_from("ab Kü\u00ad\u00a0\ufb01\u2161\u0308\u200b\n§5a\u0301")))
def test_reading_offsets_map_every_normalised_character_to_the_nfc_text(raw: str) -> None:
    offsets = reading_offsets(raw)
    normalised, nfc = normalise_text(raw), unicodedata.normalize("NFC", raw)
    if offsets is None:  # the composition joined characters across a dropped one: no mapping claimed
        return
    assert len(offsets) == len(normalised) + 1 and offsets[-1] == len(nfc)
    assert list(offsets) == sorted(offsets)
    for i, ch in enumerate(normalised):
        # The reader's character at the mapped position normalises to (a text containing) this character.
        assert ch in normalise_text(nfc[offsets[i]]) or nfc[offsets[i]] == ch


def test_reading_offsets_skip_what_normalisation_drops() -> None:
    raw = "Kündi\u00adgung §\u00a0573 \ufb01nal"
    offsets = reading_offsets(raw)
    assert offsets is not None
    normalised = normalise_text(raw)
    start = normalised.index("gung")
    assert raw[offsets[start] : offsets[start + 3] + 1] == "gung"
    assert raw[offsets[normalised.index("final")] : offsets[len(normalised) - 1] + 1] == "\ufb01nal"


def test_every_replaced_character_is_seen_by_the_quick_check() -> None:
    # The quick check skips the table for texts without any of its characters: each one must trip it.
    for code, replacement in _TABLE.items():
        text = f"Kündigung{chr(code)}frist"
        assert normalise_text(text) == unicodedata.normalize("NFC", f"Kündigung{replacement or ''}frist"), hex(code)


@given(st.text())
def test_the_quick_check_gives_what_the_whole_table_gives(text: str) -> None:
    assert normalise_text(text) == unicodedata.normalize("NFC", text.translate(_TABLE))

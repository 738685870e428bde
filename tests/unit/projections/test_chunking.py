import random
import unicodedata

import pytest

from projections.chunking import Chunk, split_text


def assert_well_formed(text: str, chunks: list[Chunk], chunk_chars: int) -> None:
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert chunk.text == text[chunk.start : chunk.end]
        assert 0 < chunk.end - chunk.start <= chunk_chars
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert prev.start < nxt.start  # forward progress
        # No gaps, except where a whitespace-only window was dropped.
        assert nxt.start <= prev.end or text[prev.end : nxt.start].isspace()
    covered = set()
    for chunk in chunks:
        covered.update(range(chunk.start, chunk.end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())


@pytest.mark.parametrize("text", ["", " ", "\n\n\t  \n"])
def test_empty_or_whitespace_text_has_no_chunks(text):
    assert split_text(text, 100, 10) == []


def test_short_text_is_one_chunk():
    assert split_text("Kurzer Vertrag.", 100, 10) == [Chunk(0, 0, 15, "Kurzer Vertrag.")]


def test_text_of_exactly_window_size_is_one_chunk():
    text = "x" * 100
    assert len(split_text(text, 100, 10)) == 1


def test_prefers_newline_boundary():
    text = "a" * 70 + "\n" + "b" * 20 + " " + "c" * 60
    chunks = split_text(text, 100, 10)
    assert chunks[0].end == 71 and chunks[0].text.endswith("\n")
    assert_well_formed(text, chunks, 100)


def test_ignores_newline_in_first_half_and_falls_back_to_whitespace():
    text = "a" * 10 + "\n" + "b" * 70 + " " + "c" * 60
    chunks = split_text(text, 100, 10)
    assert chunks[0].end == 82  # after the space, not after the early newline at 10
    assert_well_formed(text, chunks, 100)


def test_hard_cut_without_any_whitespace():
    text = "x" * 250
    chunks = split_text(text, 100, 10)
    assert [(c.start, c.end) for c in chunks] == [(0, 100), (90, 190), (180, 250)]


def test_consecutive_windows_overlap_by_overlap_chars():
    text = " ".join(f"wort{i}" for i in range(400))
    chunks = split_text(text, 120, 20)
    assert len(chunks) > 3
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert prev.end - nxt.start == 20
    assert_well_formed(text, chunks, 120)


def test_no_overlap():
    text = "abc " * 100
    chunks = split_text(text, 50, 0)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert prev.end == nxt.start
    assert "".join(c.text for c in chunks) == text


@pytest.mark.parametrize(("chunk_chars", "overlap"), [(100, 100), (100, 150), (0, 0), (10, -1)])
def test_invalid_window_raises(chunk_chars, overlap):
    with pytest.raises(ValueError):
        split_text("some text", chunk_chars, overlap)


def test_large_overlap_still_progresses():
    text = "\n".join("zeile" for _ in range(300))
    chunks = split_text(text, 50, 49)
    assert_well_formed(text, chunks, 50)


def test_umlauts_and_emoji_count_as_one_character():
    text = "Äöü߀😀" * 50
    chunks = split_text(text, 64, 8)
    assert_well_formed(text, chunks, 64)
    for chunk in chunks:
        chunk.text.encode("utf-8")  # no broken code points


def test_hard_cut_does_not_separate_combining_marks_or_zwj_sequences():
    decomposed = unicodedata.normalize("NFD", "Ä") * 40  # A + combining diaeresis
    family = "👨\u200d👩\u200d👧" * 20
    for text in (decomposed, family):
        chunks = split_text(text, 31, 5)
        assert_well_formed(text, chunks, 31)
        for chunk in chunks:
            assert unicodedata.combining(text[chunk.start]) == 0
            assert text[chunk.start] != "\u200d" and text[chunk.end - 1] != "\u200d"


def test_whitespace_only_windows_are_dropped_and_ordinals_stay_consecutive():
    text = "Anfang" + " " * 500 + "Ende"
    chunks = split_text(text, 100, 10)
    assert chunks[0].text.startswith("Anfang") and chunks[-1].text.endswith("Ende")
    assert_well_formed(text, chunks, 100)


def test_deterministic_and_well_formed_on_random_text():
    rng = random.Random(1234)
    alphabet = "abcdefghijklmnopqrstuvwxyzäöüß €😀\n\n  .,"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 2000)))
        chunk_chars = rng.randint(1, 300)
        overlap = rng.randint(0, chunk_chars - 1)
        chunks = split_text(text, chunk_chars, overlap)
        assert chunks == split_text(text, chunk_chars, overlap)
        assert_well_formed(text, chunks, chunk_chars)


# --- cutting to the embedder's token window ----------------------------------------------------


def _word_tokens(text: str) -> int:
    """A stand-in tokenizer: one token per word plus two special tokens."""
    return len(text.split()) + 2


def test_windows_fit_the_token_budget_and_cover_the_text():
    from projections.chunking import TokenBudget

    rng = random.Random(7)
    words = ["Kündigung", "§", "573", "Abs.", "2", "BGB", "Mieter", "Vermieter", "Frist", "1.2.2024"]
    text = " ".join(rng.choice(words) for _ in range(3000))
    budget = TokenBudget(_word_tokens, 80)
    chunks = split_text(text, 1200, 120, fits=budget.fits)
    assert_well_formed(text, chunks, 1200)
    assert all(budget.fits(c.text) for c in chunks)
    # Without the budget the same windows would overflow it: the budget is what cut them.
    assert not all(budget.fits(c.text) for c in split_text(text, 1200, 120))
    # Windows stay long: the budget is used, not a few words per chunk.
    assert min(_word_tokens(c.text) for c in chunks[:-1]) >= 40


def test_token_budget_keeps_overlap_and_prefers_word_boundaries():
    from projections.chunking import TokenBudget

    text = " ".join(f"Wort{i}" for i in range(400))
    chunks = split_text(text, 1000, 50, fits=TokenBudget(_word_tokens, 60).fits)
    assert_well_formed(text, chunks, 1000)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert prev.end - nxt.start >= 50  # the overlap survives the shorter windows
        assert text[prev.end - 1] == " " or prev.end == len(text)  # cut after a space, not inside a word


def test_text_that_never_fits_still_terminates_with_short_windows():
    text = "x" * 500  # one "word": the stand-in counts 3 tokens for any window of it
    chunks = split_text(text, 200, 20, fits=lambda window: False)
    assert_well_formed(text, chunks, 200)
    assert all(c.end - c.start <= 21 for c in chunks)


def test_windows_that_fit_are_unchanged_by_the_budget():
    text = "Ein kurzer Satz. " * 200
    assert split_text(text, 300, 30, fits=lambda window: True) == split_text(text, 300, 30)

"""The detector's shortcuts change no result: each rule's trigger (`Rule.needs`) is in every match of its
pattern, proven from the parsed pattern; skipping the rules whose trigger is missing loses no finding; the
fast fold (printable ASCII a stretch at a time) and the checks that skip a normalisation step when it cannot
apply give the copy and the map the plain way gives."""

from __future__ import annotations

import json
import random
import re
from re import _constants as sre  # the parser's own types: the proof below reads parsed patterns
from re import _parser as sre_parse

import pytest

from apps.dev.checkout import REPO_ROOT
from search.evidence import injection
from search.evidence.injection import RULES, Normalised, normalise, scan

DATA = REPO_ROOT / "tests" / "data" / "injection"
TEXTS = [
    json.loads(line)["text"]
    for name in ("attacks.jsonl", "benign_de.jsonl")
    for line in (DATA / name).read_text(encoding="utf-8").splitlines()
    if line.strip()
]
_FEW = 5000  # most strings a run of pattern items is expanded to


def _item_strings(op, av) -> set[str] | None:
    """The strings one parsed item matches, if there are few (None: many, or any of a class)."""
    if op is sre.LITERAL:
        return {chr(av)}
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):  # zero width: nothing of the match
        return {""}
    if op is sre.IN:
        chars: set[str] = set()
        for item_op, item_av in av:
            if item_op is sre.LITERAL:
                chars.add(chr(item_av))
            elif item_op is sre.RANGE and item_av[1] - item_av[0] < 64:
                chars.update(map(chr, range(item_av[0], item_av[1] + 1)))
            else:  # a negated set, \w, \s ...
                return None
        return chars
    if op is sre.SUBPATTERN:
        return _strings(av[3])
    if op is sre.BRANCH:
        out: set[str] = set()
        for alternative in av[1]:
            strings = _strings(alternative)
            if strings is None:
                return None
            out |= strings
        return out
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[1] <= 4:
        inner = _strings(av[2])
        if inner is None:
            return None
        out, repeated = set(), {""}
        for count in range(av[1] + 1):
            if count >= av[0]:
                out |= repeated
            repeated = {a + b for a in repeated for b in inner}
        return out
    return None


def _strings(items) -> set[str] | None:
    out = {""}
    for op, av in items:
        strings = _item_strings(op, av)
        if strings is None:
            return None
        out = {a + b for a in out for b in strings}
        if len(out) > _FEW:
            return None
    return out


def _every_match_holds(items, stems: tuple[str, ...]) -> bool:
    """True if every string the parsed items match holds one of `stems` (False: not proven)."""
    items = list(items)
    # A run of consecutive items with few strings: the match holds one of them.
    for start in range(len(items)):
        run = {""}
        for op, av in items[start:]:
            strings = _item_strings(op, av)
            if strings is None:
                break
            run = {a + b for a in run for b in strings}
            if len(run) > _FEW:
                break
            if all(any(stem in string for stem in stems) for string in run):
                return True
    # Or one item that always holds one: a group, alternatives that all do, a repeat at least once.
    for op, av in items:
        if op is sre.SUBPATTERN and _every_match_holds(av[3], stems):
            return True
        if op is sre.BRANCH and all(_every_match_holds(alternative, stems) for alternative in av[1]):
            return True
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[0] >= 1 and _every_match_holds(av[2], stems):
            return True
    return False


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_each_group_of_a_trigger_is_in_every_match_of_the_pattern(rule):
    parsed = sre_parse.parse(rule.pattern, re.MULTILINE)
    assert rule.needs and all(group and all(group) for group in rule.needs)
    for group in rule.needs:
        assert _every_match_holds(parsed, group), (rule.name, group)
    assert not _every_match_holds(parsed, ("no such stem",))  # the proof is not vacuous


def test_the_proof_rejects_a_string_the_pattern_can_do_without():
    parsed = sre_parse.parse(r"\b(?:ignore|disregard) (?:all )?previous\b", 0)
    assert _every_match_holds(parsed, ("ignore", "disregard"))
    assert _every_match_holds(parsed, ("previous",))
    assert not _every_match_holds(parsed, ("ignore",))
    assert not _every_match_holds(parsed, ("all",))


def _variants(seed: int, count: int) -> list[str]:
    """Corpus strings with characters dropped, inserted, doubled or cased, and joined pairs."""
    rng = random.Random(seed)
    extra = list("aou .,:-_\n\t\u200b\u00ad\u0308\u00e4\u00df\u0130\u0435137")
    out = []
    for _ in range(count):
        chars = list(rng.choice(TEXTS))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(chars) + 1)
            action = rng.randrange(4)
            if action == 0 and at < len(chars):
                del chars[at]
            elif action == 1:
                chars.insert(at, rng.choice(extra))
            elif action == 2 and at < len(chars):
                chars.insert(at, chars[at])
            else:
                chars = list("".join(chars).upper())
        out.append("".join(chars))
    return out + [rng.choice(TEXTS) + rng.choice(["\n", " ", ""]) + rng.choice(TEXTS) for _ in range(count // 4)]


SAMPLES = TEXTS + _variants(48, 2000)


def test_skipping_the_rules_without_their_trigger_loses_no_finding(monkeypatch):
    fast = [scan(text) for text in SAMPLES]
    monkeypatch.setattr(injection, "_rules_to_try", lambda copy: list(injection._COMPILED))
    assert [scan(text) for text in SAMPLES] == fast
    assert sum(bool(findings) for findings in fast) > len(TEXTS) // 2


def _normalise_plainly(text: str) -> Normalised:
    """`normalise` without its shortcuts: each character folded, each step run, every word read for leetspeak."""
    norm = injection._fold_each(text)
    norm = injection._keep_only(norm, injection._SPACED_OUT, injection._spaced_out_letters)
    norm = injection._keep_only(norm, injection._WHITESPACE_RUN, injection._one_whitespace)
    norm = injection._keep_only(norm, injection._HYPHENATED, lambda match: [])
    words = []
    for word in re.split(r"(\w+)", norm.text):
        mixed = not (word.isalpha() or word.isdigit()) and any(c.isalpha() for c in word)
        words.append(word.translate(injection._LEET) if mixed else word)
    return Normalised("".join(words), norm.origin)


def test_the_shortcuts_of_normalise_give_the_copy_and_the_map_of_the_plain_way():
    tricky = [
        "", "A", "\u0308", "a\u0308", "a\u200b\u0308", "\u00e4\u0308", "U\u0308ber", "\u0130stanbul", "\x00\x7f\t\r",
        "Stra\u00dfe \u1e9e \ufb01 \uff21", "i g n o r e", "a  b\n\n c", "Anwei-\nsungen", "1gn0r3 \u00a7 573a x\u00b2",
        "\U0001d5c2\U0001d5c0\U0001d5c7", "\u2460 \u2167 \u0661\u0662",
    ]  # fmt: skip
    for text in tricky + SAMPLES:
        fast, plain = normalise(text), _normalise_plainly(text)
        assert (fast.text, fast.origin) == (plain.text, plain.origin), text


def test_printable_ascii_folds_as_str_lower_folds_it():
    for ch in "\n" + "".join(map(chr, range(0x20, 0x7F))):
        assert not injection._NOT_PLAIN.match(ch)
        assert injection._fold(ch) == ch.lower()

"""Flag (or redact) passages of document text that read as instructions to a language model.

Text handed to an agent is data. A passage that tries to steer the model reading it ("ignoriere alle
vorherigen Anweisungen", a chat-template role marker, a tool call, characters a reader cannot see) is
reported as a `Finding`: its kind, the rule that matched and its span in the original text. `sanitise`
then leaves the text as it is (mode "flag", the default) or replaces each span (mode "redact").

How: the text is normalised once into a copy that remembers, for each of its characters, the original
character it came from (compatibility forms and case folded, invisible characters dropped, spaced-out
letters and hyphenated words joined, leetspeak digits and look-alike letters of other scripts read as Latin
letters, umlauts and ß spelt out, whitespace runs made one). The rules of one table (`RULES`) are matched
against that copy and their spans mapped back. Characters that hide text or reorder it (Unicode tag
characters, runs of zero-width characters, bidirectional controls) are found in the original text itself.

Every pattern is free of nested quantifiers and each gap in it is bounded, so a scan takes time linear in
the text's length (times the longest gap), whatever the input.

Speed (a scan runs on every search hit): each rule names its trigger, strings one of which every match of its
pattern holds (`Rule.needs`, proven against the parsed pattern in the unit tests); a pattern whose trigger
the copy lacks is not tried, which on ordinary legal text is nearly all of them. Normalising lower-cases
printable ASCII a stretch at a time and folds only the other characters one by one, and skips a step when a
cheap search shows it has nothing to do. Neither shortcut changes a finding or a span.

Precision over German statutes: the German verbs are imperatives addressed to the model ("ignoriere",
"vergessen Sie"), not the third person a statute or a judgment uses ("missachtet der Arbeitnehmer die
Weisungen"); words such as "System", "Assistent" or "Anweisung" count only in the shapes a prompt gives
them (a role label with a colon at a line start, "neue Anweisung:", a template token).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Kind = Literal["override", "role_marker", "tool_call", "exfiltration", "hidden_unicode", "bidi_control"]
Mode = Literal["flag", "redact"]

#: What `sanitise(..., mode="redact")` puts where a finding was.
REDACTION = "[entfernt]"


@dataclass(frozen=True, slots=True)
class Finding:
    """One passage that reads as an instruction to a model: `text[start:end]` of the scanned text."""

    kind: Kind
    rule: str  # the name of the table row (or the character check) that matched
    start: int  # code-point offsets into the original text
    end: int


@dataclass(frozen=True, slots=True)
class Sanitised:
    """The text to hand on (unchanged in mode "flag", spans replaced in mode "redact") and what was found."""

    text: str
    findings: tuple[Finding, ...]

    @property
    def flagged(self) -> bool:
        return bool(self.findings)


# --- Normalisation --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Normalised:
    """The matching copy of a text: `origin[i]` is the index in the original of `text[i]`'s source character."""

    text: str
    origin: list[int]

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span `[start, end)` of the copy covers (end exclusive; `end > start`)."""
        return self.origin[start], self.origin[end - 1] + 1


_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
# Letters (Mn/Cf aside) that render as nothing: Hangul fillers, the Mongolian vowel separator.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u180e")
_PUNCTUATION = {
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u00ab\u00bb\u2033\u301d\u301e\uff02", '"'),
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2039\u203a", "'"),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
}
# Letters of other scripts that look like Latin ones (after case folding): "Ignorе" with a Cyrillic е.
_HOMOGLYPHS = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "һ": "h", "ԁ": "d", "ԛ": "q",
    "ԝ": "w", "ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "μ": "m", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ω": "w",
    # Armenian
    "օ": "o", "ս": "u", "ց": "g", "ք": "p",
}  # fmt: skip
_COMBINING_DIAERESIS = "\u0308"
_SPELT_OUT_UMLAUT_BASE = frozenset("aou")  # ä, ö, ü read as ae, oe, ue (what the rules are written in)
_LEET = str.maketrans("013457", "oieast")


@lru_cache(maxsize=8192)
def _fold(ch: str) -> str:
    """What one original character contributes to the copy: '' for an invisible one; a combining
    diaeresis is kept so `normalise` can spell the umlaut out after its base letter."""
    if ch.isspace():
        return "\n" if ch in _LINE_BREAKS else " "
    category = unicodedata.category(ch)
    if category in ("Cf", "Cc") or ch in _INVISIBLE_LETTERS:
        return ""
    if ch in _PUNCTUATION:
        return _PUNCTUATION[ch]
    out = []
    for part in unicodedata.normalize("NFKD", ch).casefold():
        if part == _COMBINING_DIAERESIS:
            out.append(part)
        elif not unicodedata.category(part).startswith("M"):  # other accents, variation selectors
            out.append(_HOMOGLYPHS.get(part, part))
    return "".join(out)


# Three or more single letters or digits, each one apart by one separator: "i g n o r e", "i.g.n.o.r.e".
_SPACED_OUT = re.compile(r"(?<![^\W_])[^\W_](?:[ .\-_*+~/·][^\W_]){2,}(?![^\W_])")
# What each such run holds (its second and third letter, after a separator each, the third at the run's end or
# before the next separator): searched for first, because a pattern that starts with a set of characters is
# fast to search (and one that starts with a look-behind is not).
_SPACED_OUT_PART = re.compile(r"[ .\-_*+~/·][^\W_][ .\-_*+~/·][^\W_](?![^\W_])")
_WHITESPACE_RUN = re.compile(r"[ \n]{2,}")
# A word hyphenated at a line break (text extracted from PDFs): "Anwei-\nsungen".
_HYPHENATED = re.compile(r"(?<=[^\W\d_])- ?\n ?(?=[^\W\d_])")
# A word (a run of \w) with a digit `_LEET` reads as a letter; a word of digits and letters has a digit next to
# a letter.
_LEET_WORD = re.compile(r"\b\w*[013457]\w*")
_DIGIT_BY_LETTER = re.compile(r"\d(?:(?=[^\W\d])|(?<=[^\W\d]\d))")


def _spaced_out_letters(match: re.Match[str]) -> list[int] | None:
    """Keep the letters of a spaced-out run (every second character); runs of digits ("1 2 3") stay."""
    letters = range(match.start(), match.end(), 2)
    text = match.string
    return list(letters) if sum(text[i].isalpha() for i in letters) >= 2 else None


def _one_whitespace(match: re.Match[str]) -> list[int]:
    """A whitespace run becomes its first line break, or its first space."""
    newline = match.group().find("\n")
    return [match.start() + max(newline, 0)]


def _keep_only(
    norm: Normalised, pattern: re.Pattern[str], keep: Callable[[re.Match[str]], list[int] | None]
) -> Normalised:
    """Each match of `pattern` shrinks to the positions `keep` chooses (None: left as it is)."""
    text, origin = norm.text, norm.origin
    parts: list[str] = []
    origins: list[int] = []
    last = 0
    for match in pattern.finditer(text):
        kept = keep(match)
        if kept is None:
            continue
        parts.append(text[last : match.start()])
        origins.extend(origin[last : match.start()])
        parts.append("".join(text[i] for i in kept))
        origins.extend(origin[i] for i in kept)
        last = match.end()
    if last == 0:
        return norm
    parts.append(text[last:])
    origins.extend(origin[last:])
    return Normalised("".join(parts), origins)


def _read_leetspeak(text: str) -> str:
    """Digits inside words that also hold letters read as letters ("1gn0r3" -> "ignore"); "§ 573" stays."""
    if not _DIGIT_BY_LETTER.search(text):
        return text
    parts: list[str] = []
    last = 0
    for match in _LEET_WORD.finditer(text):
        word = match.group()
        if not any(c.isalpha() for c in word):  # a number
            continue
        parts.append(text[last : match.start()])
        parts.append(word.translate(_LEET))
        last = match.end()
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)


# What `_fold` makes of a character, with a combining diaeresis of its own spelt out ("ä" -> "ae") or dropped
# ("ë" -> "e"), filled as characters are met.
_FOLDED: dict[str, str] = {}
_FOLDED_MAX = 65_536  # characters remembered (more are folded each time they are met)
# The characters `str.lower` does not fold as `_fold` does: all but printable ASCII and the line feed.
_NOT_PLAIN = re.compile(r"[^\n\x20-\x7e]")


def _folded(ch: str) -> str | None:
    """`_fold(ch)` with its diaeresis spelt out or dropped; None if that depends on the character before."""
    if ch in _FOLDED:
        return _FOLDED[ch]
    out: list[str] = []
    for part in _fold(ch):
        if part != _COMBINING_DIAERESIS:
            out.append(part)
        elif not out:
            return None  # spelt out or dropped by what the character before it became: `_fold_each` decides
        elif out[-1] in _SPELT_OUT_UMLAUT_BASE:
            out.append("e")
    folded = "".join(out)
    if len(_FOLDED) < _FOLDED_MAX:
        _FOLDED[ch] = folded
    return folded


def _fold_text(text: str) -> Normalised | None:
    """`_fold` over the text: printable ASCII lower-cased a stretch at a time, the other characters looked up
    one by one (None if one of them is a diaeresis that needs the character before it)."""
    parts: list[str] = []
    origin: list[int] = []
    last = 0  # text[last:] not yet folded; origin covers text[:last]
    for match in _NOT_PLAIN.finditer(text):
        at = match.start()
        folded = _folded(match.group())
        if folded is None:
            return None
        if last < at:
            parts.append(text[last:at].lower())
            origin.extend(range(last, at))
        parts.append(folded)
        origin.extend([at] * len(folded))
        last = at + 1
    parts.append(text[last:].lower())
    origin.extend(range(last, len(text)))
    return Normalised("".join(parts), origin)


def _fold_each(text: str) -> Normalised:
    """`_fold` character by character (what `_fold_text` does faster where it can)."""
    chars: list[str] = []
    origin: list[int] = []
    for index, ch in enumerate(text):
        for out in _fold(ch):
            if out == _COMBINING_DIAERESIS:
                if chars and chars[-1] in _SPELT_OUT_UMLAUT_BASE:
                    chars.append("e")
                    origin.append(index)
                continue
            chars.append(out)
            origin.append(index)
    return Normalised("".join(chars), origin)


def normalise(text: str) -> Normalised:
    """The copy the rules are matched against (see the module docstring), with its map back to `text`."""
    norm = _fold_text(text)
    if norm is None:
        norm = _fold_each(text)
    if _SPACED_OUT_PART.search(norm.text):
        norm = _keep_only(norm, _SPACED_OUT, _spaced_out_letters)
    if "\n" in norm.text or "  " in norm.text:
        norm = _keep_only(norm, _WHITESPACE_RUN, _one_whitespace)
    if "\n" in norm.text:  # a hyphenated word is broken at a line break
        norm = _keep_only(norm, _HYPHENATED, lambda match: [])
    return Normalised(_read_leetspeak(norm.text), norm.origin)  # one character for one: the map holds


# --- The rules ------------------------------------------------------------------------------------------------


def _any(*alternatives: str) -> str:
    return "(?:" + "|".join(alternatives) + ")"


# A few words inside one sentence (a line break may fall between them: text extracted from PDFs).
_GAP = r"[^.!?;]{0,40}?"
_SHORT_GAP = r"[^.!?;]{0,25}?"
# "shall not ignore the above instructions" is an obligation, not an attack.
_EN_NOT_NEGATED = r"(?<!\bnot )(?<!\bnever )(?<!n't )"
_SENTENCE_START = r"(?:^|[.!?:]\s)"

_EN_DROP_WORDS = ("ignore", "disregard", "forget", "bypass", "discard", "skip")
_EN_DROP = _any(*_EN_DROP_WORDS)
_EN_EARLIER = _any(
    "previous", "prior", "preceding", "above", "earlier", "foregoing", "former", "original", "initial", "all",
    "your", "system", "developer", "safety",
)  # fmt: skip
_EN_EARLIER_STRICT = _any("previous", "prior", "preceding", "above", "earlier", "original", "initial", "system",
                          "developer", "your")  # fmt: skip
_EN_ORDERS = _any(
    r"instructions?", r"prompts?", "rules", "directions", r"directives?", "guidelines", "guidance", r"commands?",
    "context", "constraints", "restrictions", "guardrails", "programming", "messages", "conversation", "text",
    "policies",
)  # fmt: skip
# Machine readers, without the words an office uses for people ("assistant to the Board", "Dear Assistant
# Professor") ...
_AI_EN_STRICT = _any(
    "ai", r"a\.i\.", r"llms?", "large language model", r"language models?", r"ai assistants?", r"chatbots?",
    r"ai agents?", r"ai models?", "gpt", "chatgpt", "claude", "copilot", "gemini",
)  # fmt: skip
# ... and with them where the sentence already speaks to the model ("you are a helpful assistant").
_AI_EN = _any(
    _AI_EN_STRICT, "bot", r"assistant(?! (?:to|of|for|at|in|manager|professor|director|editor|secretary|judge)\b)"
)

# Imperatives addressed to the model (du, ihr, Sie). The plural "-t" forms double as the third person
# ("Ignoriert der Schuldner alle ..."), so they count only before "alle"/"sämtliche"/"jegliche"/"eure".
_DE_DROP = (
    _any(
        "ignoriere", "ignorier", "ignorieren sie", "vergiss", "vergessen sie", "missachte", "missachten sie",
        "verwirf", "verwerfen sie", "uebergehe", "uebergehen sie", "ueberspringe", "ueberspringen sie", "umgehe",
        "umgehen sie",
        r"(?:ignoriert|missachtet|vergesst|uebergeht|verwerft)(?= (?:alle|saemtliche|jegliche|eure))",
    )
    + r"\b(?! nicht)"  # "Vergessen Sie nicht, alle Regeln ..." reminds, it does not override
)  # fmt: skip
# What every match of _DE_DROP holds ("ignorier" in "ignoriere", "ignorieren sie", "ignoriert" ...).
_DE_DROP_STEMS = ("ignorier", "vergiss", "vergess", "missachte", "verwirf", "verwerf", "uebergeh", "ueberspringe",
                  "umgehe")  # fmt: skip
_DE_EARLIER = _any(
    "alle", "saemtliche", "jegliche", "vorherige", "vorige", "vorangegangene", "vorangehende", "vorstehende",
    "obige", "oben genannte", "bisherige", "fruehere", "urspruengliche", "alte", "deine", "ihre", "eure",
    "dir gegebene", "ihnen gegebene", "erhaltene", "system",
) + r"\w{0,3}"  # fmt: skip
_DE_EARLIER_STRICT = _any(
    "vorherige", "vorige", "vorangegangene", "obige", "bisherige", "fruehere", "urspruengliche", "alte", "deine",
    "eure", "system",
) + r"\w{0,3}"  # fmt: skip
_DE_ORDERS = _any(
    "anweisung", "instruktion", "regel", "vorgabe", "befehl", "richtlinie", "anordnung", "weisung", "prompt",
    "system-?prompt", "einschraenkung", "beschraenkung", "sicherheitsregel", "programmierung", "leitlinie",
    "direktive", "auftrag", "auftraege", "kontext", "nachricht", "text",
) + r"\w{0,4}"  # fmt: skip
# "Missachten Sie die bisherigen Vorgaben, droht ein Bußgeld": a condition in a leaflet, not an order.
_NOT_A_CONDITION_DE = (
    r"(?!,? (?:droht|drohen|kann|koennen|wird|werden|entfaellt|haftet|haften|muss|muessen|ist|sind)\b)"
)
_DE_DROP_DU = (
    _any("ignoriere", "ignorier", "vergiss", "missachte", "verwirf", "uebergehe", "ueberspringe", "umgehe")
    + r"\b(?! nicht)"
)
_DE_ORDERS_PLURAL = _any(
    "anweisungen", "instruktionen", "regeln", "vorgaben", "befehle", "richtlinien", "weisungen", "beschraenkungen",
    "einschraenkungen",
)  # fmt: skip
_AI_DE = _any(
    "ki", "llm", "sprachmodell", r"ki-\w{2,12}", "assistent", "chatbot", "bot", "modell", "chatgpt", "claude",
    "copilot", "gemini",
) + r"\w{0,2}\b(?!-)"  # fmt: skip
# Machine readers without the words a statute uses for people ("Assistent", "Modell", "Bote").
_AI_DE_STRICT = _any("ki", "llm", "sprachmodell", r"ki-\w{2,12}", "chatbot", "chatgpt", "claude", "copilot",
                     "gemini") + r"\w{0,2}\b(?!-)"  # fmt: skip
_AI_DE_STRICT_STEMS = ("ki", "llm", "sprachmodell", "chat", "claude", "copilot", "gemini")
_NOW_DE = _any("jetzt", "nun", "ab sofort", "von nun an", "ab jetzt", "ab heute", "fortan", "ab diesem moment")
# A link or a mail address ("https://", "ftp://", "www.", "name@host.de").
_URL_STEMS = ("://", "www.", "@")


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    kind: Kind
    pattern: str
    # The rule's trigger, a necessary condition: for each group, every match of `pattern` holds one of its
    # strings (a literal part the pattern cannot match without). A copy that holds none of some group's strings
    # cannot match, so `scan` does not try the pattern on it and loses no finding. The unit tests prove each
    # group from the parsed pattern.
    needs: tuple[tuple[str, ...], ...]


#: The table: one row a pattern, matched against the normalised copy (lower case, umlauts spelt out,
#: whitespace runs made one space or line break), with its trigger (the group rarest in legal text first: the
#: others are looked for only when it is there). Comments say why a row is there.
RULES: tuple[Rule, ...] = (
    # -- Overrides: the classic "forget what you were told". English needs an earlier/all/your qualifier
    # ("ignore any instructions of the Engineer" is a contract), German an imperative verb first.
    Rule("ignore_previous_en", "override",
         rf"\b{_EN_NOT_NEGATED}{_EN_DROP}\b{_GAP}\b{_EN_EARLIER}\b{_GAP}\b{_EN_ORDERS}\b",
         needs=(_EN_DROP_WORDS,)),
    Rule("ignore_the_above_en", "override",
         rf"\b{_EN_NOT_NEGATED}{_any('ignore', 'disregard', 'forget')} (?:all |everything |anything )?"
         r"(?:of )?(?:the |what is |what was |what came |what you were told |what you have been told )?"
         r"(?:above|before|so far)\b",
         needs=(("ignore", "disregard", "forget"),)),
    Rule("stop_following_en", "override",
         rf"\b(?:do not|don't|stop|no longer) (?:follow|obey|adhere to|comply with|following|obeying)\b{_GAP}"
         rf"\b{_EN_EARLIER_STRICT}\b{_GAP}\b{_EN_ORDERS}\b",
         needs=(("follow", "obey", "adhere to", "comply with"),)),
    Rule("ignore_previous_de", "override",
         rf"\b{_DE_DROP}{_GAP}\b{_DE_EARLIER}\b{_GAP}\b{_DE_ORDERS}\b{_NOT_A_CONDITION_DE}",
         needs=(_DE_DROP_STEMS,)),
    # With "du" the imperative alone is the tell, whatever follows: "Ignoriere Datenschutzvorgaben".
    Rule("ignore_orders_de", "override",
         rf"\b{_DE_DROP_DU}{_SHORT_GAP}\b\w{{0,20}}{_DE_ORDERS_PLURAL}\b{_NOT_A_CONDITION_DE}",
         needs=(_DE_DROP_STEMS,)),
    # "Setzen Sie die bisherigen Regeln fort / um" continues them; only "außer Kraft" overrides.
    Rule("suspend_rules_de", "override",
         rf"\b(?:setze|setzt|setzen sie)\b{_GAP}\b{_DE_EARLIER}\b{_GAP}\b{_DE_ORDERS}\b ausser kraft\b",
         needs=(("ausser kraft",),)),
    Rule("forget_everything_de", "override",
         rf"\b{_DE_DROP} (?:bitte )?(?:alles|das (?:obige|oben stehende|vorherige|vorangegangene|bisherige|"
         rf"vorstehende|zuvor gesagte))\b{_NOT_A_CONDITION_DE}",
         needs=(_DE_DROP_STEMS,)),
    Rule("stop_following_de", "override",
         r"\b(?:befolge|befolgt|befolgen sie|beachte|beachten sie|folge|folgen sie|gehorche)\b"
         rf"{_GAP}\b(?:nicht mehr|nicht laenger|keine|keinerlei)\b{_GAP}\b{_DE_EARLIER_STRICT}\b{_GAP}"
         rf"\b{_DE_ORDERS}\b",
         needs=(("nicht mehr", "nicht laenger", "keine"), ("folge", "befolgt", "beachte", "gehorche"))),
    Rule("stop_following_after_de", "override",
         rf"\b(?:befolge|befolgt|befolgen sie|beachte|beachten sie|folge|folgen sie)\b{_GAP}"
         rf"\b{_DE_EARLIER_STRICT}\b{_GAP}\b{_DE_ORDERS}\b (?:ab sofort |ab jetzt )?(?:nicht mehr|nicht laenger)",
         needs=(("nicht mehr", "nicht laenger"), ("folge", "befolgt", "beachte"))),
    # Spaced-out letters with one space everywhere lose the word breaks: "i g n o r e a l l ..." reads
    # "ignoreall...". Glued forms of the commonest overrides (also camel case, hashtags).
    Rule("glued_override", "override",
         r"(?:ignore|disregard|forget)(?:all|the|any|your)?(?:previous|prior|above|earlier|preceding|system)"
         r"(?:instructions?|prompts?|rules)"
         r"|(?:ignoriere|vergiss|missachte)(?:alle)?(?:vorherigen|obigen|bisherigen|vorigen|deine)"
         r"(?:anweisungen|instruktionen|regeln)"
         r"|dubist(?:jetzt|nun|absofort)|youarenow",
         needs=(("ignore", "disregard", "forget", "ignorier", "vergiss", "missachte", "dubist", "youarenow"),)),
    # -- New roles and rules for the reader: "you are now", "du bist jetzt", "act as an unrestricted AI".
    Rule("you_are_now_en", "override",
         rf"\byou are now\b{_SHORT_GAP}\b(?:{_AI_EN}|dan|unrestricted|unfiltered|uncensored|jailbroken|"
         r"developer mode|evil|persona|character|no longer bound|free from)\b",
         needs=(("you are",),)),
    Rule("you_are_an_ai_en", "override", rf"\b{_EN_NOT_NEGATED}you are (?:a|an)\b{_SHORT_GAP}\b{_AI_EN}\b(?!-)",
         needs=(("you are",),)),
    Rule("from_now_on_en", "override",
         r"\bfrom now on\b,? (?:you (?:will|shall|must|are|should) )?(?:only )?"
         r"(?:respond|answer|reply|act as|behave|pretend|roleplay|ignore|obey)\b",
         needs=(("from now on",),)),
    Rule("act_as_en", "override",
         rf"(?:{_SENTENCE_START}|\bnow |\bplease )(?:act|behave|roleplay|role-play|pose) as\b{_SHORT_GAP}"
         rf"\b(?:{_AI_EN_STRICT}|dan|hacker|unrestricted|unfiltered|uncensored|jailbroken|evil|terminal|shell|persona|"
         r"developer mode|root)\b",
         needs=((" as",), ("act", "behave", "roleplay", "role-play", "pose"))),
    # "It is an offence to pretend to be a solicitor" describes, it does not ask.
    Rule("pretend_en", "override", rf"\b{_EN_NOT_NEGATED}(?<!\bto )pretend (?:to be|you are|that you are|you're)\b",
         needs=(("pretend",),)),
    Rule("new_instructions_en", "override",
         r"\b(?:new|updated|revised|real|actual|true|secret|hidden|override|priority) (?:system )?"
         r"(?:instructions?|directives?|prompt|task|orders|rules) ?:",
         needs=((":",), ("instruction", "directive", "prompt", "task", "orders", "rules"))),
    Rule("you_are_now_de", "override", rf"\bdu bist {_NOW_DE}\b",
         needs=(("du bist",),)),
    Rule("now_you_de", "override",
         rf"\b{_NOW_DE}\b,? (?:bist|antwortest|handelst|agierst|verhaeltst|sprichst|ignorierst|befolgst|spielst|"
         r"gibst|tust|wirst|gehorchst) du\b",
         needs=(("st du",),)),
    Rule("now_you_formal_de", "override",
         rf"\b{_NOW_DE}\b,? (?:antworten|agieren|ignorieren|spielen|gehorchen) sie\b",
         needs=(("en sie",), ("antworten", "agieren", "ignorieren", "spielen", "gehorchen"))),
    Rule("you_are_an_ai_de", "override", rf"\bdu bist (?:eine?|der|die)\b{_SHORT_GAP}\b{_AI_DE}",
         needs=(("du bist",),)),
    Rule("you_are_now_formal_de", "override",
         rf"\bsie sind {_NOW_DE} (?:ein |eine |einen |einer |der |die |das )?"
         r"(?:uneingeschraenkt|ungefiltert|unzensiert|ki\b(?!-)|ki-\w|sprachmodell|chatbot|dan\b|llm)",
         needs=(("sie sind",), ("jetzt", "nun", "ab ", "fortan"))),
    Rule("act_as_de", "override",
         rf"(?:{_SENTENCE_START}|\b(?:jetzt|nun|bitte|ab sofort|von nun an) )(?:(?:handle|agiere|verhalte dich|"
         r"gib dich) (?:ab sofort |ab jetzt |jetzt |nun |bitte |von nun an )?(?:als|wie|aus als)|(?:spiel|spiele|"
         r"uebernimm|schluepfe) (?:ab sofort |ab jetzt |jetzt |nun |bitte |von nun an )?(?:in )?die rolle)\b",
         needs=(("handle", "agiere", "verhalte dich", "gib dich", "die rolle"),)),
    Rule("pretend_de", "override", r"\btue? so,? als (?:ob|waerst|wuerdest|seist|du)\b",
         needs=(("tu so", "tue so"),)),
    Rule("new_instructions_de", "override",
         r"\b(?:neue|aktualisierte|geaenderte|echte|eigentliche|wahre|geheime|versteckte|vorrangige|oberste)\w{0,2}"
         r" (?:system)?(?:anweisung|instruktion|direktive|befehl|aufgabe|prompt)\w{0,3} ?:",
         needs=((":",), ("anweisung", "instruktion", "direktive", "befehl", "aufgabe", "prompt"))),
    # -- Words to the model reading the text: "Note to the AI:", "Hinweis für die KI:", "Falls du eine KI bist".
    Rule("note_to_ai_en", "override",
         rf"\b(?:note|message|instructions?|attention|reminder|hint|memo) (?:to|for) (?:the |any |all |every )?"
         rf"{_AI_EN_STRICT}s?\b(?!-) ?[:,!-]",
         needs=((" to ", " for "),)),
    Rule("if_you_are_ai_en", "override", rf"\bif you are (?:an? )?(?:{_AI_EN}|assistant reading this)\b(?!-)",
         needs=(("you are",),)),
    Rule("hello_ai", "override",
         r"\b(?:dear|hello|hi|hey|attention|achtung|liebe|lieber|hallo) (?:ai|a\.i\.|llm|chatgpt|gpt|claude|"
         r"copilot|gemini|chatbot|ki|ki-assistent|sprachmodell|language model)\b(?!-)",
         needs=(("dear", "hello", "hi ", "hey", "attention", "achtung", "liebe", "hallo"),
                (" ai", " a.i.", " llm", " chat", " gpt", " claude", " copilot", " gemini", " ki", " sprachmodell",
                 " language model"))),
    Rule("note_to_ai_de", "override",
         r"\b(?:hinweis|nachricht|anweisung|botschaft|info|information|befehl|auftrag|achtung)\w{0,2} (?:fuer|an) "
         rf"(?:die |den |das |alle |jede |jeden |jedes |eine |einen )?{_AI_DE_STRICT} ?[:,!-]",
         needs=((" fuer ", "an "), _AI_DE_STRICT_STEMS,
                ("hinweis", "nachricht", "anweisung", "botschaft", "info", "befehl", "auftrag", "achtung"))),
    Rule("to_the_ai_de", "override", rf"(?:^|[.!?:] )an (?:alle |die |den |das |jede |jeden |jedes )?{_AI_DE_STRICT}",
         needs=(("an ",), _AI_DE_STRICT_STEMS)),
    Rule("your_new_task", "override",
         r"\b(?:your|deine|ihre) (?:new|real|actual|true|neue|eigentliche|wahre|echte) (?:task|instructions?|job|"
         r"goal|aufgabe|anweisung|instruktion|ziel)\w{0,2} (?:is|are|ist|lautet|lauten|sind)\b",
         needs=(("your ", "deine", "ihre "),
                (" new ", " real ", " actual ", " true ", " neue ", " eigentliche ", " wahre ", " echte "))),
    Rule("if_you_are_ai_de", "override",
         rf"\b(?:falls|wenn|sofern) (?:du|sie) (?:eine?|der|die) {_AI_DE} ?(?:bist|sind|liest|lesen)\b",
         needs=(("falls du", "wenn du", "sofern du", "falls sie", "wenn sie", "sofern sie"),
                ("bist", "sind", "liest", "lesen"))),
    # -- Encoded payloads the reader is told to decode and obey ("base64" reads "base6a" after leetspeak).
    Rule("encoded_payload", "override",
         rf"\b(?:decode|dekodiere|entschluessele|entschluessle)\b{_GAP}\b(?:and|und|then|dann)\b{_SHORT_GAP}"
         rf"\b(?:follow|execute|run|obey|befolge|fuehre|folge)\b|\bbase6[4a]\b{_GAP}\b(?:as instructions?|als "
         r"anweisung|als befehl|ausfuehren|execute|follow|befolge|befolgen)",
         needs=(("decode", "dekodiere", "entschluess", "base6"),)),
    # -- Jailbreak vocabulary no statute uses (the word "Jailbreaking" alone names a thing done to phones).
    Rule("jailbreak", "override",
         r"\b(?:do anything now|dan mode|developer mode (?:enabled|activated|on)|entwicklermodus (?:aktiviert|an|"
         r"ein)|jailbreak(?:ed)? mode|jailbroken|god mode|unrestricted mode|uneingeschraenkte\w{0,2} modus)\b",
         needs=((" mode", "modus", "jailbroken", "do anything now"),)),
    # -- Keep it from the user: the model is told to hide what it does.
    Rule("hide_from_user_en", "override",
         r"\b(?:do not|don't|never) (?:tell|inform|mention|reveal|disclose|show|alert|notify) (?:this |anything )?"
         r"(?:about this )?(?:to )?(?:the )?(?:user|human|reader|operator)s?\b|\bwithout (?:telling|alerting) the "
         r"(?:user|human)\b",
         needs=(("user", "human", "reader", "operator"), ("do not", "don't", "never", "without"))),
    Rule("hide_from_user_de", "override",
         rf"\b(?:sag|sage|erwaehne|verrate|zeige|teile|erzaehle|informiere)\b{_SHORT_GAP}\b(?:dem|den|der) "
         rf"(?:nutzer|benutzer|anwender|user|menschen|leser|mandant|kunde)\w{{0,3}}\b{_SHORT_GAP}\bnichts?\b",
         needs=(("nicht",), ("nutzer", "anwender", "user", "menschen", "leser", "mandant", "kunde"),
                ("sag", "erwaehne", "verrate", "zeige", "teile", "erzaehle", "informiere"))),
    # -- Role and system markers: chat-template tokens anywhere, role labels at a line (or sentence) start,
    # prompt-format headings. "System der sozialen Sicherung" or "der Assistent" have no colon or brackets.
    Rule("chat_template_token", "role_marker", r"<\|[a-z_]{2,30}\|>",
         needs=(("|",),)),
    Rule("inst_marker", "role_marker",
         r"\[/?inst\]|<</?sys>>|</s> ?(?:<s>|\[inst\]|<\||(?:system|user|assistant|human) ?:)|<s> ?\[inst\]",
         needs=(("]", ">"),)),
    Rule("bracketed_role", "role_marker",
         r"\[/?(?:system|sys|admin|administrator|developer|assistant)(?: (?:message|prompt|note|override|"
         r"instructions?))?\]",
         needs=(("[",), ("sys", "admin", "developer", "assistant"))),
    # A bare label ("System: SAP S/4HANA", "Developer: Acme Ltd.") is an annex's field; as a chat role it
    # speaks to the model ("System: du bist ...") or answers as it ("Assistant: Sure, here are ...").
    Rule("role_label", "role_marker",
         r"(?:^|[.!?] )[ >*#-]{0,3}(?:system|assistant|developer|override) ?:[^\n]{0,80}?\b(?:you|your|du|dich|"
         r"dir|dein\w{0,2}|ignore|ignoriere|sure|certainly|understood|verstanden|i will|i'll|ich werde|here is|"
         r"here are|hier ist|hier sind|all (?:earlier|previous|prior))\b",
         needs=((":",), ("system", "assistant", "developer", "override"))),
    Rule("system_prompt_label", "role_marker",
         r"\b(?:system|developer|admin|administrator|entwickler)[- ]?(?:prompt|anweisung|instruktion|nachricht|"
         r"message|instruction|override|befehl)\w{0,2} ?:",
         needs=((":",), ("system", "developer", "admin", "entwickler"),
                ("prompt", "anweisung", "instruktion", "nachricht", "message", "instruction", "override", "befehl"))),
    Rule("prompt_heading", "role_marker",
         r"^#{1,4} ?(?:instruction|instructions|system|system prompt|response|input|human|user|assistant|"
         r"anweisung|systemanweisung) ?:",
         needs=(("#",), (":",))),
    # -- Tool-call syntax: an agent framework might execute it.
    Rule("tool_call_tag", "tool_call",
         r"</?(?:tool_call|tool_calls|tool_use|tool_result|function_call|function_calls|functioncall|invoke)\b"
         r"|<function=[\w.-]{1,60}>|<function name=|<parameter name=",
         needs=(("<",), ("tool_", "function", "invoke", "parameter name="))),
    Rule("tool_call_json", "tool_call",
         r"\{ ?\"(?:name|tool|function|tool_name|action)\" ?: ?\"[^\"\n]{1,80}\" ?, ?\"(?:arguments|parameters|args|"
         r"input|tool_input|action_input)\" ?:",
         needs=(("{",), ('"',))),
    Rule("tool_call_word", "tool_call",
         r"\b(?:function_call|tool_calls?|tool_use|tool_choice)\b|\bfunctions\.\w{2,40}\(",
         needs=(("tool_", "function"),)),
    # -- Exfiltration: a markdown image loads its URL (with the query the model filled in) as soon as the
    # answer renders; "send ... to http" asks the agent to ship data out; "reveal your system prompt".
    Rule("image_with_query", "exfiltration",
         r"!\[[^\]\n]{0,200}\]\( ?<?(?:https?:)?//[^\s)?]{1,300}\?[^\s)]{0,300}\)"
         r"|<img\b[^>]{0,200}?\bsrc ?= ?[\"']?(?:https?:)?//[^\s\"'>?]{1,300}\?",
         needs=(("!", "<"), ("//",))),
    Rule("url_template", "exfiltration", r"https?://[^\s\"'<>?]{1,300}\?[^\s\"'<>]{0,300}?=(?:\{|\[|<|%7b|\$\{)",
         needs=(("=",), ("http",))),
    Rule("send_to_url_en", "exfiltration",
         r"\b(?:send|post|upload|forward|transmit|exfiltrate|leak|append|encode|email|mail)\b[^.!?]{0,40}?"
         r"\b(?:conversation|chat|history|context|system prompt|prompt|secrets?|passwords?|credentials|api keys?|"
         r"tokens?|summary|personal data|user data|email addresses|everything|all data|the data|this data|"
         r"this document|the document)\b[^.!?]{0,60}?\b(?:to|into|at|via) <?(?:https?://|www\.|ftp://|"
         r"[\w.+-]{1,64}@[\w-]{1,63}\.[a-z]{2,})",
         needs=(_URL_STEMS,
                ("send", "post", "upload", "forward", "transmit", "exfiltrate", "leak", "append", "encode", "mail"))),
    Rule("send_to_url_de", "exfiltration",
         r"\b(?:sende|schicke|schick|uebermittle|uebertrage|leite|lade|poste|kopiere|fuege|haenge)\b[^.!?]{0,40}?"
         r"\b(?:alles\b|[\w-]{0,20}?(?:daten|inhalt|verlauf|gespraech|chat|kontext|prompt|passw|kennw|schluessel|"
         r"token|zusammenfassung|adressen|geheimnis|dokument|akte)\w{0,4}\b)[^.!?]{0,60}?"
         r"\b(?:an|zu|nach|auf|in|unter) <?(?:https?://|www\.|[\w.+-]{1,64}@[\w-]{1,63}\.[a-z]{2,})",
         needs=(_URL_STEMS, ("sende", "schick", "uebermittle", "uebertrage", "leite", "lade", "poste", "kopiere",
                             "fuege", "haenge"))),
    Rule("reveal_prompt_en", "exfiltration",
         rf"\b(?:reveal|print|output|repeat|show|display|leak|dump|disclose|write out)\b{_SHORT_GAP}\b(?:(?:your|the) "
         r"(?:system prompt|initial prompt|hidden prompt|original prompt|system message|hidden instructions|"
         r"secret instructions|initial instructions|original instructions)|your (?:instructions|prompt|rules|"
         r"configuration|guidelines))\b",
         needs=(("your ", "the "),
                ("prompt", "system message", "instructions", "rules", "configuration", "guidelines"))),
    Rule("reveal_prompt_de", "exfiltration",
         rf"\b(?:gib|gebe|zeige|zeig|nenne|verrate|wiederhole|drucke|schreibe|kopiere|offenbare)\b{_SHORT_GAP}"
         r"\b(?:(?:deinen|deine|dein|den|die|ihren|ihre) (?:system-?prompt|systemanweisung\w{0,2}|"
         r"systemnachricht\w{0,2}|urspruenglichen? anweisung\w{0,2}|geheimen? anweisung\w{0,2}|versteckten? "
         r"anweisung\w{0,2})|deine\w? (?:anweisung|instruktion|regel|vorgabe|prompt|konfiguration)\w{0,2})",
         needs=(("system", "anweisung", "deine"),
                ("gib", "gebe", "zeig", "nenne", "verrate", "wiederhole", "drucke", "schreibe", "kopiere",
                 "offenbare"))),
)  # fmt: skip

_COMPILED: tuple[tuple[Rule, re.Pattern[str]], ...] = tuple((r, re.compile(r.pattern, re.MULTILINE)) for r in RULES)


def _by_first_stem() -> dict[str, list[int]]:
    """Each string of a rule's first `needs` group, with the rules (their indexes) whose first group holds it:
    a string shared by several rules is looked for once."""
    rules: dict[str, list[int]] = {}
    for index, rule in enumerate(RULES):
        for stem in rule.needs[0]:
            rules.setdefault(stem, []).append(index)
    return rules


_BY_FIRST_STEM = _by_first_stem()


def _rules_to_try(copy: str) -> list[tuple[Rule, re.Pattern[str]]]:
    """The rows of the table whose trigger (`Rule.needs`) the normalised copy holds, in table order: a row
    whose trigger is missing cannot match, so leaving it out loses no finding."""
    first = {index for stem, rules in _BY_FIRST_STEM.items() if stem in copy for index in rules}
    return [
        (rule, pattern)
        for rule, pattern in (_COMPILED[index] for index in sorted(first))
        if all(any(stem in copy for stem in group) for group in rule.needs[1:])
    ]


# --- Characters that hide or reorder text, found in the original ------------------------------------------------

# Unicode tag characters spell ASCII no renderer shows. Emoji flag sequences use them legitimately: a black
# flag followed by two to six tag letters and the cancel tag (the flag of Scotland).
_TAG_RUN = re.compile("[\U000e0000-\U000e007f]+")
_FLAG_TAGS = re.compile("\U0001f3f4[\U000e0061-\U000e007a]{2,6}\U000e007f")
# Four or more zero-width characters in a row carry bits, not typography (one joiner or break is normal).
_ZERO_WIDTH_RUN = re.compile("[\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e]{4,}")
# Embeddings, overrides and isolates reorder what a reader sees against what a model reads.
_BIDI_RUN = re.compile("[\u202a-\u202e\u2066-\u2069]+")
# Any character of the three runs above: most texts have none, and one search says so.
_HIDING = re.compile("[\U000e0000-\U000e007f\u200b\u200c\u200d\u2060-\u2064\ufeff\u180e\u202a-\u202e\u2066-\u2069]")


def _hidden_characters(text: str) -> Iterable[Finding]:
    if text.isascii() or not _HIDING.search(text):
        return
    for match in _TAG_RUN.finditer(text):
        if match.start() > 0 and _FLAG_TAGS.fullmatch(text, match.start() - 1, match.end()):
            continue
        yield Finding("hidden_unicode", "unicode_tags", match.start(), match.end())
    for match in _ZERO_WIDTH_RUN.finditer(text):
        yield Finding("hidden_unicode", "zero_width_run", match.start(), match.end())
    for match in _BIDI_RUN.finditer(text):
        yield Finding("bidi_control", "bidi_control", match.start(), match.end())


# --- Scanning, redacting ---------------------------------------------------------------------------------------


def _merged(findings: Iterable[Finding]) -> list[Finding]:
    """Sorted by position; overlapping findings of one kind become one (the first rule's name kept)."""
    out: list[Finding] = []
    open_by_kind: dict[str, int] = {}  # kind -> index in `out` of its last finding
    for finding in sorted(findings, key=lambda f: (f.start, -f.end, f.kind, f.rule)):
        at = open_by_kind.get(finding.kind)
        if at is not None and finding.start < out[at].end:
            last = out[at]
            out[at] = Finding(last.kind, last.rule, last.start, max(last.end, finding.end))
            continue
        open_by_kind[finding.kind] = len(out)
        out.append(finding)
    return out


def scan(text: str) -> list[Finding]:
    """Every passage of `text` that reads as an instruction to a model, by position (spans into `text`)."""
    if not text:
        return []
    found = list(_hidden_characters(text))
    norm = normalise(text)
    for rule, pattern in _rules_to_try(norm.text):
        for match in pattern.finditer(norm.text):
            if match.end() > match.start():
                start, end = norm.span(match.start(), match.end())
                found.append(Finding(rule.kind, rule.name, start, end))
    return _merged(found)


def redact(text: str, findings: Sequence[Finding], replacement: str = REDACTION) -> str:
    """`text` with every finding's span (overlapping spans joined) replaced by `replacement`."""
    spans: list[list[int]] = []
    for finding in sorted(findings, key=lambda f: f.start):
        if spans and finding.start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], finding.end)
        else:
            spans.append([finding.start, finding.end])
    parts: list[str] = []
    last = 0
    for start, end in spans:
        parts.extend((text[last:start], replacement))
        last = end
    parts.append(text[last:])
    return "".join(parts)


def sanitise(text: str, mode: Mode = "flag", replacement: str = REDACTION) -> Sanitised:
    """The findings of `text`, and the text to hand on: as it is ("flag") or with the findings replaced ("redact")."""
    findings = tuple(scan(text))
    handed_on = redact(text, findings, replacement) if mode == "redact" and findings else text
    return Sanitised(handed_on, findings)


def marked(text: str, mode: Mode = "flag") -> tuple[str, dict[str, object]]:
    """The text to hand out and its `injection` field: whether a passage reads as an instruction to a model,
    and (mode "flag") where -- spans into the text handed out, each with its kind; (mode "redact") the kinds
    found, the passages replaced by `REDACTION`."""
    result = sanitise(text, mode)
    if not result.findings:
        return text, {"flagged": False}
    if mode == "redact":
        kinds = sorted({f.kind for f in result.findings})
        return result.text, {"flagged": True, "redacted": True, "kinds": kinds}
    spans = [{"start": f.start, "end": f.end, "kind": f.kind} for f in result.findings]
    return result.text, {"flagged": True, "redacted": False, "spans": spans}

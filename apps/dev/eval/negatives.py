"""Unanswerable queries for `ki eval --categories` (issue 50, item 3), generated per data set, and what the
answers to them count as. Pure: no I/O; every choice is seeded, so a data set gives the same queries each run.

Two kinds:

* `real_word`: one or two real words of the data set's language (from the everyday word lists below) that occur
  in no loaded document (casefolded word forms of titles and texts): no document is about them, so any hit is
  wrong. The analyzer may still find a stem or a compound part of them in the corpus: that is what is measured.
  The words are split once, seeded, into a train half and a test half, so a threshold is never chosen on the
  words it is reported on.
* `removed_answer`: an in-domain query of the split whose relevant documents are removed from the corpus for that
  query (the eval hides their versions from the caller's scope, as a missing document is hidden): the query is
  about the corpus's domain, but its answer is gone.

An answer to an unanswerable query is `empty` (no hits, reason `no_credible_evidence`), `empty_other` (no hits,
another reason) or `wrong_hit` (a confident wrong answer: anything returned). A removed document that is returned
anyway is counted as `leaked` (the removal did not hold; never expected).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Everyday words, far from statutes, encyclopaedia paragraphs about history and science, and biomedical abstracts;
# those a corpus does contain are left out per data set (`real_word_queries`).
_GERMAN = """
        Regenschirm Gitarre Kochlöffel Zahnbürste Gartenzwerg Blumenkohl Sandburg Schneemann Kuscheltier
        Waschlappen Marmelade Pfannkuchen Gummibärchen Lakritz Brezel Sauerkraut Schlafanzug Hausschuh Strickmütze
        Sonnenbrille Badeente Luftballon Seifenblase Trampolin Schaukelstuhl Hängematte Liegestuhl Picknickdecke
        Kaffeetasse Teekanne Zuckerdose Brotkorb Nudelholz Schneebesen Backofen Kühlschrank Staubsauger Bügeleisen
        Wäscheklammer Blumentopf Gießkanne Rasenmäher Heckenschere Vogelhaus Eichhörnchen Igel Marienkäfer Regenwurm
        Schmetterling Hummel Libelle Goldfisch Meerschweinchen Wellensittich Dackel Pudel Kätzchen Ponyhof Zirkuszelt
        Zauberer Clownsnase Jongleur Karussell Achterbahn Zuckerwatte Lebkuchen Weihnachtsbaum Osterhase Adventskranz
        Geburtstagskuchen Kerzenschein Pusteblume Gänseblümchen Sonnenblume Tulpenzwiebel Erdbeere Himbeere
        Stachelbeere Heidelbeere Apfelstrudel Kirschkuchen Schokoladeneis Vanillepudding Milchshake Limonade
        Kakaobohne Popcorn Kartoffelsalat Bratwurst Frikadelle Spiegelei Rührei Butterbrot Käsekuchen Gurkensalat
        Wanderschuh Rucksack Zeltplatz Lagerfeuer Taschenlampe Fernglas Kompass Angelrute Ruderboot Segelboot
        Leuchtturm Strandkorb Muschel Seestern Qualle Wattwurm Sandale Flipflop Badehose Schwimmflügel Taucherbrille
        Skateboard Rollschuh Tretroller Dreirad Schlitten Skistock Schlittschuh Eishockey Tischtennis Federball
        Kegelbahn Minigolf Puzzle Würfelspiel Kartenspiel Schachbrett Murmel Kreisel Drachenschnur Bauklotz
        Wachsmalstift Buntstift Radiergummi Anspitzer Federmappe Schulranzen Pausenbrot Tafelkreide Blockflöte
        Trompete Posaune Klarinette Harfe Akkordeon Mundharmonika Schlagzeug Xylophon Dudelsack Triangel
"""
_ENGLISH = """
        umbrella guitar toothbrush snowman teddy washcloth marmalade pancake gumdrop licorice pretzel sauerkraut
        pajamas slipper beanie sunglasses rubber balloon bubblegum trampoline rocking hammock deckchair picnic
        teacup teapot breadbasket rolling whisk oven fridge vacuum ironing clothespin flowerpot watering lawnmower
        birdhouse squirrel hedgehog ladybug earthworm butterfly bumblebee dragonfly goldfish hamster parakeet
        dachshund poodle kitten circus magician juggler carousel rollercoaster candyfloss gingerbread christmas
        easter birthday candlelight dandelion daisy sunflower tulip strawberry raspberry gooseberry blueberry
        cheesecake milkshake lemonade popcorn sausage meatball omelette sandwich cucumber backpack campfire
        flashlight binoculars fishing rowboat sailboat lighthouse seashell starfish jellyfish sandal flipflop
        swimsuit snorkel skateboard rollerblade scooter tricycle sledge snowboard hockey badminton bowling
        minigolf jigsaw checkers chessboard marble spinning kite crayon pencil eraser sharpener schoolbag lunchbox
        chalk recorder trumpet trombone clarinet harp accordion harmonica drumkit xylophone bagpipe triangle
        wardrobe doorbell mailbox doormat chimney attic basement garage trampoline sandbox playground swing
"""
WORDS: dict[str, tuple[str, ...]] = {"de": tuple(_GERMAN.split()), "en": tuple(_ENGLISH.split())}

OUTCOMES: tuple[str, ...] = ("empty", "empty_other", "wrong_hit", "leaked")
EMPTY_REASON = "no_credible_evidence"
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Unanswerable:
    qid: str
    text: str
    kind: str  # "real_word" | "removed_answer"
    removed: frozenset[str] = frozenset()  # corpus ids removed from the corpus for this query


def corpus_vocabulary(texts: Iterable[str]) -> frozenset[str]:
    """The casefolded word forms of the texts."""
    return frozenset(w for text in texts for w in _WORD.findall(text.casefold()))


def absent_words(language: str, vocabulary: frozenset[str]) -> list[str]:
    """The language's everyday words that occur in no document (in list order, each once); [] for a language
    without a list."""
    words = dict.fromkeys(WORDS.get(language, ()))
    return [w for w in words if not (set(_WORD.findall(w.casefold())) & vocabulary)]


def split_words(words: Sequence[str], seed: int) -> dict[str, list[str]]:
    """The words shuffled with `seed` and halved: {"train": first half, "test": second half}."""
    shuffled = list(words)
    random.Random(seed).shuffle(shuffled)
    half = len(shuffled) // 2
    return {"train": shuffled[:half], "test": shuffled[half:]}


def real_word_queries(words: Sequence[str], count: int, seed: int, split: str) -> list[Unanswerable]:
    """`count` queries of one word (even positions) or two distinct words (odd positions), drawn with `seed` from
    `words` (one split's half); fewer when the words run out of distinct queries."""
    if not words:
        return []
    rng = random.Random(f"{seed}:{split}")
    out: list[Unanswerable] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < count and attempts < count * 20:
        attempts += 1
        size = 1 if len(out) % 2 == 0 or len(words) < 2 else 2
        text = " ".join(rng.sample(list(words), size))
        if text in seen:
            continue
        seen.add(text)
        out.append(Unanswerable(f"neg-word-{split}-{len(out)}", text, "real_word"))
    return out


def removed_answer_queries(
    qrels: Mapping[str, Mapping[str, int]], queries: Mapping[str, str], count: int, seed: int, split: str
) -> list[Unanswerable]:
    """`count` judged queries of the split (sampled with `seed`), each with its relevant documents removed."""
    judged = sorted(qid for qid, j in qrels.items() if qid in queries and any(g > 0 for g in j.values()))
    chosen = random.Random(f"{seed}:{split}:removed").sample(judged, min(count, len(judged)))
    return [
        Unanswerable(
            f"neg-removed-{split}-{qid}",
            queries[qid],
            "removed_answer",
            frozenset(doc for doc, g in qrels[qid].items() if g > 0),
        )
        for qid in sorted(chosen)
    ]


def outcome(hits: Sequence[str], reason: str | None, removed: frozenset[str] = frozenset()) -> str:
    """What an answer (its hits' corpus ids and its empty reason) to an unanswerable query counts as."""
    if removed & set(hits):
        return "leaked"
    if hits:
        return "wrong_hit"
    return "empty" if reason == EMPTY_REASON else "empty_other"


def shares(outcomes: Iterable[str]) -> dict[str, float | int]:
    """Each outcome's share of the answers, and their number."""
    counted = list(outcomes)
    n = len(counted)
    return {"queries": n, **{o: round(counted.count(o) / n, 4) if n else 0.0 for o in OUTCOMES}}


def choose_threshold(curve: Sequence[Mapping[str, object]], baseline_ndcg: float, max_cost: float) -> dict | None:
    """The point of a train curve (each with `threshold`, `ndcg@10`, `empty`) with the largest share of empty
    answers on the unanswerable queries whose answerable nDCG@10 is at most `max_cost` below `baseline_ndcg`;
    ties go to the higher nDCG@10. None when no point qualifies."""
    fits = [p for p in curve if float(p["ndcg@10"]) >= baseline_ndcg - max_cost - 1e-12]  # type: ignore[arg-type]
    if not fits:
        return None
    return dict(max(fits, key=lambda p: (float(p["empty"]), float(p["ndcg@10"]))))  # type: ignore[arg-type]


def markdown_curve(unanswerable: Mapping[str, Any]) -> list[str]:
    """BENCHMARKS.md rows of a report's floor curve: per point the answerable nDCG@10 and the unanswerable queries'
    empty share (all, real words, removed answers) on train and on test; the point chosen on train in bold."""
    chosen = (unanswerable.get("chosen_on_train") or {}).get("threshold")

    def side(figures: Mapping[str, Any] | None) -> str:
        if not figures:
            return "– | –"
        kinds = figures.get("kinds", {})
        parts = "/".join(f"{kinds[k]['empty']:.2f}" if k in kinds else "–" for k in ("real_word", "removed_answer"))
        return f"{figures['ndcg@10']:.4f} | {figures['empty']:.2f} ({parts})"

    configured, no_floor = unanswerable["configured"], unanswerable["no_floor"]
    rows = [
        f"| no floor | off | {side(no_floor.get('train'))} | {side(no_floor.get('test'))} |",
        f"| {configured['floor']} (configured) | {'on' if configured['gates_answer'] else 'off'} | "
        f"{side(configured.get('train'))} | {side(configured.get('test'))} |",
    ]
    for point in unanswerable["curve"]:
        label = f"**{point['threshold']}**" if point["threshold"] == chosen else str(point["threshold"])
        rows.append(f"| {label} | on | {side(point.get('train'))} | {side(point.get('test'))} |")
    return rows


# --- the coverage gate's curve, computed from one run's readings (retrieval.answer_coverage_gate) -------------
# Similarity bars (cosine; 1.0: any similarity short of an exact match) and minimum coverages the curve crosses.
COVERAGE_BARS: tuple[float, ...] = (0.8, 0.82, 0.84, 0.85, 0.86, 0.87, 0.88, 0.9, 1.0)
COVERAGE_MINS: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)


@dataclass(frozen=True)
class Reading:
    """One query's answer without the coverage gate, as the gate would read it: its hits (corpus ids), its empty
    reason, and the `answer_gate` explain of the API (best similarity and coverage of the first hits, whether one
    matched an identifier)."""

    hits: tuple[str, ...]
    reason: str | None
    similarity: float | None
    coverage: float | None
    identifier: bool = False
    texts: tuple[str, ...] = ()  # the first hits' texts, as the gate read them (kept out of the report)

    def gated(self, bar: float, min_coverage: float) -> bool:
        """Whether the gate at (`bar`, `min_coverage`) would make this answer empty (as the API stage decides)."""
        if not self.hits or self.identifier or self.similarity is None or self.coverage is None:
            return False
        return self.similarity < bar and self.coverage < min_coverage

    def to_json(self) -> dict[str, Any]:
        return {"hits": len(self.hits), "reason": self.reason, "similarity": self.similarity,
                "coverage": self.coverage, "identifier": self.identifier}  # fmt: skip


def coverage_point(
    readings: Mapping[str, Reading],
    answerable_ndcg: Mapping[str, float],
    negatives: Sequence[Unanswerable],
    bar: float,
    min_coverage: float,
) -> dict[str, Any]:
    """The answerable queries' nDCG@10 (a gated answer scores 0) and the unanswerable queries' outcomes, had the
    coverage gate been on at (`bar`, `min_coverage`)."""
    ndcg = [0.0 if readings[q].gated(bar, min_coverage) else v for q, v in answerable_ndcg.items()]
    kinds: dict[str, list[str]] = {}
    for n in negatives:
        r = readings[n.qid]
        hits = () if r.gated(bar, min_coverage) else r.hits
        reason = EMPTY_REASON if r.gated(bar, min_coverage) else r.reason
        kinds.setdefault(n.kind, []).append(outcome(hits, reason, n.removed))
    return {
        "threshold": [bar, min_coverage],
        "ndcg@10": round(sum(ndcg) / len(ndcg), 4) if ndcg else 0.0,
        "answerable_empty": round(
            sum(1 for q in answerable_ndcg if readings[q].gated(bar, min_coverage)) / max(len(answerable_ndcg), 1), 4
        ),  # fmt: skip
        **shares(o for outcomes in kinds.values() for o in outcomes),
        "kinds": {kind: shares(outcomes) for kind, outcomes in kinds.items()},
    }


def coverage_curve(
    readings: Mapping[str, Reading],
    answerable_ndcg: Mapping[str, float],
    negatives: Sequence[Unanswerable],
    bars: Sequence[float] = COVERAGE_BARS,
    mins: Sequence[float] = COVERAGE_MINS,
) -> list[dict[str, Any]]:
    """`coverage_point` over the grid of bars x minimum coverages."""
    return [coverage_point(readings, answerable_ndcg, negatives, b, m) for b in bars for m in mins]


def choose_joint(curves: Sequence[Sequence[Mapping[str, Any]]], baselines: Sequence[float], max_cost: float
                 ) -> dict[str, Any] | None:  # fmt: skip
    """One grid point for several data sets' train curves (same grid, same order): among the points within
    `max_cost` nDCG@10 of each set's baseline on every set, the one with the largest smallest empty share (ties:
    the larger mean empty share, then the smaller largest cost). None when no point fits every set."""
    best: tuple[tuple[float, float, float], dict[str, Any]] | None = None
    for points in zip(*curves, strict=True):
        costs = [base - float(p["ndcg@10"]) for p, base in zip(points, baselines, strict=True)]
        if any(c > max_cost + 1e-12 for c in costs):
            continue
        empties = [float(p["empty"]) for p in points]
        key = (min(empties), sum(empties) / len(empties), -max(costs))
        if best is None or key > best[0]:
            best = (key, {"threshold": points[0]["threshold"], "empty": empties, "cost": [round(c, 4) for c in costs]})
    return None if best is None else best[1]

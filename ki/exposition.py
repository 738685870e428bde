"""Reading Prometheus expositions: one parser, one scraper and the sums over samples, for every reader
of `/metrics` (the operations dashboard, the dev tools waiting for a worker, the benchmarks, the tests)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = Mapping[str, str]
Buckets = dict[float, float]  # upper bound -> cumulative count
Match = Callable[[Labels], bool]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


def parse(text: str) -> list[Sample]:
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def fetch(url: str, *, token: str | None = None, timeout_s: float = 10.0) -> str:
    """One GET of an exposition's text (with a bearer token where `/metrics` is for operators only); an
    unreachable or slow endpoint raises OSError (TimeoutError is one)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return str(response.read().decode())


def scrape(url: str, *, token: str | None = None, timeout_s: float = 10.0) -> list[Sample]:
    return parse(fetch(url, token=token, timeout_s=timeout_s))


def answers(url: str, family: str | None = None, *, timeout_s: float = 3.0) -> bool:
    """A readiness probe: `url` answers with an exposition that declares `family`, if named (a labelled
    counter declares itself before it has any sample)."""
    try:
        text = fetch(url, timeout_s=timeout_s)
    except OSError:
        return False
    return family is None or family in text


def _all(_: Labels) -> bool:
    return True


def having(**labels: str) -> Match:
    """Samples whose labels include these."""
    return lambda sample_labels: labels.items() <= sample_labels.items()


def total(samples: Iterable[Sample], name: str, match: Match = _all) -> float:
    return sum(s.value for s in samples if s.name == name and match(s.labels))


def first(samples: Iterable[Sample], name: str) -> float | None:
    return next((s.value for s in samples if s.name == name), None)


def by_label(samples: Iterable[Sample], name: str, label: str) -> dict[str, float]:
    """The samples named `name`, summed per value of `label` (samples without it left out)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name and label in s.labels:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def histogram(samples: Iterable[Sample], name: str, match: Match = _all) -> Buckets:
    """The `<name>_bucket` series whose labels match, summed per upper bound."""
    out: Buckets = {}
    for s in samples:
        if s.name == f"{name}_bucket" and match(s.labels):
            bound = float(s.labels["le"])
            out[bound] = out.get(bound, 0.0) + s.value
    return out


def minus(new: Mapping[float, float], old: Mapping[float, float]) -> Buckets:
    """What was counted between two readings of one histogram; a counter that went down was reset (a
    restarted process), so the new reading is all there is."""
    if any(new.get(b, 0.0) < v for b, v in old.items()):
        return dict(new)
    return {b: v - old.get(b, 0.0) for b, v in new.items()}

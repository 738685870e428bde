"""The consistency token's wait (search.consistency) over a scripted Kafka port: when a token counts as applied,
what the answer says, and that it never answers early."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from ki.errors import RequestInvalid
from search.consistency import (
    Consistency,
    ConsistencyGate,
    Offsets,
    Stale,
    answer_consistent,
    caught_up,
    parse_token,
    reading_fresh,
)

P0, P1 = ("t", 0), ("t", 1)


@dataclass
class Script:
    """The broker as the gate sees it; each reading advances the lanes by one step."""

    heartbeats: list[int | None]
    access: list[dict[tuple[str, int], int]]
    content: list[dict[tuple[str, int], int]]
    ends: dict[str, Offsets] = field(default_factory=lambda: {"access": {P0: 5, P1: 3}, "content": {P0: 2}})
    reads: list[str] = field(default_factory=list)

    def heartbeat_lsn(self) -> int | None:
        self.reads.append("heartbeat")
        return self.heartbeats.pop(0) if len(self.heartbeats) > 1 else self.heartbeats[0]

    def log_ends(self, lane: str) -> Offsets:
        self.reads.append(f"ends:{lane}")
        return self.ends[lane]

    def committed(self, lane: str) -> Offsets:
        self.reads.append(f"committed:{lane}")
        steps = self.access if lane == "access" else self.content
        return steps.pop(0) if len(steps) > 1 else steps[0]


def gate(script: Script, max_wait_s: float = 2.0) -> ConsistencyGate:
    async def refresh() -> None:
        script.reads.append("refresh")

    return ConsistencyGate(script, refresh, max_wait_s=max_wait_s, poll_s=0.001)  # type: ignore[arg-type]


def test_tokens_parse_as_postgres_prints_them() -> None:
    assert parse_token("0/16B3748") == 0x16B3748
    assert parse_token("16/B374D848") == (0x16 << 32) | 0xB374D848
    for bad in ("", "16", "0/", "x/1", "0/123456789", "1/2/3"):
        with pytest.raises(RequestInvalid) as refused:
            parse_token(bad)
        assert refused.value.field == "consistency_token"


def test_caught_up_needs_every_partition_at_its_end() -> None:
    assert caught_up({P0: 5, P1: 0}, {P0: 5})
    assert not caught_up({P0: 5, P1: 3}, {P0: 5, P1: 2})
    assert not caught_up({P0: 5}, {})


def test_the_wait_ends_only_after_a_later_heartbeat_and_the_access_lane_at_the_ends_read_after_it() -> None:
    script = Script(heartbeats=[None, 90, 99, 120], access=[{P0: 4, P1: 3}, {P0: 5, P1: 3}], content=[{P0: 1}])
    answer = asyncio.run(gate(script).wait(100))
    assert answer == Consistency(("access",), "pending")
    # Heartbeats before the token prove nothing; the ends are read only after one at or past it.
    first_end = script.reads.index("ends:access")
    assert script.reads[:first_end] == ["heartbeat"] * 4
    assert script.reads.count("committed:access") == 2 and script.reads[-1] == "committed:content"
    # What the lane acknowledged is made searchable once, after its commits reached the ends.
    assert script.reads[-3:] == ["committed:access", "refresh", "committed:content"]


def test_a_token_below_a_proven_heartbeat_is_answered_without_reading_kafka() -> None:
    script = Script(heartbeats=[150, 200], access=[{P0: 5, P1: 3}], content=[{P0: 2}])
    g = gate(script)
    assert asyncio.run(g.wait(100)) == Consistency(("access",), "current")
    reads = len(script.reads)
    assert asyncio.run(g.wait(150)) == Consistency(("access",), "current") and len(script.reads) == reads
    asyncio.run(g.wait(151))  # past the proven heartbeat: read again, until the next one
    assert len(script.reads) > reads and g.proven["access"] == 200
    # Nothing committed comes before the WAL's start: a token of 0/0 holds at once.
    fresh = Script(heartbeats=[None], access=[{}], content=[{}])
    assert asyncio.run(gate(fresh).wait(parse_token("0/0"))) == Consistency(("access",), "current")
    assert fresh.reads == []


def test_a_lane_that_does_not_get_there_in_time_is_stale_never_an_older_answer() -> None:
    behind = Script(heartbeats=[150], access=[{P0: 1, P1: 0}], content=[{P0: 0}])
    with pytest.raises(Stale):
        asyncio.run(gate(behind, max_wait_s=0.05).wait(100))
    assert "refresh" not in behind.reads
    no_heartbeat = Script(heartbeats=[99], access=[{P0: 5, P1: 3}], content=[{P0: 2}])
    with pytest.raises(Stale):
        asyncio.run(gate(no_heartbeat, max_wait_s=0.05).wait(100))


def test_an_answer_with_a_token_says_so_and_reads_past_the_caches() -> None:
    script = Script(heartbeats=[150], access=[{P0: 5, P1: 3}], content=[{P0: 2}])
    seen: list[bool] = []

    async def answer() -> dict[str, object]:
        seen.append(reading_fresh())
        return {"hits": []}

    @dataclass
    class Request:
        consistency_token: str | None

    g = gate(script)
    with_token = asyncio.run(answer_consistent(g, Request("0/64"), answer))
    without = asyncio.run(answer_consistent(g, Request(None), answer))
    assert with_token == {
        "hits": [],
        "consistency": {"consistent": True, "waited_for": ["access"], "vectors": "current"},
    }
    assert without == {"hits": []} and seen == [True, False]

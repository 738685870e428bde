"""Whether a sync lane makes progress, not only whether its process answers.

A lane is *stalled* when records wait for it (its consumer group's lag is above 0) and it has neither received
a batch nor resolved one (applied, dead-lettered or skipped: what the checkpoint may then commit) for
`streams.stall_after_s`. A worker stopped for longer than its session timeout and resumed may stay out of its
group without a word: alive, answering, fetching nothing. An idle lane (no lag) is never stalled; a lag that
cannot be read (the broker away) says nothing either way, so it is not stalled -- restarting the lanes would not
bring the broker back.

A lane *paused* on purpose (`streams.batch`: the index refuses writes, e.g. a full disk's flood stage) is not
stalled while it keeps checking whether it may go on: each check is progress, and its verdict is `paused` with
the reason (200), so the supervisor leaves it alone -- a restart would only pause again. A paused lane that
stopped checking for `streams.stall_after_s` is stalled all the same.

A lane whose topics were deleted and created again under it (`TopicIdentity`: a topic's id changed) is stalled at
once: it may hold read positions of the old topic, and Faust skips every record of the new one below them. A
restarted lane starts from the group's committed offsets, which Kafka dropped with the old topic, so it reads the new
topic from its start (the recovery runbook: README, "Lost CDC topics").

The lane's `/healthz` answers the verdict (503 when stalled) and `ki sync run`'s supervisor restarts a lane
that is stalled, or that answered once and then stopped answering (`apps.runtime.supervisor`). Pure: the
caller passes the clock's readings and the lag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Liveness:
    lane: str
    stalled: bool
    lag: int | None  # records behind the log end (None: not read)
    since_fetch_s: float | None  # since the last batch received (None: none yet)
    since_applied_s: float | None  # since the last batch resolved (None: none yet)
    idle_s: float  # since the last of both (or of a pause's checks), or since the lane started
    paused: str | None = None  # why the lane is paused (None: it is not)
    recreated: tuple[str, ...] = ()  # its topics that were deleted and created again since it started

    def to_json(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "lane": self.lane,
            "status": "stalled" if self.stalled else "paused" if self.paused else "ok",
            "paused": self.paused,
            "lag": self.lag,
            "seconds_since_fetch": rounded(self.since_fetch_s),
            "seconds_since_applied": rounded(self.since_applied_s),
            "seconds_idle": rounded(self.idle_s),
            "recreated_topics": list(self.recreated),
        }


class LaneProgress:
    """The last moments a lane received and resolved a batch (monotonic clock readings)."""

    def __init__(self, lane: str, started: float) -> None:
        self.lane, self.started = lane, started
        self.last_fetch: float | None = None
        self.last_applied: float | None = None
        self.pause_reason: str | None = None
        self.last_pause_check: float | None = None

    def fetched(self, now: float) -> None:
        self.last_fetch = now

    def applied(self, now: float) -> None:
        self.last_applied = now

    def paused(self, reason: str, now: float) -> None:
        """The lane paused for `reason`, and checked just now whether it may go on."""
        self.pause_reason, self.last_pause_check = reason, now

    def resumed(self) -> None:
        self.pause_reason = None

    def idle_s(self, now: float) -> float:
        checked = self.last_pause_check if self.pause_reason is not None else None
        return now - max(
            self.started, self.last_fetch or self.started, self.last_applied or self.started, checked or self.started
        )

    def verdict(self, lag: int | None, now: float, stall_after_s: float, recreated: tuple[str, ...] = ()) -> Liveness:
        idle = self.idle_s(now)
        return Liveness(
            self.lane,
            stalled=bool(recreated) or (lag is not None and lag > 0 and idle > stall_after_s),
            lag=lag,
            since_fetch_s=None if self.last_fetch is None else now - self.last_fetch,
            since_applied_s=None if self.last_applied is None else now - self.last_applied,
            idle_s=idle,
            paused=self.pause_reason,
            recreated=recreated,
        )


class TopicIdentity:
    """The ids of a lane's topics as first seen (Kafka gives every topic a new id when it is created): a topic
    whose id differs later was deleted and created again under the lane. A topic missing when first looked
    at is not tracked until it appears (the consumer had no partition of it, so no stale position either)."""

    def __init__(self) -> None:
        self.first_seen: dict[str, str] = {}
        self.recreated: tuple[str, ...] = ()

    def observe(self, ids: dict[str, str]) -> tuple[str, ...]:
        """Record the ids seen now (topic -> id; absent: the topic does not exist); answer every topic that
        was recreated since first seen (once recreated, always: only a restart resets the lane's positions)."""
        changed = {topic for topic, topic_id in ids.items() if self.first_seen.get(topic, topic_id) != topic_id}
        for topic, topic_id in ids.items():
            self.first_seen.setdefault(topic, topic_id)
        self.recreated = tuple(sorted(set(self.recreated) | changed))
        return self.recreated

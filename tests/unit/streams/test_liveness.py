"""A lane's liveness (streams.liveness): stalled only when records wait and it did nothing for the bound."""

from __future__ import annotations

from streams.liveness import LaneProgress, Liveness, TopicIdentity
from streams.status import describe_health


def test_a_lane_with_lag_and_no_progress_past_the_bound_is_stalled() -> None:
    lane = LaneProgress("access", started=100.0)
    assert not lane.verdict(5, now=150.0, stall_after_s=60).stalled  # young: still within the bound
    stalled = lane.verdict(5, now=161.0, stall_after_s=60)
    assert stalled.stalled and stalled.idle_s == 61.0 and stalled.since_fetch_s is None
    assert stalled.to_json()["status"] == "stalled"


def test_an_idle_lane_or_an_unread_lag_is_never_stalled() -> None:
    lane = LaneProgress("content", started=0.0)
    assert not lane.verdict(0, now=10_000.0, stall_after_s=60).stalled  # nothing waits for it
    assert not lane.verdict(None, now=10_000.0, stall_after_s=60).stalled  # the broker away: restarting won't help


def test_receiving_or_resolving_a_batch_is_progress() -> None:
    lane = LaneProgress("access", started=0.0)
    lane.fetched(100.0)
    assert not lane.verdict(3, now=150.0, stall_after_s=60).stalled
    verdict = lane.verdict(3, now=200.0, stall_after_s=60)
    assert verdict.stalled and verdict.since_fetch_s == 100.0 and verdict.since_applied_s is None
    lane.applied(190.0)  # a long batch resolved: progress again
    verdict = lane.verdict(3, now=200.0, stall_after_s=60)
    assert not verdict.stalled and verdict.idle_s == 10.0 and verdict.to_json()["seconds_since_applied"] == 10.0


def test_a_paused_lane_that_keeps_checking_is_paused_not_stalled_and_one_that_stopped_is_stalled() -> None:
    """The supervisor restarts a stalled lane: a lane paused on a read-only index would only pause again."""
    lane = LaneProgress("access", started=0.0)
    lane.fetched(10.0)
    lane.paused("index read-only (flood stage) on ki--1", 900.0)  # its latest check of the block
    verdict = lane.verdict(7, now=905.0, stall_after_s=60)
    assert not verdict.stalled and verdict.idle_s == 5.0
    health = verdict.to_json()
    assert health["status"] == "paused" and health["paused"] == "index read-only (flood stage) on ki--1"
    hung = lane.verdict(7, now=1000.0, stall_after_s=60)  # no check for 100 s: the pause itself hangs
    assert hung.stalled and hung.to_json()["status"] == "stalled"
    lane.resumed()
    assert lane.verdict(7, now=905.0, stall_after_s=60).stalled  # resumed: the pause's checks no longer count
    assert lane.verdict(0, now=905.0, stall_after_s=60).to_json()["paused"] is None


def test_sync_status_says_what_each_lane_worker_is_doing() -> None:
    base = {"lane": "content", "lag": 12, "seconds_since_fetch": 1.0, "seconds_since_applied": 1.0}
    ok = Liveness("content", False, 0, 1.0, 1.0, 1.0)
    paused = Liveness("access", False, 3, 0.5, 40.0, 0.5, paused="index_read_only")
    stalled = Liveness("content", True, 12, 400.0, 400.0, 400.0)
    assert describe_health(ok.to_json()) == "ok"
    assert describe_health(paused.to_json()).startswith("paused (index_read_only)")
    assert describe_health(stalled.to_json()).startswith("stalled: lag and no progress for 400.0 s")
    assert describe_health(None) == "no answer from a worker on this machine"
    recreated = Liveness("access", True, 0, 1.0, 1.0, 1.0, recreated=("ki.public.grants",))
    assert describe_health(recreated.to_json()).startswith("stalled: its topics were created again under it (ki.")
    assert describe_health({**base, "status": "odd"}).startswith("unexpected answer")


def test_a_topic_created_again_under_the_lane_stalls_it_at_once_and_for_good() -> None:
    topics = TopicIdentity()
    assert topics.observe({"ki.public.grants": "id-1"}) == ()  # first seen
    assert topics.observe({}) == ()  # deleted: the lane has no partition of it, nothing stale yet
    assert topics.observe({"ki.public.grants": "id-1", "ki.message": "id-7"}) == ()  # appeared: first seen now
    assert topics.observe({"ki.public.grants": "id-2", "ki.message": "id-7"}) == ("ki.public.grants",)
    assert topics.observe({"ki.public.grants": "id-2", "ki.message": "id-7"}) == ("ki.public.grants",)  # sticky

    lane = LaneProgress("access", started=0.0)
    verdict = lane.verdict(0, now=1.0, stall_after_s=60, recreated=topics.recreated)  # no lag, young: still
    assert verdict.stalled and verdict.to_json()["recreated_topics"] == ["ki.public.grants"]
    assert lane.verdict(0, now=1.0, stall_after_s=60).to_json()["recreated_topics"] == []

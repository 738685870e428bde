"""Progress of long jobs: rate and ETA from a recent window, plain lines at most every few seconds, the
bar on a terminal; and the per-lane lag readings the progress lines and `ki sync status` show. An
injected clock: nothing sleeps."""

from __future__ import annotations

import io

import pytest

from apps.runtime.progress import ProgressReport, RateWindow, StepReport, duration
from streams.status import LaneLag, PartitionLag, lag_summary, synced


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_comes_from_the_recent_window_not_from_the_start() -> None:
    window = RateWindow(window_s=30)
    # A slow start (1/s for a minute), then 20/s: the average since the start would say ~7/s.
    for t in range(0, 61, 5):
        window.add(t, t)
    for t in range(65, 121, 5):
        window.add(t, 60 + (t - 60) * 20)
    assert window.rate() == pytest.approx(20.0)
    done = 60 + 60 * 20
    assert window.eta(done, done + 400) == pytest.approx(20.0)


def test_the_window_keeps_an_anchor_at_its_start_when_samples_are_sparse() -> None:
    window = RateWindow(window_s=30)
    window.add(0, 0)
    window.add(50, 500)  # one sample far apart: still a rate over what is there
    assert window.rate() == pytest.approx(10.0)
    window.add(100, 500)
    assert window.points[0] == (50, 500)  # the sample at t=0 is outside the window now
    assert window.rate() == 0.0


def test_no_rate_before_two_samples_and_no_eta_without_one() -> None:
    window = RateWindow()
    assert window.rate() is None and window.eta(0, 100) is None
    window.add(0, 0)
    assert window.rate() is None and window.eta(0, 100) is None
    window.add(1, 7)
    assert window.rate() == pytest.approx(7.0)
    assert window.eta(7, None) is None  # no total: no ETA
    assert window.eta(100, 100) == 0.0


def test_a_stalled_job_has_rate_zero_and_no_eta() -> None:
    window = RateWindow(window_s=30)
    for t in range(0, 31, 5):
        window.add(t, t * 10)  # moving
    for t in range(35, 100, 5):
        window.add(t, 300)  # stuck behind one batch for a minute
    assert window.rate() == 0.0
    assert window.eta(300, 1000) is None


def test_a_count_going_down_is_no_progress() -> None:
    window = RateWindow(window_s=30)
    window.add(0, 100)
    window.add(10, 40)
    assert window.rate() == 0.0


def test_samples_closer_than_the_spacing_replace_each_other() -> None:
    window = RateWindow(window_s=30, min_spacing_s=1.0)
    for i in range(1000):
        window.add(i * 0.01, i)  # a caller reporting every event
    assert len(window.points) <= 12
    assert window.rate() == pytest.approx(100.0)
    with pytest.raises(ValueError, match="window_s"):
        RateWindow(window_s=0)


def test_durations_read_as_a_person_says_them() -> None:
    assert duration(4.4) == "4s"
    assert duration(725) == "12m05s"
    assert duration(3 * 3600 + 4 * 60 + 9) == "3h04m"


def test_plain_lines_at_most_every_interval_with_count_rate_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    report = ProgressReport("rebuild", "versions", 1000, stream=out, live=False, interval_s=5, clock=clock)
    for _ in range(20):  # one update a second, 10 versions each
        report.update(report.done + 10)
        clock.now += 1
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # t = 0, 5, 10, 15 s: at most one line every 5 s
    assert lines[0].startswith("rebuild: 10/1000 versions (1%), rate: measuring")
    assert lines[-1] == "rebuild: 160/1000 versions (16%), 10.0 versions/s, ETA 1m24s, 15s elapsed"
    report.close()  # the final state is shown even between two lines
    assert out.getvalue().splitlines()[-1].startswith("rebuild: 200/1000 versions (20%), 10.0 versions/s, ETA 1m20s")
    report.close()
    assert len(out.getvalue().splitlines()) == 5  # nothing new to show: no repeated line


def test_a_plain_line_says_when_it_is_stalled_and_carries_the_note() -> None:
    clock, out = Clock(), io.StringIO()
    with ProgressReport("eval: indexing", "rows", 500, stream=out, live=False, clock=clock) as report:
        for _ in range(40):
            report.update(120, note="Kafka lag: content 9, access 0")
            clock.now += 1
    last = out.getvalue().splitlines()[-1]
    assert "120/500 rows (24%), stalled (nothing in the last 30s)" in last
    assert "ETA" not in last and last.endswith("; Kafka lag: content 9, access 0")


def test_before_the_first_unit_it_waits_and_a_stall_names_only_the_time_measured() -> None:
    clock, out = Clock(), io.StringIO()
    with ProgressReport("ki demo: keyword-searchable", "versions", 200, stream=out, live=False, interval_s=1,
                        clock=clock) as report:  # fmt: skip
        for _ in range(6):
            report.update(0)
            clock.now += 1
        assert "0/200 versions (0%), waiting for the first versions, 5s elapsed" in out.getvalue().splitlines()[-1]
    clock, out = Clock(), io.StringIO()  # a resumed run: ten done from its start, none since
    with ProgressReport("ki demo: keyword-searchable", "versions", 200, stream=out, live=False, clock=clock) as report:
        for _ in range(7):
            report.update(10)
            clock.now += 1
    assert "10/200 versions (5%), stalled (nothing in the last 6s)" in out.getvalue().splitlines()[-1]


def test_a_terminal_gets_a_bar_with_the_same_rate_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    with ProgressReport("ki demo: indexing", "versions", 200, stream=out, live=True, clock=clock) as report:
        for _ in range(10):
            report.update(report.done + 4, note="Kafka lag: content 3, access 0")
            clock.now += 1
        report.message("a line of its own")
    shown = out.getvalue()
    assert "40/200" in shown and "4.0 versions/s" in shown and "ETA 40s" in shown
    assert "a line of its own" in shown and "Kafka lag: content 3" in shown


def test_steps_get_a_report_each() -> None:
    clock, out = Clock(), io.StringIO()
    with StepReport("rebuild", stream=out, live=False, clock=clock) as steps:
        steps.line("rebuild: replaying the CDC topics")
        steps.advance("events", 0, 300)
        steps.advance("events", 300, 300)
        steps.advance("versions", 0, 64)
        steps.advance("versions", 64, 64)
        steps.line("rebuild: alias swapped")
    lines = out.getvalue().splitlines()
    assert lines[0] == "rebuild: replaying the CDC topics"
    assert lines[1].startswith("rebuild: 0/300 events") and lines[2].startswith("rebuild: 300/300 events")
    assert lines[3].startswith("rebuild: 0/64 versions")
    assert lines[-2].startswith("rebuild: 64/64 versions (100%)")  # the last step's final state
    assert lines[-1] == "rebuild: alias swapped"


def _lane(lane: str, running: bool, *offsets: tuple[int, int]) -> LaneLag:
    partitions = [PartitionLag("t", i, committed, end) for i, (committed, end) in enumerate(offsets)]
    return LaneLag(lane, f"g-{lane}", True, 1 if running else 0, partitions)  # type: ignore[arg-type]


def test_lane_lag_counts_events_and_partitions_never_committed() -> None:
    lane = _lane("content", True, (5, 5), (3, 10), (-1, 4), (-1, 0))
    assert lane.total == 7 + 4
    assert [p.partition for p in lane.lagging] == [1, 2]  # an empty, never committed partition is not behind
    assert not lane.caught_up
    assert _lane("content", True, (5, 5), (-1, 0)).caught_up
    assert not _lane("content", True).caught_up  # no partitions read: nothing says it is caught up


def test_synced_needs_every_running_lane_caught_up() -> None:
    done, behind = ((4, 4),), ((2, 4),)
    assert synced([_lane("access", True, *done), _lane("content", True, *done)])
    assert not synced([_lane("access", True, *behind), _lane("content", True, *done)])
    assert synced([_lane("access", False, *behind), _lane("content", True, *done)])  # left by an earlier worker
    assert not synced([_lane("access", False, *done), _lane("content", False, *done)])  # nothing started
    summary = lag_summary([_lane("access", False, *behind), _lane("content", True, *done)])
    assert summary == "Kafka lag: access 2 (no worker), content 0"

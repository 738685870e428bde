"""`ki bench soak`'s pure parts: the fault rotation and schedule, the leak rule, the summary and its table."""

from __future__ import annotations

from collections import Counter

import pytest

from apps.dev.bench.soak import (
    FAULTS,
    PlannedFault,
    fault_schedule,
    leaked_hits,
    parse_faults,
    summarize,
    table,
    unexplained_leaks,
)


def test_faults_parse_all_none_and_a_list_in_the_order_given() -> None:
    assert parse_faults("all") == FAULTS
    assert parse_faults("none") == ()
    assert parse_faults("postgres, kill") == ("postgres", "kill")


def test_an_unknown_fault_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--faults: unknown reboot"):
        parse_faults("kill,reboot")


def test_one_fault_every_interval_in_rotation_none_at_or_past_the_end() -> None:
    schedule = fault_schedule(60 * 60, 300, FAULTS)
    assert len(schedule) == 11  # 300 s ... 3300 s; 3600 s is the end
    assert [p.at_s for p in schedule[:3]] == [300, 600, 900]
    assert [p.kind for p in schedule] == [FAULTS[i % len(FAULTS)] for i in range(11)]
    assert fault_schedule(30, 15, ("kill",)) == [PlannedFault(15, "kill")]
    assert fault_schedule(30, 30, ("kill",)) == []
    assert fault_schedule(600, 60, ()) == []


def test_a_hit_leaks_only_if_invisible_both_before_and_after_the_request() -> None:
    hits = [1, 2, 3, 4]
    before, after = {1, 2}, {1, 3}  # 2 revoked during the request, 3 granted during it: both may show
    assert leaked_hits(hits, before, after) == [4]
    assert leaked_hits([], set(), set()) == []
    assert leaked_hits([5], set(), set()) == [5]


def test_a_flagged_hit_is_explained_only_by_a_change_each_way_inside_its_window() -> None:
    grant = {"kind": "grant added", "principals": ["user:a"], "documents": [7]}
    revoke = {"kind": "grant revoked", "principals": ["user:a"], "documents": [7]}
    leaks = [{"version": 1, "changes_in_window": []}, {"version": 2, "changes_in_window": [grant]},
             {"version": 3, "changes_in_window": [grant, revoke]}]  # fmt: skip
    assert [leak["version"] for leak in unexplained_leaks(leaks)] == [1, 2]


def test_the_summary_counts_5xx_in_and_out_of_fault_windows_and_judges_only_what_sql_answered() -> None:
    searches = [
        {"at_s": 10.0, "status": 200, "ms": 20.0, "hits": 3, "judged": True, "leaked": 0},
        {"at_s": 55.0, "status": 503, "ms": 5.0, "hits": 0, "judged": False, "leaked": 0},  # during the fault
        {"at_s": 90.0, "status": 500, "ms": 6.0, "hits": 0, "judged": True, "leaked": 0},
        {"at_s": 95.0, "status": "URLError", "ms": 1.0, "hits": 0, "judged": True, "leaked": 0},
        {"at_s": 99.0, "status": 200, "ms": 40.0, "hits": 2, "judged": True, "leaked": 1},
    ]
    faults = [{"kind": "postgres", "start_s": 50.0, "end_s": 60.0, "recovered_s": 70.0, "recovery_s": 10.0,
               "probe_found_s": 4.0, "lag_zero_s": 10.0, "lane_restarted": False},
              {"kind": "kill", "start_s": 80.0, "end_s": 80.5, "recovered_s": None, "recovery_s": None}]  # fmt: skip
    lost = {"lost": 0, "live": 8, "rebuilt": 8, "missing": [], "extra": [], "differing": []}
    result = summarize(duration_s=100.0, changes=Counter({"grant added": 4000, "content edit": 100}),
                       retried_changes=7, searches=searches, faults=faults, lost=lost)  # fmt: skip
    assert result["changes"] == {"committed": 4100, "per_kind": {"content edit": 100, "grant added": 4000},
                                 "achieved_per_s": 41.0, "retried_attempts": 7}  # fmt: skip
    s = result["searches"]
    assert s["sent"] == 5 and s["5xx"] == 2
    # the 503 at 55 s falls in the postgres window (50-70 s); the 500 at 90 s after the kill (80-80.5 s)
    assert s["5xx_during_faults"] == 1
    assert s["status_counts"] == {"200": 2, "500": 1, "503": 1, "URLError": 1}
    assert s["judged"] == 4 and s["hits_judged"] == 5 and s["leaked"] == 1
    assert s["latency_200"] == {"n": 2, "p50_ms": 20.0, "p99_ms": 40.0}
    assert result["recovery_s_max"] == 10.0 and result["faults_not_recovered"] == 1
    result["searches"]["leaked_unexplained"] = 0
    printed = table({**result, "minutes": 1.7, "rate": 50})
    assert "lost 0" in printed and "leaked 1" in printed and "5xx 2 (1 during faults)" in printed
    assert "| 1 | postgres | 50.0 | 60.0 | 10.0 | 4.0 | 10.0 | False |" in printed

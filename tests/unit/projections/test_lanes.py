"""The lanes' topics and groups (projections.lanes): who reads what, under which group, on which port."""

from __future__ import annotations

from ki.settings import load_settings
from ki.table_roles import ACCESS_TABLES, CAPTURED_TABLES, CONTENT_TABLES
from projections.lanes import LANES, consumer_group, lane_topics

SETTINGS = load_settings(environ={})


def tables(lane: str) -> set[str]:
    return {topic.rsplit(".", 1)[-1] for topic in lane_topics(SETTINGS, lane) if topic.count(".") == 2}  # type: ignore[arg-type]


def test_the_principals_lane_reads_the_access_tables_alone_and_the_access_lane_reads_them_too() -> None:
    assert tables("principals") == set(ACCESS_TABLES) and not set(ACCESS_TABLES) & set(CONTENT_TABLES)
    # A fast path only: everything it reads, the access lane (the authority for all but vectors) reads as well.
    assert tables("principals") < tables("access") == set(CAPTURED_TABLES)
    assert tables("content") == set(CONTENT_TABLES)


def test_each_lane_has_a_group_and_a_port_of_its_own() -> None:
    groups = {consumer_group(SETTINGS, lane) for lane in LANES}
    ports = {SETTINGS.streams.lane_web_port(lane) for lane in LANES}
    assert len(groups) == len(ports) == len(LANES)
    assert consumer_group(SETTINGS, "content") == SETTINGS.streams.app_id  # an upgrade keeps the content offsets
    moved = load_settings(environ={"KI_STREAMS__WEB_PORT": "7000"})
    assert [moved.streams.lane_web_port(lane) for lane in ("content", "access", "principals")] == [7000, 7001, 7002]

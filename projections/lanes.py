"""The sync's lanes by name: which CDC topics each reads and under which consumer group. Pure naming, shared
by the worker (`streams`) and by the search API, which waits on a lane's committed offsets for a writer's
consistency token (`search.consistency`).

The access lane reads every captured table and does all the work that needs no embedding (keyword rows and
the principal projection); it is the authority for everything but vectors. The content lane reads the content
tables and embeds. The principals lane reads only the access tables (grants, observations, memberships,
aliases, projects) and rewrites the principal projection of rows already searchable: during a bulk import
the access lane's queue holds thousands of import events, and a revocation must not wait behind them. It is a
fast path only: the access lane applies every access change too, so a principals lane that is down, behind or
started late costs speed, never correctness.
"""

from __future__ import annotations

from typing import Literal

from ki.settings import Settings
from ki.table_roles import ACCESS_TABLES, CAPTURED_TABLES, CONTENT_TABLES
from projections.cdc import message_topic, topic_name

Lane = Literal["access", "content", "principals"]
LANES: tuple[Lane, ...] = ("access", "content", "principals")


def lane_topics(settings: Settings, lane: Lane) -> list[str]:
    """The access lane also reads the logical-decoding messages: the truncate markers (`projections.cdc`)."""
    prefix = settings.kafka.topic_prefix
    if lane == "content":
        return [topic_name(prefix, table) for table in CONTENT_TABLES]
    if lane == "principals":
        return [topic_name(prefix, table) for table in ACCESS_TABLES]
    return [*(topic_name(prefix, table) for table in CAPTURED_TABLES), message_topic(prefix)]


def consumer_group(settings: Settings, lane: Lane) -> str:
    """The content lane keeps the group the single worker had (`streams.app_id`), so an upgraded
    deployment resumes its content where it was; the other lanes have groups of their own."""
    return settings.streams.app_id if lane == "content" else f"{settings.streams.app_id}-{lane}"

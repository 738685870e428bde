"""The sync's two lanes by name: which CDC topics each reads and under which consumer group. Pure naming, shared
by the worker (`streams`) and by the search API, which waits on a lane's committed offsets for a writer's
consistency token (`search.consistency`).

The access lane reads every captured table and does all the work that needs no embedding, at once (keyword
rows and the principal projection); the content lane reads the content tables and embeds.
"""

from __future__ import annotations

from typing import Literal

from ki.settings import Settings
from ki.table_roles import CAPTURED_TABLES, CONTENT_TABLES
from projections.cdc import message_topic, topic_name

Lane = Literal["access", "content"]
LANES: tuple[Lane, ...] = ("access", "content")


def lane_topics(settings: Settings, lane: Lane) -> list[str]:
    """The access lane also reads the logical-decoding messages: the truncate markers (`projections.cdc`)."""
    prefix = settings.kafka.topic_prefix
    if lane == "content":
        return [topic_name(prefix, table) for table in CONTENT_TABLES]
    return [*(topic_name(prefix, table) for table in CAPTURED_TABLES), message_topic(prefix)]


def consumer_group(settings: Settings, lane: Lane) -> str:
    """The content lane keeps the group the single worker had (`streams.app_id`), so an upgraded
    deployment resumes its content where it was; the access lane starts its own group from the start."""
    return settings.streams.app_id if lane == "content" else f"{settings.streams.app_id}-access"

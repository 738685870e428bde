"""The dead-letter sender (streams.app.DeadLetters) against a stand-in for Faust's topic: a record counts as
dead-lettered only once the broker acknowledged it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from streams.app import DeadLetters
from streams.dead_letters import Failure, parse


@dataclass
class Record:
    topic: str = "ki.public.document_versions"
    partition: int = 2
    offset: int = 7
    key: bytes | None = b'{"id": 42}'
    value: bytes | None = b"{not json"


class Topic:
    """Faust's `Topic.send` queues the record and returns the future of its delivery."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.deliveries: list[asyncio.Future[Any]] = []

    async def send(self, *, key: bytes | None, value: bytes) -> asyncio.Future[Any]:
        self.sent.append(json.loads(value))
        self.deliveries.append(asyncio.get_running_loop().create_future())
        return self.deliveries[-1]


def test_a_dead_letter_is_sent_only_once_the_broker_acknowledged_it() -> None:
    async def scenario() -> None:
        topic = Topic()
        sending = asyncio.ensure_future(
            DeadLetters(topic, "content").send(Record(), Failure("undecodable: x", "undecodable", 1))
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert topic.sent[0]["offset"] == 7 and topic.sent[0]["reason"] == "undecodable: x"
        # It reads back as what `ki dlq list` shows.
        back = parse(0, 3, 1, json.dumps(topic.sent[0]).encode())
        assert (back.key, back.error_class, back.attempts, back.lane) == ("document_versions/42", "undecodable", 1,
                                                                          "content")  # fmt: skip
        assert not sending.done(), "returned before the broker acknowledged the dead letter"
        topic.deliveries[0].set_result("metadata")
        await asyncio.wait_for(sending, 1)

    asyncio.run(scenario())


def test_a_dead_letter_the_broker_refuses_raises() -> None:
    async def scenario() -> None:
        topic = Topic()
        failure = Failure("cannot be applied", "X", 2)
        sending = asyncio.ensure_future(DeadLetters(topic, "access").send(Record(), failure))
        for _ in range(5):
            await asyncio.sleep(0)
        topic.deliveries[0].set_exception(RuntimeError("MessageSizeTooLarge"))
        with pytest.raises(RuntimeError, match="MessageSizeTooLarge"):
            await asyncio.wait_for(sending, 1)

    asyncio.run(scenario())

"""Admission control and hostile tokens (no services)."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest

from ki.settings import ApiSettings, LimitsSettings
from search.web.admission import AdmissionGate, Overloaded
from search.web.auth import AuthError, authenticate, mint_token

API = ApiSettings(limits=LimitsSettings(max_token_bytes=512))


def test_gate_admits_queues_and_refuses() -> None:
    async def scenario() -> list[object]:
        gate = AdmissionGate(max_in_flight=1, max_queued=1, queue_timeout_s=30)
        release = asyncio.Event()
        inside = asyncio.Event()

        async def holder() -> str:
            async with gate.admit():
                inside.set()
                await release.wait()
            return "held"

        async def queued() -> str:
            async with gate.admit():
                return "queued"

        first = asyncio.create_task(holder())
        await inside.wait()
        second = asyncio.create_task(queued())
        while gate.waiting == 0:  # let the second request reach the queue
            await asyncio.sleep(0)
        with pytest.raises(Overloaded) as refused:
            async with gate.admit():
                pass
        release.set()
        return [await first, await second, refused.value.status, gate.in_flight, gate.waiting]

    assert asyncio.run(scenario()) == ["held", "queued", 429, 0, 0]


def test_gate_wait_times_out_with_503() -> None:
    async def scenario() -> int:
        gate = AdmissionGate(max_in_flight=1, max_queued=5, queue_timeout_s=0.05)
        release = asyncio.Event()
        inside = asyncio.Event()

        async def holder() -> None:
            async with gate.admit():
                inside.set()
                await release.wait()

        task = asyncio.create_task(holder())
        await inside.wait()
        try:
            async with gate.admit():
                return 200
        except Overloaded as exc:
            return exc.status
        finally:
            release.set()
            await task
            assert (gate.in_flight, gate.waiting) == (0, 0)

    assert asyncio.run(scenario()) == 503


def signed(**claims: object) -> str:
    base: dict[str, object] = {"sub": "alice", "iss": API.jwt.issuer, "aud": API.jwt.audience}
    base["exp"] = int(time.time()) + 60
    base.update(claims)
    return jwt.encode(base, API.jwt.secret, algorithm=API.jwt.algorithm)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer " + mint_token(API, "alice", groups=["g" * 40] * 20),  # over max_token_bytes
        "Bearer " + signed(sub="a\x00b"),
        "Bearer " + signed(groups=["ok", "bad\x00"]),
        "Bearer " + signed(sub="\ud800x"),
        "Bearer " + signed(sub="x" * 513),
        "Bearer ünïcödé.token.x",
        "Bearer " + "a" * 10 + "." + "b" * 10,
    ],
)
def test_hostile_tokens_are_auth_errors(header: str) -> None:
    with pytest.raises(AuthError):
        authenticate(header, API)

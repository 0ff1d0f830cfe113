"""The fleet's shared rate against a member with a wrong clock and values no member wrote.

Whatever one process or a stray value in Redis does, a request of another process
waits no longer than the rate justifies (a few intervals), a learned rate is used within
the process's own bounds, and a key of the wrong type or with an impossible value is
repaired (logged once) instead of holding the fleet back. Each `asyncio.timeout` here
only stops a hang: the defects it guards against made a process wait an hour, a day, or
forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
import redis.asyncio

import dispatch_async as da
from dispatch_async._adaptive import Aimd, RateState
from dispatch_async._throttle import Slot

#: Only a hang guard (see the module docstring), never a measure of speed.
HANG = 30
AN_HOUR = 3600.0
A_DAY = 86400.0


@pytest.fixture
async def admin(redis_server: str) -> AsyncIterator[Any]:
    """A client with every right: it plants what a stray process or an operator could."""
    client = redis.asyncio.Redis.from_url(redis_server)
    yield client
    await client.aclose()


async def redis_now(client: Any) -> float:
    seconds, micros = await client.time()
    return float(seconds + micros / 1e6)


async def lead(client: Any, key: str) -> float:
    """Seconds the time stored under *key* is ahead of Redis's clock (0 if none is)."""
    raw = await client.get(key)
    return 0.0 if raw is None else float(raw) - await redis_now(client)


def schedule_key(prefix: str, rate: float | Literal["auto"]) -> str:
    return f"{prefix}rate:learned:next" if rate == "auto" else f"{prefix}rate:next"


def limiters(
    redis_url: str, prefix: str, rate: float | Literal["auto"], count: int
) -> list[da.RedisRateLimiter]:
    return [
        da.RedisRateLimiter(redis_url, requests_per_second=rate, key_prefix=prefix)
        for _ in range(count)
    ]


async def closed(*limiters: da.RedisRateLimiter) -> None:
    for limiter in limiters:
        await limiter.aclose()


async def acquired(limiter: da.RedisRateLimiter, times: int = 1) -> None:
    """*times* requests' turns (each test's hang guard around them); then it is closed."""
    try:
        async with asyncio.timeout(HANG):
            for _ in range(times):
                await limiter.acquire()
    finally:
        await limiter.aclose()


class TestTheLearnedRateKeepsToTheProcesssBounds:
    """``max_requests_per_second`` and the 0.1/s floor hold for a rate read from Redis."""

    async def test_a_fleet_rate_above_the_maximum_is_sent_at_the_maximum(
        self, redis_server: str, prefix: str, admin: Any
    ) -> None:
        fast = RateState(1000.0, 5, time.time(), 40.0, "increase")
        await admin.set(f"{prefix}rate:learned", fast.encode())
        limiter = da.RedisRateLimiter(
            redis_server, requests_per_second="auto", max_requests_per_second=2, key_prefix=prefix
        )
        started = time.monotonic()
        await acquired(limiter, 3)
        # 3 requests at 2/s span a second (at the 1000/s read from Redis: 2 ms).
        assert time.monotonic() - started >= 0.9
        assert limiter.requests_per_second == 2

    async def test_a_fleet_rate_below_the_floor_is_sent_at_the_floor(
        self, redis_server: str, prefix: str, admin: Any
    ) -> None:
        slow = RateState(0.001, 5, time.time(), 0.1, "decrease")
        await admin.set(f"{prefix}rate:learned", slow.encode())
        limiter = da.RedisRateLimiter(redis_server, requests_per_second="auto", key_prefix=prefix)
        await acquired(limiter)
        assert limiter.requests_per_second == Aimd().minimum
        # The next request is 1/0.1 = 10 s away, not 1/0.001 = 1,000 s.
        assert 5 < await lead(admin, f"{prefix}rate:learned:next") <= 10.5


class TestOneProcessCannotStallTheFleet:
    @pytest.mark.parametrize("rate", ["auto", 10], ids=["learned", "fixed"])
    async def test_a_process_whose_clock_is_an_hour_ahead_holds_no_one_back(
        self,
        redis_server: str,
        prefix: str,
        admin: Any,
        monkeypatch: pytest.MonkeyPatch,
        rate: float | Literal["auto"],
    ) -> None:
        skewed, other = limiters(redis_server, prefix, rate, 2)
        real = time.time
        try:
            with monkeypatch.context() as clock:
                clock.setattr(time, "time", lambda: real() + AN_HOUR)
                await skewed.acquire()
            async with asyncio.timeout(HANG):  # the other waited an hour
                await other.acquire()
                await other.acquire()
        finally:
            await closed(skewed, other)
        assert await lead(admin, schedule_key(prefix, rate)) < 5

    async def test_without_time_in_the_acl_a_clock_an_hour_ahead_is_still_bounded(
        self,
        redis_server: str,
        prefix: str,
        admin: Any,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Each process then keeps time by its own clock; a schedule that far ahead is reset."""
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        user = f"notime-{prefix.rstrip(':')}"
        await admin.execute_command(
            "ACL", "SETUSER", user, "reset", "on", ">s3cret", f"~{prefix}*", "resetchannels",
            "-@all", "+get", "+set", "+del", "+evalsha", "+eval", "+script|load", "+ping",
        )  # fmt: skip
        url = redis_server.replace("redis://", f"redis://{user}:s3cret@")
        skewed, other = limiters(url, prefix, 10, 2)
        real = time.time
        try:
            with monkeypatch.context() as clock:
                clock.setattr(time, "time", lambda: real() + AN_HOUR)
                await skewed.acquire()
            async with asyncio.timeout(HANG):
                await other.acquire()
                await other.acquire()
        finally:
            await closed(skewed, other)
            await admin.execute_command("ACL", "DELUSER", user)
        assert await lead(admin, schedule_key(prefix, 10)) < 5
        assert caplog.text.count("may not run TIME") == 2  # once per process
        assert "was reset" in caplog.text

    @pytest.mark.parametrize(
        "planted",
        [A_DAY, 30.0, "a list", "soon"],
        ids=["a-day-ahead", "30s-ahead", "wrong-type", "not-a-time"],
    )
    @pytest.mark.parametrize("rate", ["auto", 10], ids=["learned", "fixed"])
    async def test_a_schedule_no_process_could_have_written_is_reset(
        self,
        redis_server: str,
        prefix: str,
        admin: Any,
        caplog: pytest.LogCaptureFixture,
        planted: float | str,
        rate: float | Literal["auto"],
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        key = schedule_key(prefix, rate)
        if planted == "a list":
            await admin.rpush(key, "x")
        elif isinstance(planted, str):
            await admin.set(key, planted)
        else:
            await admin.set(key, repr(await redis_now(admin) + planted), ex=int(planted) + 60)
        (limiter,) = limiters(redis_server, prefix, rate, 1)
        await acquired(limiter, 3)
        # At 10/s, the fleet's schedule is a few intervals ahead at most.
        assert await lead(admin, key) < 2
        assert caplog.text.count(f"{key} ") == 1  # repaired, and said so once

    async def test_a_key_planted_again_is_reset_again_and_said_once(
        self, redis_server: str, prefix: str, admin: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        key = schedule_key(prefix, 10)
        (limiter,) = limiters(redis_server, prefix, 10, 1)
        try:
            async with asyncio.timeout(HANG):
                for _ in range(2):
                    await admin.set(key, "soon")
                    await limiter.acquire()
                    assert await admin.get(key) != b"soon"  # reset each time
        finally:
            await limiter.aclose()
        assert caplog.text.count(f"{key} ") == 1  # once per process, not per reset

    async def test_a_learned_rate_key_of_another_type_is_replaced(
        self, redis_server: str, prefix: str, admin: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        key = f"{prefix}rate:learned"
        await admin.rpush(key, "not a rate")
        limiter = da.RedisRateLimiter(redis_server, requests_per_second="auto", key_prefix=prefix)
        await acquired(limiter, 3)  # it failed closed, forever
        fresh = RateState.decode((await admin.get(key)).decode())
        assert fresh is not None
        assert (fresh.rate, fresh.version, fresh.reason) == (Aimd().initial, 1, "start")
        assert limiter.requests_per_second == Aimd().initial
        assert caplog.text.count(f"{key} ") == 1
        assert "unreachable" not in caplog.text

    async def test_a_hold_planted_far_ahead_is_ignored(
        self, redis_server: str, prefix: str, admin: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        key = f"{prefix}rate:learned:hold"
        await admin.set(key, repr(await redis_now(admin) + A_DAY))
        limiter = da.RedisRateLimiter(redis_server, requests_per_second="auto", key_prefix=prefix)
        await acquired(limiter)
        assert await admin.exists(key) == 0
        assert caplog.text.count(f"{key} ") == 1

    async def test_a_retry_after_holds_the_fleet_two_minutes_at_most(
        self, redis_server: str, prefix: str, admin: Any
    ) -> None:
        (told,) = limiters(redis_server, prefix, "auto", 1)
        assert told.learner is not None
        try:
            await told.learner.hold(A_DAY)
        finally:
            await told.aclose()
        assert 100 < await lead(admin, f"{prefix}rate:learned:hold") <= 121

    async def test_a_change_dated_by_a_clock_an_hour_ahead_stops_no_rise(
        self, redis_server: str, prefix: str, admin: Any
    ) -> None:
        ahead = RateState(40.0, 7, time.time() + AN_HOUR, 2.0, "increase")
        await admin.set(f"{prefix}rate:learned", ahead.encode())
        (limiter,) = limiters(redis_server, prefix, "auto", 1)
        assert limiter.learner is not None
        try:
            await limiter.learner.refresh()
            await limiter.learner.answered(Slot(7, held=True), 200)
        finally:
            await limiter.aclose()
        raw = await admin.get(f"{prefix}rate:learned")
        risen = RateState.decode(raw.decode())
        assert risen is not None
        assert (risen.rate, risen.version, risen.reason) == (42.0, 8, "increase")


class TestManyProcessesKeepTheRate:
    async def test_more_processes_than_the_schedule_holds_still_keep_to_the_rate(
        self, redis_server: str, prefix: str
    ) -> None:
        """At 4/s the schedule holds 8 turns (2 s): the other 4 processes ask again."""
        fleet = limiters(redis_server, prefix, 4, 12)
        started = time.monotonic()
        try:
            async with asyncio.timeout(HANG):
                await asyncio.gather(*(limiter.acquire() for limiter in fleet))
        finally:
            await closed(*fleet)
        # 12 requests at 4/s: the last starts 11/4 s after the first (lower bound only).
        assert time.monotonic() - started >= 2.5

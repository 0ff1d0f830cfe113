"""RedisRateLimiter: one requests-per-second budget for every process sharing Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import redis.asyncio

import dispatch_async as da
from dispatch_async._adaptive import Aimd
from dispatch_async._fleet.schedule import Schedule
from dispatch_async.testing import FakeDispatchServer
from tests.conftest import SECRET, numbers, session_for
from tests.fleet.conftest import free_port, redis_user


async def test_limiters_sharing_a_prefix_share_one_budget(redis_server: str, prefix: str) -> None:
    limiters = [
        da.RedisRateLimiter(redis_server, requests_per_second=10, key_prefix=prefix)
        for _ in range(3)
    ]
    started = time.monotonic()
    try:
        # 3 limiters x 7 requests = 21 requests at 10 per second: the last waits >= 1 s.
        await asyncio.gather(*(lim.acquire() for lim in limiters for _ in range(7)))
    finally:
        for lim in limiters:
            await lim.aclose()
    assert time.monotonic() - started >= 1.0


async def test_fails_closed_while_redis_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    limiter = da.RedisRateLimiter(
        f"redis://127.0.0.1:{free_port()}/0", requests_per_second=100, on_redis_error="closed"
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(limiter.acquire(), timeout=0.5)
    await limiter.aclose()
    assert "unreachable" in caplog.text


async def test_fails_open_to_a_local_limit_while_redis_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = da.RedisRateLimiter(
        f"redis://127.0.0.1:{free_port()}/0",
        requests_per_second=100,
        on_redis_error="open",
        local_requests_per_second=50,
    )
    await asyncio.wait_for(asyncio.gather(*(limiter.acquire() for _ in range(3))), timeout=5)
    await limiter.aclose()
    assert caplog.text.count("unreachable") == 1  # once per outage, not per request


@pytest.mark.parametrize("rate", [0, -1, True, "5"])
def test_a_bad_rate_is_refused(rate: object) -> None:
    with pytest.raises(da.ConfigurationError):
        da.RedisRateLimiter("redis://127.0.0.1:6379/0", requests_per_second=rate)  # type: ignore[arg-type]


async def test_the_documented_acl_is_enough(
    redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis user restricted as the README says can share the token and the limit."""
    admin = redis.asyncio.Redis.from_url(redis_server)
    user = f"fleet-{prefix.rstrip(':')}"
    try:
        await admin.execute_command(
            "ACL", "SETUSER", user, "reset", "on", ">s3cret", f"~{prefix}*", "resetchannels",
            "-@all", "+get", "+set", "+pttl", "+pexpire", "+del", "+evalsha", "+eval",
            "+script|load", "+ping", "+time",
        )  # fmt: skip
        url = redis_server.replace("redis://", f"redis://{user}:s3cret@")
        async with FakeDispatchServer(client_secret=SECRET) as server:
            async with session_for(
                server,
                token_store=da.RedisTokenStore(url, key_prefix=prefix),
                rate_limiter=da.RedisRateLimiter(url, requests_per_second=50, key_prefix=prefix),
            ) as session:
                async with asyncio.timeout(20):  # a refused command would make it wait
                    result = await session.send_basic(numbers(20), text="hi", chunk_size=5)
            assert len(result.valid) == 20
            assert server.stats.token_calls == 1
        # The token went through Redis (the store did not fall back to a local token).
        assert await admin.exists(f"{prefix}token") == 1
        assert "unreachable" not in caplog.text
        assert "may not run TIME" not in caplog.text  # the schedule keeps Redis's time
        # Outside the prefix, the same user can read nothing.
        other = redis.asyncio.Redis.from_url(url)
        try:
            with pytest.raises(redis.exceptions.NoPermissionError):
                await other.get("elsewhere:token")
        finally:
            await other.aclose()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_unreachable_rate_limit_redis_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="dispatch_async")
    async with FakeDispatchServer(client_secret=SECRET) as server:
        limiter = da.RedisRateLimiter(
            f"redis://127.0.0.1:{free_port()}/0", requests_per_second=100, on_redis_error="open"
        )
        async with session_for(server, rate_limiter=limiter) as session:
            result = await session.send_basic(numbers(10), text="hi", chunk_size=2)
    assert len(result.valid) == 10
    assert caplog.text.count("rate limit in Redis is unreachable") == 1


async def test_the_schedule_keeps_exact_time_at_thousands_a_second(
    redis_server: str, prefix: str
) -> None:
    """Each step adds 1/rate: the stored time rounded to 14 digits sent 10% too fast."""
    client = redis.asyncio.Redis.from_url(redis_server)
    key = f"{prefix}rate:next"

    async def connected() -> redis.asyncio.Redis:
        return client

    schedule = Schedule(connected, lambda name: prefix + name, "rate:next")
    gap = 1 / 3000
    try:
        # The fleet is 0.8 s ahead of Redis's clock (within what the schedule holds at
        # this rate, 1 s): each reservation is one gap after the one before.
        seconds, micros = await client.time()
        start = seconds + micros / 1e6 + 0.8
        await client.set(key, repr(start), px=5000)
        turns = [await schedule.reserve(gap) for _ in range(200)]
        end = float(await client.get(key))
    finally:
        await client.aclose()
    assert all(turn.reserved for turn in turns)
    # (Doubles near the epoch still round each step by a fraction of a microsecond.)
    assert end - start == pytest.approx(200 * gap, rel=1e-3)


class TestItsSettings:
    @pytest.mark.parametrize(
        ("options", "refused"),
        [
            ({"requests_per_second": 5, "on_redis_error": "ignore"}, "on_redis_error"),
            ({"requests_per_second": 5, "max_requests_per_second": 10}, '"auto"'),
            ({"requests_per_second": 5, "local_requests_per_second": -1}, "local_requests"),
            ({"requests_per_second": 5, "local_requests_per_second": 0}, "local_requests"),
        ],
    )
    def test_a_bad_setting_is_refused_naming_it(
        self, options: dict[str, Any], refused: str
    ) -> None:
        with pytest.raises(da.ConfigurationError, match=refused):
            da.RedisRateLimiter("redis://127.0.0.1:1/0", **options)

    async def test_a_fixed_rate_is_its_rate_and_closing_it_unused_connects_nothing(self) -> None:
        limiter = da.RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", requests_per_second=5)
        assert limiter.requests_per_second == 5.0
        await limiter.aclose()  # nothing listens there: no connection is made


class TestARedisThatRefusesAndComesBack:
    async def test_a_refused_command_is_a_configuration_error_at_once(
        self, redis_server: str, prefix: str
    ) -> None:
        """NOPERM is no outage: waiting for it (as before) never ends."""
        async with redis_user(redis_server, prefix, "+get", "+time") as url:
            limiter = da.RedisRateLimiter(url, requests_per_second=100, key_prefix=prefix)
            try:
                async with asyncio.timeout(5):
                    with pytest.raises(da.RedisConfigurationError, match=r"NOPERM|ACL"):
                        await limiter.acquire()
            finally:
                await limiter.aclose()

    async def test_a_learned_rate_failing_open_paces_each_process_at_its_last_rate(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        limiter = da.RedisRateLimiter(
            f"redis://127.0.0.1:{free_port()}/0", requests_per_second="auto", on_redis_error="open"
        )
        try:
            await asyncio.wait_for(asyncio.gather(*(limiter.acquire() for _ in range(3))), 30)
        finally:
            await limiter.aclose()
        assert limiter.requests_per_second == Aimd().initial  # nothing learned: the start
        assert caplog.text.count("sending at a per-process rate") == 1

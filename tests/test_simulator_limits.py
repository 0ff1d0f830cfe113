"""The simulator's own extras: a per-account rate limit, its counters over HTTP, its summary."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer
from dispatch_async.testing._rate import AccountRateLimit

from .conftest import HANG
from .test_simulator import PROJECT_ROOT, body, post


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestTheTokenBucket:
    def test_allows_a_burst_of_one_second_then_one_request_per_interval(self) -> None:
        clock = Clock()
        limit = AccountRateLimit(5, clock=clock)
        assert [limit.take("acme") for _ in range(5)] == [None] * 5
        wait = limit.take("acme")
        assert wait == pytest.approx(0.2)
        clock.now += 0.2
        assert limit.take("acme") is None
        assert limit.take("acme") == pytest.approx(0.2)

    def test_each_account_has_its_own_bucket(self) -> None:
        limit = AccountRateLimit(1, clock=Clock())
        assert limit.take("acme") is None
        assert limit.take("acme") is not None
        assert limit.take("other") is None

    def test_lowering_the_rate_caps_what_a_bucket_holds(self) -> None:
        clock = Clock()
        limit = AccountRateLimit(50, clock=clock)
        limit.take("acme")
        limit.rate = 2
        assert [limit.take("acme") is None for _ in range(3)] == [True, True, False]

    def test_no_rate_lets_everything_through(self) -> None:
        limit = AccountRateLimit(None)
        assert all(limit.take("acme") is None for _ in range(1000))

    @pytest.mark.parametrize("rate", [0, -1, float("inf"), float("nan")])
    def test_refuses_a_rate_that_is_not_a_positive_number(self, rate: float) -> None:
        with pytest.raises(ValueError, match="positive"):
            AccountRateLimit(rate)


class TestTheServersRateLimit:
    async def test_over_the_limit_it_answers_429_with_retry_after_and_acts_on_nothing(
        self, http: aiohttp.ClientSession
    ) -> None:
        async with FakeDispatchServer(rate_limit=2) as server:
            token = server.issue_token()
            statuses = [(await post(http, server, body(), token=token))[0] for _ in range(3)]
            assert statuses == [200, 200, 429]
            assert server.stats.dispatch_calls == 2
            assert server.stats.rate_limited == 1
            url = f"{server.url}/api/v3/basic"
            headers = {"Authorization": f"Bearer {token}", "X-Auth-Type": "JWT"}
            async with http.post(url, json=body(), headers=headers) as response:
                assert response.status == 429
                assert 0 < float(response.headers["Retry-After"]) <= 0.5

    async def test_the_sdk_honours_its_retry_after_and_sends_everything_once(self) -> None:
        async with (
            FakeDispatchServer(rate_limit=20, client_secret="s") as server,
            da.DispatchSession(
                server.url, client_secret="s", account="acme", retry=da.RetryPolicy(attempts=100)
            ) as session,
        ):
            numbers = [f"+55119{i:08d}" for i in range(60)]
            result = await session.send_template(
                numbers, template_id="t", chunk_size=1, max_concurrency=8
            )
        assert result.ok
        assert server.stats.rate_limited > 0
        assert server.stats.recipients_received == 60
        assert not server.stats.duplicates

    async def test_the_limit_can_change_while_serving_over_http(
        self, http: aiohttp.ClientSession
    ) -> None:
        async with FakeDispatchServer() as server:
            token = server.issue_token()
            async with http.put(f"{server.url}/_rate_limit", json={"rate": 1}) as response:
                assert response.status == 200
            assert server.rate_limit == 1
            statuses = [(await post(http, server, body(), token=token))[0] for _ in range(2)]
            assert statuses == [200, 429]
            async with http.put(f"{server.url}/_rate_limit", json={"rate": None}) as response:
                assert response.status == 200
            assert (await post(http, server, body(), token=token))[0] == 200

    async def test_a_bad_rate_is_refused(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer() as server:
            async with http.put(f"{server.url}/_rate_limit", json={"rate": -3}) as response:
                assert response.status == 400
            assert server.rate_limit is None


class TestItsCounters:
    async def test_are_served_as_json_at_stats(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer() as server:
            token = server.issue_token()
            numbers = ["+5511900000001", "+5511900000001"]
            await post(http, server, body(numbers=numbers), token=token)
            async with http.get(f"{server.url}/_stats") as response:
                stats = orjson.loads(await response.read())
        assert stats["dispatch_calls"] == 1
        assert stats["recipients_received"] == 2
        assert stats["duplicates"] == {"+5511900000001": 2}
        assert stats["status_counts"] == {"200": 1}

    async def test_are_printed_when_the_process_stops(self) -> None:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatch_async.testing",
            "--port",
            "0",
            "--rate-limit",
            "100",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert process.stdout is not None
        async with asyncio.timeout(HANG):
            url = (await process.stdout.readline()).decode().strip()
        async with aiohttp.ClientSession() as http:
            form = {"grant_type": "client_credentials", "client_secret": "test-secret"}
            async with http.post(f"{url}/oauth/token", data=form) as response:
                assert response.status == 200
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(HANG):
            _, err = await process.communicate()
        assert process.returncode == 0
        assert "simulator stopped: 1 token request, " in err.decode()

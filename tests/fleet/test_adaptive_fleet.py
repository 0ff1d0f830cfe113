"""requests_per_second="auto" on a RedisRateLimiter: one learned rate for the whole fleet."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

import pytest
import redis.asyncio

import dispatch_async as da
from dispatch_async._adaptive import Aimd, RateState
from dispatch_async._fleet import learned_rate
from dispatch_async._throttle import Slot
from dispatch_async.testing import FakeDispatchServer
from tests.fleet.conftest import free_port, redis_user

ROOT = Path(__file__).resolve().parents[2]
AN_HOUR = 3600.0


async def workers(
    urls: list[str], redis_server: str, prefix: str, until: str
) -> list[dict[str, Any]]:
    """One worker process per URL, all on *prefix*, sending *until* (see the worker)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.fleet._adaptive_worker",
            url,
            redis_server,
            prefix,
            str(index),
            until,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        for index, url in enumerate(urls)
    ]
    outputs = [await asyncio.wait_for(p.communicate(), timeout=90) for p in processes]
    assert [p.returncode for p in processes] == [0] * len(processes)
    return [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]


async def stored(redis_server: str, prefix: str) -> RateState:
    client = redis.asyncio.Redis.from_url(redis_server)
    try:
        raw = await client.get(f"{prefix}rate:learned")
    finally:
        await client.aclose()
    assert raw is not None
    state = RateState.decode(raw.decode())
    assert state is not None
    return state


async def test_a_429_seen_by_one_worker_lowers_the_rate_of_all(
    redis_server: str, prefix: str
) -> None:
    # The first worker's service limits it; the second's never answers 429.
    async with (
        FakeDispatchServer(client_secret="test-secret", rate_limit=2) as limited,
        FakeDispatchServer(client_secret="test-secret") as free,
    ):
        first, second = await workers([limited.url, free.url], redis_server, prefix, "decrease")
        assert limited.stats.rate_limited > 0
        assert free.stats.rate_limited == 0
        assert limited.stats.recipients_received == first["sent"]
        assert free.stats.recipients_received == second["sent"]
    assert first["failed"] == second["failed"] == 0
    # The second worker learned of decreases it never caused, from the shared rate.
    assert any(seen["reason"] == "decrease" for seen in second["seen"])
    assert all(seen["shared"] for seen in first["seen"] + second["seen"])
    learned = await stored(redis_server, prefix)
    assert learned.rate < Aimd().initial


async def test_a_worker_that_starts_later_adopts_the_fleets_rate(
    redis_server: str, prefix: str
) -> None:
    async with FakeDispatchServer(client_secret="test-secret", rate_limit=3) as server:
        await workers([server.url], redis_server, prefix, "decrease")
        before = await stored(redis_server, prefix)
        assert before.rate < Aimd().initial  # it learned something below where it started
        (late,) = await workers([server.url], redis_server, prefix, "once")
    first = late["seen"][0]
    assert first["previous"] is None
    assert first["reason"] != "start"  # adopted, not probing from scratch
    assert first["requests_per_second"] == pytest.approx(before.rate)


async def answer_all_at_once(limiters: list[Any], slot: Slot, status: int) -> None:
    """Every limiter hears *status* for *slot* at the same moment; then all are closed."""
    try:
        await asyncio.gather(*(lim.learner.answered(slot, status) for lim in limiters))
    finally:
        for lim in limiters:
            await lim.aclose()


class TestCoordination:
    """Many processes deciding at once change the shared rate once (compare-and-set)."""

    async def limiters(
        self, redis_server: str, prefix: str, state: RateState, count: int = 5
    ) -> list[Any]:
        """*count* processes' limiters, each holding *state* as the fleet's rate."""
        client = redis.asyncio.Redis.from_url(redis_server)
        try:
            await client.set(f"{prefix}rate:learned", state.encode())
        finally:
            await client.aclose()
        found = []
        for _ in range(count):
            limiter = da.RedisRateLimiter(
                redis_server, requests_per_second="auto", key_prefix=prefix
            )
            assert limiter.learner is not None
            await limiter.learner.refresh()
            found.append(limiter)
        return found

    async def test_five_due_increases_at_once_raise_the_rate_one_step(
        self, redis_server: str, prefix: str
    ) -> None:
        old = RateState(40.0, 7, time.time() - 10, step=2.0, reason="decrease")
        limiters = await self.limiters(redis_server, prefix, old)
        await answer_all_at_once(limiters, Slot(7, held=True), 200)
        now = await stored(redis_server, prefix)
        assert (now.rate, now.version, now.reason) == (42.0, 8, "increase")

    async def test_five_429s_to_the_same_rate_cut_it_once(
        self, redis_server: str, prefix: str
    ) -> None:
        old = RateState(40.0, 7, time.time() - 10, step=2.0, reason="increase")
        limiters = await self.limiters(redis_server, prefix, old)
        await answer_all_at_once(limiters, Slot(7, held=True), 429)
        now = await stored(redis_server, prefix)
        assert (now.rate, now.version, now.reason) == (pytest.approx(32.0), 8, "decrease")
        # Every process holds what Redis holds, not a cut of its own.
        assert all(lim.learner.state == now for lim in limiters)

    async def test_a_rise_decided_from_an_older_rate_never_overwrites_a_cut(
        self, redis_server: str, prefix: str
    ) -> None:
        old = RateState(40.0, 7, time.time() - 10, step=2.0, reason="increase")
        cutter, stale = await self.limiters(redis_server, prefix, old, count=2)
        try:
            await cutter.learner.answered(Slot(7, held=True), 429)
            # The other process still holds the rate from before the cut, due a rise.
            assert stale.learner.state == old
            await stale.learner.answered(Slot(7, held=True), 200)
        finally:
            await cutter.aclose()
            await stale.aclose()
        now = await stored(redis_server, prefix)
        assert (now.rate, now.version, now.reason) == (pytest.approx(32.0), 8, "decrease")
        assert stale.learner.state == now

    async def test_a_retry_after_told_to_one_process_holds_every_process(
        self, redis_server: str, prefix: str
    ) -> None:
        told, other = await self.limiters(redis_server, prefix, Aimd().start(time.time()), 2)
        try:
            await told.learner.hold(30.0)
            turn = await other.learner.reserve(10.0)
        finally:
            await told.aclose()
            await other.aclose()
        assert turn.reserved
        assert turn.wait > 20  # generous: the other's next send is ~30 s away


@pytest.mark.parametrize("rate", ["auto", 10], ids=["learned", "fixed"])
async def test_processes_share_the_rate_fairly(
    redis_server: str, prefix: str, rate: float | Literal["auto"]
) -> None:
    """Each request reserves the fleet's next send time: a fast process starves no other."""
    limiters = [
        da.RedisRateLimiter(redis_server, requests_per_second=rate, key_prefix=prefix)
        for _ in range(3)
    ]
    done = [0, 0, 0]
    first_finished: list[int] = []

    async def one_task(index: int) -> None:
        for _ in range(3):
            await limiters[index].acquire()
            done[index] += 1

    async def send(index: int) -> None:  # 4 requests in flight per process, 12 in all
        await asyncio.gather(*(one_task(index) for _ in range(4)))
        if not first_finished:
            first_finished.extend(done)

    try:
        await asyncio.gather(*(send(index) for index in range(3)))
    finally:
        for limiter in limiters:
            await limiter.aclose()
    # At 10 requests/s for the fleet (the learned rate's start, or the fixed one): when one
    # process has had its 12, the others have had nearly as many (with a window every
    # process raced for, one got ahead by half).
    assert min(first_finished) >= 9


async def test_a_stranger_value_under_the_key_is_replaced_by_a_fresh_start(
    redis_server: str, prefix: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server)
    try:
        await client.set(f"{prefix}rate:learned", "not a state")
    finally:
        await client.aclose()
    limiter = da.RedisRateLimiter(redis_server, requests_per_second="auto", key_prefix=prefix)
    try:
        await limiter.acquire()
        assert limiter.requests_per_second == Aimd().initial
    finally:
        await limiter.aclose()
    assert (await stored(redis_server, prefix)).version == 1


def test_auto_is_shown_in_its_repr() -> None:
    limiter = da.RedisRateLimiter("redis://127.0.0.1:1/0", requests_per_second="auto")
    assert "requests_per_second=auto" in repr(limiter)
    assert limiter.requests_per_second is None  # nothing learned yet


def test_a_local_rate_for_failing_open_is_refused_with_auto() -> None:
    with pytest.raises(da.ConfigurationError, match="rate last learned"):
        da.RedisRateLimiter(
            "redis://127.0.0.1:1/0", requests_per_second="auto", local_requests_per_second=5
        )


class TestTheLearnedRateWhenRedisFailsOrLags:
    async def test_before_anything_is_read_a_process_paces_at_the_starting_rate(self) -> None:
        limiter = da.RedisRateLimiter("redis://127.0.0.1:1/0", requests_per_second="auto")
        assert limiter.learner is not None
        assert limiter.learner.current_rate == Aimd().initial

    async def test_a_retry_after_redis_cannot_hold_is_logged_not_raised(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        limiter = da.RedisRateLimiter(
            f"redis://127.0.0.1:{free_port()}/0", requests_per_second="auto"
        )
        assert limiter.learner is not None
        try:
            await limiter.learner.hold(5.0)
        finally:
            await limiter.aclose()
        assert "the shared rate limit in Redis is unreachable (ConnectionError" in caplog.text

    async def test_an_answer_neither_429_nor_200_changes_no_rate(
        self, redis_server: str, prefix: str
    ) -> None:
        old = RateState(40.0, 7, time.time() - 10, step=2.0, reason="decrease")  # due a rise
        [limiter] = await TestCoordination().limiters(redis_server, prefix, old, count=1)
        try:
            await limiter.learner.answered(Slot(7, held=True), 500)
        finally:
            await limiter.aclose()
        assert await stored(redis_server, prefix) == old

    async def test_a_change_redis_refuses_to_store_is_a_configuration_error_rate_kept(
        self, redis_server: str, prefix: str
    ) -> None:
        """NOPERM is the ACL, not an outage: said at once, naming the fix."""
        old = RateState(40.0, 7, time.time() - 10, step=2.0, reason="decrease")  # due a rise
        async with redis.asyncio.Redis.from_url(redis_server) as admin:
            await admin.set(f"{prefix}rate:learned", old.encode())
        async with redis_user(redis_server, prefix, "+get", "+time") as url:
            limiter = da.RedisRateLimiter(url, requests_per_second="auto", key_prefix=prefix)
            assert limiter.learner is not None
            try:
                assert await limiter.learner.refresh() == old  # read with GET
                with pytest.raises(da.RedisConfigurationError, match=r"NoPermissionError.*ACL"):
                    await limiter.learner.answered(Slot(7, held=True), 200)  # written with EVAL
            finally:
                await limiter.aclose()
        assert limiter.learner.state == old
        assert await stored(redis_server, prefix) == old

    async def test_a_redis_that_will_not_be_read_is_a_configuration_error_not_a_fresh_start(
        self, redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        async with redis_user(redis_server, prefix, "+set") as url:
            limiter = da.RedisRateLimiter(url, requests_per_second="auto", key_prefix=prefix)
            assert limiter.learner is not None
            try:
                with pytest.raises(da.RedisConfigurationError, match="NoPermissionError"):
                    await limiter.learner.refresh()
            finally:
                await limiter.aclose()
        async with redis.asyncio.Redis.from_url(redis_server) as admin:
            written = await admin.exists(f"{prefix}rate:learned")
        assert "was of another type" not in caplog.text
        assert not written

    async def test_a_rate_older_than_the_one_held_is_not_adopted(
        self, redis_server: str, prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A reply that left Redis before a newer one this process already has."""
        monkeypatch.setattr(learned_rate, "REFRESH", 0.0)  # read Redis at every refresh
        newer = RateState(32.0, 8, time.time() - 5, step=2.0, reason="decrease")
        older = RateState(40.0, 7, time.time() - 10, step=2.0, reason="increase")
        [limiter] = await TestCoordination().limiters(redis_server, prefix, newer, count=1)
        admin = redis.asyncio.Redis.from_url(redis_server)
        try:
            await admin.set(f"{prefix}rate:learned", older.encode())
            await limiter.learner.refresh()
        finally:
            await admin.aclose()
            await limiter.aclose()
        assert limiter.learner.state == newer

    @pytest.mark.parametrize("meanwhile", ["deleted", "a stranger's value"])
    async def test_a_turn_taken_while_the_learned_rate_is_gone_keeps_the_rate_held(
        self, redis_server: str, prefix: str, meanwhile: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(learned_rate, "REFRESH", AN_HOUR)  # the copy held is fresh
        held = RateState(40.0, 7, time.time() - 10, step=2.0, reason="decrease")
        [limiter] = await TestCoordination().limiters(redis_server, prefix, held, count=1)
        admin = redis.asyncio.Redis.from_url(redis_server)
        try:
            if meanwhile == "deleted":
                await admin.delete(f"{prefix}rate:learned")
            else:
                await admin.set(f"{prefix}rate:learned", "not a state")
            slot = await limiter.learner.take()
        finally:
            await admin.aclose()
            await limiter.aclose()
        assert slot.version == held.version  # sent under the rate held
        assert limiter.learner.state == held

    async def test_a_fresh_start_that_loses_to_another_writer_overwrites_nothing(
        self, redis_server: str, prefix: str
    ) -> None:
        """A stranger's value, changed again between this process's read and its write."""
        key = f"{prefix}rate:learned"
        admin = redis.asyncio.Redis.from_url(redis_server)
        await admin.set(key, "not a state")
        limiter = da.RedisRateLimiter(redis_server, requests_per_second="auto", key_prefix=prefix)
        assert limiter.learner is not None
        client = await limiter._client()
        read = client.get

        async def read_then_changed(name: str) -> Any:
            value = await read(name)
            await admin.set(key, "another stranger")
            return value

        client.get = read_then_changed
        try:
            state = await limiter.learner.refresh()
            after = await admin.get(key)
        finally:
            await admin.aclose()
            await limiter.aclose()
        assert after == b"another stranger"  # the compare-and-set lost: nothing written
        assert state == limiter.learner.state
        assert (state.rate, state.version) == (Aimd().initial, 1)  # this process starts afresh

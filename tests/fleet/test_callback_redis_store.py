"""The Redis delivery store against a real redis-server: the store contract
(tests/callback_store_contract.py), and what is Redis's own: keys under the prefix,
receivers on several hosts folding one message at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

import dispatch_async as da
from dispatch_async.callbacks import DeliveryStatus, DeliveryTracker, RedisDeliveryStore

from ..callback_store_contract import (
    AnswersQuestions,
    CommitsInGroups,
    StreamsChanges,
    TracksOneMessage,
    event,
    reference,
)


@pytest.fixture
async def tracker(any_redis: str, prefix: str) -> AsyncIterator[DeliveryTracker]:
    store = RedisDeliveryStore(any_redis, key_prefix=prefix)
    async with DeliveryTracker(store, poll_interval=0.05) as opened:
        yield opened


@pytest.fixture
async def second_tracker(
    any_redis: str, prefix: str, tracker: DeliveryTracker
) -> AsyncIterator[DeliveryTracker]:
    store = RedisDeliveryStore(any_redis, key_prefix=prefix)
    async with DeliveryTracker(store, poll_interval=0.05) as opened:
        yield opened


class TestTracksOneMessage(TracksOneMessage):
    pass


class TestAnswersQuestions(AnswersQuestions):
    pass


class TestStreamsChanges(StreamsChanges):
    pass


class TestCommitsInGroups(CommitsInGroups):
    pass


class TestRedisOwn:
    async def test_every_key_is_under_the_prefix_braced_on_a_cluster(
        self, tracker: DeliveryTracker, any_redis: str, prefix: str, request: pytest.FixtureRequest
    ) -> None:
        ref = reference()
        await tracker.record(event(ref, "READ", campaign="july"))
        on_cluster = "cluster" in request.node.callspec.id
        kind = redis.asyncio.RedisCluster if on_cluster else redis.asyncio.Redis
        client = kind.from_url(any_redis.removesuffix("/0"))
        try:
            keys = {key.decode() async for key in client.scan_iter(match="*")}
        finally:
            await client.aclose()
        if on_cluster:
            prefix = f"{{{prefix}}}"  # one hash slot: a batch's script uses them together
        mine = {key for key in keys if key.startswith(prefix)}
        assert mine == {
            f"{prefix}cb:m:{ref}",
            f"{prefix}cb:k:{ref}",
            f"{prefix}cb:e:{ref}",
            f"{prefix}cb:n:5511987654321",
            f"{prefix}cb:c:=july",
            f"{prefix}cb:log",
        }

    async def test_a_message_keeps_its_campaign_when_a_later_event_names_another(
        self, tracker: DeliveryTracker
    ) -> None:
        """The script is told the key of the campaign counted before (it builds no key)."""
        ref = reference()
        await tracker.record(event(ref, "basic", campaign="july"))
        await tracker.record(event(ref, "READ", campaign="august"))
        assert await tracker.counts("july") == {DeliveryStatus.READ: 1}
        assert await tracker.counts("august") == {}

    async def test_two_hosts_folding_one_message_never_move_it_back(
        self, tracker: DeliveryTracker, second_tracker: DeliveryTracker
    ) -> None:
        refs = [reference() for _ in range(100)]
        types = ["basic", "DELIVERED", "READ"]
        await asyncio.gather(
            *(
                host.record(event(ref, types[(i + j) % 3], event_id=f"e-{j}"))
                for i, ref in enumerate(refs)
                for j, host in enumerate((tracker, second_tracker, tracker))
            )
        )
        assert await tracker.counts("july") == {DeliveryStatus.READ: 100}

    async def test_a_bad_prefix_or_url_is_a_configuration_error(self, redis_server: str) -> None:
        with pytest.raises(da.ConfigurationError, match="key_prefix"):
            RedisDeliveryStore(redis_server, key_prefix="a*")
        with pytest.raises(da.ConfigurationError, match="redis://"):
            RedisDeliveryStore("http://127.0.0.1:6379")

    async def test_the_password_stays_out_of_the_repr(self) -> None:
        store = RedisDeliveryStore("redis://:hunter2@127.0.0.1:6379/0")
        assert "hunter2" not in repr(store)

    async def test_a_redis_that_is_down_is_a_store_error(self) -> None:
        store = RedisDeliveryStore("redis://127.0.0.1:9/0")
        with pytest.raises(da.DeliveryStoreError, match="ConnectionError"):
            await DeliveryTracker(store).open()

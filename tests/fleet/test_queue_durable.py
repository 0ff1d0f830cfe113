"""A worker's claim and records outlive a failover: each waits for a replica to have it,
and runs again on the new primary when none did (``durable``).

Behind Sentinel, a primary failed over while still up goes on taking writes from the
connections made before, and drops them once the sentinels make it a replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dispatch_async._cli.queued.chunks import (
    IN_FLIGHT,
    PENDING,
    JobKeys,
    QueueRedis,
    claim,
    connect,
    finish,
)
from dispatch_async._cli.queued.link import disconnect
from tools.redis_topologies import SentinelSet, cli


async def _job(redis: QueueRedis, keys: JobKeys, chunks: int) -> None:
    """A job of *chunks* pending chunks, their rows stored."""
    await redis.hset(keys.meta, mapping={"target": "{}", "account": ""})
    for index in range(chunks):
        await redis.hset(keys.state, str(index), PENDING)
        await redis.set(keys.rows(index), b"[]")


class TestClaimingTwice:
    @pytest.fixture
    async def redis(self, redis_server: str) -> AsyncIterator[QueueRedis]:
        client = await connect(redis_server)
        try:
            yield client
        finally:
            await disconnect(client)

    async def test_the_same_claim_repeated_finds_the_chunk_as_the_first_did(
        self, redis: QueueRedis, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "twice")
        await _job(redis, keys, 1)
        first = await claim(redis, keys, 0, "1@host:7", b"1-1")
        again = await claim(redis, keys, 0, "1@host:7", b"1-1")
        assert (first.state, again.state) == (PENDING, PENDING)
        assert await redis.hget(keys.owner, "0") == b"1@host:7"

    async def test_another_claim_finds_the_chunk_in_flight(
        self, redis: QueueRedis, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "other")
        await _job(redis, keys, 1)
        await claim(redis, keys, 0, "1@host:7", b"1-1")
        later = await claim(redis, keys, 0, "2@host:7", b"1-1")
        assert (later.state, later.failed_over) == (IN_FLIGHT, False)
        assert await redis.hget(keys.owner, "0") == b"1@host:7"


class TestAfterASentinelFailover:
    async def test_claims_and_records_written_after_it_are_on_the_new_primary(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "split")
        redis = await connect(redis_sentinels.url)
        try:
            await _job(redis, keys, 4)
            await claim(redis, keys, 0, "1@w:1", b"1-0")  # before: the connection is made
            new = await asyncio.to_thread(redis_sentinels.fail_over)
            # Another worker, on the new primary, claimed chunk 3 meanwhile.
            cli(new, "hset", keys.state, "3", "in_flight")
            cli(new, "hset", keys.owner, "3", "1@w:2")
            taken = await claim(redis, keys, 3, "2@w:1", b"1-3")
            mine = await claim(redis, keys, 1, "3@w:1", b"1-1")
            await finish(redis, keys, 0, [b'{"line":2}'], None, 60)
        finally:
            await disconnect(redis)

        def on_new(*args: str) -> str:
            return cli(new, *args).strip()

        assert (taken.state, taken.failed_over) == (IN_FLIGHT, True)
        assert on_new("hget", keys.owner, "3") == "1@w:2"
        assert mine.state == PENDING
        assert on_new("hget", keys.state, "1") == "in_flight"
        assert on_new("hget", keys.owner, "1") == "3@w:1"
        assert on_new("hget", keys.state, "0") == "done"
        assert on_new("hget", keys.out, "0") == '{"line":2}'

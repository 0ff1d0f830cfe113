"""Finishing a chunk: its records and ``done`` at once, then its stream entry let go; a
second entry for one chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from dispatch_async._cli.queued.chunks import GROUP, JobKeys, QueueRedis, claim, connect, finish
from dispatch_async._cli.queued.worker import Worker
from tests.fleet.test_queue import worker_config


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[QueueRedis]:
    client = await connect(redis_server)
    try:
        yield client
    finally:
        await client.aclose()


async def _chunk_in_stream(redis: QueueRedis, keys: JobKeys, state: bytes) -> bytes:
    """Chunk 3 of the job in *state*, with its rows, and its entry delivered to a worker."""
    await redis.hset(keys.meta, mapping={"target": "{}", "account": ""})
    await redis.hset(keys.state, "3", state)
    await redis.set(keys.rows(3), b"[]")
    await redis.hset(keys.queued, "3", 1)
    await redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    entry: bytes = await redis.xadd(keys.stream, {"job": keys.job, "chunk": "3"})
    await redis.xreadgroup(GROUP, "w", {keys.stream: ">"}, count=1)
    return entry


async def test_finishing_stores_the_records_and_lets_the_entry_go(
    redis: QueueRedis, prefix: str
) -> None:
    keys = JobKeys(prefix, "job")
    entry = await _chunk_in_stream(redis, keys, b"in_flight")
    assert await finish(redis, keys, 3, [b'{"line":2}', b'{"line":3}'], entry, 100)
    assert await redis.hget(keys.out, "3") == b'{"line":2}\n{"line":3}'
    assert await redis.hget(keys.state, "3") == b"done"
    assert await redis.hget(keys.meta, "last_done") is not None
    assert not await redis.exists(keys.rows(3))
    assert not await redis.hexists(keys.queued, "3")
    assert [f for _, f in await redis.xrange(keys.done)] == [{b"chunk": b"3"}]
    assert 0 < await redis.ttl(keys.out) <= 100
    assert 0 < await redis.ttl(keys.done) <= 100
    assert await redis.xlen(keys.stream) == 0
    assert (await redis.xpending(keys.stream, GROUP))["pending"] == 0


async def test_a_redelivery_never_overwrites_a_chunk_done_meanwhile(
    redis: QueueRedis, prefix: str
) -> None:
    keys = JobKeys(prefix, "job")
    entry = await _chunk_in_stream(redis, keys, b"done")
    await redis.hset(keys.out, "3", b"sent")
    assert not await finish(redis, keys, 3, [b"maybe_sent"], entry, 100, only_if_in_flight=True)
    assert await redis.hget(keys.out, "3") == b"sent"
    assert not await redis.exists(keys.done)
    # Its entry is let go all the same.
    assert await redis.xlen(keys.stream) == 0
    assert (await redis.xpending(keys.stream, GROUP))["pending"] == 0
    assert not await redis.hexists(keys.queued, "3")


async def test_a_redelivery_records_a_chunk_still_in_flight(redis: QueueRedis, prefix: str) -> None:
    keys = JobKeys(prefix, "job")
    entry = await _chunk_in_stream(redis, keys, b"in_flight")
    assert await finish(redis, keys, 3, [b"maybe_sent"], entry, -1, only_if_in_flight=True)
    assert await redis.hget(keys.out, "3") == b"maybe_sent"
    assert await redis.ttl(keys.out) == -1  # the job has no TTL: neither have its records
    assert await redis.xlen(keys.stream) == 0


@attrs.frozen
class TwoEntries:
    """Chunk 3 claimed (by a live worker) with the first of its two entries."""

    keys: JobKeys
    worker: Worker
    first: bytes
    second: bytes


@pytest.fixture
async def two_entries(redis: QueueRedis, redis_server: str, prefix: str) -> TwoEntries:
    keys = JobKeys(prefix, "job")
    await redis.hset(keys.meta, mapping={"target": '{"endpoint":"basic","text":"hi"}'})
    await redis.hset(keys.state, "3", b"pending")
    await redis.set(keys.rows(3), b'[[5, "+5511900000005", "hi", null]]')
    await redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    first = await redis.xadd(keys.stream, {"job": keys.job, "chunk": "3"})
    second = await redis.xadd(keys.stream, {"job": keys.job, "chunk": "3"})
    await redis.xreadgroup(GROUP, "w", {keys.stream: ">"}, count=2)
    claimed = await claim(redis, keys, 3, "live:1", first)
    assert claimed.state == b"pending"
    return TwoEntries(keys, Worker(worker_config(redis_server, prefix), redis), first, second)


class TestASecondEntryForAChunk:
    """A producer that died between adding a chunk's entry and noting it in ``queued``
    leaves an entry that its next run adds again: two entries for one chunk."""

    async def test_it_is_let_go_unrecorded_while_the_first_entry_waits(
        self, redis: QueueRedis, two_entries: TwoEntries
    ) -> None:
        keys = two_entries.keys
        assert await two_entries.worker.send_chunk("job", 3, two_entries.second) == (
            "a second entry: let go"
        )
        assert await redis.hget(keys.state, "3") == b"in_flight"  # the live worker's
        assert not await redis.hexists(keys.out, "3")
        assert [e for e, _ in await redis.xrange(keys.stream)] == [two_entries.first]

    async def test_it_records_the_chunk_maybe_sent_once_the_first_entry_is_gone(
        self, redis: QueueRedis, two_entries: TwoEntries
    ) -> None:
        keys = two_entries.keys
        # The first let go without a record (its rows were gone): the chunk is the second's.
        await redis.xdel(keys.stream, two_entries.first)
        assert await two_entries.worker.send_chunk("job", 3, two_entries.second) == "interrupted"
        assert b"maybe_sent" in await redis.hget(keys.out, "3")
        assert await redis.xlen(keys.stream) == 0

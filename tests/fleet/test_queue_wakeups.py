"""A queued job moves at the speed of its workers, not of a poll interval.

The workers here run in this process with a poll interval of an hour: whatever they do
within the test, Redis handed them (a chunk queued by the producer, given to one slot
waiting in XREADGROUP ... BLOCK). Each test's `asyncio.timeout` only stops a hang: a
worker that waited for its poll interval would not finish at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from dispatch_async._cli.queue import JobKeys, connect, stream_name
from dispatch_async._cli.report import report
from dispatch_async._cli.spec import Connection
from dispatch_async._cli.waiting import wait_until_done
from dispatch_async._cli.worker import Worker, WorkerConfig
from dispatch_async.testing import FakeDispatchServer
from tests.fleet.test_queue import CHUNK, LINES, SECRET, produce, read_report, until, write_input

ROOT = Path(__file__).resolve().parents[2]
CHUNKS = LINES // CHUNK
AN_HOUR = 3600.0
#: Only a hang guard (see the module docstring), never a measure of speed.
HANG = 60


class Fetches:
    """Counts a worker's reads of new entries (XREADGROUP); `done` is set after each."""

    def __init__(self, pool: Any) -> None:
        self.count = 0
        self.done = asyncio.Event()
        read = pool.xreadgroup

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            try:
                return await read(*args, **kwargs)
            finally:
                self.done.set()

        pool.xreadgroup = counted


async def blocked_readers(admin: Any) -> int:
    """How many clients wait in a blocking command (here: slots in XREADGROUP)."""
    return int((await admin.info("clients"))["blocked_clients"])


@contextlib.asynccontextmanager
async def running_worker(
    server: FakeDispatchServer,
    queue_url: str,
    prefix: str,
    *,
    max_jobs: int = 2,
    poll_delay: float = AN_HOUR,
    takeover_after: float = 30.0,
    idle_first: bool = False,
) -> AsyncIterator[Fetches]:
    """An in-process worker (with *idle_first*, idle before this yields: each slot
    waiting in XREADGROUP), stopped (as by SIGTERM) at the end."""
    config = WorkerConfig(
        queue_url=queue_url,
        connection=Connection(base_url=server.url, client_secret=SECRET, account="acme"),
        key_prefix=prefix,
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        takeover_after=takeover_after,
    )
    pool = await connect(queue_url)
    fetches = Fetches(pool)
    before = await blocked_readers(pool) if idle_first else 0
    running = asyncio.ensure_future(Worker(config, pool).run())
    try:
        if idle_first:

            async def idle() -> bool:
                return await blocked_readers(pool) >= before + max_jobs

            await until(idle, HANG, "the worker's slots waiting for entries")
        yield fetches
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await pool.aclose()


async def produce_all(queue_url: str, prefix: str, source: Path, job: str) -> None:
    assert (await produce(queue_url, prefix, source, job)).enqueued == CHUNKS


async def queued(queue_url: str, prefix: str, tmp_path: Path, job: str) -> JobKeys:
    """*job* produced from a fresh input file, every chunk pending."""
    source = tmp_path / "in.csv"
    write_input(source)
    await produce_all(queue_url, prefix, source, job)
    return JobKeys(prefix, job)


async def test_an_idle_worker_sends_a_job_queued_after_it_went_idle(
    redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    redis = await connect(redis_server)
    async with (
        FakeDispatchServer(client_secret=SECRET, latency=0.05) as server,
        running_worker(server, redis_server, prefix, idle_first=True) as fetches,
    ):
        # The queue was empty: the worker is idle now, both slots waiting in Redis.
        fetches.count = 0
        await produce_all(redis_server, prefix, source, "idle")
        async with asyncio.timeout(HANG):
            # 12 chunks, 2 at a time: each is handed to a waiting slot.
            await wait_until_done(redis, job="idle", key_prefix=prefix, every=AN_HOUR)
        output = tmp_path / "report.jsonl"
        summary = await report(redis, job="idle", output=output, key_prefix=prefix)
        stats = server.stats
    await redis.aclose()
    assert summary.complete
    assert [r["line"] for r in read_report(output)] == list(range(2, LINES + 2))
    assert stats.recipients_received == LINES - 1
    assert not stats.duplicates
    # One read per chunk, and each slot's read still waiting (or cancelled) at the end:
    # handed each chunk, never spinning.
    assert CHUNKS <= fetches.count <= CHUNKS + 2
    assert stats.token_calls == 1


async def test_the_waiting_producer_returns_when_the_last_chunk_is_done(
    redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    await produce_all(redis_server, prefix, source, "wait")
    redis = await connect(redis_server)
    progress: list[tuple[int, int]] = []
    async with FakeDispatchServer(client_secret=SECRET, latency=0.05) as server:
        waiting = asyncio.ensure_future(
            wait_until_done(
                redis,
                job="wait",
                key_prefix=prefix,
                every=AN_HOUR,
                on_progress=lambda done, chunks: progress.append((done, chunks)),
            )
        )
        async with running_worker(server, redis_server, prefix, max_jobs=4):
            async with asyncio.timeout(HANG):
                await waiting
            states = await redis.hvals(JobKeys(prefix, "wait").state)
    await redis.aclose()
    assert states.count(b"done") == CHUNKS
    # Shown at the start and at the end, not once per look at Redis.
    assert progress[0][1] == CHUNKS
    assert progress[-1] == (CHUNKS, CHUNKS)
    assert len(progress) == 2


async def test_a_finished_job_is_not_waited_for(
    redis_server: str, prefix: str, tmp_path: Path
) -> None:
    keys = await queued(redis_server, prefix, tmp_path, "over")
    redis = await connect(redis_server)
    await redis.hset(keys.state, mapping={str(i): b"done" for i in range(CHUNKS)})
    async with asyncio.timeout(HANG):
        await wait_until_done(redis, job="over", key_prefix=prefix, every=AN_HOUR)
    await redis.aclose()


def documented_queue_acl() -> list[str]:
    """The arguments of the queue's ``ACL SETUSER`` line in the fleet guide."""
    guide = (ROOT / "docs" / "guides" / "fleet.md").read_text()
    block = re.search(r"```text\n(ACL SETUSER dispatch-fleet [^`]*)```", guide)
    assert block is not None, "the fleet guide shows the queue's ACL"
    return block.group(1).split()[2:]  # after ACL SETUSER


async def test_the_documented_acl_is_enough_for_a_queued_job(
    redis_server: str, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Producer, worker (a killed worker's chunk taken over), waiting producer and report
    as the Redis user the guide shows, confined to the prefix."""
    caplog.set_level(logging.WARNING, logger="dispatch_async")
    source = tmp_path / "in.csv"
    write_input(source)
    admin = redis.asyncio.Redis.from_url(redis_server)
    user = f"fleet-{prefix.rstrip(':')}"
    words = documented_queue_acl()
    assert words[0] == "dispatch-fleet"
    rules = [w.replace("acme-dispatch:", prefix).replace("PASSWORD", "s3cret") for w in words[1:]]
    await admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
    url = redis_server.replace("redis://", f"redis://{user}:s3cret@")
    keys = JobKeys(prefix, "acl")
    try:
        await produce_all(url, prefix, source, "acl")
        # A chunk a dead worker took (read, never acknowledged): taken over.
        await admin.xreadgroup("workers", "dead:1", {stream_name(prefix): ">"}, count=1)
        async with FakeDispatchServer(client_secret=SECRET) as server:
            pool = await connect(url)
            try:
                async with running_worker(server, url, prefix, poll_delay=0.05, takeover_after=0.2):
                    async with asyncio.timeout(HANG):
                        await wait_until_done(pool, job="acl", key_prefix=prefix, every=0.05)
                summary = await report(pool, job="acl", output=None, key_prefix=prefix)
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await pool.get("elsewhere:token")
            finally:
                await pool.aclose()
            assert server.stats.token_calls == 1
        assert await admin.exists(f"{prefix}token") == 1  # shared through Redis
        assert await admin.xlen(stream_name(prefix)) == 0
        assert await admin.hlen(keys.queued) == 0
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
    assert summary.complete
    assert "took over entry" in caplog.text
    assert "Redis failed" not in caplog.text
    assert "unreachable" not in caplog.text


async def test_a_chunk_slower_than_the_takeover_time_is_not_taken_over(
    redis_server: str, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat keeps a long chunk its worker's, however many workers look."""
    caplog.set_level(logging.WARNING, logger="dispatch_async")
    await queued(redis_server, prefix, tmp_path, "slow")
    redis = await connect(redis_server)
    async with FakeDispatchServer(client_secret=SECRET, latency=1.0) as server:
        fast = {"poll_delay": 0.05, "takeover_after": 0.3}
        async with (
            running_worker(server, redis_server, prefix, **fast),
            running_worker(server, redis_server, prefix, **fast),
        ):
            async with asyncio.timeout(HANG):
                await wait_until_done(redis, job="slow", key_prefix=prefix, every=0.1)
        output = tmp_path / "report.jsonl"
        await report(redis, job="slow", output=output, key_prefix=prefix)
        stats = server.stats
    await redis.aclose()
    records = read_report(output)
    assert Counter(r["outcome"] for r in records) == {"sent": LINES - 2, "invalid": 2}
    assert "took over" not in caplog.text
    assert stats.recipients_received == LINES - 1
    assert not stats.duplicates


class TestAnythingWrittenToTheStreams:
    """Anyone who may write to the streams can: an entry that is no chunk is dropped, and
    nothing of it kept; the waiting producer still looks in Redis."""

    async def test_the_worker_drops_and_keeps_nothing_of_entries_that_are_no_chunk(
        self, redis_server: str, prefix: str
    ) -> None:
        payload = b"x" * 2**20
        writer = redis.asyncio.Redis.from_url(redis_server)
        stream = stream_name(prefix)
        async with (
            FakeDispatchServer(client_secret=SECRET) as server,
            running_worker(server, redis_server, prefix, idle_first=True) as fetches,
        ):
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                for fields in (
                    {"junk": payload},
                    {"job": payload, "chunk": "0"},
                    {"job": "nosuchjob", "chunk": payload},
                    {"job": "nosuchjob", "chunk": "3"},
                ) * 8:
                    fetches.done.clear()
                    await writer.xadd(stream, fields)
                    async with asyncio.timeout(HANG):
                        await fetches.done.wait()  # handed to a slot

                async def drained() -> bool:
                    return await writer.xlen(stream) == 0

                await until(drained, HANG, "every entry dropped")
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
                pending = await writer.xpending(stream, "workers")
                await writer.aclose()
            assert server.stats.dispatch_calls == 0
        assert held < 8 * 2**20  # about 24 MiB were written
        assert pending["pending"] == 0  # every entry acknowledged

    async def test_the_waiting_producer_looks_in_redis_whatever_arrives(
        self, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        """The job is done in Redis, its entries were missed, and entries trickle in."""
        keys = await queued(redis_server, prefix, tmp_path, "trickle")
        redis = await connect(redis_server)
        progress: list[tuple[int, int]] = []
        shown = asyncio.Event()

        def show(done: int, chunks: int) -> None:
            progress.append((done, chunks))
            shown.set()

        waiting = asyncio.ensure_future(
            wait_until_done(redis, job="trickle", key_prefix=prefix, every=0.5, on_progress=show)
        )

        async def trickle() -> None:
            # A worker announcing chunk 0 again and again: each entry comes well within
            # `every` of the one before.
            while True:
                await redis.xadd(keys.done, {"chunk": b"0"})
                await asyncio.sleep(0.05)

        trickling = asyncio.ensure_future(trickle())
        try:
            async with asyncio.timeout(HANG):
                await shown.wait()  # waiting
            await redis.hset(keys.state, mapping={str(i): b"done" for i in range(CHUNKS)})
            async with asyncio.timeout(HANG):  # it looked in Redis within `every`
                await waiting
        finally:
            for task in (waiting, trickling):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await redis.aclose()
        assert progress[-1] == (CHUNKS, CHUNKS)

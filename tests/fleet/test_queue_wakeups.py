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

from dispatch_async._cli.job.spec import Connection
from dispatch_async._cli.queued import consumer as consumer_module
from dispatch_async._cli.queued.chunks import JobKeys, connect, ensure_group, stream_name
from dispatch_async._cli.queued.consumer import Consumer, Entry
from dispatch_async._cli.queued.report import report
from dispatch_async._cli.queued.waiting import wait_until_done
from dispatch_async._cli.queued.worker import Worker, WorkerConfig, run_queue_worker
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.testing import FakeDispatchServer
from tests.fleet.conftest import redis_user, user_of
from tests.fleet.test_queue import (
    CHUNK,
    LINES,
    SECRET,
    produce,
    read_report,
    until,
    worker_config,
    write_input,
)

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


# -- the consumer on its own: a handler of the test's, the real Redis ----------------


class Handled:
    """A handler that keeps what it is handed (`entries`, `seen` set after each)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.entries: list[Entry] = []
        self.seen = asyncio.Event()
        self.fail = fail

    async def __call__(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.seen.set()
        if self.fail is not None:
            raise self.fail


@contextlib.asynccontextmanager
async def consuming(
    client: Any, prefix: str, handle: Any, admin: Any = None, **options: Any
) -> AsyncIterator[asyncio.Future[None]]:
    """A `Consumer` of the stream under *prefix* running (yielded), stopped at the end once
    its slots wait in Redis (stopped as a slot starts its read, it stops when the read's
    block ends: up to 10 s)."""
    settings = {"slots": 1, "takeover": 30.0, "poll": AN_HOUR, **options}
    consumer = Consumer(client, stream_name(prefix), "test:1", handle, **settings)
    admin = admin or client
    before = await blocked_readers(admin)
    running = asyncio.ensure_future(consumer.run())
    try:
        yield running
    finally:
        if not running.done():

            async def idle() -> bool:
                return await blocked_readers(admin) >= before + settings["slots"]

            await until(idle, HANG, "the consumer's slots waiting for entries")
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def handed(handled: Handled, count: int = 1) -> None:
    async with asyncio.timeout(HANG):
        while len(handled.entries) < count:
            handled.seen.clear()
            await handled.seen.wait()


class TestAnEntryWhoseHandlingFailed:
    """It stays in the group, to be taken over later; the slot goes on with the next."""

    @pytest.mark.parametrize(
        ("error", "logged"),
        [
            (RuntimeError("a bug"), "entry {} failed; it is taken over later"),
            (
                redis.exceptions.ConnectionError("lost"),
                "Redis failed while handling entry {}: lost",
            ),
        ],
    )
    async def test_it_is_logged_left_unacknowledged_and_the_next_entry_is_handled(
        self,
        redis_server: str,
        prefix: str,
        caplog: pytest.LogCaptureFixture,
        error: BaseException,
        logged: str,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        client = await connect(redis_server)
        handled = Handled(fail=error)
        stream = stream_name(prefix)
        try:
            first = await client.xadd(stream, {"n": "1"})
            second = await client.xadd(stream, {"n": "2"})
            async with consuming(client, prefix, handled):
                await handed(handled, 2)
            pending = await client.xpending_range(stream, "workers", "-", "+", 10)
        finally:
            await client.aclose()
        assert [e[0] for e in handled.entries] == [first, second]
        assert logged.format(first.decode()) in caplog.text
        assert sorted(p["message_id"] for p in pending) == [first, second]  # not acknowledged


@contextlib.asynccontextmanager
async def user_without(redis_server: str, prefix: str, *commands: str) -> AsyncIterator[str]:
    """The URL of a Redis user with the guide's queue ACL less *commands* (yielded)."""
    rules = [
        w.replace("acme-dispatch:", prefix).replace("PASSWORD", "s3cret")
        for w in documented_queue_acl()[1:]
        if w not in commands
    ]
    async with redis_user(redis_server, prefix, *rules) as url:
        yield url


class TestRedisFailingUnderTheConsumer:
    async def test_a_group_redis_lost_is_created_again_and_entries_still_arrive(
        self, redis_server: str, prefix: str
    ) -> None:
        """A Redis restarted without persistence has no group: the slot makes it again."""
        client = await connect(redis_server)
        handled = Handled()
        stream = stream_name(prefix)
        try:
            async with consuming(client, prefix, handled):
                first = await client.xadd(stream, {"n": "1"})  # handled, never acknowledged
                await handed(handled)
                await client.xgroup_destroy(stream, "workers")  # the slot's read fails
                second = await client.xadd(stream, {"n": "2"})

                async def grouped() -> bool:
                    return bool(await client.xinfo_groups(stream))

                await until(grouped, HANG, "the group created again")
                third = await client.xadd(stream, {"n": "3"})
                await handed(handled, 4)
        finally:
            await client.aclose()
        # The new group starts at the stream's first entry: nothing in the stream is missed.
        assert [e[0] for e in handled.entries] == [first, first, second, third]

    async def test_a_refusing_redis_is_logged_and_tried_again_until_it_answers(
        self,
        redis_server: str,
        prefix: str,
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        monkeypatch.setattr(consumer_module, "_RETRY_AFTER", 0.01)
        admin = redis.asyncio.Redis.from_url(redis_server)
        handled = Handled()
        async with user_without(redis_server, prefix, "+xreadgroup") as url:
            client = await connect(url)
            try:
                async with consuming(client, prefix, handled, admin):

                    async def refused() -> bool:
                        return "NoPermissionError" in caplog.text

                    await until(refused, HANG, "the refusal logged")
                    await admin.execute_command("ACL", "SETUSER", user_of(url), "+xreadgroup")
                    entry = await client.xadd(stream_name(prefix), {"n": "1"})
                    await handed(handled)
            finally:
                await client.aclose()
                await admin.aclose()
        assert handled.entries[0][0] == entry
        # Said as a wrong setting (an error naming the fix), and tried again: fixed, it heals.
        assert "answered NoPermissionError" in caplog.text
        assert "grant the ACL the fleet guide lists" in caplog.text
        assert "trying again" in caplog.text

    async def test_a_failed_heartbeat_is_logged_and_the_entry_still_handled(
        self, redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="dispatch_async")
        admin = redis.asyncio.Redis.from_url(redis_server)
        handled = Handled()
        release = asyncio.Event()

        async def holding(entry: Entry) -> None:
            await handled(entry)
            await release.wait()

        async with user_without(redis_server, prefix, "+xclaim") as url:
            client = await connect(url)
            try:
                async with consuming(client, prefix, holding, admin, takeover=0.04):
                    await client.xadd(stream_name(prefix), {"n": "1"})
                    await handed(handled)

                    async def beat_failed() -> bool:
                        return "heartbeat failed: NoPermissionError" in caplog.text

                    await until(beat_failed, HANG, "the heartbeat's failure logged")
                    release.set()
                    second = await client.xadd(stream_name(prefix), {"n": "2"})
                    await handed(handled, 2)
            finally:
                await client.aclose()
                await admin.aclose()
        assert handled.entries[1][0] == second
        levels = {r.levelname for r in caplog.records if "heartbeat failed" in r.getMessage()}
        assert levels == {"DEBUG"}  # it is tried again at the next beat

    async def test_a_burst_run_ends_with_the_error_of_a_refusing_redis(
        self, redis_server: str, prefix: str
    ) -> None:
        async with user_without(redis_server, prefix, "+xreadgroup") as url:
            client = await connect(url)
            try:
                consumer = Consumer(
                    client, stream_name(prefix), "test:1", Handled(), slots=1, takeover=30.0,
                    poll=AN_HOUR, burst=True,
                )  # fmt: skip
                with pytest.raises(redis.exceptions.NoPermissionError):  # not in a group
                    async with asyncio.timeout(HANG):
                        await consumer.run()
            finally:
                await client.aclose()

    async def test_a_burst_worker_whose_redis_refuses_a_read_exits_2_with_one_line(
        self, redis_server: str, prefix: str
    ) -> None:
        async with user_without(redis_server, prefix, "+xreadgroup") as url:
            with pytest.raises(Problem) as raised:
                async with asyncio.timeout(HANG):
                    await run_queue_worker(worker_config(url, prefix), verbose=0)
        assert raised.value.exit_code == 2
        # A wrong setting, said as what to change: not an unreachable queue.
        assert re.fullmatch(
            r"Redis at redis://[^:@]+:\*\*\*@127\.0\.0\.1:\d+/0 answered "
            r"NoPermissionError: .*xreadgroup.*grant the ACL the fleet guide lists.*",
            str(raised.value),
        ), str(raised.value)


async def held_by(
    client: Any, stream: str, consumer: str, count: int, idle_ms: int = 0
) -> list[bytes]:
    """*count* new entries, read by *consumer* (another worker) *idle_ms* ago."""
    await ensure_group(client, stream)
    async with client.pipeline(transaction=False) as pipe:
        for n in range(count):
            pipe.xadd(stream, {"n": str(n)})
        ids: list[bytes] = await pipe.execute()
    await client.xreadgroup("workers", consumer, {stream: ">"}, count=count)
    if idle_ms:
        await client.xclaim(stream, "workers", consumer, 0, ids, idle=idle_ms, justid=True)
    return ids


class TestTakingOverFromAWorkerGoneQuiet:
    async def test_an_entry_behind_more_live_ones_than_one_look_reaches_is_taken_over(
        self, redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """XAUTOCLAIM looks at 10 entries a call for one free slot: the look goes on."""
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        client = await connect(redis_server)
        stream = stream_name(prefix)
        handled = Handled()
        try:
            live = await held_by(client, stream, "live:1", 15)
            [dead] = await held_by(client, stream, "dead:1", 1, idle_ms=3_600_000)
            async with consuming(client, prefix, handled):
                await handed(handled)
            pending = await client.xpending_range(stream, "workers", "-", "+", 100)
        finally:
            await client.aclose()
        assert [e[0] for e in handled.entries] == [dead]
        assert f"took over entry {dead.decode()}" in caplog.text
        assert {p["message_id"] for p in pending if p["consumer"] == b"live:1"} == set(live)

    async def test_a_look_among_many_live_entries_ends_and_new_entries_are_read(
        self, redis_server: str, prefix: str
    ) -> None:
        client = await connect(redis_server)
        stream = stream_name(prefix)
        handled = Handled()
        looks = 0
        autoclaim = client.xautoclaim

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal looks
            looks += 1
            return await autoclaim(*args, **kwargs)

        client.xautoclaim = counted
        try:
            await held_by(client, stream, "live:1", 150)  # 10 calls look at 100 of them
            async with consuming(client, prefix, handled):
                entry = await client.xadd(stream, {"n": "new"})
                await handed(handled)
        finally:
            await client.aclose()
        assert [e[0] for e in handled.entries] == [entry]
        assert looks == consumer_module._SCANS  # one look, of a bounded number of calls

    async def test_an_entry_this_worker_still_handles_is_not_taken_over_by_its_other_slot(
        self, redis_server: str, prefix: str
    ) -> None:
        """A heartbeat late past the takeover time (a blocked loop) leaves an entry idle
        in Redis while a slot of this very worker still handles it."""
        client = await connect(redis_server)
        stream = stream_name(prefix)
        handled = Handled()
        looked = asyncio.Event()
        autoclaim = client.xautoclaim

        async def signalled(*args: Any, **kwargs: Any) -> Any:
            try:
                return await autoclaim(*args, **kwargs)
            finally:
                looked.set()

        async def holding(entry: Entry) -> None:
            await handled(entry)
            if len(handled.entries) == 1:
                await asyncio.Event().wait()  # cancelled with the slot

        client.xautoclaim = signalled
        # Its free slot looks for entries to take over every 10 ms (poll).
        consumer = Consumer(client, stream, "test:1", holding, slots=2, takeover=30.0, poll=0.01)
        running = asyncio.ensure_future(consumer.run())
        try:
            entry = await client.xadd(stream, {"n": "1"})
            await handed(handled)
            await client.xclaim(stream, "workers", "test:1", 0, [entry], idle=3_600_000)
            for _ in range(2):  # a look after the idle time was set, and one more
                looked.clear()
                async with asyncio.timeout(HANG):
                    await looked.wait()
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await client.aclose()
        assert [e[0] for e in handled.entries] == [entry]


class TestStoppingWhenTheCancellationIsSwallowed:
    """redis-py may swallow a cancellation (3.11's ``wait_for``, when the command ends as
    it comes), as may a handler: the consumer still stops, not at its next read's end."""

    async def test_a_slot_whose_handler_swallowed_it_stops(
        self, redis_server: str, prefix: str
    ) -> None:
        started = asyncio.Event()

        async def swallowing(entry: Entry) -> None:
            started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

        client = await connect(redis_server)
        consumer = Consumer(
            client, stream_name(prefix), "test:1", swallowing, slots=1, takeover=30.0, poll=AN_HOUR
        )
        running = asyncio.ensure_future(consumer.run())
        try:
            await client.xadd(stream_name(prefix), {"n": "1"})
            async with asyncio.timeout(HANG):
                await started.wait()
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(HANG):  # not another read of up to 10 s, in a loop
                    await running
        finally:
            running.cancel()
            await client.aclose()

    @pytest.mark.parametrize("turned_into", [None, "ConnectionError"])
    async def test_a_heartbeat_whose_command_swallowed_it_stops(
        self, redis_server: str, prefix: str, turned_into: str | None
    ) -> None:
        # Swallowed: the command returns; turned into: redis-py raises its own error for
        # a connection it cut (a stop, not an unreachable Redis).
        client = await connect(redis_server)
        xclaim = client.xclaim
        stopping = False
        inside = asyncio.Event()

        async def swallowing_at_stop(*args: Any, **kwargs: Any) -> Any:
            if not stopping:
                return await xclaim(*args, **kwargs)
            inside.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if turned_into is not None:
                    raise getattr(redis.exceptions, turned_into)("cut") from None
                return []

        client.xclaim = swallowing_at_stop
        handled = Handled()

        async def holding(entry: Entry) -> None:
            await handled(entry)
            await asyncio.Event().wait()  # cancelled with the slot

        consumer = Consumer(
            client, stream_name(prefix), "test:1", holding, slots=1, takeover=0.04, poll=AN_HOUR
        )
        running = asyncio.ensure_future(consumer.run())
        try:
            await client.xadd(stream_name(prefix), {"n": "1"})
            await handed(handled)
            stopping = True
            async with asyncio.timeout(HANG):
                await inside.wait()  # the heartbeat is in its command
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(HANG):
                    await running
        finally:
            running.cancel()
            await client.aclose()

"""A queued job moves at the speed of its workers, not of a poll interval.

The workers here run in this process with a poll interval of an hour: whatever they do
within the test, they were woken for (a chunk announced by the producer, one of their
own chunks ending). Each test's `asyncio.timeout` only stops a hang: a worker that
waited for its poll interval would not finish at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from arq.worker import Worker

from dispatch_async._cli.queue import JobKeys, connect, wake_channel
from dispatch_async._cli.report import report
from dispatch_async._cli.spec import Connection, Problem
from dispatch_async._cli.wake import wait_until_done
from dispatch_async._cli.worker import WorkerConfig, make_worker
from dispatch_async.testing import FakeDispatchServer
from tests.fleet.test_queue import CHUNK, LINES, SECRET, produce, read_report, write_input

# arq's Worker.close() calls redis-py's deprecated close(); the worker runs in-process here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Call to deprecated close:DeprecationWarning"),
    # Stopping an in-process worker cancels arq's poll loop wherever it is; a redis-py
    # pipeline cancelled inside its own clean-up keeps its connection and says so when
    # collected (seen once in two full CI runs). A process worker exits instead.
    pytest.mark.filterwarnings(
        "ignore:Unclosed client session <redis.asyncio.client.Pipeline:ResourceWarning"
    ),
]

CHUNKS = LINES // CHUNK
AN_HOUR = 3600.0
#: Only a hang guard (see the module docstring), never a measure of speed.
HANG = 60


class Fetches:
    """Counts a worker's fetches from its queue; `first` is set after the first one, and
    `done` after each."""

    def __init__(self, pool: Any) -> None:
        self.count = 0
        self.first = asyncio.Event()
        self.done = asyncio.Event()
        fetch = pool.zrangebyscore

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            try:
                return await fetch(*args, **kwargs)
            finally:
                self.first.set()
                self.done.set()

        pool.zrangebyscore = counted


@contextlib.asynccontextmanager
async def running_worker(
    server: FakeDispatchServer, queue_url: str, prefix: str, *, max_jobs: int = 2
) -> AsyncIterator[Fetches]:
    """An in-process worker polling once an hour, stopped (as by SIGTERM) at the end."""
    config = WorkerConfig(
        queue_url=queue_url,
        connection=Connection(base_url=server.url, client_secret=SECRET, account="acme"),
        key_prefix=prefix,
        max_jobs=max_jobs,
        poll_delay=AN_HOUR,
    )
    pool = await connect(queue_url)
    fetches = Fetches(pool)
    worker = make_worker(config, redis_pool=pool, handle_signals=False)
    running = asyncio.ensure_future(worker.async_run())
    try:
        yield fetches
    finally:
        await worker.close()  # cancels the run, as arq's signal handler does
        with contextlib.suppress(asyncio.CancelledError):
            await running


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
        running_worker(server, redis_server, prefix) as fetches,
    ):
        await fetches.first.wait()  # the queue was empty: the worker is idle now
        await produce_all(redis_server, prefix, source, "idle")
        async with asyncio.timeout(HANG):
            # 12 chunks, 2 at a time: each slot is refilled when its chunk ends.
            await wait_until_done(redis, job="idle", key_prefix=prefix, every=AN_HOUR)
        output = tmp_path / "report.jsonl"
        summary = await report(redis, job="idle", output=output, key_prefix=prefix)
        stats = server.stats
    await redis.aclose()
    assert summary.complete
    assert [r["line"] for r in read_report(output)] == list(range(2, LINES + 2))
    assert stats.recipients_received == LINES - 1
    assert not stats.duplicates
    # At most one fetch per reason to fetch (the start, each chunk announced, each chunk
    # ended): woken, never spinning.
    assert 2 <= fetches.count <= 1 + 2 * CHUNKS
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


async def test_a_redis_user_without_channels_still_finishes_the_job(
    redis_server: str, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without ``&P*`` in its ACL, the fleet looks for work every poll interval instead."""
    caplog.set_level(logging.WARNING, logger="dispatch_async")
    source = tmp_path / "in.csv"
    write_input(source)
    admin = redis.asyncio.Redis.from_url(redis_server)
    user = f"nochannels-{prefix.rstrip(':')}"
    await admin.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">s3cret", f"~{prefix}*", "~arq:*",
        "resetchannels", "+@all",
    )  # fmt: skip
    url = redis_server.replace("redis://", f"redis://{user}:s3cret@")
    try:
        await produce_all(url, prefix, source, "acl")
        async with FakeDispatchServer(client_secret=SECRET) as server:
            config = WorkerConfig(
                queue_url=url,
                connection=Connection(base_url=server.url, client_secret=SECRET, account="acme"),
                key_prefix=prefix,
                poll_delay=0.05,
                burst=True,
            )
            worker = make_worker(config, handle_signals=False)
            async with asyncio.timeout(HANG):
                await worker.async_run()
            await worker.close()
            pool = await connect(url)
            async with asyncio.timeout(HANG):
                await wait_until_done(pool, job="acl", key_prefix=prefix, every=0.05)
            summary = await report(pool, job="acl", output=None, key_prefix=prefix)
            await pool.aclose()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
    assert summary.complete
    assert "cannot subscribe to the Redis channel" in caplog.text


@pytest.mark.parametrize("hook", ["_poll_iteration", "start_jobs"])
def test_an_arq_without_what_the_worker_overrides_is_refused(
    hook: str, redis_server: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without its _poll_iteration, the worker (poll_delay 0 for arq) would fetch in a loop.
    monkeypatch.delattr(Worker, hook)
    config = WorkerConfig(
        queue_url=redis_server,
        connection=Connection(base_url="http://127.0.0.1:9", client_secret=SECRET, account="a"),
        key_prefix=prefix,
    )
    ctrl_c = signal.getsignal(signal.SIGINT)
    with pytest.raises(Problem, match=rf"arq [0-9.]+ has no Worker\.{hook}, which the queue"):
        make_worker(config)
    assert signal.getsignal(signal.SIGINT) is ctrl_c  # refused before arq took Ctrl-C over


class TestAnythingPublishedOnTheChannels:
    """Anyone who may publish can: a message says "look again", and nothing more."""

    async def test_the_worker_keeps_nothing_of_what_wakes_it(
        self, redis_server: str, prefix: str
    ) -> None:
        payload = b"x" * 2**20
        publisher = redis.asyncio.Redis.from_url(redis_server)
        async with (
            FakeDispatchServer(client_secret=SECRET) as server,
            running_worker(server, redis_server, prefix) as fetches,
        ):
            await fetches.first.wait()  # subscribed, and idle
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                for _ in range(32):
                    fetches.done.clear()
                    await publisher.publish(wake_channel(prefix), payload)
                    async with asyncio.timeout(HANG):
                        await fetches.done.wait()  # woken: the message was read
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
                await publisher.aclose()
        assert held < 8 * 2**20  # 32 MiB were published

    async def test_the_waiting_producer_looks_in_redis_whatever_arrives(
        self, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        """The job is done in Redis, its announcements were missed, and messages trickle in."""
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
            # A worker announcing chunk 0 again and again: each message comes well within
            # `every` of the one before.
            while True:
                await redis.publish(keys.done_channel, b"0")
                await asyncio.sleep(0.05)

        trickling = asyncio.ensure_future(trickle())
        try:
            async with asyncio.timeout(HANG):
                await shown.wait()  # subscribed, and waiting
            await redis.hset(keys.state, mapping={str(i): b"done" for i in range(CHUNKS)})
            async with asyncio.timeout(HANG):  # it waited for a full `every` of silence
                await waiting
        finally:
            for task in (waiting, trickling):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await redis.aclose()
        assert progress[-1] == (CHUNKS, CHUNKS)

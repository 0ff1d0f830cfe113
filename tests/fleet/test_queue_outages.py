"""A queued job through a worker's SIGTERM and through Redis stopping and starting again:
no line recorded twice, no number received twice, every line recorded in the end."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from dispatch_async._cli.queued.chunks import JobKeys, connect
from dispatch_async._cli.queued.report import report
from dispatch_async.testing import FakeDispatchServer
from tests.fleet.conftest import _answers_ping, answer_to_ping, free_port
from tests.fleet.test_queue import (
    JOB_TIMEOUT,
    LINES,
    SECRET,
    produce,
    read_report,
    start_worker,
    until,
    write_input,
)


def assert_every_line_once_and_nothing_received_twice(
    output: Path, server: FakeDispatchServer
) -> list[dict[str, Any]]:
    records = read_report(output)
    assert [r["line"] for r in records] == list(range(2, LINES + 2))
    assert not server.stats.duplicates
    sent = {r["number"] for r in records if r["outcome"] == "sent"}
    maybe = {r["number"] for r in records if r["outcome"] == "maybe_sent"}
    assert sent <= set(server.stats.received)
    assert set(server.stats.received) <= sent | maybe | {"12"}
    return records


async def test_a_worker_stopped_by_sigterm_mid_chunk_records_it_maybe_sent_once(
    redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    redis = await connect(redis_server)
    try:
        async with FakeDispatchServer(client_secret=SECRET, latency=1.0) as server:
            await produce(redis_server, prefix, source, "term")
            keys = JobKeys(prefix, "term")
            worker = await start_worker(server, redis_server, prefix)

            async def a_request_in_flight() -> bool:
                return server.in_flight > 0 and b"in_flight" in await redis.hvals(keys.state)

            await until(a_request_in_flight, 20, "a chunk in flight")
            worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(worker.communicate(), 20)
            assert "Traceback" not in err.decode(), err.decode()[-2000:]
            states = Counter(await redis.hvals(keys.state))
            assert states[b"in_flight"] == 0, "a chunk stopped mid-send is recorded"
            assert states[b"done"] >= 1

            server.latency = 0
            # What SIGTERM cut short is maybe_sent; the rest is sent by the next worker.
            await produce(redis_server, prefix, source, "term")
            second = await start_worker(server, redis_server, prefix)
            await asyncio.wait_for(second.communicate(), JOB_TIMEOUT + 30)
            output = tmp_path / "report.jsonl"
            summary = await report(redis, job="term", output=output, key_prefix=prefix)
            records = assert_every_line_once_and_nothing_received_twice(output, server)
    finally:
        await redis.aclose()
    assert summary.complete
    interrupted = [r for r in records if r.get("error_type") == "Interrupted"]
    assert interrupted, "the chunk SIGTERM interrupted is maybe_sent, not sent again"
    assert all(r["outcome"] == "maybe_sent" for r in interrupted)


def redis_command(tmp_path: Path) -> tuple[list[str], int]:
    """redis-server on a free port of 127.0.0.1, its data in *tmp_path*: (command, port)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    return [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data)], port


def started(command: list[str], port: int) -> subprocess.Popen[bytes]:
    """redis-server run as *command*, once it answers a PING."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    for _ in range(500):
        if _answers_ping(port):
            return process
        assert process.poll() is None, "redis-server did not start"
        time.sleep(0.02)  # between two pings of a process starting up
    process.kill()
    pytest.fail("redis-server did not answer")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Any, Any]]:
    """A redis-server of this test's own, with an append-only file so that it can be
    stopped and started again with its data: (url, start, stop)."""
    command, port = redis_command(tmp_path)
    command += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        processes.append(started(command, port))

    def stop() -> None:
        process = processes[-1]
        process.terminate()
        process.wait(timeout=10)

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", start, stop
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


async def test_redis_stopping_mid_job_then_starting_again_loses_and_doubles_nothing(
    own_redis: tuple[str, Any, Any], prefix: str, tmp_path: Path
) -> None:
    url, start, stop = own_redis
    source = tmp_path / "in.csv"
    write_input(source)
    keys = JobKeys(prefix, "outage")

    async with FakeDispatchServer(client_secret=SECRET, latency=0.3) as server:
        await produce(url, prefix, source, "outage")
        worker = await start_worker(server, url, prefix)
        redis = await connect(url)
        try:

            async def some_chunks_done() -> bool:
                return (await redis.hvals(keys.state)).count(b"done") >= 2

            await until(some_chunks_done, 20, "two chunks done")
        finally:
            await redis.aclose()
        stop()  # Redis goes away mid-job...
        try:
            await asyncio.wait_for(worker.communicate(), 30)
        except TimeoutError:
            worker.kill()
            await worker.wait()
        start()  # ...and comes back with what it had.
        server.latency = 0
        await produce(url, prefix, source, "outage")
        # A chunk claimed before the outage is taken over once its stream entry has been
        # idle for --takeover-after: the next worker records it maybe_sent, not sent again.
        for _ in range(3):
            again = await start_worker(server, url, prefix)
            await asyncio.wait_for(again.communicate(), JOB_TIMEOUT + 30)
            redis = await connect(url)
            try:
                summary = await report(
                    redis, job="outage", output=tmp_path / "report.jsonl", key_prefix=prefix
                )
            finally:
                await redis.aclose()
            if summary.complete:
                break
    assert summary.complete, summary
    assert_every_line_once_and_nothing_received_twice(tmp_path / "report.jsonl", server)


@pytest.fixture
def loading_redis(tmp_path: Path) -> Iterator[tuple[str, redis_sync.Redis]]:
    """A redis-server of this test's own, started on data it takes seconds to load back
    (20,000 keys, each held 200 µs by a setting made for such tests): (url, a client),
    once it answers LOADING."""
    command, port = redis_command(tmp_path)
    command += ["--save", "", "--appendonly", "no"]
    filling = started(command, port)
    try:
        with redis_sync.Redis(port=port) as client, client.pipeline(transaction=False) as pipe:
            for n in range(20_000):
                pipe.set(f"filler:{n}", "x")
            pipe.execute()
            client.save()
    finally:
        filling.terminate()
        filling.wait(timeout=10)
    slow = ["--key-load-delay", "200", "--loading-process-events-interval-bytes", "1024"]
    loading = subprocess.Popen(  # noqa: S603 - redis-server from PATH, fixed arguments
        [*command, *slow], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis_sync.Redis(port=port)
    try:
        for _ in range(500):
            answer = answer_to_ping(port)
            if answer.startswith(b"-LOADING"):
                break
            assert not answer.startswith(b"+PONG"), "Redis loaded its data before the test"
            time.sleep(0.02)  # not listening yet
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        client.close()
        loading.kill()
        loading.wait()


async def test_a_worker_started_while_redis_loads_its_data_waits_for_it(
    loading_redis: tuple[str, redis_sync.Redis], prefix: str
) -> None:
    # A restarted Redis answers LOADING until it has read its data back; a worker started
    # then (a supervisor replacing one) waits instead of exiting "cannot use the queue".
    url, client = loading_redis
    async with FakeDispatchServer(client_secret=SECRET) as server:
        worker = await start_worker(server, url, prefix)
        _, err = await asyncio.wait_for(worker.communicate(), JOB_TIMEOUT + 30)
    told = err.decode()
    assert worker.returncode == 0, told[-2000:]
    assert "the queue's Redis is loading its data: waiting for it" in told
    assert "cannot use the Redis queue" not in told
    filler = sum(1 for _ in client.scan_iter("filler:*", count=5_000))
    assert filler == 20_000  # the data loaded whole, the worker's keys beside it

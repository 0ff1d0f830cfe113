"""A queued job on the Redis that fleets run: any node of a Cluster, a Sentinel set.

The commands run as real processes (``send --queue``, ``worker --burst``, ``report``)
against real servers on 127.0.0.1, and the simulator counts what it received.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis.asyncio

from dispatch_async.testing import FakeDispatchServer, ServerStats
from tests.fleet.test_queue import (
    CHUNK,
    LINES,
    read_report,
    start_worker,
    until,
    worker_env,
    write_input,
)
from tests.fleet.test_queue import cli as run
from tests.fleet.test_queue_wakeups import documented_queue_acl
from tools.redis_topologies import Cluster, SentinelSet, TlsRedis, cli


def send_args(queue: str, prefix: str, source: Path, job: str, *more: str) -> tuple[str, ...]:
    return (
        "send", "basic", "--text", "hi", "-i", str(source), "--chunk-size", str(CHUNK),
        "--queue", queue, "--job", job, "--key-prefix", prefix, *more,
    )  # fmt: skip


async def run_a_job(queue: str, prefix: str, tmp_path: Path) -> FakeDispatchServer:
    """Enqueue (``send --queue``), two ``worker --burst``, ``report -o``: every line
    recorded once, no number received twice; the simulator's figures."""
    source = tmp_path / "in.csv"
    numbers = write_input(source)
    output = tmp_path / "results.jsonl"
    async with FakeDispatchServer(client_secret="queue-test-secret") as server:
        env = worker_env(server)
        code, err = await run(*send_args(queue, prefix, source, "j1"), env=env)
        assert code == 0, err
        assert f"{LINES // CHUNK} enqueued now" in err
        workers = [await start_worker(server, queue, prefix) for _ in range(2)]
        for worker in workers:
            _, werr = await asyncio.wait_for(worker.communicate(), 60)
            assert worker.returncode == 0, werr.decode()[-2000:]
        args = ("report", "--queue", queue, "--key-prefix", prefix, "--job", "j1")
        code, err = await run(*args, "-o", str(output), env=env)
        stats = server.stats
    assert code == 0, err
    assert_each_line_once(output, stats, numbers)
    assert stats.token_calls == 1
    return server


def assert_each_line_once(output: Path, stats: ServerStats, numbers: dict[int, str]) -> None:
    """Every input line recorded once, in order; every number received, none twice."""
    records = read_report(output)
    assert [r["line"] for r in records] == list(range(2, LINES + 2))
    assert Counter(r["outcome"] for r in records) == {"sent": LINES - 2, "invalid": 2}
    assert not stats.duplicates
    assert sorted(stats.received) == sorted(numbers.values())  # "12" too: it is rejected


class TestACluster:
    async def test_a_job_queued_on_any_node_is_sent_once_and_reported(
        self, redis_cluster: Cluster, prefix: str, tmp_path: Path
    ) -> None:
        await run_a_job(redis_cluster.url, prefix, tmp_path)
        # The job's keys are under one hash tag, {P job:J}; the stream has its own.
        client = cluster_client(redis_cluster)
        try:
            job = f"{{{prefix}job:j1}}"
            assert await client.exists(job, f"{job}:state", f"{job}:out", f"{job}:done") == 4
            assert await client.exists(f"{{{prefix}chunks}}") == 1
        finally:
            await client.aclose()

    async def test_the_guides_acl_with_its_cluster_additions_is_enough(
        self, redis_cluster: Cluster, prefix: str, tmp_path: Path
    ) -> None:
        words = documented_queue_acl()[1:]  # after the user's name
        assert "~acme-dispatch:*" in words
        rules = [
            w.replace("~acme-dispatch:*", f"~{{{prefix}*").replace("PASSWORD", "s3cret")
            for w in words
        ] + ["+info", "+cluster|slots", "+command"]  # the guide's additions on a Cluster
        user = f"fleet-{prefix.rstrip(':')}"
        for port in redis_cluster.ports:
            cli(
                port, "acl", "setuser", user, "reset", *rules, "+info", "+cluster|slots", "+command"
            )
        try:
            url = f"redis://{user}:s3cret@127.0.0.1:{redis_cluster.ports[1]}/0"
            await run_a_job(url, prefix, tmp_path)
        finally:
            for port in redis_cluster.ports:
                cli(port, "acl", "deluser", user)

    async def test_the_producer_waits_for_the_workers_and_writes_the_report(
        self, redis_cluster: Cluster, prefix: str, tmp_path: Path
    ) -> None:
        source = tmp_path / "in.csv"
        write_input(source)
        output = tmp_path / "results.jsonl"
        async with FakeDispatchServer(client_secret="queue-test-secret") as server:
            env = worker_env(server)
            producer = asyncio.create_task(
                run(*send_args(redis_cluster.url, prefix, source, "w", "-o", str(output)), env=env)
            )
            client = cluster_client(redis_cluster)
            try:
                queued = functools.partial(client.exists, f"{{{prefix}job:w}}:queued")
                await until(queued, 30, "the producer's chunks")
            finally:
                await client.aclose()
            worker = await start_worker(server, redis_cluster.url, prefix)
            _, werr = await asyncio.wait_for(worker.communicate(), 60)
            assert worker.returncode == 0, werr.decode()[-2000:]
            code, err = await producer
            assert not server.stats.duplicates
        assert code == 0, err
        assert [r["line"] for r in read_report(output)] == list(range(2, LINES + 2))


def cluster_client(cluster: Cluster) -> redis.asyncio.RedisCluster:
    return redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


#: Seconds before a quiet worker's chunk is taken over in a failover test.
FAILOVER_TAKEOVER = 6.0


class TestFailover:
    """A failover mid-job (a queued job's commands as processes, 2 workers): every line
    recorded once, no number received twice; and so says a report read once the old
    primary is a replica (behind Sentinel it takes writes until then, and drops them)."""

    async def test_a_cluster_failover_of_the_jobs_primary_loses_and_repeats_nothing(
        self, redis_cluster: Cluster, prefix: str, tmp_path: Path
    ) -> None:
        primary = redis_cluster.primary_for(f"{{{prefix}job:f}}")
        await run_with_a_failover(
            redis_cluster.url, prefix, tmp_path, lambda: redis_cluster.fail_over(primary)
        )

    async def test_a_sentinel_failover_loses_and_repeats_nothing(
        self, redis_sentinels: SentinelSet, prefix: str, tmp_path: Path
    ) -> None:
        await run_with_a_failover(
            redis_sentinels.url,
            prefix,
            tmp_path,
            redis_sentinels.fail_over,
            settle=redis_sentinels.settled,
        )


async def run_with_a_failover(
    queue: str,
    prefix: str,
    tmp_path: Path,
    fail_over: Callable[[], object],
    settle: Callable[[], object] = lambda: None,
) -> None:
    """``send --queue -o`` and 2 workers; *fail_over* once the first request is out;
    ``report -o`` once the job is done and *settle* returned (and before it starts)."""
    await asyncio.to_thread(settle)  # an earlier test's failover over: this one is mid-job
    source = tmp_path / "in.csv"
    numbers = write_input(source)
    output = tmp_path / "results.jsonl"
    async with FakeDispatchServer(client_secret="queue-test-secret", latency=1.0) as server:
        env = worker_env(server)
        # A chunk is taken over only after its worker was quiet longer than a failover
        # keeps it from Redis (its heartbeats go to the old primary until a write of its
        # finds no replica, a second or two); with less, the chunk is recorded maybe_sent.
        workers = [
            await start_worker(server, queue, prefix, burst=False, takeover=FAILOVER_TAKEOVER)
            for _ in range(2)
        ]
        try:
            producer = asyncio.create_task(
                run(*send_args(queue, prefix, source, "f", "-o", str(output)), env=env)
            )

            async def a_request() -> int:
                return server.stats.requests

            await until(a_request, 30, "the first request")
            await asyncio.to_thread(fail_over)
            code, err = await producer
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
                await asyncio.wait_for(worker.communicate(), 30)
        await asyncio.to_thread(settle)
        reported = tmp_path / "report.jsonl"
        args = ("report", "--queue", queue, "--key-prefix", prefix, "--job", "f")
        report_code, report_err = await run(*args, "-o", str(reported), env=env)
        stats = server.stats
    assert code == 0, err
    assert_each_line_once(output, stats, numbers)
    assert [w.returncode for w in workers] == [0, 0]
    assert report_code == 0, report_err
    assert_each_line_once(reported, stats, numbers)


class TestSentinel:
    async def test_a_job_queued_through_the_sentinels_is_sent_once_and_reported(
        self, redis_sentinels: SentinelSet, prefix: str, tmp_path: Path
    ) -> None:
        await run_a_job(redis_sentinels.url, prefix, tmp_path)


class TestTls:
    async def test_a_job_queued_over_tls_with_a_private_ca_is_sent_once_and_reported(
        self, tls_redis: TlsRedis, prefix: str, tmp_path: Path
    ) -> None:
        await run_a_job(f"{tls_redis.url}?ssl_ca_certs={tls_redis.ca_file}", prefix, tmp_path)


class TestWrongSettings:
    async def test_a_replica_is_one_line_naming_the_primary_not_an_unreachable_queue(
        self, redis_sentinels: SentinelSet, prefix: str, tmp_path: Path
    ) -> None:
        _, replica = redis_sentinels.settled()
        source = tmp_path / "in.csv"
        write_input(source)
        queue = f"redis://127.0.0.1:{replica}/0"
        async with FakeDispatchServer(client_secret="queue-test-secret") as server:
            code, err = await run(*send_args(queue, prefix, source, "ro"), env=worker_env(server))
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        assert "ReadOnlyError" in err
        assert "primary" in err
        assert "redis+sentinel://" in err
        assert "cannot use the Redis queue" not in err

    async def test_a_user_who_may_not_run_info_is_one_line_naming_it(
        self, redis_cluster: Cluster, prefix: str, tmp_path: Path
    ) -> None:
        """A user that may not run INFO: the Cluster goes undetected, and the queue's
        first look at its primary (``durable``) says INFO is refused, in one line."""
        source = tmp_path / "in.csv"
        write_input(source)
        # A job whose keys another primary serves than the node given.
        node = redis_cluster.ports[0]
        job = next(
            f"m{i}" for i in range(100) if redis_cluster.primary_for(f"{prefix}job:m{i}") != node
        )
        for port in redis_cluster.ports:
            cli(port, "acl", "setuser", "noinfo", "on", ">s3cret", "~*", "+@all", "-info")
        try:
            queue = f"redis://noinfo:s3cret@127.0.0.1:{node}/0"
            async with FakeDispatchServer(client_secret="queue-test-secret") as server:
                code, err = await run(
                    *send_args(queue, prefix, source, job), env=worker_env(server)
                )
        finally:
            for port in redis_cluster.ports:
                cli(port, "acl", "deluser", "noinfo")
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        assert "NoPermissionError" in err
        assert "INFO" in err
        assert "the ACL the fleet guide lists" in err
        assert "s3cret" not in err

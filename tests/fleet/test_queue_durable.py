"""A worker's claim and records outlive a failover: each waits for a replica to have it,
and runs again on the new primary when none did (``durable``).

Behind Sentinel, a primary failed over while still up goes on taking writes from the
connections made before, and drops them once the sentinels make it a replica.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import cast

import attrs
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dispatch_async._cli.job.spec import InputSpec, Target
from dispatch_async._cli.queued import durable
from dispatch_async._cli.queued.chunks import (
    IN_FLIGHT,
    PENDING,
    Claimed,
    JobKeys,
    QueueRedis,
    claim,
    connect,
    finish,
)
from dispatch_async._cli.queued.link import disconnect
from dispatch_async._cli.queued.producer import enqueue
from dispatch_async._cli.queued.worker import Worker
from dispatch_async._cli.reading.rows import Row, Rows
from tests.fleet.test_queue import CHUNK, LINES, worker_config, write_input
from tests.fleet.test_queue_wakeups import documented_queue_acl
from tools.redis_topologies import SentinelSet, Servers, cli, free_ports, wait_for


async def _job(redis: QueueRedis, keys: JobKeys, chunks: int) -> None:
    """A job of *chunks* pending chunks, their rows stored."""
    await redis.hset(keys.meta, mapping={"target": "{}", "account": ""})
    for index in range(chunks):
        await redis.hset(keys.state, str(index), PENDING)
        await redis.set(keys.rows(index), b"[]")


def guide_acl(prefix: str, *left_out: str) -> list[str]:
    """The fleet guide's ACL rules for *prefix* (password ``s3cret``), less *left_out*."""
    return [
        word.replace("acme-dispatch:", prefix).replace("PASSWORD", "s3cret")
        for word in documented_queue_acl()[1:]
        if word not in left_out
    ]


async def claim_first_chunk(url: str, keys: JobKeys) -> Claimed:
    """A job of one chunk, claimed through *url*."""
    redis = await connect(url)
    try:
        await _job(redis, keys, 1)
        return await claim(redis, keys, 0, "1@w:1", b"1-0")
    finally:
        await disconnect(redis)


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


class TestOnAPrimaryWithAReplica:
    """The Sentinel set's primary, given by its own URL as a user of the guide's ACL
    (before the failovers below: no wait for the set to settle)."""

    @staticmethod
    def user(sentinels: SentinelSet, prefix: str, *rules: str) -> str:
        primary, _ = sentinels.settled()
        wait_for("the replica online", lambda: "state=online" in cli(primary, "info"))
        name = f"fleet-{prefix.rstrip(':')}"
        cli(primary, "acl", "setuser", name, "reset", *rules)
        return f"redis://{name}:s3cret@127.0.0.1:{primary}/0"

    async def test_the_guides_acl_is_enough_and_the_replica_has_the_records(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "acl")
        redis = await connect(self.user(redis_sentinels, prefix, *guide_acl(prefix)))
        try:
            await _job(redis, keys, 1)
            assert (await claim(redis, keys, 0, "1@w:1", b"1-0")).state == PENDING
            assert await finish(redis, keys, 0, [b'{"line":2}'], None, 60)
        finally:
            await disconnect(redis)
        _, replica = redis_sentinels.settled()
        assert cli(replica, "hget", keys.state, "0").strip() == "done"

    async def test_a_user_who_may_not_wait_is_refused_before_anything_is_written(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "nowait")
        url = self.user(redis_sentinels, prefix, *guide_acl(prefix, "+wait"))
        with pytest.raises(NoPermissionError, match="wait"):
            await claim_first_chunk(url, keys)
        primary, _ = redis_sentinels.settled()
        assert cli(primary, "hget", keys.state, "0").strip() == "pending"

    async def test_a_sentinel_that_does_not_answer_is_passed_over(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        (dead,) = free_ports(1)
        url = redis_sentinels.url.replace("//", f"//127.0.0.1:{dead},", 1)
        keys = JobKeys(prefix, "dead")
        assert (await claim_first_chunk(url, keys)).state == PENDING
        primary, _ = redis_sentinels.settled()
        assert cli(primary, "hget", keys.state, "0").strip() == "in_flight"

    async def test_a_sentinel_that_hangs_is_passed_over(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        async def say_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read()  # reads what it is sent until closed, never answers
            finally:
                writer.close()

        silent = await asyncio.start_server(say_nothing, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        url = redis_sentinels.url.replace("/mymaster", f",127.0.0.1:{port}/mymaster")
        try:
            async with asyncio.timeout(10):  # it asked the silent one for 30 s, 11 times
                claimed = await claim_first_chunk(url, JobKeys(prefix, "hung"))
        finally:
            silent.close()
            await silent.wait_closed()
        assert claimed.state == PENDING


class TestAfterASentinelFailover:
    async def test_claims_and_records_written_after_it_are_on_the_new_primary(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        keys = JobKeys(prefix, "split")
        redis = await connect(redis_sentinels.url)
        try:
            await _job(redis, keys, 4)
            entry = await redis.xadd(keys.stream, {"job": keys.job, "chunk": "3"})
            await claim(redis, keys, 0, "1@w:1", b"1-0")  # before: the connection is made
            new = await asyncio.to_thread(redis_sentinels.fail_over)
            # Another worker, on the new primary, claimed chunk 3 meanwhile.
            cli(new, "hset", keys.state, "3", "in_flight")
            cli(new, "hset", keys.owner, "3", "1@w:2")
            worker = Worker(worker_config(redis_sentinels.url, prefix), redis)
            outcome = await worker.send_chunk(keys.job, 3, entry)
            mine = await claim(redis, keys, 1, "3@w:1", b"1-1")
            await finish(redis, keys, 0, [b'{"line":2}'], None, 60)
        finally:
            await disconnect(redis)

        def on_new(*args: str) -> str:
            return cli(new, *args).strip()

        assert outcome == "claimed by another worker during a failover: left to it"
        assert on_new("hget", keys.owner, "3") == "1@w:2"
        assert on_new("hexists", keys.out, "3") == "0"
        assert on_new("xlen", keys.stream) == "1"  # its entry, for the other worker
        assert mine.state == PENDING
        assert on_new("hget", keys.state, "1") == "in_flight"
        assert on_new("hget", keys.owner, "1") == "3@w:1"
        assert on_new("hget", keys.state, "0") == "done"
        assert on_new("hget", keys.out, "0") == '{"line":2}'

    async def test_a_job_enqueued_across_it_is_enqueued_whole_on_the_new_primary(
        self, redis_sentinels: SentinelSet, prefix: str, tmp_path: Path
    ) -> None:
        source = tmp_path / "in.csv"
        write_input(source)
        spec = FailingOverInput(str(source), fail_over=redis_sentinels.fail_over)
        redis = await connect(redis_sentinels.url)
        try:
            await enqueue(
                redis,
                job="across",
                target=Target("basic", text="hi"),
                account=None,
                input_spec=spec,
                chunk_size=CHUNK,
                key_prefix=prefix,
            )
        finally:
            await disconnect(redis)
        assert spec.failed_over.is_set()
        keys = JobKeys(prefix, "across")
        new = redis_sentinels.current_primary()
        states = cli(new, "hvals", keys.state).split()
        assert states == ["pending"] * (LINES // CHUNK)
        assert cli(new, "hget", keys.meta, "chunks").strip() == str(LINES // CHUNK)
        assert int(cli(new, "xlen", keys.stream)) >= LINES // CHUNK


@attrs.frozen
class FailingOverInput(InputSpec):
    """The file's rows; *fail_over* runs once, when the second chunk's rows are read."""

    fail_over: Callable[[], object] = lambda: None
    failed_over: threading.Event = attrs.field(factory=threading.Event)

    def open(self) -> Rows:
        rows = super().open()
        return cast(Rows, _ThenFailOver(rows, self))


class _ThenFailOver:
    def __init__(self, rows: Rows, spec: FailingOverInput) -> None:
        self.rows, self.spec = rows, spec

    def __iter__(self) -> Iterator[Row]:
        for count, row in enumerate(self.rows):
            if count == CHUNK and not self.spec.failed_over.is_set():
                self.spec.fail_over()  # in the producer's reading thread
                self.spec.failed_over.set()
            yield row

    def close(self) -> None:
        self.rows.close()


@attrs.frozen
class Pair:
    """A primary and its replica (no Sentinel), on 127.0.0.1."""

    primary: int
    replica: subprocess.Popen[bytes]
    primary_process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primary}/0"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    servers = Servers(tmp_path)
    primary, replica = free_ports(2)
    common = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
    try:
        servers.start("primary", *common, "--port", str(primary))
        servers.start(
            "replica", *common, "--port", str(replica), "--replicaof", "127.0.0.1", str(primary)
        )
        wait_for("the replica online", lambda: "state=online" in cli(primary, "info"))
        yield Pair(primary, servers.processes[1], servers.processes[0])
    finally:
        for process in servers.processes:
            process.send_signal(signal.SIGCONT)
        servers.stop()


@pytest.fixture
async def first_claimed(pair: Pair, prefix: str) -> AsyncIterator[tuple[QueueRedis, JobKeys]]:
    """A client of *pair*, a job of three chunks, and its first chunk claimed (confirmed:
    the replica is up)."""
    keys = JobKeys(prefix, "pair")
    redis = await connect(pair.url)
    try:
        await _job(redis, keys, 3)
        await claim(redis, keys, 0, "1@w:1", b"1-0")
        yield redis, keys
    finally:
        await disconnect(redis)


class TestOnAPrimaryAndItsReplica:
    async def test_a_write_no_replica_confirms_goes_on_after_five_tries_with_a_warning(
        self,
        pair: Pair,
        first_claimed: tuple[QueueRedis, JobKeys],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        redis, keys = first_claimed
        pair.replica.send_signal(signal.SIGSTOP)
        try:
            with caplog.at_level(logging.INFO, logger="dispatch_async"):
                claimed = await claim(redis, keys, 1, "2@w:1", b"1-1")
        finally:
            pair.replica.send_signal(signal.SIGCONT)
        assert claimed.state == PENDING
        assert cli(pair.primary, "hget", keys.owner, "1").strip() == "2@w:1"
        messages = [r.getMessage() for r in caplog.records]
        unconfirmed = [m for m in messages if m.endswith("was not confirmed by its replicas")]
        assert len(unconfirmed) == 5
        assert any("no replica of the queue's Redis confirmed a write" in m for m in messages)

    async def test_a_replica_gone_costs_one_unconfirmed_write_not_every_one(
        self,
        pair: Pair,
        first_claimed: tuple[QueueRedis, JobKeys],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        redis, keys = first_claimed
        pair.replica.terminate()
        pair.replica.wait(10)
        with caplog.at_level(logging.INFO, logger="dispatch_async"):
            for index in (1, 2):
                await claim(redis, keys, index, f"{index + 1}@w:1", f"1-{index}".encode())
        unconfirmed = [r for r in caplog.records if "was not confirmed" in r.getMessage()]
        assert len(unconfirmed) == 1
        assert cli(pair.primary, "hget", keys.state, "2").strip() == "in_flight"

    async def test_a_script_the_primary_lost_is_loaded_again(
        self, pair: Pair, first_claimed: tuple[QueueRedis, JobKeys]
    ) -> None:
        redis, keys = first_claimed
        cli(pair.primary, "script", "flush")
        assert (await claim(redis, keys, 1, "2@w:1", b"1-1")).state == PENDING
        assert cli(pair.primary, "hget", keys.state, "1").strip() == "in_flight"

    async def test_a_primary_gone_mid_write_raises_its_error(
        self, pair: Pair, first_claimed: tuple[QueueRedis, JobKeys]
    ) -> None:
        redis, keys = first_claimed
        pair.primary_process.terminate()
        pair.primary_process.wait(10)
        with pytest.raises(RedisConnectionError):
            await claim(redis, keys, 1, "2@w:1", b"1-1")

    async def test_a_primary_that_hangs_fails_the_write_at_its_bound(
        self,
        pair: Pair,
        first_claimed: tuple[QueueRedis, JobKeys],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        redis, keys = first_claimed
        monkeypatch.setattr(durable, "WRITE_WITHIN", 0.5)  # 20 s, else
        pair.primary_process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError, match=r"did not take a write within 0 s"):
                await claim(redis, keys, 1, "2@w:1", b"1-1")
        finally:
            pair.primary_process.send_signal(signal.SIGCONT)

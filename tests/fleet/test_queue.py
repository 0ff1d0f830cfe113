"""A bulk job spread over worker processes: one simulator, one real Redis.

Workers run as real processes (``dispatch-async worker --burst``); one is killed with
SIGKILL while a chunk of its is in flight, and another worker takes that chunk's stream
entry over once it has been idle for ``--takeover-after`` seconds.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import redis.exceptions as redis_exceptions

from dispatch_async._adaptive import RateState
from dispatch_async._cli.job.spec import Connection, InputSpec, Target
from dispatch_async._cli.queued.chunks import JobKeys, connect, connected, ensure_group
from dispatch_async._cli.queued.producer import Produced, enqueue
from dispatch_async._cli.queued.report import report, run_enqueue
from dispatch_async._cli.queued.worker import Worker, WorkerConfig, run_queue_worker, run_worker
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.testing import FakeDispatchServer
from tests.conftest import HANG
from tests.fleet.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = "queue-test-secret"
COMMAND = (sys.executable, "-m", "dispatch_async._cli")
LINES = 60
CHUNK = 5
JOB_TIMEOUT = 3
TAKEOVER = 1.5  # seconds before a dead worker's chunk is taken over


def write_input(path: Path) -> dict[int, str]:
    """A CSV with LINES rows (line 2 onwards): one malformed, one invalid number."""
    numbers = {}
    rows = ["number,name"]
    for i in range(LINES):
        line = i + 2
        if i == 7:
            rows.append("+5511900000007,too,many")  # malformed: three fields
        elif i == 13:
            rows.append("12,short")  # the simulator rejects it
            numbers[line] = "12"
        else:
            numbers[line] = f"+55119{i:08d}"
            rows.append(f"{numbers[line]},n{i}")
    path.write_text("\n".join(rows) + "\n")
    return numbers


def worker_env(server: FakeDispatchServer) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DISPATCH_BASE_URL": server.url,
        "DISPATCH_CLIENT_SECRET": SECRET,
        "DISPATCH_ACCOUNT": "acme",
    }


async def start_worker(
    server: FakeDispatchServer,
    redis_url: str,
    prefix: str,
    *,
    burst: bool = True,
    takeover: float = TAKEOVER,
) -> Any:
    return await asyncio.create_subprocess_exec(
        *COMMAND,
        "worker",
        "--queue",
        redis_url,
        "--key-prefix",
        prefix,
        "--max-jobs",
        "2",
        "--job-timeout",
        str(JOB_TIMEOUT),
        "--takeover-after",
        str(takeover),
        "--poll-delay",
        "0.05",
        *(["--burst"] if burst else []),
        cwd=ROOT,
        env=worker_env(server),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def until(condition: Any, seconds: float, what: str) -> Any:
    """Poll an async *condition* until it returns something true, for at most *seconds*."""
    # Another process changes what is polled (Redis): nothing to wait on but the state.
    try:
        async with asyncio.timeout(seconds):
            while True:
                if value := await condition():
                    return value
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Any]:
    client = await connect(redis_server)
    yield client
    await client.aclose()


async def produce(redis_url: str, prefix: str, source: Path, job: str) -> Produced:
    """Run the producer (again): it stores and enqueues what is not done."""
    redis = await connect(redis_url)
    try:
        return await enqueue(
            redis,
            job=job,
            target=Target("basic", text="hi"),
            account=None,
            input_spec=InputSpec(str(source)),
            chunk_size=CHUNK,
            key_prefix=prefix,
        )
    finally:
        await redis.aclose()


def read_report(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_a_killed_workers_chunk_is_recorded_once_and_never_sent_again(
    redis: Any, redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    numbers = write_input(source)
    async with FakeDispatchServer(client_secret=SECRET, latency=0.4) as server:
        produced = await enqueue(
            redis,
            job="kill",
            target=Target("basic", text="hi"),
            account=None,
            input_spec=InputSpec(str(source)),
            chunk_size=CHUNK,
            key_prefix=prefix,
        )
        assert (produced.chunks, produced.lines, produced.enqueued) == (12, LINES, 12)
        workers = [await start_worker(server, redis_server, prefix) for _ in range(3)]
        keys = JobKeys(prefix, "kill")

        async def a_chunk_in_flight() -> tuple[int, int] | None:
            # Once a request reached the service, the shared token is in Redis: the kill
            # lands mid-request, not while the victim holds the token's refresh lock
            # (which would hold the others up until the lock expires).
            if not server.stats.requests:
                return None
            states = await redis.hgetall(keys.state)
            owners = await redis.hgetall(keys.owner)
            for index, state in states.items():
                if state == b"in_flight" and index in owners:
                    return int(index), int(owners[index].rsplit(b":", 1)[1])
            return None

        victim_chunk, victim_pid = await until(a_chunk_in_flight, 20, "a chunk in flight")
        victim = next(w for w in workers if w.pid == victim_pid)
        victim.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(victim.wait(), 10) == -signal.SIGKILL
        # It may have had a second chunk in flight (--max-jobs 2): what it held when it
        # died, before anyone takes it over.
        states = await redis.hgetall(keys.state)
        owners = await redis.hgetall(keys.owner)
        victim_chunks = [
            int(index)
            for index, state in states.items()
            if state == b"in_flight" and owners.get(index, b"").endswith(b":%d" % victim_pid)
        ]
        assert victim_chunk in victim_chunks
        others = [w for w in workers if w is not victim]
        # The survivors exit (--burst) once the queue is empty: the killed worker's chunk
        # included, which one of them takes over once it has been idle for TAKEOVER.
        for worker in others:
            _, err = await asyncio.wait_for(worker.communicate(), JOB_TIMEOUT + 20)
            assert worker.returncode == 0, err.decode()[-2000:]

        output = tmp_path / "results.jsonl"
        summary = await report(redis, job="kill", output=output, key_prefix=prefix)
        stats = server.stats

    records = read_report(output)
    # Every input line recorded exactly once, in line order.
    assert [r["line"] for r in records] == list(range(2, LINES + 2))
    assert summary.complete
    assert summary.records == LINES
    by_line = {r["line"]: r for r in records}
    assert by_line[9]["outcome"] == "invalid"  # the malformed row
    assert by_line[9]["reason"] == "malformed input row"
    # The chunks in flight when their worker died: maybe_sent, not sent again.
    lines_held = set()
    for chunk in victim_chunks:
        first = chunk * CHUNK + 2
        interrupted = [by_line[line] for line in range(first, first + CHUNK)]
        assert {r["outcome"] for r in interrupted} <= {"maybe_sent", "invalid"}
        assert any(r.get("error_type") == "Interrupted" for r in interrupted)
        lines_held.update(range(first, first + CHUNK))
    if 15 not in lines_held:
        assert by_line[15]["outcome"] == "invalid", by_line[15]  # "12": the service rejects it
    assert {r["line"] for r in records if r["outcome"] == "maybe_sent"} <= lines_held
    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes == summary.outcomes
    assert outcomes["not_sent"] == 0
    # The service never received a number twice; every "sent" line really arrived, and
    # nothing arrived that the report does not account for as sent, invalid or maybe_sent.
    assert not stats.duplicates
    sent = {r["number"] for r in records if r["outcome"] == "sent"}
    maybe = {r["number"] for r in records if r["outcome"] == "maybe_sent"}
    assert sent <= set(stats.received)
    assert set(stats.received) <= sent | maybe | {"12"}
    assert len(sent) == len(numbers) - 1 - len(maybe)  # all but "12" and the interrupted
    # One token for the whole fleet (it outlives the run).
    assert stats.token_calls == 1
    assert stats.unauthorized == 0


async def test_running_the_producer_again_enqueues_and_sends_nothing_twice(
    redis: Any, redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    output = tmp_path / "results.jsonl"
    async with FakeDispatchServer(client_secret=SECRET) as server:
        env = worker_env(server)
        enqueue_args = (
            "send",
            "basic",
            "--text",
            "hi",
            "-i",
            str(source),
            "--chunk-size",
            str(CHUNK),
            "--queue",
            redis_server,
            "--job",
            "again",
            "--key-prefix",
            prefix,
        )
        code, err = await cli(*enqueue_args, env=env)
        assert code == 0, err
        assert "12 enqueued now, 0 already done" in err
        # A producer restarted before any worker ran: the chunks are queued once.
        code, err = await cli(*enqueue_args, env=env)
        assert code == 0, err
        assert "0 enqueued now" in err
        assert await redis.xlen(f"{prefix}chunks") == 12

        worker = await start_worker(server, redis_server, prefix)
        _, werr = await asyncio.wait_for(worker.communicate(), 30)
        assert worker.returncode == 0, werr.decode()[-2000:]
        received = server.stats.recipients_received

        # And after the job is done: nothing is enqueued, a worker finds nothing to send.
        code, err = await cli(*enqueue_args, env=env)
        assert code == 0, err
        assert "0 enqueued now, 12 already done" in err
        assert await redis.xlen(f"{prefix}chunks") == 0
        worker = await start_worker(server, redis_server, prefix)
        await asyncio.wait_for(worker.communicate(), 30)
        assert server.stats.recipients_received == received == LINES - 1
        assert not server.stats.duplicates

        args = ("report", "--queue", redis_server, "--key-prefix", prefix, "--job", "again")
        code, err = await cli(*args, "-o", str(output), env=env)
    assert code == 0, err
    assert "job again: done in" in err
    records = read_report(output)
    assert [r["line"] for r in records] == list(range(2, LINES + 2))
    assert Counter(r["outcome"] for r in records) == {"sent": LINES - 2, "invalid": 2}


async def test_a_chunk_whose_rows_are_gone_is_never_reported_finished(
    redis: Any, redis_server: str, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    output = tmp_path / "report.jsonl"
    async with FakeDispatchServer(client_secret=SECRET) as server:
        env = worker_env(server)
        produce = (
            *("send", "basic", "--text", "hi", "-i", str(source), "--chunk-size", "20"),
            *("--queue", redis_server, "--job", "lost", "--key-prefix", prefix),
        )
        report_args = ("report", "--queue", redis_server, "--key-prefix", prefix)
        code, err = await cli(*produce, env=env)
        assert code == 0, err
        keys = JobKeys(prefix, "lost")
        # A worker claimed chunk 1 and died; then Redis lost its rows (eviction, a TTL).
        await redis.hset(keys.state, "1", b"in_flight")
        await redis.delete(keys.rows(1))
        worker = await start_worker(server, redis_server, prefix)
        _, werr = await asyncio.wait_for(worker.communicate(), 30)
        assert worker.returncode == 0, werr.decode()[-2000:]
        assert "recorded maybe_sent" not in werr.decode()
        code, err = await cli(*report_args, "--job", "lost", "-o", str(output), env=env)
        assert code == 1, err
        assert "not finished: 40 of 60 input lines recorded" in err
        assert len(read_report(output)) == 40

        # The producer, run again, stores the rows again: their lines get records.
        code, err = await cli(*produce, env=env)
        assert code == 0, err
        worker = await start_worker(server, redis_server, prefix)
        await asyncio.wait_for(worker.communicate(), 30)
        code, err = await cli(*report_args, "--job", "lost", "-o", str(output), env=env)
    records = read_report(output)
    assert sorted(r["line"] for r in records) == list(range(2, LINES + 2))
    assert Counter(r["outcome"] for r in records if 22 <= r["line"] <= 41) == {"maybe_sent": 20}
    assert server.stats.recipients_received == 39  # chunks 0 and 2, less the malformed row
    assert not server.stats.duplicates


async def test_the_same_job_with_other_input_is_refused(
    redis: Any, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    spec = InputSpec(str(source))
    target = Target("basic", text="hi")
    await enqueue(
        redis,
        job="j",
        target=target,
        account=None,
        input_spec=spec,
        chunk_size=5,
        key_prefix=prefix,
    )
    with pytest.raises(Problem, match="another target"):
        await enqueue(
            redis,
            job="j",
            target=Target("basic", text="other"),
            account=None,
            input_spec=spec,
            chunk_size=5,
            key_prefix=prefix,
        )
    source.write_text(source.read_text().replace("n3", "changed"))
    with pytest.raises(Problem, match="differs from what was enqueued"):
        await enqueue(
            redis,
            job="j",
            target=target,
            account=None,
            input_spec=spec,
            chunk_size=5,
            key_prefix=prefix,
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--queue", "redis://127.0.0.1:1/0"), "--queue needs --job"),
        (("--queue", "redis://127.0.0.1:1/0", "--job", "j", "--resume"), "cannot go with --queue"),
        (("--job", "j"), "--job goes with --queue"),
        (("--queue", "redis://127.0.0.1:1/0", "--job", "j", "--concurrency", "8"), "--max-jobs"),
    ],
)
async def test_queue_options_are_checked(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    code, err = await cli(
        "send", "basic", "--text", "hi", "-i", str(source), *args, env=dict(os.environ)
    )
    assert code == 2
    assert message in err


async def test_report_of_an_unknown_job_is_a_usage_error(redis_server: str, prefix: str) -> None:
    code, err = await cli(
        "report", "--queue", redis_server, "--key-prefix", prefix, "--job", "nope",
        env=dict(os.environ),
    )  # fmt: skip
    assert code == 2
    assert "no job 'nope'" in err


@pytest.mark.parametrize("failure", ["wrong password", "nothing listening"])
@pytest.mark.parametrize("command", ["worker", "producer", "report"])
async def test_redis_failures_are_one_line_without_the_password(
    command: str, failure: str, redis_server: str, prefix: str, tmp_path: Path
) -> None:
    host = redis_server.split("@")[-1].split("//")[-1]
    if failure == "nothing listening":
        host = f"127.0.0.1:{free_port()}/0"
    # A user name too: a Redis without passwords accepts any bare password from redis-py 6+.
    queue = f"redis://nobody:hunter2pw@{host}"
    source = tmp_path / "in.csv"
    write_input(source)
    args = {
        "worker": ("worker", "--burst"),
        "producer": ("send", "basic", "--text", "hi", "-i", str(source), "--job", "j"),
        "report": ("report", "--job", "j"),
    }[command]
    env = {**os.environ, "DISPATCH_CLIENT_SECRET": SECRET, "DISPATCH_ACCOUNT": "acme"}
    code, err = await cli(*args, "--queue", queue, "--key-prefix", prefix, env=env)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert "hunter2pw" not in err
    assert "Redis" in err


async def test_a_worker_serves_metrics_on_the_metrics_host_or_says_it_cannot(
    redis_server: str, prefix: str
) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding it fails at once,
    # and nothing is ever sent there.
    port = str(free_port())
    code, err = await cli(
        "worker", "--queue", redis_server, "--key-prefix", prefix, "--burst",
        "--metrics-port", port, "--metrics-host", "192.0.2.1", env=dict(os.environ),
    )  # fmt: skip
    assert code == 2, err
    assert f"cannot serve metrics on 192.0.2.1:{port}" in err


async def test_a_worker_serves_prometheus_metrics_that_match_what_the_service_saw(
    redis: Any, redis_server: str, prefix: str, tmp_path: Path
) -> None:
    import aiohttp

    source = tmp_path / "in.csv"
    write_input(source)
    metrics_port = free_port()
    async with FakeDispatchServer(client_secret=SECRET) as server:
        await enqueue(
            redis,
            job="metrics",
            target=Target("basic", text="hi"),
            account=None,
            input_spec=InputSpec(str(source)),
            chunk_size=CHUNK,
            key_prefix=prefix,
        )
        worker = await asyncio.create_subprocess_exec(
            *COMMAND,
            *("worker", "--queue", redis_server, "--key-prefix", prefix, "--poll-delay", "0.05"),
            *("--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"),
            cwd=ROOT,
            env=worker_env(server),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        keys = JobKeys(prefix, "metrics")
        try:

            async def all_done() -> bool:
                return (await redis.hvals(keys.state)).count(b"done") == LINES // CHUNK

            await until(all_done, 30, "every chunk done")
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{metrics_port}/metrics") as response,
            ):
                text = await response.text()
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.wait_for(worker.communicate(), 20)
        stats = server.stats

    def sample(name: str, **labels: str) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(name + "{") and all(p in line for p in wanted.split(",")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    assert sample("dispatch_requests_total", status="200") == stats.dispatch_calls
    valid = sample("dispatch_recipients_total", outcome="valid")
    invalid = sample("dispatch_recipients_total", outcome="invalid")
    assert valid + invalid == stats.recipients_received
    assert invalid == 1  # "12": the service rejects it
    assert sample("dispatch_token_fetches_total", source="fetched") == stats.tokens_issued
    assert "+55119" not in text  # no phone number is ever a label


async def test_a_worker_learns_the_rate_no_higher_than_max_rate(
    redis_server: str, prefix: str, tmp_path: Path, redis: Any
) -> None:
    source = tmp_path / "in.csv"
    write_input(source)
    await produce(redis_server, prefix, source, "bounded")
    async with FakeDispatchServer(client_secret=SECRET) as server:
        code, err = await cli(
            "worker", "--queue", redis_server, "--key-prefix", prefix, "--burst",
            "--poll-delay", "0.05", "--rate", "auto", "--max-rate", "3", env=worker_env(server),
        )  # fmt: skip
        assert code == 0, err
        assert server.stats.recipients_received == LINES - 1
    learned = RateState.decode((await redis.get(f"{prefix}rate:learned")).decode())
    assert learned is not None
    assert learned.rate == 3  # it starts at 10/s and doubles, unbounded


class TestTheReport:
    async def test_an_output_it_cannot_write_is_a_usage_error(
        self, redis: Any, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        source = tmp_path / "in.csv"
        write_input(source)
        await produce(redis_server, prefix, source, "out")
        with pytest.raises(Problem, match="cannot write") as raised:
            await report(redis, job="out", output=tmp_path, key_prefix=prefix)  # a directory
        assert raised.value.exit_code == 2

    @pytest.mark.parametrize("quiet", [False, True])
    async def test_done_chunks_whose_records_are_gone_are_not_finished(
        self, redis: Any, redis_server: str, prefix: str, tmp_path: Path, quiet: bool
    ) -> None:
        """Every chunk done, their records evicted: the waiting producer says so, exit 1."""
        source = tmp_path / "in.csv"
        write_input(source)
        keys = JobKeys(prefix, "gone")
        produced = await produce(redis_server, prefix, source, "gone")
        await redis.hset(keys.state, mapping={str(i): b"done" for i in range(produced.chunks)})
        err = io.StringIO()
        code = await run_enqueue(
            queue_url=redis_server, job="gone", target=Target("basic", text="hi"),
            account=None, input_spec=InputSpec(str(source)), chunk_size=CHUNK,
            key_prefix=prefix, output=tmp_path / "report.jsonl", quiet=quiet, err=err,
        )  # fmt: skip
        told = err.getvalue()
        assert code == 1
        assert "job gone is not finished: 60 input lines without a record" in told
        assert ("job gone: 12/12 chunks done" in told) is not quiet
        assert (tmp_path / "report.jsonl").read_bytes() == b""


class TestTheQueuesRedis:
    @pytest.mark.parametrize("prefix_given", ["", "a*:"])
    async def test_a_key_prefix_that_cannot_confine_the_keys_is_refused(
        self, redis: Any, prefix_given: str
    ) -> None:
        with pytest.raises(Problem, match="--key-prefix must be non-empty"):
            await report(redis, job="j", output=None, key_prefix=prefix_given)

    async def test_a_queue_url_that_is_not_redis_is_refused(self) -> None:
        with pytest.raises(Problem, match="--queue must be a redis://"):
            await connect("http://127.0.0.1:6379/0")

    async def test_redis_failing_during_a_command_is_one_line_and_exit_1(
        self, redis_server: str
    ) -> None:
        with pytest.raises(Problem, match="Redis failed: ResponseError") as raised:
            async with connected(redis_server) as client:
                await client.execute_command("NO-SUCH-COMMAND")
        assert raised.value.exit_code == 1

    async def test_a_stream_key_holding_something_else_is_an_error(
        self, redis: Any, prefix: str
    ) -> None:
        await redis.set(f"{prefix}chunks", "not a stream")
        with pytest.raises(redis_exceptions.ResponseError, match="WRONGTYPE"):
            await ensure_group(redis, f"{prefix}chunks")


def worker_config(redis_url: str, prefix: str, **connection: Any) -> WorkerConfig:
    options = {"base_url": "http://127.0.0.1:1", "client_secret": SECRET, "account": "acme"}
    return WorkerConfig(
        queue_url=redis_url,
        connection=Connection(**{**options, **connection}),
        key_prefix=prefix,
        burst=True,
        poll_delay=0.05,
    )


class TestTheWorkerInProcess:
    async def test_a_chunk_found_done_is_let_go_unsent(
        self, redis: Any, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        source = tmp_path / "in.csv"
        write_input(source)
        await produce(redis_server, prefix, source, "over")
        keys = JobKeys(prefix, "over")
        await redis.hset(keys.state, "0", b"done")
        [(entry, fields)] = await redis.xrange(keys.stream, count=1)
        assert fields[b"chunk"] == b"0"
        worker = Worker(worker_config(redis_server, prefix), redis)
        assert await worker.send_chunk("over", 0, entry) == "already done"
        assert await redis.xrange(keys.stream, entry, entry) == []
        assert not await redis.hexists(keys.queued, "0")
        assert not await redis.hexists(keys.out, "0")

    async def test_refused_credentials_stop_each_chunk_and_record_it_not_sent(
        self, redis: Any, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        source = tmp_path / "in.csv"
        write_input(source)
        await produce(redis_server, prefix, source, "refused")
        async with FakeDispatchServer(client_secret=SECRET) as server:
            config = worker_config(redis_server, prefix, base_url=server.url, client_secret="no")
            async with asyncio.timeout(HANG):
                await Worker(config, redis).run()  # --burst: until the queue is empty
            stats = server.stats
        output = tmp_path / "report.jsonl"
        summary = await report(redis, job="refused", output=output, key_prefix=prefix)
        records = read_report(output)
        assert summary.complete
        assert stats.dispatch_calls == 0
        assert Counter(r["outcome"] for r in records) == {"not_sent": LINES - 1, "invalid": 1}
        assert {r["error_type"] for r in records if r["outcome"] == "not_sent"} == {
            "AuthenticationError"
        }

    async def test_a_chunk_sent_is_recorded_sent_however_long_redis_takes_to_store_it(
        self, redis: Any, redis_server: str, prefix: str, tmp_path: Path
    ) -> None:
        """``--job-timeout`` cuts the sending only: Redis taking writes again only after
        it (paused, as for a failover's moment) gets the records of the chunks sent
        meanwhile, not a takeover's maybe_sent."""
        source = tmp_path / "in.csv"
        write_input(source)
        await produce(redis_server, prefix, source, "paused")
        async with FakeDispatchServer(client_secret=SECRET, latency=0.2) as server:
            config = attrs.evolve(
                worker_config(redis_server, prefix, base_url=server.url),
                job_timeout=1.0,
                takeover_after=0.5,
            )
            worker = asyncio.ensure_future(Worker(config, redis).run())  # --burst

            async def a_request() -> int:
                return server.stats.requests

            try:
                await until(a_request, HANG, "the first request")
                await redis.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
                async with asyncio.timeout(HANG):
                    await asyncio.shield(worker)
            finally:
                worker.cancel()
            stats = server.stats
        output = tmp_path / "report.jsonl"
        await report(redis, job="paused", output=output, key_prefix=prefix)
        records = read_report(output)
        assert Counter(r["outcome"] for r in records) == {"sent": LINES - 2, "invalid": 2}
        assert not stats.duplicates

    async def test_without_the_services_address_or_secret_it_says_what_to_set(
        self, redis_server: str, prefix: str
    ) -> None:
        config = worker_config(redis_server, prefix, base_url=None)
        with pytest.raises(Problem, match="the worker needs DISPATCH_BASE_URL"):
            await run_worker(config)

    @pytest.mark.parametrize("found", [signal.SIG_IGN, signal.default_int_handler])
    async def test_run_in_process_it_leaves_ctrl_c_as_it_found_it(
        self, redis_server: str, prefix: str, found: Any
    ) -> None:
        before = signal.signal(signal.SIGINT, found)
        try:
            assert await run_worker(worker_config(redis_server, prefix)) == 0  # burst: empty
            after = signal.getsignal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, before)
        assert after == found

    async def test_a_rate_the_shared_limiter_refuses_is_a_usage_error(
        self, redis_server: str, prefix: str
    ) -> None:
        config = worker_config(redis_server, prefix, rate=5.0, max_rate=10.0)
        with pytest.raises(Problem, match="max_requests_per_second") as raised:
            await run_worker(config)
        assert raised.value.exit_code == 2

    async def test_a_queue_stream_it_cannot_use_is_one_line_exit_2(
        self, redis: Any, redis_server: str, prefix: str
    ) -> None:
        await redis.set(f"{prefix}chunks", "not a stream")
        config = worker_config(redis_server, prefix)
        with pytest.raises(Problem, match=r"cannot use the Redis queue .*WRONGTYPE") as raised:
            await run_queue_worker(config, verbose=0)
        assert raised.value.exit_code == 2


class TestMissingExtras:
    async def test_a_queue_without_the_queue_extra_names_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "redis", None)
        monkeypatch.setitem(sys.modules, "redis.asyncio", None)
        with pytest.raises(Problem, match=r"dispatch-async\[queue\]"):
            await connect("redis://127.0.0.1:6379/0")

    async def test_metrics_without_the_prometheus_extra_names_it(
        self, redis_server: str, prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "prometheus_client", None)
        config = attrs.evolve(worker_config(redis_server, prefix), metrics_port=free_port())
        with pytest.raises(Problem, match=r"dispatch-async\[prometheus\]"):
            await run_worker(config)

"""The worker of a queued job: one `DispatchSession` per process, one chunk per stream entry.

The session shares its token (`RedisTokenStore`) and, with a rate, its request rate
(`RedisRateLimiter`) with every worker on the same Redis and key prefix. A chunk is
claimed (``pending`` -> ``in_flight``) before anything is sent, and its records are
stored with ``done`` after; see ``chunks`` for the keys and ``consumer`` for the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket

import attrs
import orjson

import dispatch_async as da

from ..job.records import failed_record, malformed_record, part_records
from ..job.spec import Connection, Target
from ..reading.input import Row
from ..screen.flags import in_our_words
from ..screen.problem import Problem
from .chunks import (
    DONE,
    IN_FLIGHT,
    PENDING,
    QueueRedis,
    check_job_id,
    claim,
    entry_waits,
    finish,
    job_keys,
    let_go,
    load_rows,
    release,
    stream_name,
)
from .consumer import Consumer, Entry
from .link import connect, connection_of, disconnect, redis_errors, unreachable

__all__ = ["Worker", "WorkerConfig", "run_queue_worker", "run_worker"]

log = logging.getLogger("dispatch_async")

#: The part of ``job_timeout`` a chunk may spend sending; the rest is left to record it.
_DEADLINE_SHARE = 0.8


@attrs.frozen
class WorkerConfig:
    """One worker process: where the queue is, how to reach the service, how much at once."""

    queue_url: str = attrs.field(repr=False)
    connection: Connection
    key_prefix: str = da.DEFAULT_KEY_PREFIX
    max_jobs: int = 4
    job_timeout: float = 300.0
    #: Seconds a chunk whose worker went quiet (died) waits before another takes it over.
    takeover_after: float = 30.0
    burst: bool = False
    #: The longest a free slot waits for a new chunk before looking for one to take over.
    poll_delay: float = 2.0
    #: Serve Prometheus metrics (the SDK's ``PrometheusHook``) on this port, if given.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


def malformed_records(rows: list[Row]) -> list[bytes]:
    """The records of the rows that cannot be sent, exactly as a single-machine run writes."""
    return [malformed_record(r) for r in rows if r.message is None]


def interrupted_records(rows: list[Row]) -> list[bytes]:
    """The records of a chunk whose worker died mid-send: maybe_sent (malformed: invalid)."""
    return malformed_records(rows) + [
        failed_record(
            r.line,
            r.number,
            maybe_sent=True,
            error="a worker was killed while this chunk may have been in flight; "
            "it is not sent again",
            error_type="Interrupted",
        )
        for r in rows
        if r.message is not None
    ]


class Worker:
    """Sends the chunks the stream hands it, with one session, until cancelled."""

    def __init__(self, config: WorkerConfig, redis: QueueRedis) -> None:
        self.config = config
        self.redis = redis
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.consumer = Consumer(
            redis,
            stream_name(config.key_prefix, redis),
            self.owner,
            self.handle,
            slots=config.max_jobs,
            takeover=config.takeover_after,
            poll=config.poll_delay,
            burst=config.burst,
        )
        self._session: da.DispatchSession | None = None
        #: Numbers this worker's claims: a claim repeated is told from another claim.
        self._claims = itertools.count(1)

    async def run(self) -> None:
        """Until cancelled (SIGTERM) or, with ``burst``, until the stream is empty."""
        async with _session(self.config) as session:
            self._session = session
            log.info(
                "worker %s started: %d chunks at once, key prefix %r",
                self.owner,
                self.config.max_jobs,
                self.config.key_prefix,
            )
            await self.consumer.run()

    async def handle(self, entry: Entry) -> None:
        """One stream entry: a chunk to send, or something to let go of."""
        entry_id, fields = entry
        try:
            job = check_job_id(fields[b"job"].decode())
            index = int(fields[b"chunk"])
        except (KeyError, ValueError, Problem):
            # Not written by a producer: nothing to do, and nothing of it is kept.
            log.error("stream entry %s is no chunk: dropped", entry_id.decode())
            await let_go(self.redis, job_keys(self.redis, self.config.key_prefix, "-"), entry_id)
            return
        try:
            outcome = await self.send_chunk(job, index, entry_id)
        except TimeoutError:
            outcome = "stopped at --job-timeout: what was in flight recorded maybe_sent"
        log.info("chunk %s of job %s: %s", index, job, outcome)

    async def send_chunk(self, job: str, index: int, entry: bytes) -> str:
        """Send chunk *index* of *job* once, and record what happened to each row."""
        redis = self.redis
        keys = job_keys(redis, self.config.key_prefix, job)
        claimed = await claim(redis, keys, index, f"{next(self._claims)}@{self.owner}", entry)
        state, raw = claimed.state, claimed.rows
        if state == DONE:
            await release(redis, keys, index, entry)
            return "already done"
        if state == IN_FLIGHT and claimed.failed_over:
            # Claimed on the new primary by another worker while this one's claim went
            # to the old primary only: the chunk, and its entry there, are the other's.
            return "claimed by another worker during a failover: left to it"
        first = claimed.entry
        if (
            state == IN_FLIGHT
            and first not in (None, entry)
            and await entry_waits(redis, keys, first or b"")
        ):
            # A second entry (a producer died between adding one and noting it): the
            # chunk is the first entry's, handled or taken over.
            await let_go(redis, keys, entry)
            return "a second entry: let go"
        if state == IN_FLIGHT:
            # A redelivery: the worker that claimed it died, maybe mid-request.
            if raw is None:
                # Its rows (and so its lines) are gone: nothing can be recorded. It stays
                # in flight, so the report says the job is not finished; running the
                # producer again stores the rows again, and a later delivery records them.
                log.error(
                    "chunk %s of job %s was interrupted and its rows are gone from Redis "
                    "(evicted or expired): run the producer again to record its lines",
                    index,
                    job,
                )
                await release(redis, keys, index, entry)
                return "rows lost"
            records = interrupted_records(load_rows(raw))
            marked = await finish(
                redis, keys, index, records, entry, claimed.ttl, only_if_in_flight=True
            )
            if marked:
                log.warning("chunk %s of job %s was interrupted: recorded maybe_sent", index, job)
            return "interrupted" if marked else "already done"
        if state != PENDING or raw is None or claimed.target is None:
            log.error("chunk %s of job %s is unknown (expired?): skipped", index, job)
            await release(redis, keys, index, entry)
            return "unknown"
        rows = load_rows(raw)
        target = Target(**orjson.loads(claimed.target))
        try:
            # Only the sending is cut at the job timeout: claiming and recording are
            # bounded apart (`write_durably`, 20 s), so a chunk sent is recorded as
            # sent even when Redis takes a failover's seconds to have it.
            async with asyncio.timeout(self.config.job_timeout):
                records, sent = await self._send(target, claimed.account, rows)
        except BaseException:
            # Cancelled (SIGTERM, the job timeout) or a bug: a request may be out.
            await asyncio.shield(
                finish(redis, keys, index, interrupted_records(rows), entry, claimed.ttl)
            )
            raise
        await finish(redis, keys, index, malformed_records(rows) + records, entry, claimed.ttl)
        return f"sent {sent} of {len(rows)}"

    async def _send(
        self, target: Target, account: str | None, rows: list[Row]
    ) -> tuple[list[bytes], int]:
        """Send the chunk's sendable rows; their records, and how many were sent."""
        session = self._session
        assert session is not None
        sendable = [r for r in rows if r.message is not None]
        records: list[bytes] = []
        covered = bytearray(len(sendable))
        sent = 0
        stop: da.DispatchError | None = None
        stream = target.stream(
            session,
            [r.message for r in sendable],
            account=account,
            deadline=self.config.job_timeout * _DEADLINE_SHARE,
        )
        try:
            async with contextlib.aclosing(stream) as parts:
                async for part in parts:
                    span = part.positions
                    part_rows, counts = part_records(sendable[span.start : span.stop], part)
                    records += part_rows
                    sent += counts["sent"]
                    covered[span.start : span.stop] = b"\x01" * len(span)
        except da.DispatchError as error:
            # It stopped the job (bad credentials, no token): the SDK accounted for every
            # row it read; one it never read was never sent.
            stop = error
        for row, done in zip(sendable, covered, strict=True):
            if not done:
                why = f"the job stopped before this was sent: {in_our_words(stop)}"
                records.append(
                    failed_record(
                        row.line, row.number, maybe_sent=False, error=why, error_type="Stopped"
                    )
                )
        return records, sent


async def run_worker(config: WorkerConfig) -> int:
    """Run a worker until SIGINT/SIGTERM (or, with ``burst``, an empty stream)."""
    if config.metrics_port is not None:
        _serve_metrics(config.metrics_host, config.metrics_port)
    redis = await connect(config.queue_url)
    try:
        running = asyncio.ensure_future(Worker(config, redis).run())
        try:
            with da.on_stop_signals(lambda _: running.cancel()):
                await running
        except asyncio.CancelledError:
            if not running.cancelled():
                raise
    except redis_errors() as exc:
        raise unreachable(config.queue_url, exc, connection_of(redis)) from None
    finally:
        await disconnect(redis)
    return 0


def _serve_metrics(host: str, port: int) -> None:
    """Count every send of this process with the SDK's Prometheus hook, served at /metrics."""
    from dispatch_async import instrumentation

    try:
        import prometheus_client
    except ImportError:
        raise Problem(
            '--metrics-port needs the prometheus extra: pip install "dispatch-async[prometheus]"'
        ) from None
    instrumentation.set_hooks([*instrumentation.get_hooks(), instrumentation.PrometheusHook()])
    try:
        prometheus_client.start_http_server(port, addr=host)
    except OSError as exc:
        raise Problem(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None


def _session(config: WorkerConfig) -> da.DispatchSession:
    connection = config.connection
    if not connection.base_url or not connection.client_secret:
        raise Problem(
            "the worker needs DISPATCH_BASE_URL and DISPATCH_CLIENT_SECRET (or --base-url "
            "and --client-secret-file)"
        )
    try:
        limiter = (
            da.RedisRateLimiter(
                config.queue_url, **connection.rate_options(), key_prefix=config.key_prefix
            )
            if connection.rate
            else None
        )
        store = da.RedisTokenStore(config.queue_url, key_prefix=config.key_prefix)
    except da.DispatchError as exc:
        raise Problem(in_our_words(exc)) from None
    return connection.session(token_store=store, rate_limiter=limiter)


async def run_queue_worker(config: WorkerConfig, *, verbose: int) -> int:
    """Run one worker process until a signal (or, with burst, an empty queue)."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return await run_worker(config)
    except redis_errors() as exc:
        raise unreachable(config.queue_url, exc) from None

"""The arq worker of a queued job: one `DispatchSession` per process, one chunk per arq job.

The session shares its token (`RedisTokenStore`) and, with a rate, its request rate
(`RedisRateLimiter`) with every worker on the same Redis and key prefix. A chunk is
claimed (``pending`` -> ``in_flight``) before anything is sent, and its records are
stored with ``done`` after; see ``_fleet_queue`` for the keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

import attrs
import orjson

import dispatch_async as da

from .input import Row
from .queue import (
    DONE,
    IN_FLIGHT,
    PENDING,
    SEND_CHUNK,
    JobKeys,
    claim,
    finish,
    interrupted_records,
    load_rows,
    malformed_records,
    queue_name,
    redis_errors,
    redis_settings,
    unreachable,
    wake_channel,
)
from .records import failed_record, part_records
from .spec import Connection, Problem, Target

__all__ = [
    "WorkerConfig",
    "make_worker",
    "run_queue_worker",
    "run_worker",
    "send_chunk",
    "worker_settings",
]

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
    burst: bool = False
    #: The longest a worker waits for work without being told (see ``prompt_worker``).
    poll_delay: float = 0.5
    #: Serve Prometheus metrics (the SDK's ``PrometheusHook``) on this port, if given.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


def worker_settings(config: WorkerConfig) -> dict[str, Any]:
    """The keyword arguments of ``PromptWorker`` (``arq.Worker``'s, and one more) for *config*."""
    redis = redis_settings(config.queue_url)  # a Problem if arq is not installed
    from arq.worker import func

    async def startup(ctx: dict[str, Any]) -> None:
        # Entered here, closed by shutdown: one HTTP pool and one token for every chunk.
        ctx["dispatch_session"] = await _session(config).__aenter__()
        ctx["dispatch_prefix"] = config.key_prefix
        ctx["dispatch_owner"] = f"{socket.gethostname()}:{os.getpid()}"
        ctx["dispatch_deadline"] = config.job_timeout * _DEADLINE_SHARE

    async def shutdown(ctx: dict[str, Any]) -> None:
        session: da.DispatchSession | None = ctx.pop("dispatch_session", None)
        if session is not None:
            await session.close()

    return {
        # One try more than a redelivery needs: a second delivery only records.
        "functions": [func(send_chunk, name=SEND_CHUNK, max_tries=3)],
        "redis_settings": redis,
        "queue_name": queue_name(config.key_prefix),
        "on_startup": startup,
        "on_shutdown": shutdown,
        "max_jobs": config.max_jobs,
        "job_timeout": config.job_timeout,
        "burst": config.burst,
        "poll_delay": config.poll_delay,
        "wake_channel": wake_channel(config.key_prefix),
        # JSON, not pickle: whoever can write to the queue must not run code in workers.
        "job_serializer": orjson.dumps,
        "job_deserializer": orjson.loads,
        # The chunk state, not arq's result, says what happened.
        "keep_result": 0,
    }


def make_worker(config: WorkerConfig, **overrides: Any) -> Any:
    """The worker for *config* (a ``PromptWorker``), *overrides* replacing its settings."""
    settings = worker_settings(config)  # first: a Problem if arq is not installed
    from .prompt_worker import PromptWorker

    return PromptWorker(**{**settings, **overrides})


async def run_worker(config: WorkerConfig) -> int:
    """Run an arq worker until SIGINT/SIGTERM (or, with ``burst``, an empty queue)."""
    if config.metrics_port is not None:
        _serve_metrics(config.metrics_host, config.metrics_port)
    worker = make_worker(config)
    try:
        await worker.async_run()
    except asyncio.CancelledError:
        pass  # arq's own SIGINT/SIGTERM handler cancels the run
    finally:
        await worker.close()
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
        raise Problem(str(exc)) from None
    return connection.session(token_store=store, rate_limiter=limiter)


async def send_chunk(ctx: dict[str, Any], job: str, index: int) -> str:
    """The arq job: send chunk *index* of *job* once, and record what happened to each row."""
    redis = ctx["redis"]
    keys = JobKeys(ctx["dispatch_prefix"], job)
    state = await claim(redis, keys, index, ctx["dispatch_owner"])
    if state == DONE:
        return "already done"
    raw = await redis.get(keys.rows(index))
    if state == IN_FLIGHT:
        # A redelivery: the worker that claimed it died, maybe mid-request.
        if raw is None:
            # Its rows (and so its lines) are gone: nothing can be recorded. It stays in
            # flight, so the report says the job is not finished; running the producer
            # again stores the rows again, and a later delivery records them.
            log.error(
                "chunk %s of job %s was interrupted and its rows are gone from Redis "
                "(evicted or expired): run the producer again to record its lines",
                index,
                job,
            )
            return "rows lost"
        records = interrupted_records(load_rows(raw))
        marked = await finish(redis, keys, index, records, only_if_in_flight=True)
        if marked:
            log.warning("chunk %s of job %s was interrupted: recorded maybe_sent", index, job)
        return "interrupted" if marked else "already done"
    if state != PENDING or raw is None:
        log.error("chunk %s of job %s is unknown (expired?): skipped", index, job)
        return "unknown"
    rows = load_rows(raw)
    try:
        records, sent = await _send(ctx, keys, rows)
    except BaseException:
        # Cancelled (SIGTERM, arq's job_timeout) or a bug: a request may be out.
        await asyncio.shield(finish(redis, keys, index, interrupted_records(rows)))
        raise
    await finish(redis, keys, index, malformed_records(rows) + records)
    return f"sent {sent} of {len(rows)}"


async def _send(ctx: dict[str, Any], keys: JobKeys, rows: list[Row]) -> tuple[list[bytes], int]:
    """Send the chunk's sendable rows; their records, and how many were sent."""
    session: da.DispatchSession = ctx["dispatch_session"]
    meta = await ctx["redis"].hmget(keys.meta, ["target", "account"])
    target = Target(**orjson.loads(meta[0]))
    account = meta[1].decode() or None if meta[1] else None
    sendable = [r for r in rows if r.message is not None]
    records: list[bytes] = []
    covered = bytearray(len(sendable))
    sent = 0
    stop: da.DispatchError | None = None
    stream = target.stream(
        session, [r.message for r in sendable], account=account, deadline=ctx["dispatch_deadline"]
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
            why = f"the job stopped before this was sent: {stop}"
            records.append(
                failed_record(
                    row.line, row.number, maybe_sent=False, error=why, error_type="Stopped"
                )
            )
    return records, sent


async def run_queue_worker(config: WorkerConfig, *, verbose: int) -> int:
    """Run one worker process until a signal (or, with burst, an empty queue)."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return await run_worker(config)
    except redis_errors() as exc:
        raise unreachable(config.queue_url, exc) from None

"""The arq worker of a queued job: one `DispatchSession` per process, one chunk per arq job.

The session shares its token (`RedisTokenStore`) and, with a rate, its request rate
(`RedisRateLimiter`) with every worker on the same Redis and key prefix. A chunk is
claimed (``pending`` -> ``in_flight``) before anything is sent, and its records are
stored with ``done`` after; see ``_fleet_queue`` for the keys.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from typing import Any

import attrs
import orjson

from ._batch import collected
from ._cli.input import Row
from ._cli.records import failed_record, invalid_record, sent_record
from ._cli.spec import Connection, Target
from ._exceptions import ConfigurationError, DispatchError
from ._fleet_queue import (
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
    redis_settings,
)
from ._models import DispatchResult
from ._redis import DEFAULT_KEY_PREFIX
from ._session import DispatchSession

__all__ = ["WorkerConfig", "run_worker", "send_chunk", "worker_settings"]

log = logging.getLogger("dispatch_async")

#: The part of ``job_timeout`` a chunk may spend sending; the rest is left to record it.
_DEADLINE_SHARE = 0.8


@attrs.frozen
class WorkerConfig:
    """One worker process: where the queue is, how to reach the service, how much at once."""

    queue_url: str = attrs.field(repr=False)
    connection: Connection
    key_prefix: str = DEFAULT_KEY_PREFIX
    max_jobs: int = 4
    job_timeout: float = 300.0
    burst: bool = False
    poll_delay: float = 0.5


def worker_settings(config: WorkerConfig) -> dict[str, Any]:
    """The keyword arguments of ``arq.Worker`` for *config*."""
    from arq.worker import func

    async def startup(ctx: dict[str, Any]) -> None:
        # Entered here, closed by shutdown: one HTTP pool and one token for every chunk.
        ctx["dispatch_session"] = await _session(config).__aenter__()
        ctx["dispatch_prefix"] = config.key_prefix
        ctx["dispatch_owner"] = f"{socket.gethostname()}:{os.getpid()}"
        ctx["dispatch_deadline"] = config.job_timeout * _DEADLINE_SHARE

    async def shutdown(ctx: dict[str, Any]) -> None:
        session: DispatchSession | None = ctx.pop("dispatch_session", None)
        if session is not None:
            await session.close()

    return {
        # One try more than a redelivery needs: a second delivery only records.
        "functions": [func(send_chunk, name=SEND_CHUNK, max_tries=3)],
        "redis_settings": redis_settings(config.queue_url),
        "queue_name": queue_name(config.key_prefix),
        "on_startup": startup,
        "on_shutdown": shutdown,
        "max_jobs": config.max_jobs,
        "job_timeout": config.job_timeout,
        "burst": config.burst,
        "poll_delay": config.poll_delay,
        # JSON, not pickle: whoever can write to the queue must not run code in workers.
        "job_serializer": orjson.dumps,
        "job_deserializer": orjson.loads,
        # The chunk state, not arq's result, says what happened.
        "keep_result": 0,
    }


async def run_worker(config: WorkerConfig) -> int:
    """Run an arq worker until SIGINT/SIGTERM (or, with ``burst``, an empty queue)."""
    from arq.worker import Worker

    worker = Worker(**worker_settings(config))
    try:
        await worker.async_run()
    except asyncio.CancelledError:
        pass  # arq's own SIGINT/SIGTERM handler cancels the run
    finally:
        await worker.close()
    return 0


def _session(config: WorkerConfig) -> DispatchSession:
    from ._redis_rate_limiter import RedisRateLimiter
    from ._redis_token_store import RedisTokenStore

    connection = config.connection
    if not connection.base_url or not connection.client_secret:
        raise ConfigurationError(
            "the worker needs DISPATCH_BASE_URL and DISPATCH_CLIENT_SECRET (or --base-url "
            "and --client-secret-file)"
        )
    limiter = (
        RedisRateLimiter(
            config.queue_url, requests_per_second=connection.rate, key_prefix=config.key_prefix
        )
        if connection.rate
        else None
    )
    return connection.session(
        token_store=RedisTokenStore(config.queue_url, key_prefix=config.key_prefix),
        rate_limiter=limiter,
    )


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
        rows = load_rows(raw) if raw is not None else []
        marked = await finish(redis, keys, index, interrupted_records(rows), only_if_in_flight=True)
        log.warning("chunk %s of job %s was interrupted: recorded maybe_sent", index, job)
        return "interrupted" if marked else "already done"
    if state != PENDING or raw is None:
        log.error("chunk %s of job %s is unknown (expired?): skipped", index, job)
        return "unknown"
    rows = load_rows(raw)
    try:
        result = await _send(ctx, keys, rows)
    except BaseException:
        # Cancelled (SIGTERM, arq's job_timeout) or a bug: a request may be out.
        await asyncio.shield(finish(redis, keys, index, interrupted_records(rows)))
        raise
    records = malformed_records(rows) + result_records(rows, result)
    await finish(redis, keys, index, records)
    return f"sent {len(result.valid)} of {len(rows)}"


async def _send(ctx: dict[str, Any], keys: JobKeys, rows: list[Row]) -> DispatchResult:
    session: DispatchSession = ctx["dispatch_session"]
    meta = await ctx["redis"].hmget(keys.meta, ["target", "account"])
    target = Target(**orjson.loads(meta[0]))
    account = meta[1].decode() or None if meta[1] else None
    messages = [r.message for r in rows if r.message is not None]
    if not messages:
        return DispatchResult(range(0))
    send = collected(target.stream)  # the send_* twin, with the partial result on errors
    try:
        return await send(session, messages, account=account, deadline=ctx["dispatch_deadline"])
    except DispatchError as error:
        # An abort (bad credentials): the partial result accounts for every recipient.
        if error.result is not None:
            return error.result
        raise


def result_records(rows: list[Row], result: DispatchResult) -> list[bytes]:
    """One record per sendable row, matching the SDK's answers to rows by number."""
    by_number: dict[str, deque[Row]] = {}
    for row in rows:
        if row.message is not None and row.number is not None:
            by_number.setdefault(row.number, deque()).append(row)

    def take(number: str) -> Row | None:
        queue = by_number.get(number)
        return queue.popleft() if queue else None

    records: list[bytes] = []
    for valid in result.valid:
        if (sent := take(valid.number)) is not None:
            records.append(sent_record(sent.line, valid.number, valid.id))
    for invalid in result.invalid:
        if (refused := take(invalid.number)) is not None:
            records.append(invalid_record(refused.line, invalid.number, invalid.reason))
    for failure in result.failed:
        number = failure.recipient.number
        if (failed := take(number)) is not None:
            records.append(
                failed_record(
                    failed.line,
                    number,
                    maybe_sent=failure.maybe_sent,
                    error=str(failure.error),
                    error_type=type(failure.error).__name__,
                )
            )
    # The SDK accounts for every recipient; anything left is a bug, recorded safely.
    leftovers = [row for queue in by_number.values() for row in queue]
    records += interrupted_records(leftovers)
    return records

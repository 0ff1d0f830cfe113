"""A bulk job spread over arq workers: the chunk state in Redis, the producer, the report.

Every key is under the key prefix P (default ``dispatch-async:``) and job id J, and
expires ``ttl`` seconds after the producer last touched the job (default 7 days)::

    P job:J          hash: the job's target, account, chunk size, chunk and line count
    P job:J:state    hash: chunk index -> pending | in_flight | done
    P job:J:owner    hash: chunk index -> the worker (host:pid) that claimed it
    P job:J:digest   hash: chunk index -> CRC-32 of its rows (a restarted producer must
                     read the same input)
    P job:J:rows:I   string: chunk I's input rows (JSON), deleted once I is done
    P job:J:out      hash: chunk index -> its output records, one JSON line per input line
    P queue          arq's queue (sorted set); arq also writes ``arq:job:J:I``,
                     ``arq:in-progress:J:I``, ``arq:retry:J:I`` and ``arq:result:J:I``

and two pub/sub channels, which only say "look again" (see ``wake``)::

    P queue:wake     the producer queued a chunk (payload: none)
    P job:J:done     chunk I of job J is done (payload: I)

A chunk goes ``pending`` (the producer) -> ``in_flight`` (a worker, with a compare-and-set,
before anything is sent) -> ``done`` (with its records). A worker that finds a chunk
already ``in_flight`` is running a redelivery after a worker died mid-send: it records
the chunk's rows ``maybe_sent`` without sending. A ``done`` chunk is never sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, TypeAlias

import attrs
import orjson

import dispatch_async as da

from .input import Row
from .records import failed_record, malformed_record
from .spec import FAILED, InputSpec, Problem, Target

#: arq's ``ArqRedis`` (a redis-py asyncio client). Typed loosely: redis-py types every
#: reply as "awaitable or not", which strict mypy rejects at each ``await``.
ArqRedis: TypeAlias = Any

__all__ = [
    "DEFAULT_TTL",
    "DONE",
    "IN_FLIGHT",
    "PENDING",
    "SEND_CHUNK",
    "ArqRedis",
    "JobKeys",
    "Produced",
    "announce",
    "check_job_id",
    "check_prefix",
    "claim",
    "connect",
    "connected",
    "dump_rows",
    "enqueue",
    "finish",
    "interrupted_records",
    "load_rows",
    "malformed_records",
    "queue_name",
    "redis_errors",
    "redis_settings",
    "unreachable",
    "wake_channel",
    "where",
]

PENDING: Final = b"pending"
IN_FLIGHT: Final = b"in_flight"
DONE: Final = b"done"
#: The arq function name every chunk job calls.
SEND_CHUNK: Final = "send_chunk"
#: Seconds the job's keys live after the producer last wrote them.
DEFAULT_TTL = 7 * 24 * 3600
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@attrs.frozen
class JobKeys:
    """The Redis keys of one job."""

    prefix: str
    job: str

    @property
    def meta(self) -> str:
        return f"{self.prefix}job:{self.job}"

    @property
    def state(self) -> str:
        return f"{self.meta}:state"

    @property
    def owner(self) -> str:
        return f"{self.meta}:owner"

    @property
    def digest(self) -> str:
        return f"{self.meta}:digest"

    @property
    def out(self) -> str:
        return f"{self.meta}:out"

    @property
    def done_channel(self) -> str:
        return f"{self.meta}:done"

    def rows(self, index: int) -> str:
        return f"{self.meta}:rows:{index}"

    @property
    def queue(self) -> str:
        return queue_name(self.prefix)

    def arq_job_id(self, index: int) -> str:
        return f"{self.job}:{index}"


def queue_name(prefix: str) -> str:
    """arq's queue (a sorted set) for jobs under *prefix*."""
    return f"{prefix}queue"


def wake_channel(prefix: str) -> str:
    """The pub/sub channel on which a producer announces a chunk queued under *prefix*."""
    return f"{queue_name(prefix)}:wake"


def check_job_id(job: str) -> str:
    """*job* if it can name a job (letters, digits, ``_.-``), else a Problem."""
    if not _JOB_ID.fullmatch(job):
        raise Problem(f"--job {job!r}: use 1-100 letters, digits, '_', '.' or '-'")
    return job


def check_prefix(key_prefix: str) -> str:
    if not key_prefix or any(c in key_prefix for c in "*?[]"):
        raise Problem("--key-prefix must be non-empty, without glob characters (*?[])")
    return key_prefix


def where(queue_url: str) -> str:
    """The queue's address for messages: scheme, host, port and database, never a password."""
    parts = urllib.parse.urlsplit(queue_url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a failing Redis raises: redis-py's errors and the socket's."""
    import redis.exceptions

    return (redis.exceptions.RedisError, OSError)


async def announce(redis: ArqRedis, channel: str, payload: bytes | str = b"") -> None:
    """Publish *payload* on *channel*: a Redis that does not allow it costs promptness only."""
    from redis.exceptions import NoPermissionError

    with contextlib.suppress(NoPermissionError):
        await redis.publish(channel, payload)


def unreachable(queue_url: str, exc: BaseException) -> Problem:
    """One line, exit 2: redis-py's messages name host and port, never the password."""
    message = f"cannot use the Redis queue {where(queue_url)}: {type(exc).__name__}: {exc}"
    return Problem(" ".join(message.split()))


def redis_settings(queue_url: str) -> Any:
    """arq's settings for *queue_url*, failing at once on a refused connection or password.

    arq retries a failing connection five times, a warning each; a wrong password or
    address does not get better, and the command line says so in one line.
    """
    try:
        from arq.connections import RedisSettings
    except ImportError:
        raise Problem(
            'a queued job needs the queue extra: pip install "dispatch-async[queue]"'
        ) from None
    if urllib.parse.urlsplit(queue_url).scheme not in ("redis", "rediss", "unix"):
        raise Problem("--queue must be a redis://, rediss:// or unix:// URL")
    settings = RedisSettings.from_dsn(queue_url)
    settings.conn_retries = 0
    return settings


async def connect(queue_url: str) -> ArqRedis:
    """An arq Redis pool (a redis-py client) for *queue_url*; JSON, never pickle, for jobs."""
    from arq.connections import create_pool

    settings = redis_settings(queue_url)
    try:
        return await create_pool(
            settings, job_serializer=orjson.dumps, job_deserializer=orjson.loads
        )
    except redis_errors() as exc:
        raise unreachable(queue_url, exc) from None


@contextlib.asynccontextmanager
async def connected(queue_url: str) -> AsyncIterator[ArqRedis]:
    """The queue's Redis for a command: a failure there is one line, exit 1; closed after."""
    redis = await connect(queue_url)
    try:
        yield redis
    except redis_errors() as exc:
        raise Problem(f"Redis failed: {type(exc).__name__}: {exc}", FAILED) from None
    finally:
        await redis.aclose()


# -- rows ------------------------------------------------------------------------------


def dump_rows(rows: list[Row]) -> bytes:
    return orjson.dumps([[r.line, r.number, r.message, r.problem] for r in rows])


def load_rows(raw: bytes) -> list[Row]:
    """The rows of one chunk as the producer stored them."""
    return [
        Row(line, number, message, problem) for line, number, message, problem in orjson.loads(raw)
    ]


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


# -- the producer ------------------------------------------------------------------


@attrs.frozen
class Produced:
    """What one producer run did: chunks enqueued now, and chunks already done."""

    job: str
    chunks: int
    lines: int
    enqueued: int
    known: int


async def enqueue(
    redis: ArqRedis,
    *,
    job: str,
    target: Target,
    account: str | None,
    input_spec: InputSpec,
    chunk_size: int,
    key_prefix: str = da.DEFAULT_KEY_PREFIX,
    ttl: int = DEFAULT_TTL,
) -> Produced:
    """Split the input into chunks of *chunk_size* rows, store and enqueue each once.

    Running it again for the same job (after a crash, or by mistake) stores and enqueues
    nothing that is already there: a done chunk is left alone; a pending or in-flight one
    is enqueued under the same arq job id, which arq ignores while it is queued or
    running (a chunk found in flight is never sent again, only recorded maybe_sent).

    Raises:
        Problem: the input cannot be read, or the job exists with other settings or input.
    """
    keys = JobKeys(check_prefix(key_prefix), check_job_id(job))
    settings = {
        "target": orjson.dumps(attrs.asdict(target)),
        "account": account or "",
        "chunk_size": str(chunk_size),
    }
    await _claim_job(redis, keys, settings, ttl)
    rows = input_spec.open()
    chunks = lines = enqueued = known = 0
    try:
        iterator = iter(rows)
        while chunk := await asyncio.to_thread(_take, iterator, chunk_size):
            lines += len(chunk)
            if not await _store_chunk(redis, keys, chunks, chunk, ttl):
                known += 1
            elif await redis.enqueue_job(
                SEND_CHUNK,
                keys.job,
                chunks,
                _job_id=keys.arq_job_id(chunks),
                _queue_name=keys.queue,
                _expires=ttl,
            ):
                enqueued += 1
                # Idle workers fetch it now, not at their next poll.
                await announce(redis, wake_channel(keys.prefix))
            chunks += 1
    finally:
        rows.close()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.meta, mapping={"chunks": chunks, "lines": lines})
        for key in (keys.meta, keys.state, keys.digest, keys.owner):
            pipe.expire(key, ttl)
        await pipe.execute()
    return Produced(keys.job, chunks, lines, enqueued, known)


def _take(rows: Iterator[Row], size: int) -> list[Row]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            break
    return chunk


async def _claim_job(redis: ArqRedis, keys: JobKeys, settings: dict[str, Any], ttl: int) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        for field, value in settings.items():
            pipe.hsetnx(keys.meta, field, value)
        pipe.hmget(keys.meta, list(settings))
        pipe.hsetnx(keys.meta, "created", str(time.time()))
        pipe.expire(keys.meta, ttl)
        stored = (await pipe.execute())[len(settings)]
    for (field, value), found in zip(settings.items(), stored, strict=True):
        wanted = value if isinstance(value, bytes) else value.encode()
        if found != wanted:
            raise Problem(
                f"job {keys.job!r} already exists with another {field.replace('_', ' ')}: "
                "use the same command to continue it, or another --job"
            )


async def _store_chunk(
    redis: ArqRedis, keys: JobKeys, index: int, chunk: list[Row], ttl: int
) -> bool:
    """Store a chunk as pending unless it is already there; True unless it is done."""
    payload = dump_rows(chunk)
    digest = str(zlib.crc32(payload)).encode()

    async def store(pipe: Any) -> bool:
        state = await pipe.hget(keys.state, str(index))
        stored = await pipe.hget(keys.digest, str(index))
        if stored is not None and stored != digest:
            raise Problem(
                f"chunk {index} of job {keys.job!r} (input lines "
                f"{chunk[0].line}-{chunk[-1].line}) differs from what was enqueued: "
                "continue a job with the same input file"
            )
        if state == DONE:
            return False
        pipe.multi()
        if state == IN_FLIGHT:
            # Enqueued again (arq refuses it while the first delivery is queued or
            # running): if that delivery failed for good, this one records the chunk
            # maybe_sent instead of leaving it in flight forever. Its rows are stored
            # again in case they were lost (evicted, expired): they name its lines.
            pipe.set(keys.rows(index), payload, ex=ttl, nx=True)
            return True
        pipe.set(keys.rows(index), payload, ex=ttl)
        pipe.hset(keys.state, str(index), PENDING)
        pipe.hset(keys.digest, str(index), digest)
        return True

    result: bool = await redis.transaction(store, keys.state, value_from_callable=True)
    return result


# -- claiming and finishing a chunk (the worker's side) -----------------------------


async def claim(redis: ArqRedis, keys: JobKeys, index: int, owner: str) -> bytes | None:
    """Set chunk *index* ``in_flight`` if it is ``pending``; the state it had before."""

    async def claim_it(pipe: Any) -> bytes | None:
        state: bytes | None = await pipe.hget(keys.state, str(index))
        if state == PENDING:
            pipe.multi()
            pipe.hset(keys.state, str(index), IN_FLIGHT)
            pipe.hset(keys.owner, str(index), owner)
        return state

    state: bytes | None = await redis.transaction(claim_it, keys.state, value_from_callable=True)
    return state


async def finish(
    redis: ArqRedis,
    keys: JobKeys,
    index: int,
    records: list[bytes],
    *,
    only_if_in_flight: bool = False,
) -> bool:
    """Store a chunk's records and mark it ``done``; False if *only_if_in_flight* and it was not.

    The worker that claimed a chunk writes unconditionally (it knows what happened); a
    redelivery marking it interrupted writes only over ``in_flight``.
    """
    ttl = await redis.ttl(keys.meta)

    async def finish_it(pipe: Any) -> bool:
        if only_if_in_flight and await pipe.hget(keys.state, str(index)) != IN_FLIGHT:
            return False
        pipe.multi()
        pipe.hset(keys.out, str(index), b"\n".join(records))
        pipe.hset(keys.state, str(index), DONE)
        pipe.hset(keys.meta, "last_done", str(time.time()))
        pipe.delete(keys.rows(index))
        if ttl > 0:
            pipe.expire(keys.out, ttl)
        return True

    watches = (keys.state,) if only_if_in_flight else ()
    done: bool = await redis.transaction(finish_it, *watches, value_from_callable=True)
    if done:
        # Outside the transaction: a refused PUBLISH there would abort the whole EXEC.
        await announce(redis, keys.done_channel, str(index))
    return done

"""A bulk job spread over worker processes: the chunk state in Redis, claimed and finished.

Every key is under the key prefix P (default ``dispatch-async:``) and job id J; the job's
keys expire ``ttl`` seconds after the producer last touched the job (default 7 days)::

    P job:J          hash: the job's target, account, chunk size, chunk and line count
    P job:J:state    hash: chunk index -> pending | in_flight | done
    P job:J:owner    hash: chunk index -> the worker (host:pid) that claimed it
    P job:J:digest   hash: chunk index -> CRC-32 of its rows (a restarted producer must
                     read the same input)
    P job:J:rows:I   string: chunk I's input rows (JSON), deleted once I is done
    P job:J:out      hash: chunk index -> its output records, one JSON line per input line
    P job:J:queued   hash: chunk index -> 1 while an entry for it is in the stream
    P job:J:done     stream: one entry per chunk done (``chunk``: I), for the waiting producer
    P chunks         stream: one entry per chunk to send (``job``: J, ``chunk``: I), read by
                     the consumer group ``workers`` (see ``consumer``)

A chunk goes ``pending`` (the producer) -> ``in_flight`` (a worker, with a compare-and-set,
before anything is sent) -> ``done`` (with its records). A worker that finds a chunk
already ``in_flight`` is running a redelivery after a worker died mid-send: it records
the chunk's rows ``maybe_sent`` without sending. A ``done`` chunk is never sent again.
The stream entry of a chunk is acknowledged and deleted in the script that stores
``done``: an entry is in the stream exactly while its chunk waits for a worker's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator
from typing import Any, Final, TypeAlias

import attrs
import orjson

from ..reading.input import Row
from ..screen.problem import FAILED, Problem

#: A redis-py asyncio client. Typed loosely: redis-py types every reply as "awaitable or
#: not", which strict mypy rejects at each ``await``.
QueueRedis: TypeAlias = Any

log = logging.getLogger("dispatch_async")

__all__ = [
    "DEFAULT_TTL",
    "DONE",
    "GROUP",
    "IN_FLIGHT",
    "PENDING",
    "SOCKET_TIMEOUT",
    "Claimed",
    "JobKeys",
    "QueueRedis",
    "block_ms",
    "check_job_id",
    "check_prefix",
    "claim",
    "connect",
    "connected",
    "dump_rows",
    "ensure_group",
    "finish",
    "load_rows",
    "redis_errors",
    "release",
    "stream_name",
    "unreachable",
    "where",
]

PENDING: Final = b"pending"
IN_FLIGHT: Final = b"in_flight"
DONE: Final = b"done"
#: The consumer group of every worker on a queue.
GROUP: Final = "workers"
#: Seconds a reply from Redis may take (the longest block of a blocking read is less):
#: the same with every redis-py (5 has none, 6+ five seconds).
SOCKET_TIMEOUT: Final = 30.0
#: The longest a blocking read (XREADGROUP, XREAD) waits before it is issued again.
_LONGEST_BLOCK = 10.0
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
    def queued(self) -> str:
        return f"{self.meta}:queued"

    @property
    def done(self) -> str:
        return f"{self.meta}:done"

    def rows(self, index: int) -> str:
        return f"{self.meta}:rows:{index}"

    @property
    def stream(self) -> str:
        return stream_name(self.prefix)


def stream_name(prefix: str) -> str:
    """The stream of the chunks to send under *prefix* (every job's)."""
    return f"{prefix}chunks"


def block_ms(seconds: float) -> int:
    """The BLOCK of a read waiting *seconds*: at least 1 ms (0 would wait forever), at
    most ``_LONGEST_BLOCK`` (well within the socket timeout)."""
    return max(int(min(seconds, _LONGEST_BLOCK) * 1000), 1)


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


def unreachable(queue_url: str, exc: BaseException) -> Problem:
    """One line, exit 2: redis-py's messages name host and port, never the password."""
    message = f"cannot use the Redis queue {where(queue_url)}: {type(exc).__name__}: {exc}"
    return Problem(" ".join(message.split()))


async def connect(queue_url: str) -> QueueRedis:
    """A redis-py client for *queue_url*, checked with a PING: a refused connection or
    password fails here, in one line, instead of at the first command."""
    try:
        import redis.asyncio
    except ImportError:
        raise Problem(
            'a queued job needs the queue extra: pip install "dispatch-async[queue]"'
        ) from None
    if urllib.parse.urlsplit(queue_url).scheme not in ("redis", "rediss", "unix"):
        raise Problem("--queue must be a redis://, rediss:// or unix:// URL")
    client = redis.asyncio.Redis.from_url(queue_url, socket_timeout=SOCKET_TIMEOUT)
    try:
        await _ping_once_loaded(client)
    except redis_errors() as exc:
        await client.aclose()
        raise unreachable(queue_url, exc) from None
    return client


#: How long a command waits for a Redis that answers but is still loading its data: a
#: restarted Redis answers LOADING until it has read its append-only file back.
LOADING_WAIT: Final = 120.0


async def _ping_once_loaded(client: QueueRedis) -> None:
    """PING, waiting while Redis is loading: a worker started as Redis restarts (by a
    supervisor, say) would otherwise exit as if the queue could not be used at all."""
    import redis.exceptions

    deadline = time.monotonic() + LOADING_WAIT
    told = False
    while True:
        try:
            await client.ping()
            return
        except redis.exceptions.BusyLoadingError:
            if time.monotonic() >= deadline:
                raise
            if not told:
                log.warning("the queue's Redis is loading its data: waiting for it")
                told = True
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def connected(queue_url: str) -> AsyncIterator[QueueRedis]:
    """The queue's Redis for a command: a failure there is one line, exit 1; closed after."""
    redis = await connect(queue_url)
    try:
        yield redis
    except redis_errors() as exc:
        raise Problem(f"Redis failed: {type(exc).__name__}: {exc}", FAILED) from None
    finally:
        await redis.aclose()


async def ensure_group(redis: QueueRedis, stream: str) -> None:
    """Create the stream's consumer group (and the stream) unless they exist.

    The group starts at the stream's first entry, so chunks queued before any worker
    ever ran are delivered too.
    """
    from redis.exceptions import ResponseError

    try:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


# -- rows ------------------------------------------------------------------------------


def dump_rows(rows: list[Row]) -> bytes:
    return orjson.dumps([[r.line, r.number, r.message, r.problem] for r in rows])


def load_rows(raw: bytes) -> list[Row]:
    """The rows of one chunk as the producer stored them."""
    return [
        Row(line, number, message, problem) for line, number, message, problem in orjson.loads(raw)
    ]


# -- claiming and finishing a chunk (the worker's side) -----------------------------


#: Chunk ARGV[1] goes ``in_flight`` (owner ARGV[2]) if ``pending`` and its job is there;
#: returns its state before, its rows, the job's target and account ("" for what is not
#: there) and the job's TTL. A script, not WATCH/MULTI: with every worker writing the state hash, a
#: watched claim was retried about one time in three, and took three round trips more.
_CLAIM = """
local state = redis.call('HGET', KEYS[1], ARGV[1])
local job = redis.call('HMGET', KEYS[4], 'target', 'account')
if state == 'pending' and job[1] then
    redis.call('HSET', KEYS[1], ARGV[1], 'in_flight')
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return {state or '', redis.call('GET', KEYS[3]) or '', job[1] or '', job[2] or '',
        redis.call('TTL', KEYS[4])}
"""


@attrs.frozen
class Claimed:
    """What a worker finds when it claims a chunk (None: not there)."""

    state: bytes | None
    rows: bytes | None
    target: bytes | None
    account: str | None
    #: Seconds the job has left (its records expire with it); -1 or -2 for none.
    ttl: int


#: Each client's registered scripts (by source); dropped with the client.
_SCRIPTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _script(redis: QueueRedis, source: str) -> Any:
    """*source* registered with *redis*, once per client: registering hashes the script
    and builds an object, which a worker would otherwise pay on every chunk."""
    scripts = _SCRIPTS.setdefault(redis, {})
    script = scripts.get(source)
    if script is None:
        script = scripts[source] = redis.register_script(source)
    return script


async def claim(redis: QueueRedis, keys: JobKeys, index: int, owner: str) -> Claimed:
    """Set chunk *index* ``in_flight`` if it is ``pending``; what was there before."""
    state, rows, target, account, ttl = await _script(redis, _CLAIM)(
        keys=[keys.state, keys.owner, keys.rows(index), keys.meta], args=[str(index), owner]
    )
    return Claimed(state or None, rows or None, target or None, account.decode() or None, ttl)


#: A stream entry ARGV[2] (if not "") acknowledged and deleted, and chunk ARGV[1] (if not
#: "") no longer queued: KEYS[1] the stream, KEYS[2] the queued hash, ARGV[3] the group.
#: The one way an entry is let go, on its own (``release``) or as ``finish`` ends.
_LET_GO = """
if ARGV[2] ~= '' then
    redis.call('XACK', KEYS[1], ARGV[3], ARGV[2])
    redis.call('XDEL', KEYS[1], ARGV[2])
end
if ARGV[1] ~= '' then
    redis.call('HDEL', KEYS[2], ARGV[1])
end
"""

#: Chunk ARGV[1] gets its records ARGV[4] and goes ``done`` (KEYS[3] its state, KEYS[4]
#: the records, KEYS[5] the job, KEYS[6] its rows, KEYS[7] the done stream), then its
#: entry is let go (``_LET_GO``'s keys and arguments first), all at once; with ARGV[5] ==
#: "1" only over ``in_flight`` (else only the entry is let go, and it returns 0).
#: ARGV[6]: the time, ARGV[7]: the TTL of the records. One script, not MULTI/EXEC (and
#: WATCH for a redelivery): one reply to read instead of a dozen, and a redelivery's
#: check needs no round trip.
_FINISH = (
    """
local done = 1
if ARGV[5] == '1' and redis.call('HGET', KEYS[3], ARGV[1]) ~= 'in_flight' then
    done = 0
else
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
    redis.call('HSET', KEYS[3], ARGV[1], 'done')
    redis.call('HSET', KEYS[5], 'last_done', ARGV[6])
    redis.call('DEL', KEYS[6])
    redis.call('XADD', KEYS[7], '*', 'chunk', ARGV[1])
    local ttl = tonumber(ARGV[7])
    if ttl > 0 then
        redis.call('EXPIRE', KEYS[4], ttl)
        redis.call('EXPIRE', KEYS[7], ttl)
    end
end
"""
    + _LET_GO
    + "return done\n"
)


async def finish(
    redis: QueueRedis,
    keys: JobKeys,
    index: int,
    records: list[bytes],
    entry: bytes | None,
    ttl: int,
    *,
    only_if_in_flight: bool = False,
) -> bool:
    """Store a chunk's records, mark it ``done`` and let its stream *entry* go, at once
    (one script); False if *only_if_in_flight* and it was not in flight (the entry is
    let go all the same).

    The worker that claimed a chunk writes unconditionally (it knows what happened); a
    redelivery marking it interrupted writes only over ``in_flight``. The records expire
    *ttl* seconds later (the job's time left when the chunk was claimed), if positive.
    The producer waiting for the job hears of it on ``keys.done`` (``waiting``).
    """
    done = await _script(redis, _FINISH)(
        keys=[keys.stream, keys.queued, keys.state, keys.out, keys.meta, keys.rows(index),
              keys.done],
        args=[str(index), entry or b"", GROUP, b"\n".join(records),
              "1" if only_if_in_flight else "0", str(time.time()), ttl],
    )  # fmt: skip
    return bool(done)


async def release(redis: QueueRedis, keys: JobKeys, index: int | None, entry: bytes) -> None:
    """Acknowledge and delete a stream *entry* that has nothing (more) to do."""
    await _script(redis, _LET_GO)(
        keys=[keys.stream, keys.queued], args=["" if index is None else str(index), entry, GROUP]
    )

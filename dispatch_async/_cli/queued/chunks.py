"""A bulk job spread over worker processes: the chunk state in Redis, claimed and finished.

Every key is under the key prefix P (default ``dispatch-async:``) and job id J; the job's
keys expire ``ttl`` seconds after the producer last touched the job (default 7 days).
On a Redis Cluster ``P job:J`` is ``{P job:J}`` and ``P chunks`` is ``{P chunks}`` (the
connection's ``key_tag``): every script uses the keys of one job, in one hash slot, and
different jobs spread over the Cluster::

    P job:J          hash: the job's target, account, chunk size, chunk and line count
    P job:J:state    hash: chunk index -> pending | in_flight | done
    P job:J:owner    hash: chunk index -> the claim that set it in flight (n@host:pid)
    P job:J:entry    hash: chunk index -> the stream entry it was claimed with
    P job:J:digest   hash: chunk index -> CRC-32 of its rows (a restarted producer must
                     read the same input)
    P job:J:rows:I   string: chunk I's input rows (JSON), deleted once I is done
    P job:J:out      hash: chunk index -> its output records, one JSON line per input line
    P job:J:queued   hash: chunk index -> its entry's id while it is in the stream
    P job:J:done     stream: one entry per chunk done (``chunk``: I), for the waiting producer
    P chunks         stream: one entry per chunk to send (``job``: J, ``chunk``: I), read by
                     the consumer group ``workers`` (see ``consumer``)

A chunk goes ``pending`` (the producer) -> ``in_flight`` (a worker, with a compare-and-set,
before anything is sent) -> ``done`` (with its records). A worker that finds a chunk
already ``in_flight`` is running a redelivery after a worker died mid-send: it records
the chunk's rows ``maybe_sent`` without sending. A ``done`` chunk is never sent again.
The stream is in a slot of its own, so its entry is acknowledged and deleted right
after the script that stores ``done`` (a worker that dies in between leaves it to be
taken over: the chunk is found ``done`` and its entry let go). The producer adds an entry,
then notes its id in ``queued``; one that dies in between leaves an entry that a producer
run again may add a second time: a chunk found ``in_flight`` under another entry still in
the stream is that entry's to finish, and the second entry is let go without a record.
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from typing import Any, Final

import attrs
import orjson

from ..reading.input import Row
from ..screen.problem import Problem
from .durable import write_durably
from .link import (
    SOCKET_TIMEOUT,
    QueueRedis,
    connect,
    connected,
    connection_of,
    redis_errors,
    unreachable,
    where,
)

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
    "entry_waits",
    "finish",
    "job_keys",
    "let_go",
    "load_rows",
    "redis_errors",
    "release",
    "script",
    "stream_name",
    "unreachable",
    "where",
]

PENDING: Final = b"pending"
IN_FLIGHT: Final = b"in_flight"
DONE: Final = b"done"
#: The consumer group of every worker on a queue.
GROUP: Final = "workers"
#: The longest a blocking read (XREADGROUP, XREAD) waits before it is issued again.
_LONGEST_BLOCK = 10.0
#: Seconds the job's keys live after the producer last wrote them.
DEFAULT_TTL = 7 * 24 * 3600
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@attrs.frozen
class JobKeys:
    """The Redis keys of one job (`job_keys`: braced on a Cluster)."""

    prefix: str
    job: str
    #: ``P job:J``, the start of every key of the job.
    meta: str = attrs.field(
        default=attrs.Factory(lambda k: f"{k.prefix}job:{k.job}", takes_self=True)
    )
    #: The stream of the chunks to send (every job's).
    stream: str = attrs.field(
        default=attrs.Factory(lambda k: stream_name(k.prefix), takes_self=True)
    )

    @property
    def state(self) -> str:
        return f"{self.meta}:state"

    @property
    def owner(self) -> str:
        return f"{self.meta}:owner"

    @property
    def entry(self) -> str:
        return f"{self.meta}:entry"

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


def job_keys(redis: QueueRedis, prefix: str, job: str) -> JobKeys:
    """The keys of *job* on *redis*: in a hash slot of the job's own on a Cluster."""
    connection = connection_of(redis)
    if connection is None:
        return JobKeys(prefix, job)
    return JobKeys(prefix, job, connection.key_tag(prefix, "job:", job), stream_name(prefix, redis))


def stream_name(prefix: str, redis: QueueRedis = None) -> str:
    """The stream of the chunks to send under *prefix* (every job's), on *redis*."""
    connection = connection_of(redis) if redis is not None else None
    return f"{prefix}chunks" if connection is None else connection.key_tag(prefix, "chunks")


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


#: Chunk ARGV[1] goes ``in_flight`` (claim ARGV[2], entry ARGV[3]) if ``pending`` and its
#: job is there; returns its state before, its rows, the job's target and account (""
#: for what is not there), the job's TTL and the entry it was claimed with before. The
#: same claim run again (its first reply lost, or its write repeated after a failover)
#: finds the chunk ``pending``, as the first did. A script, not WATCH/MULTI: with every
#: worker writing the state hash, a watched claim was retried about one time in three,
#: and took three round trips more.
_CLAIM = """
local state = redis.call('HGET', KEYS[1], ARGV[1])
local job = redis.call('HMGET', KEYS[4], 'target', 'account')
local before = redis.call('HGET', KEYS[5], ARGV[1])
if state == 'in_flight' and redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
    state = 'pending'
end
if state == 'pending' and job[1] then
    redis.call('HSET', KEYS[1], ARGV[1], 'in_flight')
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    redis.call('HSET', KEYS[5], ARGV[1], ARGV[3])
end
return {state or '', redis.call('GET', KEYS[3]) or '', job[1] or '', job[2] or '',
        redis.call('TTL', KEYS[4]), before or ''}
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
    #: The entry that claimed it before (a chunk ``in_flight``), if known.
    entry: bytes | None = None
    #: Whether the claim was written again on a new primary (a failover): a chunk found
    #: ``in_flight`` was then claimed there by another worker, not left by a dead one.
    failed_over: bool = False


#: Each client's registered scripts (by source); dropped with the client.
_SCRIPTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def script(redis: QueueRedis, source: str) -> Any:
    """*source* registered with *redis*, once per client: registering hashes the script
    and builds an object, which a worker would otherwise pay on every chunk."""
    scripts = _SCRIPTS.setdefault(redis, {})
    found = scripts.get(source)
    if found is None:
        found = scripts[source] = redis.register_script(source)
    return found


async def claim(
    redis: QueueRedis, keys: JobKeys, index: int, claim_id: str, entry: bytes = b""
) -> Claimed:
    """Set chunk *index* ``in_flight`` (by *entry*) if it is ``pending``, once a replica
    has it (`write_durably`); what was there before.

    *claim_id* names this claim alone (a worker's name and a count): the same claim
    repeated finds the chunk as the first one did.
    """
    written = await write_durably(
        redis,
        script(redis, _CLAIM),
        keys=[keys.state, keys.owner, keys.rows(index), keys.meta, keys.entry],
        args=[str(index), claim_id, entry],
    )
    state, rows, target, account, ttl, before = written.reply
    return Claimed(
        state or None,
        rows or None,
        target or None,
        account.decode() or None,
        ttl,
        before or None,
        failed_over=written.moved,
    )


async def entry_waits(redis: QueueRedis, keys: JobKeys, entry: bytes) -> bool:
    """Whether *entry* is still in the stream (not yet let go by whoever handles it)."""
    return bool(await redis.xrange(keys.stream, entry, entry))


#: A stream entry ARGV[1] acknowledged (group ARGV[2]) and deleted: KEYS[1] the stream.
#: The one way an entry is let go; in a slot of its own on a Cluster, so never in the
#: job's scripts.
_LET_GO = """
redis.call('XACK', KEYS[1], ARGV[2], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
"""

#: Chunk ARGV[1] gets its records ARGV[2] and goes ``done`` (KEYS[2] its state, KEYS[3]
#: the records, KEYS[4] the job, KEYS[5] its rows, KEYS[6] the done stream) and is no
#: longer queued (KEYS[1]), all at once; with ARGV[3] == "1" only over ``in_flight`` (else
#: it returns 0 and only the chunk's queued mark goes). ARGV[4]: the time, ARGV[5]: the
#: TTL of the records. One script, not MULTI/EXEC (and WATCH for a redelivery): one
#: reply to read instead of a dozen, and a redelivery's check needs no round trip.
_FINISH = """
local done = 1
if ARGV[3] == '1' and redis.call('HGET', KEYS[2], ARGV[1]) ~= 'in_flight' then
    done = 0
else
    redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
    redis.call('HSET', KEYS[2], ARGV[1], 'done')
    redis.call('HSET', KEYS[4], 'last_done', ARGV[4])
    redis.call('DEL', KEYS[5])
    redis.call('XADD', KEYS[6], '*', 'chunk', ARGV[1])
    local ttl = tonumber(ARGV[5])
    if ttl > 0 then
        redis.call('EXPIRE', KEYS[3], ttl)
        redis.call('EXPIRE', KEYS[6], ttl)
    end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return done
"""


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
    """Store a chunk's records and mark it ``done`` (one script, once a replica has it:
    `write_durably`), then let its stream *entry* go; False if *only_if_in_flight* and it
    was not in flight (the entry is let go all the same).

    The worker that claimed a chunk writes unconditionally (it knows what happened); a
    redelivery marking it interrupted writes only over ``in_flight``. The records expire
    *ttl* seconds later (the job's time left when the chunk was claimed), if positive.
    The producer waiting for the job hears of it on ``keys.done`` (``waiting``).
    """
    written = await write_durably(
        redis,
        script(redis, _FINISH),
        keys=[keys.queued, keys.state, keys.out, keys.meta, keys.rows(index), keys.done],
        args=[str(index), b"\n".join(records), "1" if only_if_in_flight else "0",
              str(time.time()), ttl],
    )  # fmt: skip
    done = written.reply
    if entry:
        await let_go(redis, keys, entry)
    return bool(done)


async def release(redis: QueueRedis, keys: JobKeys, index: int, entry: bytes) -> None:
    """Chunk *index* no longer queued, and its stream *entry* let go: it has nothing
    (more) to do (the chunk first: a worker that dies in between leaves the entry to be
    taken over, never a chunk noted queued without an entry)."""
    await redis.hdel(keys.queued, str(index))
    await let_go(redis, keys, entry)


async def let_go(redis: QueueRedis, keys: JobKeys, entry: bytes) -> None:
    """Acknowledge and delete a stream *entry* (the chunk's state untouched)."""
    await script(redis, _LET_GO)(keys=[keys.stream], args=[entry, GROUP])

"""The producer of a queued job: the input split into chunks, each stored and queued once
(see ``chunks`` for the keys)."""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import orjson

import dispatch_async as da

from ..job.spec import InputSpec, Target
from ..reading.input import Row
from ..screen.problem import Problem
from .chunks import (
    DEFAULT_TTL,
    JobKeys,
    QueueRedis,
    check_job_id,
    check_prefix,
    dump_rows,
    ensure_group,
    job_keys,
    script,
)
from .durable import primary_id, write_durably

__all__ = ["Produced", "enqueue"]

log = logging.getLogger("dispatch_async")

#: Runs of the producer over the input while Redis fails over under it, at most.
_RUNS = 3


@attrs.frozen
class Produced:
    """What one producer run did: chunks enqueued now, and chunks already done."""

    job: str
    chunks: int
    lines: int
    enqueued: int
    known: int


async def enqueue(
    redis: QueueRedis,
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
    nothing that is already there: a done chunk is left alone, and so is a chunk whose
    entry is still in the stream; a pending or in-flight chunk without one (its entry
    was released without a record, e.g. its rows were lost) is enqueued again (a chunk
    found in flight is never sent again, only recorded maybe_sent). A failover while it
    runs (the primary's run id changed) makes it run once more: what the old primary took
    meanwhile may be gone.

    Raises:
        Problem: the input cannot be read, the job exists with other settings or input,
            or Redis failed over during each of three runs.
    """
    keys = job_keys(redis, check_prefix(key_prefix), check_job_id(job))
    settings = {
        "target": orjson.dumps(attrs.asdict(target)),
        "account": account or "",
        "chunk_size": str(chunk_size),
    }
    primary = await primary_id(redis)
    for _ in range(_RUNS):
        produced = await _enqueue_once(redis, keys, settings, input_spec, chunk_size, ttl)
        primary, before = await primary_id(redis), primary
        if primary == before:
            return produced
        # What the old primary took after the failover is gone with it (workers would
        # never see those chunks, and the waiting producer would wait for them): store
        # and enqueue again what the new one lacks.
        log.warning(
            "the queue's Redis failed over while job %s was enqueued: enqueuing it again", job
        )
    raise Problem(
        f"the queue's Redis failed over (or restarted) while job {job!r} was enqueued, "
        f"{_RUNS} times: run the same command again once it is steady"
    )


async def _enqueue_once(
    redis: QueueRedis,
    keys: JobKeys,
    settings: dict[str, Any],
    input_spec: InputSpec,
    chunk_size: int,
    ttl: int,
) -> Produced:
    await _claim_job(redis, keys, settings, ttl)
    await ensure_group(redis, keys.stream)
    rows = input_spec.open()
    chunks = lines = enqueued = known = 0
    try:
        iterator = iter(rows)
        while chunk := await asyncio.to_thread(_take, iterator, chunk_size):
            lines += len(chunk)
            stored = await _store_chunk(redis, keys, chunks, chunk, ttl)
            if stored is None:
                known += 1
            elif stored:
                enqueued += 1
            chunks += 1
    finally:
        rows.close()
    await write_durably(
        redis,
        script(redis, _COUNTED),
        keys=[keys.meta, keys.state, keys.digest, keys.owner, keys.entry, keys.queued],
        args=[chunks, lines, ttl],
    )
    return Produced(keys.job, chunks, lines, enqueued, known)


def _take(rows: Iterator[Row], size: int) -> list[Row]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            break
    return chunk


#: The job's counts (ARGV[1] chunks, ARGV[2] lines) in KEYS[1], and every KEYS' TTL ARGV[3].
_COUNTED = """
redis.call('HSET', KEYS[1], 'chunks', ARGV[1], 'lines', ARGV[2])
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ARGV[3]) end
"""

#: The job's settings (ARGV: field, value, ...; then the time and the TTL) in KEYS[1],
#: each unless there; returns the settings found (the first run's).
_CLAIM_JOB = """
local found = {}
for i = 1, #ARGV - 2, 2 do
    redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
    found[#found + 1] = redis.call('HGET', KEYS[1], ARGV[i])
end
redis.call('HSETNX', KEYS[1], 'created', ARGV[#ARGV - 1])
redis.call('EXPIRE', KEYS[1], ARGV[#ARGV])
return found
"""


async def _claim_job(redis: QueueRedis, keys: JobKeys, settings: dict[str, Any], ttl: int) -> None:
    pairs = [part for field, value in settings.items() for part in (field, value)]
    stored = await script(redis, _CLAIM_JOB)(keys=[keys.meta], args=[*pairs, str(time.time()), ttl])
    for (field, value), found in zip(settings.items(), stored, strict=True):
        wanted = value if isinstance(value, bytes) else value.encode()
        if found != wanted:
            raise Problem(
                f"job {keys.job!r} already exists with another {field.replace('_', ' ')}: "
                "use the same command to continue it, or another --job"
            )


#: Store chunk ARGV[1] (rows ARGV[2], CRC ARGV[3], TTL ARGV[4]) as pending, to be queued
#: ('queue now'), unless it is done or queued; a chunk in flight whose entry was released
#: (its rows were gone) is queued again, so that it is recorded maybe_sent instead of
#: staying in flight forever, its rows stored again if lost (they name its lines). A
#: script, not WATCH/MULTI: every worker writes the state hash, and a watched producer
#: was retried so often that it, not the workers, set the pace of a 20-worker fleet.
#: The entry is added after it (the stream is in another slot on a Cluster).
_STORE = """
local stored = redis.call('HGET', KEYS[2], ARGV[1])
if stored and stored ~= ARGV[3] then return 'differs' end
local state = redis.call('HGET', KEYS[1], ARGV[1])
if state == 'done' then return 'done' end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'queued' end
if state == 'in_flight' then
    redis.call('SET', KEYS[4], ARGV[2], 'EX', ARGV[4], 'NX')
else
    redis.call('SET', KEYS[4], ARGV[2], 'EX', ARGV[4])
    redis.call('HSET', KEYS[1], ARGV[1], 'pending')
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
return 'queue now'
"""


async def _store_chunk(
    redis: QueueRedis, keys: JobKeys, index: int, chunk: list[Row], ttl: int
) -> bool | None:
    """Store a chunk as pending and queue it, unless it is there: None if it is done,
    False if its entry is still in the stream, True if it was queued now."""
    payload = dump_rows(chunk)
    answer = await script(redis, _STORE)(
        keys=[keys.state, keys.digest, keys.queued, keys.rows(index)],
        args=[str(index), payload, str(zlib.crc32(payload)), ttl],
    )
    if answer == b"differs":
        raise Problem(
            f"chunk {index} of job {keys.job!r} (input lines "
            f"{chunk[0].line}-{chunk[-1].line}) differs from what was enqueued: "
            "continue a job with the same input file"
        )
    if answer != b"queue now":
        return None if answer == b"done" else False
    # Added, then noted: a producer that dies in between leaves an entry that a run
    # again adds a second time (harmless: see ``chunks``), never a chunk noted queued
    # without an entry (it would wait for ever).
    entry = await redis.xadd(keys.stream, {"job": keys.job, "chunk": str(index)})
    await redis.hset(keys.queued, str(index), entry)
    return True

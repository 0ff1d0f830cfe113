"""The producer's waiting for the end of a job (``send ... --queue -o``).

A worker adds an entry to the job's ``done`` stream in the transaction that stores a
chunk ``done``; the producer reads that stream with ``XREAD ... BLOCK``, so it hears the
last chunk the moment it is stored, with no channel to subscribe to and nothing lost
while it was away (an entry stays). An entry only says "look again": the chunk states
stay the only truth, and the producer counts them every so often whatever it reads
(anyone who may write to the stream can write anything, as often as they like).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import dispatch_async as da

from .chunks import DONE, JobKeys, QueueRedis, block_ms, check_job_id, check_prefix, job_keys
from .link import cut_by_failover, outage_errors, redis_errors

__all__ = ["wait_until_done"]

#: Entries read at most per XREAD (each is one chunk index, a few bytes from a worker).
_BATCH = 100
#: Seconds the waiting producer rides out a lost connection (a failover, Redis
#: restarting) before it stops with the error; and its pause between tries.
_OUTAGE = 30.0
_PAUSE = 0.5

log = logging.getLogger("dispatch_async")
T = TypeVar("T")


async def wait_until_done(
    redis: QueueRedis,
    *,
    job: str,
    key_prefix: str = da.DEFAULT_KEY_PREFIX,
    every: float = 1.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> None:
    """Return once every chunk of *job* is ``done``.

    It counts the states in Redis at the start, every *every* seconds whatever it reads
    meanwhile, and when the entries read say the job is done. *on_progress* (done,
    chunks) is called at most every *every* seconds, and once at the end.
    """
    keys = job_keys(redis, check_prefix(key_prefix), check_job_id(job))
    loop = asyncio.get_running_loop()
    shown = -math.inf
    # Read from the stream's last entry before the first count: nothing stored after
    # the count is missed.
    last = await redis.xrevrange(keys.done, count=1)
    cursor: bytes = last[0][0] if last else b"0-0"
    chunks = int(await redis.hget(keys.meta, "chunks") or 0)
    outage = _Outage()
    while True:
        done = await outage.ride_out(lambda: _done(redis, keys))
        look_again = loop.time() + every
        if len(done) >= chunks:
            break
        while len(done) < chunks and (left := look_again - loop.time()) > 0:
            if on_progress is not None and loop.time() - shown >= every:
                shown = loop.time()
                on_progress(len(done), chunks)
            read = functools.partial(
                redis.xread, {keys.done: cursor}, count=_BATCH, block=block_ms(left)
            )
            reply = await outage.ride_out(read)
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    cursor = entry_id
                    index = fields.get(b"chunk", b"")
                    # Only a chunk the job has counts (a set of at most `chunks` indexes).
                    if len(index) <= 10 and index.isdigit() and int(index) < chunks:
                        done.add(str(int(index)).encode())
    if on_progress is not None:
        on_progress(len(done), chunks)


async def _done(redis: QueueRedis, keys: JobKeys) -> set[bytes]:
    """The indexes (as stored: bytes) of the job's done chunks."""
    states = await redis.hgetall(keys.state)
    return {index for index, state in states.items() if state == DONE}


class _Outage:
    """Rides out a failover: a blocking read cut by it, and a lost connection for at most
    ``_OUTAGE`` seconds in a row (then its error ends the wait)."""

    def __init__(self) -> None:
        self._since: float | None = None

    async def ride_out(self, call: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        while True:
            try:
                result = await call()
            except redis_errors() as exc:
                if not cut_by_failover(exc):
                    if not isinstance(exc, outage_errors()):
                        raise
                    if self._since is None:
                        self._since = loop.time()
                        log.warning("the queue's Redis failed (%s): trying again", exc)
                    elif loop.time() - self._since > _OUTAGE:
                        raise
                    await asyncio.sleep(_PAUSE)
                continue
            self._since = None
            return result

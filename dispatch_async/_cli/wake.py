"""Prompt wake-ups over Redis pub/sub, so that nobody in a fleet waits for a poll interval:
the subscription, and the producer's waiting for a job's end with it.

A producer publishes on the queue's wake channel when it queues a chunk (idle workers
fetch it at once); a worker publishes on the job's done channel when a chunk is done (a
producer waiting with ``-o`` recounts at once). A message only says "look again": the
state in Redis stays the only truth, and whoever waits still looks every so often in
case a message was lost (pub/sub does not keep messages for a subscriber that is away,
e.g. while Redis restarts) or the channel is not allowed (a Redis ACL without ``&P*``).
Whoever may publish can publish anything, as often as they like: no message is kept,
and none puts the next look in Redis off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import dispatch_async as da

from .queue import DONE, ArqRedis, JobKeys, check_job_id, check_prefix, redis_errors

__all__ = ["Wakeups", "subscribed", "wait_until_done"]

log = logging.getLogger("dispatch_async")

#: Seconds to wait for Redis to confirm a subscription.
_SUBSCRIBE_TIMEOUT = 5.0
#: Seconds between two tries to subscribe after one failed (an ACL does not change often).
_RETRY_AFTER = 30.0


class Wakeups:
    """A subscription to one channel: *event* is set per message, and *heard* (if given)
    called with its payload; nothing is kept (a worker ran out of memory keeping them).

    Not subscribed (Redis refused, or the connection was lost) is not an error: the one
    waiting falls back to looking every so often. `resubscribe` tries again.
    """

    def __init__(
        self,
        redis: ArqRedis,
        channel: str,
        event: asyncio.Event | None = None,
        heard: Callable[[bytes], None] | None = None,
    ) -> None:
        self.channel = channel
        self.event = event or asyncio.Event()
        self._redis = redis
        self._heard = heard
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        self._warned = False
        self._next_try = -math.inf

    @property
    def listening(self) -> bool:
        return self._listener is not None and not self._listener.done()

    async def resubscribe(self) -> bool:
        """Subscribe (again) unless listening; True once Redis confirmed the subscription.

        After a failure it tries again only some time later.
        """
        if self.listening:
            return True
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_try:
            return False
        self._next_try = loop.time() + _RETRY_AFTER
        await self.aclose()
        self._pubsub = self._redis.pubsub()
        failures: tuple[type[BaseException], ...] = (TimeoutError, *redis_errors())
        try:
            await self._pubsub.subscribe(self.channel)
            async with asyncio.timeout(_SUBSCRIBE_TIMEOUT):
                # Confirmed: every message published from now on reaches this subscriber.
                while await self._pubsub.get_message(timeout=None) is None:
                    pass
        except failures as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot subscribe to the Redis channel %s (%s: %s): looking in Redis "
                    "every so often instead",
                    self.channel,
                    type(exc).__name__,
                    exc,
                )
            await self.aclose()
            return False
        self._listener = asyncio.create_task(self._listen(self._pubsub))
        return True

    async def _listen(self, pubsub: Any) -> None:
        try:
            async for message in pubsub.listen():
                if message["type"] == "message":
                    if self._heard is not None:
                        self._heard(message["data"])
                    self.event.set()
        except redis_errors() as exc:
            log.debug("lost the Redis channel %s: %s", self.channel, type(exc).__name__)

    async def wait(self, at_most: float) -> None:
        """Until *event* is set (then clear it) or *at_most* seconds passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self.event.wait()
        self.event.clear()

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(*redis_errors()):
                await pubsub.aclose()


@contextlib.asynccontextmanager
async def subscribed(
    redis: ArqRedis, channel: str, heard: Callable[[bytes], None]
) -> AsyncIterator[Wakeups]:
    """Wake-ups on *channel*, subscribed before this yields, unsubscribed after."""
    wakeups = Wakeups(redis, channel, heard=heard)
    await wakeups.resubscribe()
    try:
        yield wakeups
    finally:
        await wakeups.aclose()


async def wait_until_done(
    redis: ArqRedis,
    *,
    job: str,
    key_prefix: str = da.DEFAULT_KEY_PREFIX,
    every: float = 1.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> None:
    """Return once every chunk of *job* is ``done``.

    Each chunk done is announced on the job's done channel, so this returns as soon as
    the last one is; it counts the states in Redis at the start, every *every* seconds
    whatever is announced meanwhile (announcements can be missed, and anyone may
    publish), and when the announcements say the job is done. *on_progress* (done,
    chunks) is called at most every *every* seconds, and once at the end.
    """
    keys = JobKeys(check_prefix(key_prefix), check_job_id(job))
    loop = asyncio.get_running_loop()
    shown = -math.inf
    done: set[bytes] = set()
    chunks = 0

    def heard(payload: bytes) -> None:
        # Only a chunk the job has counts (a set of at most `chunks` indexes).
        if len(payload) <= 10 and payload.isdigit() and int(payload) < chunks:
            done.add(str(int(payload)).encode())

    async with subscribed(redis, keys.done_channel, heard) as wakeups:
        chunks = int(await redis.hget(keys.meta, "chunks") or 0)
        while True:
            # An announcement is published after its chunk's ``done`` is stored, and a
            # done chunk stays done; still, Redis says when the job is finished.
            done = await _done(redis, keys)
            look_again = loop.time() + every
            if len(done) >= chunks:
                break
            while len(done) < chunks and (left := look_again - loop.time()) > 0:
                if on_progress is not None and loop.time() - shown >= every:
                    shown = loop.time()
                    on_progress(len(done), chunks)
                await wakeups.wait(left)
    if on_progress is not None:
        on_progress(len(done), chunks)


async def _done(redis: ArqRedis, keys: JobKeys) -> set[bytes]:
    """The indexes (as stored: bytes) of the job's done chunks."""
    states = await redis.hgetall(keys.state)
    return {index for index, state in states.items() if state == DONE}

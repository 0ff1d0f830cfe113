"""A worker's side of the queue's stream: one consumer of the group ``workers``.

Each of the worker's ``slots`` (``--max-jobs``) waits in its own ``XREADGROUP ... BLOCK``:
Redis hands a new entry to exactly one waiting slot of one worker, the moment it is
added, so an idle fleet neither polls nor is woken as a whole. A slot that waited
``poll`` seconds in vain looks (once per worker per ``poll``) for entries another
worker took and left for ``takeover`` seconds: ``XAUTOCLAIM`` moves them to this worker.
A live worker's entries never stay idle that long: a heartbeat (``XCLAIM ... JUSTID``,
every quarter of ``takeover``) resets their idle time while they are handled.

An entry is acknowledged by whoever handles it (``queue.finish``/``queue.release``), in
the transaction that records its chunk; one handled with an error is left in the
group, and taken over (by this worker or another) ``takeover`` seconds later.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .chunks import GROUP, QueueRedis, block_ms, ensure_group, redis_errors
from .link import cut_by_failover, wrong_setting

__all__ = ["Consumer", "Entry"]

log = logging.getLogger("dispatch_async")

#: An entry's id and its fields, as redis-py returns them.
Entry = tuple[bytes, dict[bytes, bytes]]
#: Seconds a slot waits before trying again after Redis failed.
_RETRY_AFTER = 1.0
#: Calls of XAUTOCLAIM per look for entries to take over.
_SCANS = 10


class Consumer:
    """Hands the stream's entries to *handle*, at most *slots* at once.

    *handle* must acknowledge the entry, or leave it to be taken over after *takeover*
    seconds. With *burst*, a slot ends once the stream is empty (no entry left in it,
    being handled or not) and a Redis failure ends the run; without, Redis failures are
    logged and tried again.
    """

    def __init__(
        self,
        redis: QueueRedis,
        stream: str,
        name: str,
        handle: Callable[[Entry], Awaitable[None]],
        *,
        slots: int,
        takeover: float,
        poll: float,
        burst: bool = False,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.name = name
        self.slots = slots
        self.takeover_ms = max(int(takeover * 1000), 1)
        self.poll = poll
        self.burst = burst
        self._handle = handle
        #: Entries this worker holds (handled, or claimed and not yet handled).
        self._held: set[bytes] = set()
        self._claimed: collections.deque[Entry] = collections.deque()
        self._next_claim = 0.0
        self._heartbeat = takeover / 4
        self._owner: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        """Until cancelled (or, with *burst*, until the stream is empty)."""
        self._owner = asyncio.current_task()
        await ensure_group(self.redis, self.stream)
        beating = asyncio.create_task(self._beat())
        try:
            async with asyncio.TaskGroup() as slots:
                for _ in range(self.slots):
                    slots.create_task(self._slot())
        except* redis_errors() as failed:
            # A burst run's slots end on Redis's first error: the run ends with it, as a
            # command would, not with a group of every slot's copy of it.
            raise failed.exceptions[0] from None
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _slot(self) -> None:
        while (entry := await self._take()) is not None:
            try:
                await self._handle(entry)
            except redis_errors() as exc:
                if self._stopping():  # the command was cut by the stop, not by Redis
                    raise asyncio.CancelledError from None
                if self.burst:
                    raise
                self._failed(
                    exc, "Redis failed while handling entry %s: %s", entry[0].decode(), exc
                )
            except Exception:
                log.exception("entry %s failed; it is taken over later", entry[0].decode())
            finally:
                self._held.discard(entry[0])

    def _failed(self, exc: BaseException, outage: str, *args: object) -> None:
        """Log a Redis failure that is tried again: an outage as *outage*, an answer that
        a setting is wrong (``MOVED``, ``NOPERM``...) as an error saying what to change
        (once changed, the worker goes on)."""
        wrong = wrong_setting(self.redis, exc)
        if wrong is not None:
            log.error("%s; trying again", wrong.message)
        else:
            log.warning(outage, *args)

    def _stopping(self) -> bool:
        """Whether this slot or the whole consumer is being cancelled.

        redis-py may turn the cancellation of a blocking command into a connection or
        timeout error, or swallow it (its ``asyncio.wait_for`` on Python 3.11, when the
        command ends as the cancellation comes): the task still says it is cancelling, and
        the run's task, cancelled by whoever stops the worker, says so too.
        """
        return _cancelling(asyncio.current_task()) or _cancelling(self._owner)

    async def _take(self) -> Entry | None:
        """The next entry for a slot: one taken over, else a new one; None to stop."""
        loop = asyncio.get_running_loop()
        while True:
            if self._stopping():  # a cancellation a library swallowed (3.11's wait_for)
                raise asyncio.CancelledError
            try:
                if not self._claimed and loop.time() >= self._next_claim:
                    self._next_claim = loop.time() + self.poll
                    await self._take_over()
                if self._claimed:
                    return self._claimed.popleft()
                entry = await self._read(max(self._next_claim - loop.time(), 0.0))
                if entry is not None:
                    return entry
                if self.burst and await self.redis.xlen(self.stream) == 0:
                    return None
            except redis_errors() as exc:
                if self._stopping():  # the command was cut by the stop, not by Redis
                    raise asyncio.CancelledError from None
                if cut_by_failover(exc):
                    continue
                if self.burst:
                    raise
                if "NOGROUP" in str(exc):
                    # Redis lost the group (restarted without persistence).
                    with contextlib.suppress(*redis_errors()):
                        await ensure_group(self.redis, self.stream)
                    continue
                self._failed(exc, "Redis failed: %s: %s; trying again", type(exc).__name__, exc)
                await asyncio.sleep(_RETRY_AFTER)

    async def _read(self, seconds: float) -> Entry | None:
        """A new entry, waiting for one at most *seconds* (see ``block_ms``)."""
        reply = await self.redis.xreadgroup(
            GROUP,
            self.name,
            {self.stream: ">"},
            count=1,
            block=block_ms(seconds),
        )
        for _, entries in reply or ():
            for entry in entries:  # pragma: no branch - a stream is in the reply with an entry
                self._held.add(entry[0])
                return entry  # type: ignore[no-any-return]
        return None

    async def _take_over(self) -> None:
        """Claim the entries other workers left idle for ``takeover`` (a free slot each)."""
        # At least one: the slot looking holds nothing, each other slot one entry at most,
        # and no entry claimed before is left to hand out (``_take`` looks only then).
        free = self.slots - len(self._held)
        cursor: bytes | str = "0-0"
        # XAUTOCLAIM looks at 10 x COUNT entries of the group per call: go on from where
        # it stopped, a few calls at most.
        for _ in range(_SCANS):
            cursor, entries, *_ = await self.redis.xautoclaim(
                self.stream, GROUP, self.name, self.takeover_ms, start_id=cursor, count=free
            )
            for entry in entries:
                if entry[1] is None:  # pragma: no cover - Redis 6.2 lists an entry deleted
                    continue  # meanwhile so (7 and later leave it out)
                if entry[0] in self._held:
                    continue  # a slot here still handles it: its heartbeat was late
                log.warning("took over entry %s from a worker gone quiet", entry[0].decode())
                self._held.add(entry[0])
                self._claimed.append(entry)
                free -= 1
            if free <= 0 or cursor in (b"0-0", "0-0"):
                return

    async def _beat(self) -> None:
        """Reset the idle time of every entry held, so that no other worker takes it."""
        while True:
            await asyncio.sleep(self._heartbeat)
            if self._stopping():  # a cancellation a library swallowed (3.11's wait_for)
                raise asyncio.CancelledError
            if not self._held:
                continue
            try:
                await self.redis.xclaim(
                    self.stream, GROUP, self.name, 0, list(self._held), justid=True
                )
            except redis_errors() as exc:
                if self._stopping():  # the command was cut by the stop, not by Redis
                    raise asyncio.CancelledError from None
                log.debug("heartbeat failed: %s", type(exc).__name__)


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    return task is not None and task.cancelling() > 0

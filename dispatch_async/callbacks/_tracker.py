"""``DeliveryTracker``: events into a store in group commits, and the questions about them.

``record`` returns once the event is durable. Events arriving while a commit is under
way wait for the next one, which takes all of them at once: one transaction (and one
fsync) for as many events as came in meanwhile, so the commit rate, not the event rate,
is what the disk must sustain.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Final, Self, TypeVar

from .._exceptions import (
    ConfigurationError,
    DeliveryStoreError,
    DispatchError,
    SessionClosedError,
)
from ._events import DeliveryEvent
from ._sqlite import SQLiteDeliveryStore
from ._status import DeliveryStatus
from ._store import DeliveryStore, MessageState

__all__ = ["DeliveryTracker"]

log = logging.getLogger("dispatch_async.callbacks")

_T = TypeVar("_T")

#: Events written in one transaction at most.
DEFAULT_MAX_BATCH: Final = 2000
#: Seconds between looks at the store for events other processes wrote.
DEFAULT_POLL_INTERVAL: Final = 1.0
#: Events read from the store at a time by the change stream.
_PAGE: Final = 500
#: Seconds a close waits for the change stream to read the last write (a consumer that
#: stopped iterating must not hold the close up).
_TAIL_GRACE: Final = 5.0


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class DeliveryTracker:
    """The delivery state of your messages, kept by a store as callbacks arrive.

    ```python
    async with DeliveryTracker("deliveries.sqlite3") as tracker:
        await tracker.record(parse_event(body))   # durable when it returns
        state = await tracker.message(valid_message.id)
        async for event in tracker:               # every event stored since it opened
            ...
    ```

    Args:
        store: a `DeliveryStore`, or the path of a SQLite file (`SQLiteDeliveryStore`).
            The tracker opens and closes it.
        max_batch: events written in one transaction at most.
        poll_interval: seconds between the change stream's looks at the store for
            events another process wrote (this process's own wake it at once).
    """

    def __init__(
        self,
        store: DeliveryStore | str | os.PathLike[str],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ConfigurationError(f"max_batch must be a whole number >= 1, not {max_batch!r}")
        if not isinstance(poll_interval, int | float) or not 0 < poll_interval < math.inf:
            raise ConfigurationError(f"poll_interval must be seconds > 0, not {poll_interval!r}")
        self.store: DeliveryStore = (
            SQLiteDeliveryStore(store) if isinstance(store, str | os.PathLike) else store
        )
        self.max_batch = max_batch
        self.poll_interval = poll_interval
        self._state = _State.UNOPENED
        self._pending: list[tuple[DeliveryEvent, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._opened = asyncio.Event()  # an open begun has ended, one way or the other
        self._opened_at = ""
        self._drained = False  # the writer has stored everything recorded: tails end
        self._tails = 0
        self._no_tails = asyncio.Event()
        self._no_tails.set()

    def __repr__(self) -> str:
        return f"<DeliveryTracker {self.store!r} {self._state.value}>"

    async def open(self) -> None:
        """Open the store and start the writer. A tracker opens once."""
        if self._state is not _State.UNOPENED:
            raise SessionClosedError(f"cannot open a DeliveryTracker that is {self._state.value}")
        self._state = _State.OPEN
        try:
            await self._guarded(self.store.open)
            _, self._opened_at = await self._guarded(lambda: self.store.changes(None, 0))
            if self._state is not _State.OPEN:
                raise SessionClosedError("the DeliveryTracker was closed while it opened")
            self._writer = asyncio.create_task(self._write_loop(), name="dispatch-async-tracker")
        except BaseException:
            self._state = _State.CLOSED
            await self.store.aclose()
            raise
        finally:
            self._opened.set()

    async def aclose(self) -> None:
        """Write what was recorded, stop the writer, close the store. Idempotent."""
        if self._state is _State.CLOSED:
            return
        opening = self._state is _State.OPEN and self._writer is None
        self._state = _State.CLOSED
        self._wake.set()
        self._committed.set()
        if opening:  # the open sees the close, and closes the store it opened
            await self._opened.wait()
        elif self._writer is not None:
            await asyncio.shield(self._writer)
            # The change stream reads what that last write stored, then the store closes.
            self._drained = True
            self._committed.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TAIL_GRACE):
                    await self._no_tails.wait()
            await self.store.aclose()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def record(self, event: DeliveryEvent) -> None:
        """Store *event*; returns once it is durable (a re-delivered one is stored once).

        Raises:
            DeliveryStoreError: the store failed; the event may not be stored.
            SessionClosedError: the tracker is not open.
        """
        await self._submit(event)

    def _submit(self, event: DeliveryEvent) -> asyncio.Future[None]:
        # record() without the coroutine: the receiver's own server answers from the
        # future's callback, one task fewer per callback.
        if self._state is not _State.OPEN:
            raise SessionClosedError("the DeliveryTracker is not open")
        done = asyncio.get_running_loop().create_future()
        self._pending.append((event, done))
        self._wake.set()
        return done

    async def message(self, reference: str) -> MessageState | None:
        """The state of the message whose id (``reference``) this is, or None."""
        return await self._guarded(lambda: self.store.message(reference))

    async def messages_for(
        self, number: str, campaign_name: str | None = None
    ) -> list[MessageState]:
        """The messages to *number* (any formatting), of one campaign if named."""
        return await self._guarded(lambda: self.store.messages_for(number, campaign_name))

    async def events(self, reference: str) -> list[DeliveryEvent]:
        """One message's events, in the order they were stored."""
        return await self._guarded(lambda: self.store.events(reference))

    async def counts(self, campaign_name: str | None) -> dict[DeliveryStatus, int]:
        """How many messages of a campaign are in each status."""
        return await self._guarded(lambda: self.store.counts(campaign_name))

    def __aiter__(self) -> AsyncIterator[DeliveryEvent]:
        """Every event stored since the tracker opened, then each one as it is stored.

        Events other processes store in the same place are seen too (within
        ``poll_interval``); a re-delivery is not stored, so not seen again. The
        iteration ends when the tracker closes, after the events its close wrote.
        """
        return self._tail()

    async def _tail(self) -> AsyncIterator[DeliveryEvent]:
        if self._state is not _State.OPEN:
            return
        cursor = self._opened_at
        self._tails += 1
        self._no_tails.clear()
        try:
            while True:
                drained, signal = self._drained, self._committed
                events, cursor = await self._guarded(partial(self.store.changes, cursor, _PAGE))
                for event in events:
                    yield event
                if len(events) == _PAGE:
                    continue
                if drained:  # caught up with the last write: the end
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await signal.wait()
        finally:
            self._tails -= 1
            if not self._tails:
                self._no_tails.set()

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                await self._commit(batch)
            if self._state is not _State.OPEN:
                return

    async def _commit(self, batch: Sequence[tuple[DeliveryEvent, asyncio.Future[None]]]) -> None:
        try:
            await self.store.write([event for event, _ in batch], time.time())
        except Exception as exc:
            log.error(
                "the delivery store failed to write %d events (%s: %s)",
                len(batch),
                type(exc).__name__,
                exc,
            )
            for _, done in batch:
                if not done.done():
                    done.set_exception(_store_error(exc))
            return
        for _, done in batch:
            if not done.done():
                done.set_result(None)
        committed, self._committed = self._committed, asyncio.Event()
        committed.set()

    @staticmethod
    async def _guarded(call: Callable[[], Awaitable[_T]]) -> _T:
        try:
            return await call()
        except DispatchError:
            raise
        except Exception as exc:
            raise _store_error(exc) from exc


def _store_error(exc: Exception) -> DeliveryStoreError:
    error = DeliveryStoreError(f"the delivery store failed: {type(exc).__name__}")
    error.__cause__ = exc
    return error

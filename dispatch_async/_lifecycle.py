"""A session's life: unopened, open on one event loop, closed; shared by a session and its views."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._exceptions import EventLoopError, SessionClosedError

__all__ = ["Lifecycle", "State"]

T = TypeVar("T")

_OTHER_LOOP = (
    "this DispatchSession was opened on another event loop (each asyncio.run() starts a new "
    "one, and so does every thread): open one session per event loop, inside it, e.g. "
    "`async with DispatchSession(...)` in the coroutine that asyncio.run() runs; from "
    "synchronous code or threads, use one DispatchClient instead"
)


class State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class Lifecycle:
    """Whether a session is open, and on which loop.

    ``closing`` is done once the session closes: its calls stop there, each accounting
    for its recipients, rather than wait out a retry or fail chunk by chunk.
    """

    state = State.UNOPENED
    loop: asyncio.AbstractEventLoop | None = None
    closing: asyncio.Future[None] | None = None

    def open_here(self) -> bool:
        """True if open on the running loop, False if it is to be opened now.

        Raises:
            EventLoopError: no loop is running, or the session is open on another one.
            SessionClosedError: the session is closed.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise EventLoopError(
                "a DispatchSession is used from a coroutine (no event loop is running)"
            ) from None
        if self.state is State.OPEN:
            if loop is not self.loop:
                raise EventLoopError(_OTHER_LOOP)
            return True
        if self.state is State.CLOSED:
            raise SessionClosedError("this session is closed; create a new one")
        return False

    def opened(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closing = self.loop.create_future()
        self.state = State.OPEN

    def closed(self) -> None:
        self.state = State.CLOSED
        if self.closing is not None:  # None: never opened
            self.closing.set_result(None)

    async def unless_closed(self, work: Coroutine[Any, Any, T]) -> T:
        """*work*'s result; SessionClosedError, *work* cancelled, if the session closes first."""
        assert self.closing is not None, "a session is opened before its calls start"
        task = asyncio.ensure_future(work)
        waiting: set[asyncio.Future[Any]] = {task, self.closing}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise SessionClosedError("the session was closed during the call")
        return task.result()

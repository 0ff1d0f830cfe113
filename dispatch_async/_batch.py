"""The batcher: chunks of any input, sent concurrently, every recipient accounted for.

One ``Batcher`` is one ``send_*`` or ``stream_*`` call. It reads the input lazily, holding
at most ``max_concurrency`` chunks in flight and as many read ahead, so memory stays
flat however long the input. Parts are yielded as chunks complete. When the job cannot
go on (a rejected secret, a bad recipient in a stream) it stops reading, lets the
requests in flight finish, accounts for what it read and raises. When the deadline
passes it cancels what is in flight and returns what it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, cast

from ._batch_settings import BatchSettings
from ._exceptions import (
    AuthenticationError,
    CallbackError,
    DeadlineExceededError,
    DispatchError,
    InputError,
    NetworkConfigurationError,
    SessionClosedError,
    TokenUnavailableError,
)
from ._matching import result_from_error
from ._outcome import DispatchResult, merge_results
from ._recipients import BadChunkError, Chunk, Recipients, Unfinished, check_shape, chunked
from ._screen import Screen
from ._split import Flight, ended

__all__ = ["STOPS_THE_JOB", "Batcher", "Flight", "collected"]

log = logging.getLogger("dispatch_async")

#: Chunk failures that no later chunk can escape (no credentials, no token, a callback
#: that cannot go on, a way to the service set up wrong): the job stops reading and
#: sends nothing more.
STOPS_THE_JOB = (
    AuthenticationError,
    CallbackError,
    NetworkConfigurationError,
    TokenUnavailableError,
)


SendChunk = Callable[[Chunk, Flight], Coroutine[Any, Any, DispatchResult]]


class Batcher:
    """One call's worth of chunks: reads, sends, and yields a result per chunk.

    When *stop_on* is done (the session closed) the job stops at once: what is in flight
    is cancelled and, with what was read but not sent, accounted for.
    """

    def __init__(
        self,
        recipients: Recipients,
        settings: BatchSettings,
        send: SendChunk,
        *,
        stop_on: asyncio.Future[None] | None = None,
    ) -> None:
        check_shape(recipients)
        self._settings = settings
        self._send = send
        self._stop_on = stop_on
        self._screen = Screen.of(settings)
        self.total = len(recipients) if isinstance(recipients, Sequence) else None
        self._sequence = isinstance(recipients, Sequence)
        self._unfinished = Unfinished()
        self._chunks = chunked(recipients, settings.chunk_size, self._unfinished)
        self._sent = self._maybe_sent = 0  # for the warning when the call is cancelled

    async def parts(self) -> AsyncGenerator[DispatchResult, None]:
        """Each chunk's result as it completes; raises (after yielding all) if the job stops."""
        done = 0
        async with contextlib.aclosing(self._run()) as parts:
            async for part in parts:
                done += len(part.positions)
                self._handed(part)
                self._progress(done)
                yield part

    def _take_unfinished(self, queued: deque[Chunk]) -> DispatchError | None:
        """Queue what a cut read had taken from the caller's iterator (never sent)."""
        try:
            chunk = self._unfinished.take()
        except BadChunkError as error:
            if error.before.size:
                queued.append(error.before)
            return error
        if chunk is not None:
            queued.append(chunk)
        return None

    async def _run(self) -> AsyncGenerator[DispatchResult, None]:
        settings = self._settings
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + settings.deadline if settings.deadline else None
        queued: deque[Chunk] = deque()
        running: dict[asyncio.Task[DispatchResult], tuple[Chunk, Flight]] = {}
        # The next chunk is read in a task of its own, raced against the requests, so a
        # slow source never keeps a free slot idle or a finished part from the caller.
        reading: asyncio.Task[Chunk | None] | None = None
        exhausted = False
        cancelled = False
        stop: DispatchError | None = None
        try:
            while True:
                expired = deadline_at is not None and loop.time() >= deadline_at
                while queued and len(running) < settings.max_concurrency and not (stop or expired):
                    chunk = queued.popleft()
                    try:
                        chunk = await self._screen.apply(chunk)
                    except CallbackError as error:
                        stop = error
                        yield result_from_error(chunk, error)
                        break
                    flight = Flight(self._announcer(chunk.positions))
                    task = loop.create_task(self._send(chunk, flight))
                    running[task] = (chunk, flight)
                may_read = not (reading or exhausted or stop or expired)
                if may_read and len(queued) < settings.max_concurrency:
                    reading = loop.create_task(anext(self._chunks, None))
                waiting: set[asyncio.Future[Any]] = set(running)
                if reading is not None:
                    waiting.add(reading)
                if not waiting:
                    break
                if self._stop_on is not None:
                    waiting.add(self._stop_on)
                timeout = None if deadline_at is None else max(deadline_at - loop.time(), 0)
                finished, _ = await asyncio.wait(
                    waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not finished:  # the deadline
                    if reading is not None:
                        await _cancelled(reading)
                        reading = None
                        stop = stop or self._take_unfinished(queued)
                    for part in await self._cancel(
                        running, DeadlineExceededError, "the deadline passed"
                    ):
                        yield part
                    continue
                if reading in finished:
                    finished.discard(reading)
                    try:
                        chunk_read = reading.result()
                    except BadChunkError as error:
                        stop = stop or error
                        if error.before.size:
                            queued.append(error.before)
                    except DispatchError as error:
                        stop = stop or error
                    except Exception as exc:  # the caller's iterator broke
                        if stop is None:
                            stop = InputError(f"reading the recipients failed: {exc!r}")
                            stop.__cause__ = exc
                    else:
                        if chunk_read is None:
                            exhausted = True
                        else:
                            queued.append(chunk_read)
                    reading = None
                finished.discard(self._stop_on)
                for future in finished:
                    sent = cast("asyncio.Task[DispatchResult]", future)
                    chunk, flight = running.pop(sent)
                    part, fatal = _outcome(sent, chunk, flight)
                    if fatal is not None and stop is None:
                        stop = fatal
                    yield part
                if self._stop_on is not None and self._stop_on.done():
                    if reading is not None:
                        await _cancelled(reading)
                        reading = None
                        stop = stop or self._take_unfinished(queued)
                    for part in await self._cancel(
                        running, SessionClosedError, "the session was closed"
                    ):
                        yield part
                    stop = stop or SessionClosedError("the session was closed during the call")
            # What was read but never sent: not sent, and why.
            reason = stop or DeadlineExceededError("the deadline passed before this was sent")
            leftovers = list(queued)
            if self._sequence:
                # A list is known whole (and already checked): account for every element,
                # after a deadline or an abort alike, so callers can retry from the result.
                leftovers += [c async for c in self._chunks]
            for chunk in leftovers:
                yield result_from_error(chunk, reason)
            if stop is not None:
                raise stop
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if reading is not None:
                await _cancelled(reading)
            if running:
                for part in await self._cancel(
                    running, DeadlineExceededError, "the call was cancelled"
                ):
                    self._handed(part)
            if cancelled:
                log.warning(  # counts only: numbers are personal data
                    "the call was cancelled: %s recipients sent, %s maybe sent",
                    f"{self._sent:,}",
                    f"{self._maybe_sent:,}",
                )
            # Closed here, not left to the loop's finalizer, which would start a task for it.
            await self._chunks.aclose()

    async def _cancel(
        self,
        running: dict[asyncio.Task[DispatchResult], tuple[Chunk, Flight]],
        failure: type[DeadlineExceededError | SessionClosedError],
        why: str,
    ) -> list[DispatchResult]:
        # Read before cancelling: the request's own cleanup clears in_request as it unwinds.
        in_request = {task: flight.in_request for task, (_, flight) in running.items()}
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        parts = []
        for task, (chunk, flight) in running.items():
            if not task.cancelled() and task.exception() is None:
                parts.append(task.result())  # it finished before the cancel reached it
                continue
            error = failure(f"{why} while this was in flight")
            error.maybe_sent = in_request[task]
            parts.append(ended(chunk, flight, error))
        running.clear()
        return parts

    def _announcer(self, positions: range) -> Callable[[], Awaitable[object]] | None:
        before_send = self._settings.before_send
        if before_send is None:
            return None
        return lambda: before_send(positions)

    def _handed(self, part: DispatchResult) -> None:
        """Count *part* and hand it to ``on_chunk``, before anything else is awaited."""
        counts = part.counts
        self._sent += counts["valid"]
        self._maybe_sent += counts["maybe_sent"]
        callback = self._settings.on_chunk
        if callback is not None:
            try:
                callback(part)
            except Exception:
                log.exception("the on_chunk callback failed")

    def _progress(self, done: int) -> None:
        callback = self._settings.on_progress
        if callback is not None:
            try:
                callback(done, self.total)
            except Exception:
                log.exception("the progress callback failed")


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _outcome(
    task: asyncio.Task[DispatchResult], chunk: Chunk, flight: Flight
) -> tuple[DispatchResult, DispatchError | None]:
    error = task.exception()
    if error is None:
        return task.result(), None
    if isinstance(error, STOPS_THE_JOB):
        return ended(chunk, flight, error), error
    raise error  # pragma: no cover - a bug: chunk tasks turn every other failure into a result


async def collected(parts: AsyncGenerator[DispatchResult, None]) -> DispatchResult:
    """A ``stream_*`` call's *parts* merged into one result: what its ``send_*`` twin returns.

    An error that stops the job carries the partial result (``error.result``).
    """
    done: list[DispatchResult] = []
    try:
        async with contextlib.aclosing(parts):
            async for part in parts:
                done.append(part)
    except DispatchError as error:
        error.result = merge_results(done)
        raise
    return merge_results(done)

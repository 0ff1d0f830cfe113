"""Where the core reports to the instrumentation hooks: a few cheap calls.

With no hooks every entry point returns at once (None or its argument), so the hot
path pays a tuple check per call and per request, nothing per recipient.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

from ._adaptive import RateState
from ._auth import Token
from ._exceptions import DispatchError, StatusError
from ._outcome import DispatchResult
from ._recipients import Chunk
from ._split import Flight
from ._transport import has_control_characters
from .instrumentation._events import (
    CallFinished,
    CallStarted,
    ChunkAnswered,
    ChunkSent,
    ChunkSplit,
    Hook,
    Paused,
    RateChanged,
    RetryScheduled,
    TokenObtained,
)
from .instrumentation._hooks import emit, get_hooks

__all__ = [
    "CURRENT",
    "CallReport",
    "TokenWatch",
    "attempt",
    "paused",
    "rate_changed",
    "retried",
    "sending_part",
    "split_reporter",
    "start_call",
]

T = TypeVar("T")

log = logging.getLogger("dispatch_async")

_REFUSED = DispatchError("the service refused the access token; re-sending with a new one")

_ids = itertools.count(1)

#: The chunk attempt under way in this task, if anything listens.
CURRENT: ContextVar[_Attempt | None] = ContextVar("dispatch_attempt", default=None)
#: The call and chunk this task sends, if anything listens (each chunk has its own task).
#: Only the chunk's span, never the chunk: every callback scheduled in the task (aiohttp's
#: timeout timers among them) keeps the context alive, and the recipients with it.
_CHUNK: ContextVar[tuple[CallReport, range, Flight] | None] = ContextVar(
    "dispatch_chunk", default=None
)


def _active(hooks: tuple[Hook, ...] | None) -> tuple[Hook, ...]:
    """A session's own hooks, or the global ones if it was given none."""
    return get_hooks() if hooks is None else hooks


def start_call(hooks: tuple[Hook, ...] | None, endpoint: str, url: str) -> CallReport | None:
    """A report for a new call to *endpoint* (a path) at *url*, or None when nothing listens."""
    current = _active(hooks)
    return CallReport(current, endpoint, url) if current else None


def attempt(sending: Awaitable[T]) -> Awaitable[T]:
    """*sending* (one attempt at the current chunk), reported if anything listens."""
    current = _CHUNK.get()
    if current is None:
        return sending
    report, span, flight = current
    return _attempt(_Attempt(report, span, flight.retries + 1), sending)


def sending_part(part: Chunk) -> None:
    """The current chunk's attempts now send *part* of it (it was refused as too large)."""
    if (current := _CHUNK.get()) is not None:
        report, _, flight = current
        _CHUNK.set((report, range(part.start, part.start + len(part.messages)), flight))


def split_reporter() -> Callable[[Chunk, int | None, int], None] | None:
    """What reports the current chunk's splits (`ChunkSplit`), or None if nothing listens."""
    current = _CHUNK.get()
    if current is None:
        return None
    report = current[0]

    def split(part: Chunk, size: int | None, most: int) -> None:
        event = ChunkSplit(
            report.call_id, report.endpoint, part.start, len(part.messages), size, most
        )
        emit(report.hooks, event)

    return split


def retried(error: BaseException, wait: float, attempt: int) -> None:
    """Report that *attempt* at the current chunk failed and will be tried again."""
    if (current := _CHUNK.get()) is not None:
        report, span, _ = current
        event = RetryScheduled(
            report.call_id, report.endpoint, span.start, attempt, str(error), wait
        )
        emit(report.hooks, event)


def paused(hooks: tuple[Hook, ...] | None, status: int, seconds: float) -> None:
    """Report a session-wide pause the service asked for."""
    if current := _active(hooks):
        emit(current, Paused(status, seconds))


def rate_changed(
    hooks: tuple[Hook, ...] | None, state: RateState, seen: RateState | None, shared: bool
) -> None:
    """Report a learned rate this session had not seen yet."""
    if current := _active(hooks):
        previous = None if seen is None else seen.rate
        emit(current, RateChanged(state.rate, previous, state.reason, shared))


class CallReport:
    """One call's events: started, each chunk attempt, finished."""

    def __init__(self, hooks: tuple[Hook, ...], endpoint: str, url: str) -> None:
        self.hooks = hooks
        self.endpoint = endpoint
        self.url = url
        self.call_id = next(_ids)

    def chunks(
        self, send: Callable[[Chunk, Flight], Awaitable[T]]
    ) -> Callable[[Chunk, Flight], Coroutine[Any, Any, T]]:
        """*send*, with the chunk it sends known to `attempt` and `retried`."""

        async def observed(chunk: Chunk, flight: Flight) -> T:
            span = range(chunk.start, chunk.start + len(chunk.messages))
            _CHUNK.set((self, span, flight))  # the chunk's own task: nothing to reset
            return await send(chunk, flight)

        return observed

    async def observe(
        self, parts: AsyncGenerator[DispatchResult, None], total: int | None
    ) -> AsyncGenerator[DispatchResult, None]:
        """*parts*, reporting the call's start, and its outcome counts when it ends."""
        emit(self.hooks, CallStarted(self.call_id, self.endpoint, total, self.url))
        started = time.monotonic()
        outcomes: Counter[str] = Counter()
        recipients = 0
        error: str | None = None
        try:
            async with contextlib.aclosing(parts):
                async for part in parts:
                    recipients += len(part.positions)
                    outcomes.update(part.counts)
                    yield part
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            outcomes.pop("failed", None)  # the sum of maybe_sent and not_sent
            duration = time.monotonic() - started
            emit(
                self.hooks,
                CallFinished(
                    self.call_id, self.endpoint, recipients, dict(outcomes), duration, error
                ),
            )


class _Attempt:
    """One attempt at a chunk: usually one request, two when a refused token is renewed."""

    __slots__ = ("report", "sent", "started")

    def __init__(self, report: CallReport, span: range, attempt: int) -> None:
        self.report = report
        self.sent = ChunkSent(report.call_id, report.endpoint, span.start, len(span), attempt)
        emit(report.hooks, self.sent)
        self.started = time.monotonic()

    def sending(self, headers: dict[str, str]) -> dict[str, str]:
        """*headers* with what hooks asked to add (trace context); starts the request's clock."""
        self.started = time.monotonic()
        added = self.sent.headers
        return {**_sendable(added, headers), **headers} if added else headers

    def answered(self, status: int | None, failure: DispatchError | None) -> None:
        sent = self.sent
        emit(
            self.report.hooks,
            ChunkAnswered(
                sent.call_id,
                sent.endpoint,
                sent.start,
                sent.size,
                sent.attempt,
                status,
                time.monotonic() - self.started,
                maybe_sent=failure.maybe_sent if failure is not None else status == 200,
                error=None if failure is None else str(failure),
            ),
        )

    def token_refused(self) -> None:
        """The service answered 401: report it, and the resend that follows."""
        sent = self.sent
        self.answered(401, _REFUSED)
        self.sent = ChunkSent(sent.call_id, sent.endpoint, sent.start, sent.size, sent.attempt)
        emit(self.report.hooks, self.sent)


def _sendable(added: dict[Any, Any], ours: dict[str, str]) -> dict[str, str]:
    """The headers hooks *added* that can go out with *ours*; the others are dropped.

    A hook never costs a recipient: a header that is not text, would split the request
    or is not a header name, or that would set one of the request's own headers or its
    framing (in any case), is left out and logged once.
    """
    taken = {name.lower() for name in ours}
    sendable = {}
    for name, value in added.items():
        if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):
            problem = "not a header name"
        elif name.lower() in taken or name.lower() in _RESERVED:
            problem = "a header the SDK or HTTP sets"
        elif not isinstance(value, str) or has_control_characters(value):
            problem = "a value that is not text or has control characters"
        else:
            sendable[name] = value
            continue
        _dropped(name, problem)
    return sendable


#: RFC 9110's field-name token.
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Set by aiohttp or the transport: a hook must not override them.
_RESERVED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te"}
    | {"trailer", "upgrade", "expect", "user-agent"}
)
_told: set[str] = set()
_TOLD_AT_MOST = 64


def _dropped(name: object, problem: str) -> None:
    # The name only (a value may carry a secret), once per name, for a bounded set of them.
    shown = repr(name)[:60] if isinstance(name, str) else f"<{type(name).__name__}>"
    if shown not in _told and len(_told) < _TOLD_AT_MOST:
        _told.add(shown)
        log.warning(
            "an instrumentation hook added the header %s to ChunkSent.headers: %s; it is "
            "left out (this is logged once)",
            shown,
            problem,
        )


async def _attempt(live: _Attempt, sending: Awaitable[T]) -> T:
    token = CURRENT.set(live)
    failure: DispatchError | None = None
    status: int | None = 200
    try:
        return await sending
    except DispatchError as error:
        failure = error
        status = error.status if isinstance(error, StatusError) else None
        raise
    except BaseException:
        status = None
        raise
    finally:
        CURRENT.reset(token)
        live.answered(status, failure)


class TokenWatch:
    """Reports tokens fetched from the service or adopted from a store (never the token)."""

    def __init__(self, hooks: tuple[Hook, ...] | None) -> None:
        self._hooks = hooks
        self._fetched: Token | None = None

    def fetching(self, fetch: Callable[[], Awaitable[Token]]) -> Callable[[], Awaitable[Token]]:
        """*fetch*, remembering what it returned, so a kept token can be told apart."""

        async def fetched() -> Token:
            self._fetched = await fetch()
            return self._fetched

        return fetched

    def kept(self, token: Token, duration: float) -> None:
        """The token keeper took *token* into use after *duration* seconds."""
        if current := _active(self._hooks):
            fetched = token is self._fetched
            source: Literal["fetched", "adopted"] = "fetched" if fetched else "adopted"
            emit(current, TokenObtained(source, duration, token.lifetime))

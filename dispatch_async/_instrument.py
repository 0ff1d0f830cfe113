"""Where the core reports to the instrumentation hooks: a few cheap calls.

With no hooks every entry point returns at once (None or its argument), so the hot
path pays a tuple check per call and per request, nothing per recipient.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

from ._exceptions import DispatchError, StatusError
from ._models import DispatchResult
from .instrumentation._events import (
    CallFinished,
    CallStarted,
    ChunkAnswered,
    ChunkSent,
    Hook,
    Paused,
    RetryScheduled,
    TokenObtained,
)
from .instrumentation._hooks import emit, get_hooks

__all__ = ["CURRENT", "CallReport", "active", "paused", "start_call", "token_obtained"]

T = TypeVar("T")

_REFUSED = DispatchError("the service refused the access token; re-sending with a new one")

_ids = itertools.count(1)

#: The chunk attempt under way in this task, if anything listens.
CURRENT: ContextVar[_Attempt | None] = ContextVar("dispatch_attempt", default=None)


class _Attempt:
    """One attempt at a chunk: usually one request, two when a refused token is renewed."""

    __slots__ = ("report", "sent", "started")

    def __init__(self, report: CallReport, start: int, size: int, attempt: int) -> None:
        self.report = report
        self.sent = ChunkSent(report.call_id, report.endpoint, start, size, attempt)
        emit(report.hooks, self.sent)
        self.started = time.monotonic()

    @property
    def headers(self) -> dict[str, str]:
        """What hooks asked to send on this request (trace context)."""
        return self.sent.headers

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
        self.started = time.monotonic()


def active(hooks: tuple[Hook, ...] | None) -> tuple[Hook, ...]:
    """A session's own hooks, or the global ones if it was given none."""
    return get_hooks() if hooks is None else hooks


class CallReport:
    """One call's events: started, each chunk attempt, retries, finished."""

    def __init__(self, hooks: tuple[Hook, ...], endpoint: str) -> None:
        self.hooks = hooks
        self.endpoint = endpoint
        self.call_id = next(_ids)

    async def observe(
        self, parts: AsyncGenerator[DispatchResult, None], total: int | None
    ) -> AsyncGenerator[DispatchResult, None]:
        """*parts*, reporting the call's start, and its outcome counts when it ends."""
        emit(self.hooks, CallStarted(self.call_id, self.endpoint, total))
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
            emit(
                self.hooks,
                CallFinished(
                    self.call_id,
                    self.endpoint,
                    recipients,
                    dict(outcomes),
                    time.monotonic() - started,
                    error,
                ),
            )

    async def attempt(
        self, start: int, size: int, attempt: int, send: Callable[[], Awaitable[T]]
    ) -> T:
        """Run one attempt at a chunk, reporting each request sent and answered."""
        live = _Attempt(self, start, size, attempt)
        token = CURRENT.set(live)
        failure: DispatchError | None = None
        status: int | None = 200
        try:
            return await send()
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

    def retry(self, start: int, attempt: int, error: BaseException, wait: float) -> None:
        """Report that *attempt* at the chunk at *start* failed and will be tried again."""
        emit(
            self.hooks,
            RetryScheduled(self.call_id, self.endpoint, start, attempt, str(error), wait),
        )


def start_call(hooks: tuple[Hook, ...] | None, endpoint: str) -> CallReport | None:
    """A report for a new call, or None when nothing listens."""
    current = active(hooks)
    return CallReport(current, endpoint) if current else None


def paused(hooks: tuple[Hook, ...] | None, status: int, seconds: float) -> None:
    """Report a session-wide pause the service asked for."""
    if current := active(hooks):
        emit(current, Paused(status, seconds))


def token_obtained(
    hooks: tuple[Hook, ...] | None, source: str, duration: float, lifetime: float
) -> None:
    """Report a token fetched or adopted (never the token itself)."""
    if current := active(hooks):
        emit(current, TokenObtained(source, duration, lifetime))  # type: ignore[arg-type]

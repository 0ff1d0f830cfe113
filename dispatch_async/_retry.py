"""When to try a request again, and how long to wait: the only module that uses backoff.

Only what the service certainly did not act on is retried by default: a connection
that was never made, a 429 and a 503. A 401 is not handled here (the session refreshes
the token and re-sends once). Swapping backoff for another library touches this file.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
from collections.abc import Awaitable, Callable, Generator, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import attrs
import backoff

from ._exceptions import ConnectError, DispatchError, StatusError, TokenUnavailableError

__all__ = ["RetryPolicy", "parse_retry_after", "retrying"]

log = logging.getLogger("dispatch_async")

T = TypeVar("T")


def _statuses(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


@attrs.frozen
class RetryPolicy:
    """How a request that the service did not act on is tried again.

    ``statuses`` are the HTTP statuses retried: add 500 (say) to opt in to re-sending
    requests the service may have acted on, accepting duplicates. ``wait=False`` turns
    every wait off (for tests); Retry-After is then ignored too.
    """

    attempts: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    """The most tries of one request, the first included (1: never retry)."""
    max_time: float = attrs.field(default=120.0, validator=attrs.validators.gt(0))
    """Seconds after the first try past which no retry starts."""
    first_wait: float = attrs.field(default=0.5, validator=attrs.validators.ge(0))
    """The longest wait before the first retry; it doubles each retry (full jitter)."""
    max_wait: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    """The longest wait between two tries, when the service asked for none."""
    max_retry_after: float = attrs.field(default=120.0, validator=attrs.validators.ge(0))
    """The longest Retry-After honoured, in seconds (a longer one is capped)."""
    statuses: frozenset[int] = attrs.field(default=frozenset({429, 503}), converter=_statuses)
    """The HTTP statuses retried (connection failures before sending always are)."""
    wait: bool = True
    """False: retry at once, ignoring Retry-After too (for tests)."""

    def should_retry(self, error: BaseException) -> bool:
        """Whether *error* is worth another attempt under this policy."""
        if isinstance(error, ConnectError):
            # A token fetch that gave up has had its retries already.
            return not isinstance(error, TokenUnavailableError)
        return isinstance(error, StatusError) and error.status in self.statuses

    def pause_for(self, error: BaseException) -> float | None:
        """The wait the service asked for (Retry-After), capped; None if it asked none."""
        retry_after = getattr(error, "retry_after", None)
        if retry_after is None:
            return None
        return min(retry_after, self.max_retry_after) if self.wait else 0.0

    def without_waits(self) -> RetryPolicy:
        """The same policy with every wait turned off (for tests)."""
        return attrs.evolve(self, wait=False)


def _waits(policy: RetryPolicy) -> Generator[float, BaseException | None, None]:
    # backoff sends each failure in, so the wait can honour the service's Retry-After.
    error = yield 0.0
    tries = 0
    while True:
        asked = policy.pause_for(error) if error is not None else None
        if asked is not None:
            wait = asked
        elif not policy.wait:
            wait = 0.0
        else:  # exponential, with full jitter so many clients do not retry in step
            ceiling = min(policy.max_wait, policy.first_wait * 2.0**tries)
            wait = random.uniform(0, ceiling)  # noqa: S311 - not crypto
        tries += 1
        error = yield wait


async def retrying(
    policy: RetryPolicy,
    attempt: Callable[[], Awaitable[T]],
    *,
    should_retry: Callable[[BaseException], bool] | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Run *attempt* until it succeeds, the error is not retryable, or the policy gives up.

    The last error is raised as it is. *on_retry* hears of each retry and its wait.
    """
    decide = should_retry or policy.should_retry
    # Most requests succeed first time: only a retryable failure pays for backoff's
    # machinery (building its decorator costs more than sending a small chunk's body).
    try:
        return await attempt()
    except DispatchError as error:
        if policy.attempts < 2 or not decide(error):
            raise
        first_failure = error

    def notify(details: Any) -> None:
        error = details["exception"]
        wait = float(details["wait"])
        log.info("retrying after %s (attempt %d, waiting %.2fs)", error, details["tries"], wait)
        if on_retry is not None:
            on_retry(error, wait)

    replayed = False

    # A coroutine *function*, as backoff needs to pick its asyncio loop. Its first call
    # replays the failure above, so backoff counts it and waits as for any failure.
    async def attempt_once() -> T:
        nonlocal replayed
        if not replayed:
            replayed = True
            raise first_failure
        return await attempt()

    decorated = backoff.on_exception(
        _waits,
        DispatchError,
        max_tries=policy.attempts,
        max_time=policy.max_time,
        giveup=lambda error: not decide(error),
        jitter=None,
        on_backoff=notify,
        logger=None,
        policy=policy,
    )(attempt_once)
    result: T = await decorated()
    return result


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
        return max(seconds, 0.0)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds

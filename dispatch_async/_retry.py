"""When to try a request again, and how long to wait.

Only what the service certainly did not act on is retried by default: a connection
that was never made (unless it never can be: `NetworkConfigurationError`), a 429 and a
503. A 401 is not handled here (the session refreshes the token and re-sends once).
tenacity runs the retries; what it decides with is the policy's: the tries, ``max_time``
and the waits (`RetryPolicy.wait_before`) are measured and spent on the policy's clock,
never on tenacity's own (docs/changelog.md says why tenacity and not stamina or backoff).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, TypeVar

import attrs
import tenacity

from ._clock import MONOTONIC, Clock
from ._exceptions import (
    ConnectError,
    DispatchError,
    NetworkConfigurationError,
    StatusError,
    TokenUnavailableError,
)

__all__ = ["RetryPolicy", "parse_retry_after", "retrying"]

log = logging.getLogger("dispatch_async")

T = TypeVar("T")

# RFC 9110 delay-seconds, with decimals as some services send them; nothing else (no
# sign, exponent, "nan", "inf", underscores or non-ASCII digits, all of which float takes).
_DELAY_SECONDS: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# 2.0 ** 1024 overflows a float; far before that, every wait is max_wait.
_MAX_DOUBLINGS: Final = 1000


def _statuses(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


@attrs.frozen
class RetryPolicy:
    """How a request that the service did not act on is tried again.

    ``statuses`` are the HTTP statuses retried: add 500 (say) to opt in to re-sending
    requests the service may have acted on, accepting duplicates. ``wait=False`` turns
    every wait off (for tests); Retry-After is then ignored too. ``clock`` is where the
    waits are measured and spent: `dispatch_async.testing.FakeClock` lets a test see them
    without waiting (one clock per session: its Retry-After pause is on it too).
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
    """The HTTP statuses retried (connection failures before sending always are, but
    for `NetworkConfigurationError`)."""
    wait: bool = True
    """False: retry at once, ignoring Retry-After too (for tests)."""
    clock: Clock = attrs.field(default=MONOTONIC, eq=False, repr=False)
    """Where the waits are measured and spent: real time, or a test's `FakeClock`."""

    def should_retry(self, error: BaseException) -> bool:
        """Whether *error* is worth another attempt under this policy."""
        if isinstance(error, ConnectError):
            # A token fetch that gave up has had its retries already; a way to the
            # service that is set up wrong will not heal.
            return not isinstance(error, TokenUnavailableError | NetworkConfigurationError)
        return isinstance(error, StatusError) and error.status in self.statuses

    def pause_for(self, error: BaseException) -> float | None:
        """The wait the service asked for (Retry-After), capped; None if it asked none."""
        retry_after = getattr(error, "retry_after", None)
        if retry_after is None:
            return None
        return min(retry_after, self.max_retry_after) if self.wait else 0.0

    def wait_before(self, retry: int, error: BaseException | None = None) -> float:
        """Seconds to wait before retry number *retry* (1 for the first) after *error*.

        The service's Retry-After when *error* carries one, capped (`pause_for`); else
        exponential backoff with full jitter, so that many clients do not retry in step:
        uniform between 0 and ``min(max_wait, first_wait * 2 ** (retry - 1))``. Always 0
        with ``wait=False``. The time left of ``max_time`` bounds it further.
        """
        asked = None if error is None else self.pause_for(error)
        if asked is not None:
            return asked
        if not self.wait:
            return 0.0
        doublings = min(max(retry - 1, 0), _MAX_DOUBLINGS)
        ceiling = min(self.max_wait, self.first_wait * 2.0**doublings)
        return random.uniform(0, ceiling)  # noqa: S311 - not crypto

    def without_waits(self) -> RetryPolicy:
        """The same policy with every wait turned off (for tests)."""
        return attrs.evolve(self, wait=False)


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
    # The first try runs outside tenacity (and its closures): a call that succeeds pays
    # for nothing more than this try.
    try:
        return await attempt()
    except DispatchError as error:
        if policy.attempts < 2 or not decide(error):
            raise
        failure = error
    return await _retry(policy, attempt, failure, decide, on_retry)


async def _retry(
    policy: RetryPolicy,
    attempt: Callable[[], Awaitable[T]],
    failure: DispatchError,
    decide: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException, float], None] | None,
) -> T:
    """The retries after the first try's retryable *failure*, run by tenacity."""
    clock = policy.clock
    started = clock.now()
    first_failure: DispatchError | None = failure

    async def again() -> T:
        # tenacity's first try replays the failure above, so its tries count as ours do.
        nonlocal first_failure
        if first_failure is not None:
            replayed, first_failure = first_failure, None
            raise replayed
        return await attempt()

    def retryable(state: tenacity.RetryCallState) -> bool:
        error = _failure(state)
        return isinstance(error, DispatchError) and decide(error)

    def gives_up(state: tenacity.RetryCallState) -> bool:
        spent = clock.now() - started >= policy.max_time
        return state.attempt_number >= policy.attempts or spent

    def wait(state: tenacity.RetryCallState) -> float:
        # Never past max_time: the wait is cut to what is left of it.
        left = policy.max_time - (clock.now() - started)
        return max(0.0, min(policy.wait_before(state.attempt_number, _failure(state)), left))

    def tell(state: tenacity.RetryCallState) -> None:
        error, waiting = _failure(state), state.upcoming_sleep
        assert error is not None  # tenacity sleeps only after a retryable error
        log.info(
            "retrying after %s (attempt %d, waiting %.2fs)", error, state.attempt_number, waiting
        )
        if on_retry is not None:
            on_retry(error, waiting)

    retryer = tenacity.AsyncRetrying(
        sleep=clock.sleep,
        stop=gives_up,
        wait=wait,
        retry=retryable,
        before_sleep=tell,
        reraise=True,
    )
    result: T = await retryer(again)
    return result


def _failure(state: tenacity.RetryCallState) -> BaseException | None:
    """The error the try that *state* is at raised (None if it returned)."""
    return None if state.outcome is None else state.outcome.exception()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None if unusable.

    A date in the past is 0; anything else that is neither (a sign, NaN, garbage) is
    None, and the retry falls back to the policy's backoff.
    """
    if not value:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max((when - dt.datetime.now(dt.UTC)).total_seconds(), 0.0)

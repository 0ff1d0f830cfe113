"""The session-wide gate every request passes: a service-ordered pause and a rate limit.

When the service answers 429 with Retry-After, every worker of the session waits, not
only the one that was told: the others would only collect 429s of their own. With a
fixed rate shared by a fleet (``shared=``) that pause is per process: a 429 tells the
process that got it, and the others learn from their own. A fleet that learns its rate
together also shares the pause (the learner's ``hold``), or the others would take the
few requests the service accepts meanwhile and the cut would go deeper than needed.

The rate is fixed, or learned (``"auto"``, see `_adaptive`): by this process alone
(`LocalRate`), or by the fleet, when the shared limiter has a ``learner``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from ._adaptive import Aimd, RateState
from ._clock import Clock
from ._exceptions import ConfigurationError

__all__ = ["Learner", "Limiter", "LocalRate", "Slot", "Throttle", "steady_limiter"]

log = logging.getLogger("dispatch_async")

#: Told of each change of a learned rate: the new state, the one before (None at first).
OnChange = Callable[[RateState, RateState | None, bool], None]


class Limiter(Protocol):
    """A rate limit shared beyond this process (`RedisRateLimiter`)."""

    async def acquire(self) -> None:
        """Return when one request may be sent."""
        ...

    async def aclose(self) -> None:
        """Release its connections."""
        ...


@attrs.frozen
class Slot:
    """What a request was sent under: the learned rate's version, and whether it waited."""

    version: int
    held: bool


@runtime_checkable
class Learner(Protocol):
    """A rate that learns from the service's answers."""

    shared: bool

    @property
    def state(self) -> RateState | None:
        """The rate now (None before the first request)."""
        ...

    async def take(self) -> Slot:
        """Return when one request may be sent, and what it is sent under."""
        ...

    async def answered(self, slot: Slot, status: int) -> None:
        """Learn from the status the service answered a request sent under *slot*."""
        ...

    async def hold(self, seconds: float) -> None:
        """The service asked every request to wait *seconds* (Retry-After)."""
        ...


def steady_limiter(requests_per_second: float) -> Any:
    """An aiolimiter limiter that lets one request through every 1/rate seconds.

    One at a time, evenly spaced: no burst ever exceeds the rate in any window.
    """
    try:
        from aiolimiter import AsyncLimiter
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError(
            'a request rate needs aiolimiter: pip install "dispatch-async[rate]"'
        ) from None
    return AsyncLimiter(1, 1 / requests_per_second)


class Pace:
    """One request every 1/rate seconds, at a rate read afresh by every waiter.

    aiolimiter's limiters have a fixed rate; here a lowered rate holds back the requests
    already waiting too, so none of them leaves at the old, refused rate.
    """

    def __init__(self, rate: Callable[[], float]) -> None:
        self._rate = rate
        self._last = -math.inf

    async def wait(self) -> bool:
        """Return when one request may go; True if it had to wait for it."""
        held = False
        while (delay := self._last + 1 / self._rate() - time.monotonic()) > 0:
            held = True
            await asyncio.sleep(delay)
        self._last = time.monotonic()
        return held


class LocalRate:
    """A rate learned by this process alone."""

    shared = False

    def __init__(self, aimd: Aimd, clock: Callable[[], float] = time.monotonic) -> None:
        self._aimd = aimd
        self._clock = clock
        self.state: RateState = aimd.start(clock())
        self._pace = Pace(lambda: self.state.rate)

    async def take(self) -> Slot:
        held = await self._pace.wait()
        return Slot(self.state.version, held)

    async def answered(self, slot: Slot, status: int) -> None:
        if status == 429:
            self.state = self._aimd.limited(self.state, slot.version, self._clock())
        elif status == 200:
            self.state = self._aimd.succeeded(self.state, slot.version, self._clock(), slot.held)

    async def hold(self, seconds: float) -> None:
        """Nothing to do: the throttle holds this process's requests itself."""


class Throttle:
    """Wait here before each request; tell it the answer, so a learned rate learns."""

    def __init__(
        self,
        requests_per_second: float | Literal["auto"] | None = None,
        maximum: float | None = None,
        *,
        shared: Limiter | None = None,
        on_change: OnChange | None = None,
    ) -> None:
        self._resume_at = 0.0
        self._shared = shared
        self._on_change = on_change
        self._limiter: Any = None
        self._fixed: float | None = None
        self._seen: RateState | None = None
        learner = getattr(shared, "learner", None)
        self._learner: Learner | None = learner if isinstance(learner, Learner) else None
        if requests_per_second == "auto":
            if shared is not None:
                raise ConfigurationError(
                    'requests_per_second="auto" learns for this process alone: to learn '
                    "for a fleet, give it to the RedisRateLimiter instead"
                )
            self._learner = LocalRate(Aimd(maximum))
        elif maximum is not None:
            raise ConfigurationError('max_requests_per_second bounds requests_per_second="auto"')
        elif requests_per_second is not None:
            self._fixed = float(requests_per_second)
            self._limiter = steady_limiter(requests_per_second)

    @property
    def rate(self) -> float | None:
        """Requests per second now: the fixed rate, the learned one, or None (no limit)."""
        if self._learner is not None:
            state = self._learner.state
            return None if state is None else state.rate
        return self._fixed

    async def pause(self, seconds: float, clock: Clock) -> None:
        """Hold every request of the session (and of a learning fleet) for *seconds*.

        *clock* is the retry policy's: a test's fake clock holds the requests on it.
        """
        resume_at = clock.now() + seconds
        if resume_at > self._resume_at:
            self._resume_at = resume_at
        if self._learner is not None:
            await self._learner.hold(seconds)

    async def wait(self, clock: Clock) -> Slot | None:
        """Return when a request may be sent; pass what it returns to `answered`.

        A pause (`pause`) is waited out on *clock*, the one it was set on.
        """
        # A loop, not one sleep: another 429 may push the resume time later meanwhile.
        while (delay := self._resume_at - clock.now()) > 0:
            await clock.sleep(delay)
        if self._limiter is not None:
            await self._limiter.acquire()
        if self._learner is not None:
            slot = await self._learner.take()
            self._notice()
            return slot
        if self._shared is not None:
            await self._shared.acquire()
        return None

    async def answered(self, slot: Slot | None, status: int) -> None:
        """Learn from the service's answer to a request `wait` let through."""
        if slot is not None and self._learner is not None:
            await self._learner.answered(slot, status)
            self._notice()

    def _notice(self) -> None:
        assert self._learner is not None
        state, seen = self._learner.state, self._seen
        if state is None or state is seen or (seen is not None and state.version == seen.version):
            return
        self._seen = state
        whose = "the fleet's" if self._learner.shared else "the"
        level = logging.INFO if state.reason == "decrease" else logging.DEBUG
        log.log(
            level,
            "%s learned request rate is %.3g/s (was %s): %s",
            whose,
            state.rate,
            "unknown" if seen is None else f"{seen.rate:.3g}/s",
            {"start": "first rate", "increase": "requests went through", "decrease": "a 429"}[
                state.reason
            ],
        )
        if self._on_change is not None:
            self._on_change(state, seen, self._learner.shared)

"""The session-wide gate every request passes: a service-ordered pause and a rate limit.

When the service answers 429 with Retry-After, every worker of the session waits, not
only the one that was told: the others would only collect 429s of their own. That pause
is per process, even when the rate limit is shared by a fleet (``shared=``): a 429 tells
the process that got it, and the others learn from their own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from ._exceptions import ConfigurationError

__all__ = ["Limiter", "Throttle", "steady_limiter"]


class Limiter(Protocol):
    """A rate limit shared beyond this process (`RedisRateLimiter`)."""

    async def acquire(self) -> None:
        """Return when one request may be sent."""
        ...

    async def aclose(self) -> None:
        """Release its connections."""
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


class Throttle:
    """Wait here before each request."""

    def __init__(
        self, requests_per_second: float | None = None, *, shared: Limiter | None = None
    ) -> None:
        self._resume_at = 0.0
        self._shared = shared
        self._limiter: Any = None
        if requests_per_second is not None:
            if not requests_per_second > 0:
                raise ConfigurationError("requests_per_second must be a positive number")
            self._limiter = steady_limiter(requests_per_second)

    def pause(self, seconds: float) -> None:
        """Hold every request of the session for *seconds* from now."""
        resume_at = time.monotonic() + seconds
        if resume_at > self._resume_at:
            self._resume_at = resume_at

    async def wait(self) -> None:
        """Return when a request may be sent."""
        # A loop, not one sleep: another 429 may push the resume time later meanwhile.
        while (delay := self._resume_at - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay)
        if self._limiter is not None:
            await self._limiter.acquire()
        if self._shared is not None:
            await self._shared.acquire()

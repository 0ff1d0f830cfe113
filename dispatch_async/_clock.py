"""The clock retries wait on: real time, or a test's fake (``RetryPolicy(clock=...)``)."""

from __future__ import annotations

import asyncio
import time
from typing import Final, Protocol

import attrs

__all__ = ["MONOTONIC", "Clock"]


class Clock(Protocol):
    """Where the waits of retries and of a service's Retry-After are measured and spent.

    ``now()`` is in seconds on a clock that never goes back; ``sleep(seconds)`` returns
    once that much of it has passed. `dispatch_async.testing.FakeClock` is one on which
    waits take no time.
    """

    def now(self) -> float:
        """Seconds, on a clock that never goes back."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once *seconds* have passed on this clock (at once if <= 0)."""
        ...


@attrs.frozen
class _Monotonic:
    """Real time: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "MONOTONIC"


#: The real clock, every policy's default.
MONOTONIC: Final[Clock] = _Monotonic()

"""A clock on which waiting takes no time, to pin down retry timing in tests."""

from __future__ import annotations

import asyncio

__all__ = ["FakeClock"]


class FakeClock:
    """A `dispatch_async.Clock` for ``RetryPolicy(clock=...)``: its waits return at once.

    Its time moves only when something sleeps on it (or with `advance`), and each sleep's
    seconds are kept in ``sleeps``, in order: a test reads the waits a retry took, and a
    Retry-After of two minutes costs nothing. Sleeps add up, as if taken one after the
    other: with several requests in flight, ``now()`` runs ahead of any single one.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        #: Every sleep asked of this clock, in seconds, in order.
        self.sleeps: list[float] = []

    def now(self) -> float:
        """The fake time, in seconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Note *seconds*, move the time on by them, and return (after one loop turn)."""
        self.sleeps.append(seconds)
        self._now += max(seconds, 0.0)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move the time on without a sleep, as if *seconds* had passed elsewhere."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._now += seconds

    def __repr__(self) -> str:
        return f"<FakeClock now={self._now:g} sleeps={len(self.sleeps)}>"

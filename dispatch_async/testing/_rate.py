"""The simulator's rate limit: a token bucket per account, answering 429 when it is empty.

The spec shows no limits; real services have them, and a client that learns a rate
needs something to learn from. ``rate`` can change while the server runs: the buckets
keep what they hold, capped to the new burst.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["AccountRateLimit"]


class AccountRateLimit:
    """``rate`` requests a second per account, in bursts of up to ``burst`` (default: one
    second's worth, at least 1); None lets everything through."""

    def __init__(
        self,
        rate: float | None = None,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._burst_given = burst
        self.rate = rate

    @property
    def rate(self) -> float | None:
        return self._rate

    @rate.setter
    def rate(self, rate: float | None) -> None:
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"a rate limit must be a positive number of requests/s, not {rate}")
        self._rate = rate
        self.burst = self._burst_given if self._burst_given is not None else max(rate or 1, 1)

    def take(self, account: str) -> float | None:
        """Spend one request of *account*'s; None if allowed, else seconds until one is."""
        rate = self._rate
        if rate is None:
            return None
        now = self._clock()
        tokens, then = self._buckets.get(account, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * rate)
        if tokens >= 1:
            self._buckets[account] = (tokens - 1, now)
            return None
        self._buckets[account] = (tokens, now)
        return (1 - tokens) / rate

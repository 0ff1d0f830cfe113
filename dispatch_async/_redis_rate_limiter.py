"""``RedisRateLimiter``: ``requests_per_second`` for a whole fleet of processes, in Redis.

The counting is the `limits` library's moving window on its async Redis storage (one
Redis list of request timestamps per limit, updated by its Lua script): in no window of
the limit's length does the fleet start more requests than allowed. A moving window
lets the whole second's allowance go at once; so that the service does not see those
bursts (its clock is not ours: a burst straddling its window edge looks like a breach),
each process also paces itself locally to the fleet rate. Only the rate is
shared; a 429's Retry-After pause stays with the process that was told (see `Throttle`).

With ``requests_per_second="auto"`` the fleet learns the rate from the service's answers
(`_redis_adaptive`), and instead of the window each request reserves the fleet's next free
send time at that rate (first come, first served: a window at the rate a process also
paces itself to lets the first process to catch a free slot keep every later one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any, Literal

from ._adaptive import Aimd
from ._exceptions import ConfigurationError
from ._redis import (
    DEFAULT_KEY_PREFIX,
    check_prefix,
    check_url,
    redacted_url,
    redis_errors,
    require_redis,
)
from ._redis_adaptive import SharedRate
from ._throttle import steady_limiter

__all__ = ["RedisRateLimiter"]

log = logging.getLogger("dispatch_async")

#: Waits between tries while Redis is unreachable and the limiter fails closed.
CLOSED_FIRST_WAIT = 0.1
CLOSED_MAX_WAIT = 2.0


class RedisRateLimiter:
    """At most *requests_per_second* requests across every process sharing Redis and prefix.

    ::

        limiter = RedisRateLimiter("redis://127.0.0.1:6379/0", requests_per_second=50)
        async with DispatchSession(url, client_secret=secret, rate_limiter=limiter) as s:
            ...

    Args:
        redis_url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``).
        requests_per_second: the fleet-wide rate (fractions allowed: 0.5 is 1 per 2 s), or
            ``"auto"``: learned by the fleet from the service's 429s, kept in Redis.
        max_requests_per_second: with ``"auto"``, the most it may learn.
        key_prefix: every key starts with it; processes with the same prefix share the limit.
        on_redis_error: ``"closed"`` (default): while Redis is unreachable, wait and try
            again, sending nothing; ``"open"``: fall back to a per-process limit of
            *local_requests_per_second* (default: the fleet rate, so a fleet of N
            processes may then send up to N times the rate; with ``"auto"``, the rate
            last learned).
        local_requests_per_second: the per-process limit used when failing open (a fixed
            rate only).

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        requests_per_second: float | Literal["auto"],
        max_requests_per_second: float | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        on_redis_error: Literal["closed", "open"] = "closed",
        local_requests_per_second: float | None = None,
    ) -> None:
        require_redis("RedisRateLimiter")
        try:
            import limits  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                'RedisRateLimiter needs the redis extra: pip install "dispatch-async[redis]"'
            ) from None
        self.url = check_url(redis_url)
        self.key_prefix = check_prefix(key_prefix)
        if on_redis_error not in ("closed", "open"):
            raise ConfigurationError('on_redis_error must be "closed" or "open"')
        self.on_redis_error = on_redis_error
        self._fixed: float | None = None
        self.learner: SharedRate | None = None
        if requests_per_second == "auto":
            self.learner = SharedRate(
                self._client,
                f"{self.key_prefix}rate:learned",
                Aimd(max_requests_per_second),
                self._scheduled,
                self._failed,
            )
        elif (
            isinstance(requests_per_second, bool)
            or not isinstance(requests_per_second, int | float)
            or not requests_per_second > 0
        ):
            raise ConfigurationError('requests_per_second must be a positive number or "auto"')
        elif max_requests_per_second is not None:
            raise ConfigurationError('max_requests_per_second bounds requests_per_second="auto"')
        else:
            self._fixed = float(requests_per_second)
        if self.learner is not None and local_requests_per_second is not None:
            raise ConfigurationError(
                'local_requests_per_second is for a fixed rate: with "auto", a process '
                "failing open keeps the rate last learned"
            )
        local = local_requests_per_second or self._fixed or Aimd().initial
        if not local > 0:
            raise ConfigurationError("local_requests_per_second must be a positive number")
        self.local_requests_per_second = float(local)
        self._pid = os.getpid()
        self._storage: Any = None
        self._pool: Any = None
        self._redis: Any = None
        self._local: Any = None
        self._pace: Any = None
        self._failing = False

    @property
    def requests_per_second(self) -> float | None:
        """The fleet's rate: as set, or as learned (None before the first request)."""
        if self.learner is None:
            return self._fixed
        return None if self.learner.state is None else self.learner.state.rate

    def __repr__(self) -> str:
        rate = "auto" if self.learner else f"{self._fixed:g}"
        return (
            f"<RedisRateLimiter {redacted_url(self.url)!r} key_prefix={self.key_prefix!r} "
            f"requests_per_second={rate} on_redis_error={self.on_redis_error!r}>"
        )

    def _get(self) -> Any:
        if self._storage is None:
            import redis.asyncio
            from limits.aio.storage import RedisStorage

            from ._redis import CONNECT_TIMEOUT, SOCKET_TIMEOUT

            self._pool = redis.asyncio.ConnectionPool.from_url(
                self.url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT
            )
            self._storage = RedisStorage(
                f"async+{self.url}",
                implementation="redispy",
                key_prefix=f"{self.key_prefix}rate",
                connection_pool=self._pool,
            )
        return self._storage

    def _client(self) -> Any:
        """A redis-py client on the limiter's connections (for the learned rate)."""
        if self._redis is None:
            import redis.asyncio

            self._get()
            self._redis = redis.asyncio.Redis(connection_pool=self._pool)
        return self._redis

    async def acquire(self) -> None:
        """Return when this process may send one request."""
        self._start_afresh_after_fork()
        if self.learner is not None:
            await self.learner.take()
            return
        assert self._fixed is not None
        if self._pace is None:
            self._pace = steady_limiter(self._fixed)
        await self._pace.acquire()
        # N requests per M seconds, whole numbers both: the form `limits` counts in.
        rate = Fraction(self._fixed).limit_denominator(1000)
        await self._window(rate.numerator, rate.denominator)

    async def _window(self, amount: int, seconds: int) -> None:
        """Return when the fleet sent fewer than *amount* requests in the last *seconds*
        (and count this one)."""
        from limits import RateLimitItemPerSecond

        key = RateLimitItemPerSecond(amount, seconds).key_for("requests")
        failures = 0
        while True:
            try:
                storage = self._get()
                if await storage.acquire_entry(key, amount, seconds):
                    self._recovered()
                    return
                # When the oldest request in the window leaves it.
                start, _ = await storage.get_moving_window(key, amount, seconds)
                delay = start + seconds - time.time()
                failures = 0
            except redis_errors() as exc:
                failures += 1
                if await self._outage(exc, failures, self._local_limiter().acquire):
                    return
                continue
            # A little jitter, so waiting processes do not all retry at the same instant.
            slot = seconds / amount
            await asyncio.sleep(max(delay, 0.0) + random.uniform(0, slot / 4))  # noqa: S311

    async def _scheduled(self, rate: float) -> bool:
        """Wait for this request's turn in the fleet's schedule at *rate*; True if it waited.

        First come, first served: each request reserves the next free send time, so no
        process starves another, whatever their speeds. Failing open, each process keeps
        to the last rate it learned.
        """
        assert self.learner is not None
        failures = 0
        while True:
            try:
                wait = await self.learner.reserve(rate)
            except redis_errors() as exc:
                failures += 1
                if await self._outage(exc, failures, self.learner.pace.wait):
                    return True
                continue
            self._recovered()
            if wait > 0:
                await asyncio.sleep(wait)
            return wait > 0

    async def _outage(
        self, exc: BaseException, failures: int, local: Callable[[], Awaitable[object]]
    ) -> bool:
        """Redis failed *failures* times in a row: True once *local* let a request go
        (failing open), False after a wait before trying Redis again (failing closed)."""
        self._failed(exc)
        if self.on_redis_error == "open":
            await local()
            return True
        await asyncio.sleep(min(CLOSED_FIRST_WAIT * 2 ** (failures - 1), CLOSED_MAX_WAIT))
        return False

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            what = "sending at a per-process rate" if self.on_redis_error == "open" else "waiting"
            log.warning(
                "the shared rate limit in Redis is unreachable (%s: %s); %s until it is back",
                type(exc).__name__,
                exc,
                what,
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("the shared rate limit in Redis is reachable again")

    def _local_limiter(self) -> Any:
        if self._local is None:
            self._local = steady_limiter(self.local_requests_per_second)
        return self._local

    def _start_afresh_after_fork(self) -> None:
        # A forked child neither uses nor closes its parent's connections and pacing.
        if self._pid != os.getpid():
            from ._fork import left_by_parent

            left_by_parent(self._pool, self._storage, self._redis, self._pace, self._local)
            self._pool = self._storage = self._redis = self._pace = self._local = None
            if self.learner is not None:
                self.learner.forget_client()
            self._pid = os.getpid()

    async def aclose(self) -> None:
        """Close the connections to Redis; the limiter may be used again afterwards."""
        self._start_afresh_after_fork()
        pool, self._pool, self._storage, self._redis = self._pool, None, None, None
        if self.learner is not None:
            self.learner.forget_client()
        if pool is not None:
            await pool.aclose()

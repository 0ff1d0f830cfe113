"""``RedisRateLimiter``: ``requests_per_second`` for a whole fleet of processes, in Redis.

The counting is the `limits` library's moving window on its async Redis storage (one
Redis list of request timestamps per limit, updated by its Lua script): in no window of
the limit's length does the fleet start more requests than allowed. A moving window
lets the whole second's allowance go at once; so that the service does not see those
bursts (its clock is not ours: a burst straddling its window edge looks like a breach),
each process also paces itself locally to the fleet rate. Only the rate is
shared; a 429's Retry-After pause stays with the process that was told (see `Throttle`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from fractions import Fraction
from typing import Any, Literal

from ._exceptions import ConfigurationError
from ._redis import (
    DEFAULT_KEY_PREFIX,
    check_prefix,
    check_url,
    redacted_url,
    redis_errors,
    require_redis,
)
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
        requests_per_second: the fleet-wide rate (fractions allowed: 0.5 is 1 per 2 s).
        key_prefix: every key starts with it; processes with the same prefix share the limit.
        on_redis_error: ``"closed"`` (default): while Redis is unreachable, wait and try
            again, sending nothing; ``"open"``: fall back to a per-process limit of
            *local_requests_per_second* (default: the fleet rate, so a fleet of N
            processes may then send up to N times the rate).
        local_requests_per_second: the per-process limit used when failing open.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        requests_per_second: float,
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
        if (
            isinstance(requests_per_second, bool)
            or not isinstance(requests_per_second, int | float)
            or not requests_per_second > 0
        ):
            raise ConfigurationError("requests_per_second must be a positive number")
        if on_redis_error not in ("closed", "open"):
            raise ConfigurationError('on_redis_error must be "closed" or "open"')
        self.requests_per_second = float(requests_per_second)
        self.on_redis_error = on_redis_error
        local = local_requests_per_second or self.requests_per_second
        if not local > 0:
            raise ConfigurationError("local_requests_per_second must be a positive number")
        self.local_requests_per_second = float(local)
        # N requests per M seconds, whole numbers both: the form `limits` counts in.
        rate = Fraction(self.requests_per_second).limit_denominator(1000)
        self._amount, self._seconds = rate.numerator, rate.denominator
        self._pid = os.getpid()
        self._limiter: Any = None
        self._pool: Any = None
        self._item: Any = None
        self._local: Any = None
        self._pace: Any = None
        self._failing = False

    def __repr__(self) -> str:
        return (
            f"<RedisRateLimiter {redacted_url(self.url)!r} key_prefix={self.key_prefix!r} "
            f"requests_per_second={self.requests_per_second:g} "
            f"on_redis_error={self.on_redis_error!r}>"
        )

    def _get(self) -> Any:
        if self._limiter is None:
            import redis.asyncio
            from limits import RateLimitItemPerSecond
            from limits.aio.storage import RedisStorage
            from limits.aio.strategies import MovingWindowRateLimiter

            from ._redis import CONNECT_TIMEOUT, SOCKET_TIMEOUT

            self._pool = redis.asyncio.ConnectionPool.from_url(
                self.url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT
            )
            storage = RedisStorage(
                f"async+{self.url}",
                implementation="redispy",
                key_prefix=f"{self.key_prefix}rate",
                connection_pool=self._pool,
            )
            self._limiter = MovingWindowRateLimiter(storage)
            self._item = RateLimitItemPerSecond(self._amount, self._seconds)
        return self._limiter

    async def acquire(self) -> None:
        """Return when this process may send one request."""
        self._start_afresh_after_fork()
        if self._pace is None:
            self._pace = steady_limiter(self.requests_per_second)
        await self._pace.acquire()
        failures = 0
        while True:
            try:
                limiter = self._get()
                if await limiter.hit(self._item, "requests"):
                    self._recovered()
                    return
                window = await limiter.get_window_stats(self._item, "requests")
                # reset_time: when the oldest request in the window leaves it.
                delay = window.reset_time - time.time()
                failures = 0
            except redis_errors() as exc:
                failures += 1
                self._failed(exc)
                if self.on_redis_error == "open":
                    await self._local_limiter().acquire()
                    return
                delay = min(CLOSED_FIRST_WAIT * 2 ** (failures - 1), CLOSED_MAX_WAIT)
            # A little jitter, so waiting processes do not all retry at the same instant.
            slot = self._seconds / self._amount
            await asyncio.sleep(max(delay, 0.0) + random.uniform(0, slot / 4))  # noqa: S311

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

            left_by_parent(self._pool, self._limiter, self._pace, self._local)
            self._pool = self._limiter = self._pace = self._local = None
            self._pid = os.getpid()

    async def aclose(self) -> None:
        """Close the connections to Redis; the limiter may be used again afterwards."""
        self._start_afresh_after_fork()
        pool, self._pool, self._limiter = self._pool, None, None
        if pool is not None:
            await pool.aclose()

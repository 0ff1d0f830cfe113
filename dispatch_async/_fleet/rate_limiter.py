"""``RedisRateLimiter``: ``requests_per_second`` for a whole fleet of processes, in Redis.

The fleet's requests keep to one schedule in Redis (`schedule`): each reserves the
next free send time, 1/rate after the one before, first come, first served. So no second
starts more than the rate, the service sees no bursts, and no process starves another.
(A moving window, each process also pacing itself to the fleet's rate, let the first
process to catch a free slot keep every later one.) With ``requests_per_second="auto"``
the fleet learns the rate from the service's answers (`learned_rate`) and the
schedule keeps to the rate learned. With a fixed rate only the rate is shared: a 429's
Retry-After pause stays with the process that was told (see `Throttle`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from .._adaptive import Aimd
from .._exceptions import ConfigurationError, RedisUnavailableError
from .._throttle import steady_limiter
from .addresses import redacted_url
from .connection import DEFAULT_KEY_PREFIX, RedisConnection, check_prefix, redis_errors
from .learned_rate import SharedRate
from .schedule import Schedule

__all__ = ["RedisRateLimiter"]

log = logging.getLogger("dispatch_async")

#: Waits between tries while Redis is unreachable and the limiter fails closed.
CLOSED_FIRST_WAIT = 0.1
CLOSED_MAX_WAIT = 2.0


class RedisRateLimiter:
    """At most *requests_per_second* requests across every process sharing Redis and prefix.

    For example:

        limiter = RedisRateLimiter("redis://127.0.0.1:6379/0", requests_per_second=50)
        async with DispatchSession(url, client_secret=secret, rate_limiter=limiter) as s:
            ...

    Args:
        redis_url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``, the
            URL of any node of a Redis Cluster, or ``redis+sentinel://...``; or a
            redis-py asyncio client you built (``Redis``, ``RedisCluster``, Sentinel's
            ``master_for``), yours to close. See `RedisConnection`.
        requests_per_second: the fleet-wide rate (fractions allowed: 0.5 is 1 per 2 s), or
            ``"auto"``: learned by the fleet from the service's 429s, kept in Redis.
        max_requests_per_second: with ``"auto"``, the most it may learn, or adopt from the
            fleet (a rate read from Redis is used within this and the 0.1/s floor).
        key_prefix: every key starts with it; processes with the same prefix share the limit.
        on_redis_error: ``"closed"`` (default): while Redis is unreachable, wait and try
            again, sending nothing, for *max_redis_wait* seconds at most; ``"open"``: fall
            back to a per-process limit of
            *local_requests_per_second* (default: the fleet rate, so a fleet of N
            processes may then send up to N times the rate; with ``"auto"``, the rate
            last learned).
        local_requests_per_second: the per-process limit used when failing open (a fixed
            rate only).
        max_redis_wait: failing closed, the longest one request waits for Redis to be
            back: then it fails with `RedisUnavailableError` (nothing was sent).
        ssl_ca_certs: with ``rediss://``, the CA file that signed the server's certificate.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
        RedisConfigurationError: (from a request) Redis answered that a setting is wrong:
            a Cluster not detected, a replica, the ACL. Raised at once, never waited on.
    """

    def __init__(
        self,
        redis_url: str | Any,
        *,
        requests_per_second: float | Literal["auto"],
        max_requests_per_second: float | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        on_redis_error: Literal["closed", "open"] = "closed",
        local_requests_per_second: float | None = None,
        max_redis_wait: float = 60.0,
        ssl_ca_certs: str | None = None,
    ) -> None:
        self._redis = RedisConnection(
            redis_url, ssl_ca_certs=ssl_ca_certs, feature="RedisRateLimiter"
        )
        self.url = self._redis.url
        if not (isinstance(max_redis_wait, int | float) and max_redis_wait > 0):
            raise ConfigurationError("max_redis_wait must be a positive number of seconds")
        self.max_redis_wait = float(max_redis_wait)
        self.key_prefix = check_prefix(key_prefix)
        if on_redis_error not in ("closed", "open"):
            raise ConfigurationError('on_redis_error must be "closed" or "open"')
        self.on_redis_error = on_redis_error
        self._fixed: float | None = None
        self.learner: SharedRate | None = None
        if requests_per_second == "auto":
            self.learner = SharedRate(
                self._client,
                self._key,
                "rate:learned",
                Aimd(max_requests_per_second),
                self._scheduled,
                self._failed,
                self._start_afresh_after_fork,
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
        local = (
            local_requests_per_second
            if local_requests_per_second is not None
            else self._fixed or Aimd().initial
        )
        if not local > 0:
            raise ConfigurationError("local_requests_per_second must be a positive number")
        self.local_requests_per_second = float(local)
        self._schedule = Schedule(self._client, self._key, "rate:next")
        self._turn: asyncio.Lock | None = None
        self._pid = os.getpid()
        self._local: Any = None
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

    async def _client(self) -> Any:
        """The redis-py client, connected on first use."""
        return await self._redis.client()

    def _key(self, name: str) -> str:
        """The key *name* under the prefix (braced on a Cluster: one hash slot)."""
        return self._redis.key_tag(self.key_prefix) + name

    async def acquire(self) -> None:
        """Return when this process may send one request."""
        self._start_afresh_after_fork()
        if self.learner is not None:
            await self.learner.take()
            return
        assert self._fixed is not None
        # One reservation at a time per process, as with "auto": a process with many
        # requests waiting books one slot ahead, not one for each of them.
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            await self._scheduled(self._fixed)

    async def _scheduled(self, rate: float) -> bool:
        """Wait for this request's turn in the fleet's schedule at *rate*; True if it waited.

        First come, first served: each request reserves the next free send time, so no
        process starves another, whatever their speeds. Failing open, each process keeps
        to its local rate (with "auto", the last rate it learned).
        """
        learner = self.learner
        failures = 0
        waited = False
        give_up_at = asyncio.get_running_loop().time() + self.max_redis_wait
        while True:
            try:
                if learner is not None:
                    turn = await learner.reserve(rate)
                else:
                    turn = await self._schedule.reserve(1 / rate)
            except redis_errors() as exc:
                failures += 1
                if await self._outage(exc, failures, self._local_wait, give_up_at):
                    return True
                continue
            self._recovered()
            if turn.wait > 0:
                waited = True
                await asyncio.sleep(turn.wait)
            if turn.reserved:  # else the schedule was full: ask again now a turn is free
                return waited

    async def _outage(
        self,
        exc: BaseException,
        failures: int,
        local: Callable[[], Awaitable[None]],
        give_up_at: float,
    ) -> bool:
        """Redis failed *failures* times in a row: True once *local* let a request go
        (failing open), False after a wait before trying Redis again (failing closed),
        `RedisUnavailableError` once past *give_up_at* (the loop's time)."""
        self._failed(exc)
        if self.on_redis_error == "open":
            await local()
            return True
        left = give_up_at - asyncio.get_running_loop().time()
        if left <= 0:
            raise RedisUnavailableError(
                f"the shared rate limit in Redis at {redacted_url(self.url)} was unreachable "
                f"for {self.max_redis_wait:g} s ({type(exc).__name__}: {exc}); nothing was "
                "sent (max_redis_wait)"
            ) from None
        await asyncio.sleep(min(CLOSED_FIRST_WAIT * 2 ** (failures - 1), CLOSED_MAX_WAIT, left))
        return False

    def _failed(self, exc: BaseException) -> None:
        """Redis failed with *exc*: a wrong setting is raised at once, an outage logged."""
        wrong = self._redis.misconfigured(exc)
        if wrong is not None:
            raise wrong from None
        if not self._failing:
            self._failing = True
            what = (
                "sending at a per-process rate"
                if self.on_redis_error == "open"
                else f"waiting (at most {self.max_redis_wait:g} s for each request)"
            )
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

    async def _local_wait(self) -> None:
        """Return when this process's own rate lets a request go (failing open)."""
        if self.learner is not None:
            await self.learner.pace.wait()
            return
        if self._local is None:
            self._local = steady_limiter(self.local_requests_per_second)
        await self._local.acquire()

    def _start_afresh_after_fork(self) -> None:
        # A forked child neither uses nor closes its parent's pacing (nor connections: the
        # RedisConnection's own).
        if self._pid != os.getpid():
            from .._fork import left_by_parent

            left_by_parent(self._local)
            self._local = self._turn = None
            if self.learner is not None:
                self.learner.start_afresh()
            self._pid = os.getpid()

    async def aclose(self) -> None:
        """Close the connections to Redis made here (a client you gave stays open); the
        limiter may be used again afterwards."""
        self._start_afresh_after_fork()
        await self._redis.aclose()

"""The queue's way to its Redis: a single Redis, any node of a Cluster, a Sentinel set,
``rediss://`` with a private CA (the SDK's `RedisConnection` tells them apart).

Each client made here remembers its connection, so the job's keys can be put in one
hash slot on a Cluster (``key_tag``) and an answer that is a wrong setting (``MOVED``,
``READONLY``, ``NOPERM``...) is said as such, not as an unreachable queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, Final, TypeAlias

import dispatch_async as da

from ..screen.problem import FAILED, Problem

__all__ = [
    "LOADING_WAIT",
    "SOCKET_TIMEOUT",
    "QueueRedis",
    "connect",
    "connected",
    "connection_of",
    "cut_by_failover",
    "disconnect",
    "outage_errors",
    "redis_errors",
    "unreachable",
    "where",
    "wrong_setting",
]

log = logging.getLogger("dispatch_async")

#: A redis-py asyncio client (a ``Redis`` or a ``RedisCluster``). Typed loosely: redis-py
#: types every reply as "awaitable or not", which strict mypy rejects at each ``await``.
QueueRedis: TypeAlias = Any

#: Seconds a reply from Redis may take (the longest block of a blocking read is less):
#: the same with every redis-py (5 has none, 6+ five seconds).
SOCKET_TIMEOUT: Final = 30.0
#: How long a command waits for a Redis that answers but is still loading its data: a
#: restarted Redis answers LOADING until it has read its append-only file back.
LOADING_WAIT: Final = 120.0
_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")

#: The connection each client was made from (dropped with the client).
_CONNECTIONS: weakref.WeakKeyDictionary[Any, da.RedisConnection] = weakref.WeakKeyDictionary()


def where(queue_url: str) -> str:
    """The queue's address for messages: scheme, hosts, path, never a user or password."""
    scheme, _, rest = queue_url.partition("://")
    hosts, slash, path = rest.partition("/")
    return f"{scheme}://{hosts.rpartition('@')[2]}{slash}{path.partition('?')[0]}"


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a failing Redis raises: redis-py's errors and the socket's."""
    import redis.exceptions

    return (redis.exceptions.RedisError, OSError)


def outage_errors() -> tuple[type[BaseException], ...]:
    """What Redis out of reach for a moment raises (a failover, a restart), as opposed to
    an answer that something is wrong: worth trying again."""
    import redis.exceptions as e

    return (e.ConnectionError, e.TimeoutError, e.ClusterDownError, e.TryAgainError, OSError)


def cut_by_failover(exc: BaseException) -> bool:
    """Whether *exc* ended a blocking read because its Redis became a replica (a
    failover): read again, from the new primary (the next command is redirected)."""
    import redis.exceptions

    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("UNBLOCKED")


def connection_of(redis: QueueRedis) -> da.RedisConnection | None:
    """The connection *redis* was made from by `connect` (None: a client made elsewhere,
    taken for a single Redis)."""
    return _CONNECTIONS.get(redis)


def wrong_setting(redis: QueueRedis, exc: BaseException) -> Problem | None:
    """One line, exit 2, if *exc* is Redis answering that a setting is wrong (no retry
    helps); None for an outage."""
    return _plainly(connection_of(redis), exc)


def _plainly(connection: da.RedisConnection | None, exc: BaseException) -> Problem | None:
    wrong = connection.misconfigured(exc) if connection is not None else None
    return None if wrong is None else Problem(" ".join(str(wrong).split()))


def unreachable(
    queue_url: str, exc: BaseException, connection: da.RedisConnection | None = None
) -> Problem:
    """One line, exit 2: what a wrong setting means, else redis-py's message (which names
    host and port, never the password)."""
    wrong = _plainly(connection, exc)
    if wrong is not None:
        return wrong
    message = f"cannot use the Redis queue {where(queue_url)}: {type(exc).__name__}: {exc}"
    return Problem(" ".join(message.split()))


async def connect(queue_url: str) -> QueueRedis:
    """A redis-py client for *queue_url*, checked with a PING: a refused connection or
    password fails here, in one line, instead of at the first command."""
    try:
        import redis.asyncio  # noqa: F401 - the queue extra, named if missing
    except ImportError:
        raise Problem(
            'a queued job needs the queue extra: pip install "dispatch-async[queue]"'
        ) from None
    if queue_url.partition("://")[0] not in _SCHEMES:
        raise Problem("--queue must be a redis://, rediss://, unix:// or redis+sentinel:// URL")
    try:
        connection = da.RedisConnection(
            queue_url, socket_timeout=SOCKET_TIMEOUT, feature="a queued job"
        )
    except da.DispatchError as exc:
        raise Problem(f"--queue: {exc}") from None
    try:
        client = await connection.client()
        await _ping_once_loaded(client)
    except redis_errors() as exc:
        await connection.aclose()
        raise unreachable(queue_url, exc, connection) from None
    except da.RedisConfigurationError as exc:
        await connection.aclose()
        raise Problem(" ".join(str(exc).split())) from None
    _CONNECTIONS[client] = connection
    return client


async def disconnect(redis: QueueRedis) -> None:
    """Close *redis* and what its connection made (a Sentinel's connections too)."""
    connection = _CONNECTIONS.pop(redis, None)
    if connection is None:
        await redis.aclose()
    else:
        await connection.aclose()


async def _ping_once_loaded(client: QueueRedis) -> None:
    """PING, waiting while Redis is loading: a worker started as Redis restarts (by a
    supervisor, say) would otherwise exit as if the queue could not be used at all."""
    import redis.exceptions

    deadline = time.monotonic() + LOADING_WAIT
    told = False
    while True:
        try:
            await client.ping()
            return
        except redis.exceptions.BusyLoadingError:
            if time.monotonic() >= deadline:
                raise
            if not told:
                log.warning("the queue's Redis is loading its data: waiting for it")
                told = True
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def connected(queue_url: str) -> AsyncIterator[QueueRedis]:
    """The queue's Redis for a command: a wrong setting is one line, exit 2, another
    failure one line, exit 1; closed after."""
    redis = await connect(queue_url)
    try:
        yield redis
    except redis_errors() as exc:
        wrong = wrong_setting(redis, exc)
        if wrong is not None:
            raise wrong from None
        raise Problem(f"Redis failed: {type(exc).__name__}: {exc}", FAILED) from None
    finally:
        await disconnect(redis)

"""Connecting to Redis for the fleet features: the optional import, the client, the errors.

``redis`` (redis-py, with its asyncio client) is the ``[redis]`` extra; it is imported
only when a fleet feature is used, so ``import dispatch_async`` works without it.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    import redis.asyncio

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "RedisClient",
    "check_prefix",
    "check_url",
    "redacted_url",
    "redis_errors",
    "require_redis",
]

#: Every key the SDK writes starts with this unless told otherwise (docs/guides/fleet.md: the ACL).
DEFAULT_KEY_PREFIX = "dispatch-async:"
#: Seconds to connect to, and to wait for an answer from, Redis: a dead Redis must not
#: hold a request up for long.
CONNECT_TIMEOUT = 2.0
SOCKET_TIMEOUT = 2.0


def require_redis(feature: str) -> Any:
    """The ``redis`` package, or a `ConfigurationError` naming the extra to install."""
    try:
        import redis.asyncio
    except ImportError:
        raise ConfigurationError(
            f'{feature} needs the redis extra: pip install "dispatch-async[redis]"'
        ) from None
    return redis


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a failing Redis raises: redis-py's errors and the socket's."""
    import redis.exceptions

    return (redis.exceptions.RedisError, OSError)


def redacted_url(url: str) -> str:
    """*url* without its password, for reprs and log lines."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_prefix(key_prefix: str) -> str:
    """*key_prefix* if it is a usable key prefix, else a `ConfigurationError`."""
    if not isinstance(key_prefix, str) or not key_prefix or any(c in key_prefix for c in "*?[]"):
        raise ConfigurationError("key_prefix must be a non-empty string without glob characters")
    return key_prefix


def check_url(redis_url: str) -> str:
    """*redis_url* if it is a Redis URL, else a `ConfigurationError`."""
    if not isinstance(redis_url, str) or urllib.parse.urlsplit(redis_url).scheme not in (
        "redis",
        "rediss",
        "unix",
    ):
        raise ConfigurationError("redis_url must be a redis://, rediss:// or unix:// URL")
    return redis_url


class RedisClient:
    """A redis-py asyncio client made on first use (inside the running loop), closed on demand."""

    def __init__(self, redis_url: str, feature: str) -> None:
        require_redis(feature)
        self.url = check_url(redis_url)
        self._client: redis.asyncio.Redis | None = None
        self._pid = os.getpid()

    def get(self) -> redis.asyncio.Redis:
        """The client, created now if need be (and anew in a forked child)."""
        if self._pid != os.getpid():
            self._forget_parent()
        if self._client is None:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(
                self.url,
                socket_connect_timeout=CONNECT_TIMEOUT,
                socket_timeout=SOCKET_TIMEOUT,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connections; a later `get` makes a new client."""
        if self._pid != os.getpid():
            self._forget_parent()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _forget_parent(self) -> None:
        # The parent's connections are its own: neither used nor closed here.
        from .._fork import left_by_parent

        if self._client is not None:
            left_by_parent(self._client)
        self._client = None
        self._pid = os.getpid()

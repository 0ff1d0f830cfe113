"""Connecting to Redis for the fleet features: the optional import, the client, its keys.

``redis`` (redis-py, with its asyncio client) is the ``[redis]`` extra; it is imported
only when a fleet feature is used, so ``import dispatch_async`` works without it.

One `RedisConnection` per feature object: from a URL (a single Redis, any node of a
Cluster, a Sentinel set) it makes its own client, detecting a Cluster at the first
connection, and closes it; a client the caller built is used as given, and left open.
The clients made here raise ``ConnectionError`` for a command written on a connection
closed underneath it (see `closed_underneath`); one the caller built behaves as built.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .._exceptions import ConfigurationError, RedisConfigurationError
from .addresses import SENTINEL_SCHEMES, check_url, parse_sentinel_url, redacted_url
from .closed_underneath import guard_client
from .errors import misconfiguration

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_KEY_PREFIX",
    "RedisConnection",
    "check_prefix",
    "redis_errors",
    "require_redis",
]

#: Every key the SDK writes starts with this unless told otherwise (docs/guides/fleet.md: the ACL).
DEFAULT_KEY_PREFIX = "dispatch-async:"
#: Seconds to connect to Redis: a dead Redis must not hold a request up for long (nor
#: answering, by default: `RedisConnection`'s ``socket_timeout``).
CONNECT_TIMEOUT = 2.0


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


def check_prefix(key_prefix: str) -> str:
    """*key_prefix* if it is a usable key prefix, else a `ConfigurationError`."""
    if not isinstance(key_prefix, str) or not key_prefix or any(c in key_prefix for c in "*?[]"):
        raise ConfigurationError("key_prefix must be a non-empty string without glob characters")
    return key_prefix


class RedisConnection:
    """The fleet's way to one Redis: a URL, or a redis-py asyncio client you built.

    Args:
        redis: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS),
            ``unix://...``, the URL of any node of a Redis Cluster (detected at the first
            connection), ``redis+sentinel://host:port[,host:port...]/service[/db]`` (see
            `parse_sentinel_url`); or a ``redis.asyncio.Redis``, ``RedisCluster`` or
            Sentinel's ``master_for(...)`` client, used as is and never closed here (it is
            yours to close, like ``http_session``).
        ssl_ca_certs: with ``rediss://``, the file of the CA that signed the server's
            certificate (a private CA); the URL's ``?ssl_ca_certs=`` works too.
        socket_timeout: seconds Redis may take to answer a command.
        feature: what uses it, for error messages.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis: str | Any,
        *,
        ssl_ca_certs: str | None = None,
        socket_timeout: float = 2.0,
        feature: str = "the fleet",
    ) -> None:
        require_redis(feature)
        if isinstance(redis, str):
            self.url = check_url(redis)
            self._given: Any = None
        elif callable(getattr(redis, "execute_command", None)):
            self.url = _describe_client(redis)
            self._given = redis
        else:
            raise ConfigurationError(
                "redis must be a Redis URL or a redis.asyncio client (Redis, RedisCluster, "
                "or Sentinel's master_for)"
            )
        if ssl_ca_certs is not None and not (isinstance(redis, str) and redis.startswith("rediss")):
            raise ConfigurationError("ssl_ca_certs is for a rediss:// URL")
        self.ssl_ca_certs = ssl_ca_certs
        self.socket_timeout = socket_timeout
        #: Whether it is a Redis Cluster: None until the first connection.
        self.cluster: bool | None = None
        self._client: Any = None
        self._sentinel: Any = None
        self._connecting: asyncio.Lock | None = None
        self._pid = os.getpid()

    @property
    def owned(self) -> bool:
        """Whether the client is made, and closed, here (from a URL)."""
        return self._given is None

    def __repr__(self) -> str:
        return f"<RedisConnection {redacted_url(self.url)!r}>"

    async def client(self) -> Any:
        """The connected client: made now if need be (anew in a forked child).

        Raises:
            RedisConfigurationError: a plain client given for a Cluster node.
            redis.exceptions.RedisError, OSError: Redis could not be reached (try again).
        """
        if self._pid != os.getpid():
            self._forget_parent()
        if self._client is not None:
            return self._client
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is None:
                self._client, self.cluster = await self._connect()
        return self._client

    def key_tag(self, *parts: str) -> str:
        """The start of the keys that one script or transaction uses together.

        On a Cluster, ``{<parts>}`` (braces: one hash slot for all of them, a slot of
        their own for every other *parts*, e.g. each job's); on a single Redis, the
        parts as they are (the layout of every earlier release). Call after `client`.
        """
        text = "".join(parts)
        return f"{{{text}}}" if self.cluster else text

    def misconfigured(self, exc: BaseException) -> RedisConfigurationError | None:
        """The `RedisConfigurationError` that *exc* stands for (raise it: no wait helps),
        or None for an outage."""
        return misconfiguration(exc, redacted_url(self.url))

    @contextlib.contextmanager
    def plain_errors(self) -> Iterator[None]:
        """Inside, an answer that is a wrong setting raises `RedisConfigurationError`
        (see `misconfigured`); an outage's error passes as it is."""
        try:
            yield
        except redis_errors() as exc:
            wrong = self.misconfigured(exc)
            if wrong is None:
                raise
            raise wrong from None

    async def aclose(self) -> None:
        """Close the connections made here (a client you gave stays open); a later
        `client` connects again."""
        if self._pid != os.getpid():
            self._forget_parent()
        client, self._client = self._client, None
        sentinel, self._sentinel = self._sentinel, None
        if client is not None and self.owned:
            await client.aclose()
        for node in getattr(sentinel, "sentinels", ()):
            await node.aclose()

    async def _connect(self) -> tuple[Any, bool]:
        import redis.asyncio

        given = self._given
        if given is not None:
            if isinstance(given, redis.asyncio.RedisCluster):
                return given, True
            if await _is_cluster(given):
                raise RedisConfigurationError(
                    f"{self.url} is a node of a Redis Cluster: pass a redis.asyncio."
                    "RedisCluster (or its URL), not a redis.asyncio.Redis"
                )
            return given, False
        options: dict[str, Any] = {
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": self.socket_timeout,
        }
        if self.ssl_ca_certs is not None:
            options["ssl_ca_certs"] = self.ssl_ca_certs
        if self.url.split("://", 1)[0] in SENTINEL_SCHEMES:
            return guard_client(self._from_sentinels(options)), False
        single = guard_client(redis.asyncio.Redis.from_url(self.url, **options))
        try:
            clustered = await _is_cluster(single)
        except BaseException:
            await single.aclose()
            raise
        if not clustered:
            return single, False
        await single.aclose()
        cluster = guard_client(
            redis.asyncio.RedisCluster.from_url(_without_db(self.url), **options)
        )
        try:
            await cluster.initialize()
        except BaseException:
            await cluster.aclose()
            raise
        return cluster, True

    def _from_sentinels(self, options: dict[str, Any]) -> Any:
        import redis.asyncio.sentinel

        address = parse_sentinel_url(self.url)
        tls: dict[str, Any] = {"ssl": True} if address.tls else {}
        if address.ssl_ca_certs is not None:
            tls["ssl_ca_certs"] = address.ssl_ca_certs
        options = {**options, **tls}
        self._sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(address.sentinels), sentinel_kwargs=options, **options
        )
        return self._sentinel.master_for(
            address.service, db=address.db, username=address.username, password=address.password
        )

    def _forget_parent(self) -> None:
        # The parent's connections are its own: neither used nor closed here.
        from .._fork import left_by_parent

        if self._client is not None and self.owned:
            left_by_parent(self._client)
        self._client = self._sentinel = self._connecting = None
        self._pid = os.getpid()


async def _is_cluster(client: Any) -> bool:
    """Whether *client* talks to a Cluster node (a user that may not run INFO: assumed
    not; a MOVED then says what to allow)."""
    import redis.exceptions

    try:
        info = await client.info("cluster")
    except redis.exceptions.NoPermissionError:
        return False
    return bool(int(info.get("cluster_enabled", 0)))


def _without_db(url: str) -> str:
    # A Cluster has database 0 only, and redis-py refuses even that in the URL's path.
    scheme, rest = url.split("://", 1)
    host, _, tail = rest.partition("/")
    query = tail.partition("?")[2]
    return f"{scheme}://{host}" + (f"/?{query}" if query else "")


def _describe_client(client: Any) -> str:
    """Where a given client connects, for messages: its class and first node."""
    kind = type(client).__name__
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    if "host" in kwargs:
        return f"{kind}(redis://{kwargs['host']}:{kwargs.get('port', 6379)})"
    if pool is not None and getattr(pool, "service_name", None):
        return f"{kind}(sentinel service {pool.service_name})"
    nodes = getattr(client, "startup_nodes", None) or []
    if nodes:
        return f"{kind}(redis://{nodes[0].host}:{nodes[0].port})"
    return kind

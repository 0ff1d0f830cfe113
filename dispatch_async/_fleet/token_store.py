"""``RedisTokenStore``: one access token for every process of a fleet, kept in Redis.

Two keys, both under the caller's prefix (on a Redis Cluster, in braces: ``{<prefix>}``,
one hash slot): ``<prefix>token`` holds the token (JSON: the value, when it was issued
on the wall clock, its lifetime) and expires with it; ``<prefix>token:lock`` is the
refresh lock (``SET NX PX`` with a random owner value,
released only by its owner: redis-py's ``Lock``), so a crashed refresher does not block
the fleet for longer than the lock's expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson

from .._token_store import StoredToken, TokenStoreUnavailable
from .addresses import redacted_url
from .connection import DEFAULT_KEY_PREFIX, RedisConnection, check_prefix, redis_errors

__all__ = ["RedisTokenStore"]

log = logging.getLogger("dispatch_async")


#: A token we put in an Authorization header: printable ASCII, no control characters.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


class RedisTokenStore:
    """Share one access token between the processes that use the same Redis and prefix.

    Give each session its own store (the session closes it):

        store = RedisTokenStore("redis://:password@127.0.0.1:6379/0", key_prefix="acme:")
        async with DispatchSession(url, client_secret=secret, token_store=store) as session:
            ...

    Only one process refreshes the token at a time; the others adopt the token it saved.
    If Redis cannot be reached, each process fetches its own token (with a warning); if
    Redis answers that a setting is wrong (a replica, the ACL...), `RedisConfigurationError`.

    Args:
        redis_url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``, the
            URL of any node of a Redis Cluster, or ``redis+sentinel://...``; or a
            redis-py asyncio client you built (``Redis``, ``RedisCluster``, Sentinel's
            ``master_for``), yours to close. See `RedisConnection`.
        key_prefix: every key starts with it; restrict the Redis user to ``~<prefix>*``
            (on a Cluster, ``~{<prefix>}*``).
        lock_timeout: seconds after which a refresh lock whose holder died expires (a
            live holder renews it every third of that while its token fetch lasts).
        ssl_ca_certs: with ``rediss://``, the CA file that signed the server's certificate.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis_url: str | Any,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        lock_timeout: float = 20.0,
        ssl_ca_certs: str | None = None,
    ) -> None:
        self._redis = RedisConnection(
            redis_url, ssl_ca_certs=ssl_ca_certs, feature="RedisTokenStore"
        )
        self.key_prefix = check_prefix(key_prefix)
        self.lock_timeout = lock_timeout

    def __repr__(self) -> str:
        return f"<RedisTokenStore {redacted_url(self._redis.url)!r} key_prefix={self.key_prefix!r}>"

    async def _client(self) -> Any:
        try:
            return await self._redis.client()
        except redis_errors() as exc:
            raise self._failure(exc) from None

    def _key(self, name: str) -> str:
        return self._redis.key_tag(self.key_prefix) + name

    def _failure(self, exc: BaseException) -> Exception:
        """What to raise for *exc*: a wrong setting at once, else the store is unavailable."""
        return self._redis.misconfigured(exc) or TokenStoreUnavailable(_describe(exc))

    async def load(self) -> StoredToken | None:
        """The token in Redis, or None (none yet, expired, or not readable)."""
        client = await self._client()
        try:
            raw = await client.get(self._key("token"))
        except redis_errors() as exc:
            raise self._failure(exc) from None
        if raw is None:
            return None
        try:
            data = orjson.loads(raw)
            value = data["v"]
            # Anything that wrote to Redis could have planted this: a token that is not a
            # plain header value would fail (or inject a header) in the HTTP layer.
            if not isinstance(value, str) or not _HEADER_SAFE.fullmatch(value):
                raise ValueError("not a header-safe token")
            return StoredToken(value, float(data["iat"]), float(data["life"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("the shared access token in Redis is unreadable; ignoring it")
            return None

    async def save(self, token: StoredToken, ttl: float) -> None:
        """Store *token* for *ttl* seconds."""
        raw = orjson.dumps({"v": token.value, "iat": token.issued_at, "life": token.lifetime})
        client = await self._client()
        try:
            await client.set(self._key("token"), raw, px=max(int(ttl * 1000), 1))
        except redis_errors() as exc:
            raise self._failure(exc) from None

    def lock(self, wait: float) -> AbstractAsyncContextManager[bool]:
        """Hold the refresh lock; enters with False if another process kept it for *wait* s."""
        return self._locked(wait)

    @contextlib.asynccontextmanager
    async def _locked(self, wait: float) -> AsyncIterator[bool]:
        from redis.exceptions import LockError

        client = await self._client()
        lock = client.lock(
            self._key("token:lock"),
            timeout=self.lock_timeout,
            sleep=0.05,
            blocking_timeout=wait,
            thread_local=False,
        )
        try:
            held = await lock.acquire()
        except redis_errors() as exc:
            raise self._failure(exc) from None
        # A token fetch can take longer than the lock's timeout (its own timeout, and
        # retries): the holder keeps the lock alive for as long as it holds it.
        keeping = asyncio.create_task(self._keep(lock)) if held else None
        try:
            yield bool(held)
        finally:
            if keeping is not None:
                keeping.cancel()
                await asyncio.gather(keeping, return_exceptions=True)
            if held:
                try:
                    await lock.release()
                except LockError:
                    log.warning("the token refresh lock expired before it was released")
                except redis_errors() as exc:
                    log.warning("could not release the token refresh lock (%s)", _describe(exc))

    async def _keep(self, lock: Any) -> None:
        """Renew *lock* to its full timeout every third of it, until cancelled."""
        from redis.exceptions import LockError

        failures: tuple[type[BaseException], ...] = (LockError, *redis_errors())
        while True:
            await asyncio.sleep(self.lock_timeout / 3)
            try:
                await lock.reacquire()
            except failures as exc:
                log.warning("could not keep the token refresh lock (%s)", _describe(exc))
                return

    async def aclose(self) -> None:
        """Close the connections to Redis made here (a client you gave stays open)."""
        await self._redis.aclose()


def _describe(exc: BaseException) -> str:
    # The class and message of a connection error; never a command's arguments.
    return f"{type(exc).__name__}: {exc}"

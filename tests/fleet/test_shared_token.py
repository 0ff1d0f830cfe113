"""RedisTokenStore: one token for every session sharing a Redis and a key prefix."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio

import dispatch_async as da
from dispatch_async._token_store import StoredToken, TokenStoreUnavailable
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.conftest import SECRET, numbers, session_for
from tests.fleet.conftest import free_port, redis_user
from tests.fleet.test_queue import until


@pytest.fixture
async def server() -> FakeDispatchServer:
    async with FakeDispatchServer(client_secret=SECRET, token_lifetime=60) as fake:
        yield fake  # type: ignore[misc]


async def test_sessions_sharing_a_store_make_one_token_call(
    server: FakeDispatchServer, any_redis: str, prefix: str
) -> None:
    """On a single Redis, and given the URL of one node of a Cluster."""
    sessions = [
        session_for(server, token_store=da.RedisTokenStore(any_redis, key_prefix=prefix))
        for _ in range(5)
    ]
    try:
        await asyncio.gather(
            *(s.send_basic(numbers(3, start=10 * i), text="hi") for i, s in enumerate(sessions))
        )
    finally:
        for s in sessions:
            await s.close()
    assert server.stats.token_calls == 1
    assert server.stats.unauthorized == 0


async def test_token_key_expires_with_the_token(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    async with session_for(
        server, token_store=da.RedisTokenStore(redis_server, key_prefix=prefix)
    ) as session:
        await session.send_basic(numbers(1), text="hi")
    client = redis.asyncio.Redis.from_url(redis_server)
    try:
        ttl_ms = await client.pttl(f"{prefix}token")
        keys = await client.keys(f"{prefix}*")
    finally:
        await client.aclose()
    # The token stops being used 5% of its lifetime (at most 10 s) before it expires.
    assert 55_000 < ttl_ms <= 57_000
    assert keys == [f"{prefix}token".encode()]  # the lock was released


async def test_a_stored_token_is_adopted_without_a_token_call(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    async with session_for(
        server, token_store=da.RedisTokenStore(redis_server, key_prefix=prefix)
    ) as first:
        await first.send_basic(numbers(1), text="hi")
    async with session_for(
        server, token_store=da.RedisTokenStore(redis_server, key_prefix=prefix)
    ) as second:
        await second.send_basic(numbers(1, start=1), text="hi")
    assert server.stats.token_calls == 1


async def test_other_prefixes_do_not_share_the_token(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    for key_prefix in (prefix, prefix + "other:"):
        async with session_for(
            server, token_store=da.RedisTokenStore(redis_server, key_prefix=key_prefix)
        ) as session:
            await session.send_basic(numbers(1), text="hi")
    assert server.stats.token_calls == 2


class _WatchedStore(da.RedisTokenStore):
    """Tells when a session was refused the lock (another process holds it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = asyncio.Event()

    @contextlib.asynccontextmanager
    async def _locked(self, wait: float) -> AsyncIterator[bool]:
        async with super()._locked(wait) as held:
            if not held:
                self.refused.set()
            yield held


async def test_waits_for_the_lock_holder_rather_than_fetching_too(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    holder = da.RedisTokenStore(redis_server, key_prefix=prefix)
    token = server.issue_token()
    store = _WatchedStore(redis_server, key_prefix=prefix)
    async with holder.lock(0.1) as held:
        assert held
        async with session_for(server, token_store=store) as session:
            sending = asyncio.create_task(session.send_basic(numbers(1), text="hi"))
            await asyncio.wait_for(store.refused.wait(), timeout=5)
            assert not sending.done()
            await holder.save(StoredToken(token, time.time(), 60.0), ttl=50)
            result = await asyncio.wait_for(sending, timeout=5)
    await holder.aclose()
    assert len(result.valid) == 1
    assert server.stats.token_calls == 0


async def test_a_refused_token_in_the_store_is_replaced(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    async with session_for(
        server, token_store=da.RedisTokenStore(redis_server, key_prefix=prefix)
    ) as session:
        await session.send_basic(numbers(1), text="hi")
        server.script(Fault.revoke_token())
        result = await session.send_basic(numbers(1, start=1), text="hi")
    assert len(result.valid) == 1
    assert server.stats.token_calls == 2


async def test_unreachable_redis_falls_back_to_a_local_token(
    server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dispatch_async")
    store = da.RedisTokenStore(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    async with session_for(server, token_store=store) as session:
        result = await session.send_basic(numbers(2), text="hi")
    assert len(result.valid) == 2
    assert server.stats.token_calls == 1
    assert "token store is unreachable" in caplog.text
    issued = list(server._tokens._deadlines)  # the issued values, to prove none was logged
    assert len(issued) == 1
    assert issued[0] not in caplog.text
    assert "hunter2" not in caplog.text


def test_repr_shows_the_url_without_its_password() -> None:
    store = da.RedisTokenStore("redis://user:hunter2@127.0.0.1:6379/0", key_prefix="acme:")
    limiter = da.RedisRateLimiter(
        "redis://:hunter2@127.0.0.1:6379/0", requests_per_second=5, key_prefix="acme:"
    )
    assert "hunter2" not in repr(store)
    assert "redis://user:***@127.0.0.1:6379/0" in repr(store)
    assert "hunter2" not in repr(limiter)


def test_repr_masks_the_password_of_a_url_without_a_port() -> None:
    store = da.RedisTokenStore("redis://:hunter2@redis.internal/0")
    assert "'redis://:***@redis.internal/0'" in repr(store)


def test_missing_redis_extra_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(da.ConfigurationError, match=r"dispatch-async\[redis\]"):
        da.RedisTokenStore("redis://127.0.0.1:6379/0")
    with pytest.raises(da.ConfigurationError, match=r"dispatch-async\[redis\]"):
        da.RedisRateLimiter("redis://127.0.0.1:6379/0", requests_per_second=5)


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "", "127.0.0.1:6379"])
def test_a_url_that_is_not_redis_is_refused(url: str) -> None:
    with pytest.raises(da.ConfigurationError):
        da.RedisTokenStore(url)


@pytest.mark.parametrize("planted", ["ok\r\nX-Injected: 1", "ok\nx", "ok\x00x", "ok\x7f", ""])
async def test_a_stored_token_with_control_characters_is_refused_where_it_is_read(
    server: FakeDispatchServer,
    redis_server: str,
    prefix: str,
    planted: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server)
    try:
        value = orjson.dumps({"v": planted, "iat": time.time(), "life": 60})
        await client.set(f"{prefix}token", value, px=60_000)
    finally:
        await client.aclose()
    with caplog.at_level(logging.WARNING, logger="dispatch_async"):
        async with session_for(
            server, token_store=da.RedisTokenStore(redis_server, key_prefix=prefix)
        ) as session:
            result = await session.send_basic(numbers(2), text="hi")
    assert len(result.valid) == 2
    assert server.stats.token_calls == 1
    assert "unreadable" in caplog.text
    assert "Injected" not in caplog.text


async def test_the_refresh_lock_outlives_a_slow_token_fetch(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    # The fetch takes five lock timeouts; the holder renews the lock every third of one. A
    # renewal may come 0.6 s late on a loaded machine (0.3 s timeouts failed there).
    server.script_token(Fault.delay(5.0))
    stores = [
        da.RedisTokenStore(redis_server, key_prefix=prefix, lock_timeout=1.0) for _ in range(3)
    ]
    sessions = [session_for(server, token_store=store) for store in stores]
    try:
        results = await asyncio.gather(
            *(s.send_basic(numbers(2, start=10 * i), text="hi") for i, s in enumerate(sessions))
        )
    finally:
        for s in sessions:
            await s.close()
    assert all(r.ok for r in results)
    assert server.stats.token_calls == 1


async def test_hooks_hear_a_token_fetched_by_one_session_and_adopted_by_another(
    server: FakeDispatchServer, redis_server: str, prefix: str
) -> None:
    from dispatch_async import instrumentation

    heard: list[instrumentation.TokenObtained] = []

    def hook(event: instrumentation.Event) -> None:
        if isinstance(event, instrumentation.TokenObtained):
            heard.append(event)

    for start in (0, 1):
        async with session_for(
            server,
            token_store=da.RedisTokenStore(redis_server, key_prefix=prefix),
            hooks=[hook],
        ) as session:
            await session.send_basic(numbers(1, start=start), text="hi")
    assert [event.source for event in heard] == ["fetched", "adopted"]
    assert server.stats.token_calls == 1
    assert heard[1].lifetime == pytest.approx(heard[0].lifetime, abs=1)


class TestTheStoreWhenRedisFails:
    """Each failure is a `TokenStoreUnavailable` naming the error, or a warning: never the
    token, never a crash of the refresh."""

    async def test_saving_to_an_unreachable_redis_is_unavailable(self) -> None:
        store = da.RedisTokenStore(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
        try:
            with pytest.raises(TokenStoreUnavailable, match="ConnectionError") as raised:
                await store.save(StoredToken("tok-secret-value", time.time(), 60), 60)
        finally:
            await store.aclose()
        assert "tok-secret-value" not in str(raised.value)
        assert "hunter2" not in str(raised.value)

    async def test_taking_the_lock_on_an_unreachable_redis_is_unavailable(self) -> None:
        store = da.RedisTokenStore(f"redis://127.0.0.1:{free_port()}/0")
        try:
            with pytest.raises(TokenStoreUnavailable, match="ConnectionError"):
                async with store.lock(wait=0.1):
                    pytest.fail("entered a lock Redis never gave")
        finally:
            await store.aclose()

    async def test_a_lock_lost_while_held_is_said_and_not_released_as_if_held(
        self, redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Its key deleted (evicted, a Redis restarted) while a slow fetch holds it."""
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        store = da.RedisTokenStore(redis_server, key_prefix=prefix, lock_timeout=0.3)
        admin = redis.asyncio.Redis.from_url(redis_server)
        try:
            async with store.lock(wait=1.0) as held:
                assert held
                await admin.delete(f"{prefix}token:lock")
                taken = await admin.set(f"{prefix}token:lock", "another", nx=True, px=5000)

                async def not_kept() -> bool:  # the renewal is every 0.1 s
                    return "could not keep the token refresh lock" in caplog.text

                await until(not_kept, 30, "the lost lock said")
            assert await admin.get(f"{prefix}token:lock") == b"another"  # not released
        finally:
            await admin.aclose()
            await store.aclose()
        assert taken
        assert "the token refresh lock expired before it was released" in caplog.text

    async def test_a_lock_redis_will_not_release_is_said_and_left_to_expire(
        self, redis_server: str, prefix: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="dispatch_async")
        async with redis_user(redis_server, prefix, "+get", "+set") as url:
            store = da.RedisTokenStore(url, key_prefix=prefix, lock_timeout=5)
            try:
                async with store.lock(wait=1.0) as held:
                    assert held
            finally:
                await store.aclose()
        async with redis.asyncio.Redis.from_url(redis_server) as admin:
            ttl = await admin.pttl(f"{prefix}token:lock")
        assert "could not release the token refresh lock (NoPermissionError" in caplog.text
        assert 0 < ttl <= 5000  # it expires by itself

"""The fleet on the Redis that fleets run: a Cluster, Sentinel, TLS with a private CA, a
client you built; answers that say a setting is wrong; failovers mid-send."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
import redis.asyncio
import redis.asyncio.sentinel

import dispatch_async as da
from dispatch_async._token_store import StoredToken
from dispatch_async.callbacks import RedisDeliveryStore
from dispatch_async.testing import FakeDispatchServer
from tests.callback_store_contract import event, reference
from tests.conftest import SECRET, numbers, session_for
from tools.redis_topologies import Cluster, SentinelSet, TlsRedis, cli, free_ports


@pytest.fixture
async def server() -> FakeDispatchServer:
    async with FakeDispatchServer(client_secret=SECRET, token_lifetime=60) as fake:
        yield fake  # type: ignore[misc]


async def rate_of(limiters: list[da.RedisRateLimiter], requests: int) -> float:
    """Requests per second the *limiters* let through, together, for *requests* requests."""
    started = time.monotonic()
    async with asyncio.timeout(20):
        await asyncio.gather(*(limiters[i % len(limiters)].acquire() for i in range(requests)))
    return (requests - 1) / (time.monotonic() - started)


def away_from(cluster: Cluster, port: int, name: str) -> str:
    """A key prefix whose *name* key (unbraced: no Cluster detected) a primary other than
    *port* serves."""
    while True:
        prefix = f"test-{uuid.uuid4().hex[:12]}:"
        if cluster.primary_for(f"{prefix}{name}") != port:
            return prefix


class TestACluster:
    @pytest.mark.parametrize("rate", [20, "auto"])
    async def test_limiters_given_a_node_url_share_one_rate(
        self, redis_cluster: Cluster, prefix: str, rate: float | str
    ) -> None:
        options = {"max_requests_per_second": 20} if rate == "auto" else {}
        limiters = [
            da.RedisRateLimiter(
                redis_cluster.url,
                requests_per_second=rate,
                key_prefix=prefix,
                **options,  # type: ignore[arg-type]
            )
            for _ in range(2)
        ]
        try:
            measured = await rate_of(limiters, 12)
        finally:
            for limiter in limiters:
                await limiter.aclose()
        assert measured <= 20 * 1.1


#: The fleet guide's ACL for the token and the rate limit, and on a Cluster what finding
#: its nodes takes: INFO at the first connection, redis-py's CLUSTER SLOTS and COMMAND.
FLEET_ACL = (
    "-@all", "+get", "+set", "+pttl", "+pexpire", "+del", "+evalsha", "+eval",
    "+script|load", "+ping", "+time",
)  # fmt: skip
CLUSTER_ACL = ("+info", "+cluster|slots", "+command")


def replica_of(sentinels: SentinelSet) -> int:
    """The port of the Sentinel set's replica now (a failover swaps the two)."""
    primary = sentinels.current_primary()
    return next(p for p in (sentinels.primary, sentinels.replica) if p != primary)


class TestACLOnACluster:
    async def test_the_documented_acl_is_enough_on_a_cluster(
        self, server: FakeDispatchServer, redis_cluster: Cluster, prefix: str
    ) -> None:
        user = f"fleet-{prefix.rstrip(':')}"
        for port in redis_cluster.ports:
            cli(port, "acl", "setuser", user, "reset", "on", ">s3cret", f"~{{{prefix}}}*",
                "resetchannels", *FLEET_ACL, *CLUSTER_ACL)  # fmt: skip
        url = redis_cluster.url.replace("redis://", f"redis://{user}:s3cret@")
        try:
            async with session_for(
                server,
                token_store=da.RedisTokenStore(url, key_prefix=prefix),
                rate_limiter=da.RedisRateLimiter(
                    url, requests_per_second="auto", key_prefix=prefix
                ),
            ) as session:
                async with asyncio.timeout(20):
                    result = await session.send_basic(numbers(10), text="hi", chunk_size=5)
        finally:
            for port in redis_cluster.ports:
                cli(port, "acl", "deluser", user)
        assert result.ok
        assert server.stats.token_calls == 1


class TestTheConnectionTheQueueShares:
    async def test_each_jobs_keys_have_a_slot_of_their_own_spread_over_the_cluster(
        self, redis_cluster: Cluster
    ) -> None:
        connection = da.RedisConnection(redis_cluster.url)
        try:
            await connection.client()
            tags = [connection.key_tag("acme:", "job:", f"j{i}") for i in range(12)]
        finally:
            await connection.aclose()
        assert connection.cluster is True
        assert tags[0] == "{acme:job:j0}"
        assert len({redis_cluster.primary_for(tag) for tag in tags}) == 3

    async def test_on_a_single_redis_the_keys_are_as_before(self, redis_server: str) -> None:
        connection = da.RedisConnection(redis_server)
        try:
            await connection.client()
        finally:
            await connection.aclose()
        assert connection.cluster is False
        assert connection.key_tag("acme:", "job:", "j0") == "acme:job:j0"


class TestAnswersThatSayASettingIsWrong:
    async def test_a_plain_client_for_a_cluster_node_is_refused_naming_the_fix(
        self, redis_cluster: Cluster, prefix: str
    ) -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_cluster.ports[0])
        store = da.RedisTokenStore(client, key_prefix=prefix)
        try:
            with pytest.raises(da.RedisConfigurationError, match="RedisCluster"):
                await store.load()
        finally:
            await store.aclose()
            await client.aclose()

    async def test_moved_is_a_configuration_error_not_an_endless_wait(
        self, redis_cluster: Cluster
    ) -> None:
        """A user that may not run INFO: the Cluster goes undetected, and MOVED says so."""
        node = redis_cluster.primary_for("{x}")
        prefix = away_from(redis_cluster, node, "rate:next")
        for port in redis_cluster.ports:
            cli(port, "acl", "setuser", "noinfo", "on", ">s3cret", "~*", "+@all", "-info")
        limiter = da.RedisRateLimiter(
            f"redis://noinfo:s3cret@127.0.0.1:{node}/0", requests_per_second=50, key_prefix=prefix
        )
        try:
            async with asyncio.timeout(5):
                with pytest.raises(da.RedisConfigurationError, match=r"MovedError.*Cluster"):
                    await limiter.acquire()
        finally:
            await limiter.aclose()
            for port in redis_cluster.ports:
                cli(port, "acl", "deluser", "noinfo")

    async def test_a_replica_is_a_configuration_error_naming_the_primary(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        replica = replica_of(redis_sentinels)
        store = da.RedisTokenStore(f"redis://127.0.0.1:{replica}/0", key_prefix=prefix)
        try:
            with pytest.raises(da.RedisConfigurationError, match=r"replica.*primary"):
                await store.save(StoredToken("t0ken", time.time(), 60), 30)
        finally:
            await store.aclose()

    async def test_a_delivery_store_on_a_replica_is_refused_naming_the_primary(
        self, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        store = RedisDeliveryStore(f"redis://127.0.0.1:{replica_of(redis_sentinels)}/0")
        try:
            await store.open()  # reading works on a replica
            with pytest.raises(da.RedisConfigurationError, match=r"ReadOnlyError.*primary"):
                await store.write([event(reference(), "READ")], time.time())
        finally:
            await store.aclose()

    async def test_an_unreachable_redis_is_waited_for_only_max_redis_wait(self) -> None:
        (port,) = free_ports(1)
        limiter = da.RedisRateLimiter(
            f"redis://127.0.0.1:{port}/0", requests_per_second=5, max_redis_wait=0.5
        )
        try:
            async with asyncio.timeout(10):
                with pytest.raises(da.RedisUnavailableError, match="max_redis_wait"):
                    await limiter.acquire()
        finally:
            await limiter.aclose()


class TestAClientYouBuilt:
    async def test_a_cluster_client_is_used_and_left_open(
        self, server: FakeDispatchServer, redis_cluster: Cluster, prefix: str
    ) -> None:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster.ports[1])
        try:
            async with session_for(
                server,
                token_store=da.RedisTokenStore(client, key_prefix=prefix),
                rate_limiter=da.RedisRateLimiter(client, requests_per_second=50, key_prefix=prefix),
            ) as session:
                result = await session.send_basic(numbers(3), text="hi")
            assert result.ok
            assert await client.exists(f"{{{prefix}}}token") == 1
            assert await client.ping()  # the caller's client: not closed by the session
        finally:
            await client.aclose()

    async def test_sentinels_master_for_client_is_used(
        self, server: FakeDispatchServer, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        sentinel = redis.asyncio.sentinel.Sentinel(
            [("127.0.0.1", p) for p in redis_sentinels.sentinels]
        )
        client = sentinel.master_for(redis_sentinels.service)
        try:
            async with session_for(
                server, token_store=da.RedisTokenStore(client, key_prefix=prefix)
            ) as session:
                await session.send_basic(numbers(2), text="hi")
            assert await client.exists(f"{prefix}token") == 1
        finally:
            await client.aclose()
            for node in sentinel.sentinels:
                await node.aclose()


class TestSentinelURLs:
    def test_a_sentinel_url_is_read_whole(self) -> None:
        address = da.parse_sentinel_url(
            "rediss+sentinel://app:pa%40ss@10.0.0.1:26380,10.0.0.2/mymaster/3?ssl_ca_certs=/ca.pem"
        )
        assert address == da.SentinelAddress(
            sentinels=(("10.0.0.1", 26380), ("10.0.0.2", 26379)),
            service="mymaster",
            db=3,
            username="app",
            password="pa@ss",
            tls=True,
            ssl_ca_certs="/ca.pem",
        )
        assert "pa@ss" not in repr(address)

    @pytest.mark.parametrize(
        "url",
        ["redis+sentinel://h:1", "redis+sentinel://h:x/m", "redis://h/m", "redis+sentinel://h/m/x"],
    )
    def test_a_malformed_sentinel_url_is_refused(self, url: str) -> None:
        with pytest.raises(da.ConfigurationError):
            da.parse_sentinel_url(url)

    async def test_a_sentinel_url_shares_the_token(
        self, server: FakeDispatchServer, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        for _ in range(2):
            async with session_for(
                server, token_store=da.RedisTokenStore(redis_sentinels.url, key_prefix=prefix)
            ) as session:
                await session.send_basic(numbers(1), text="hi")
        assert server.stats.token_calls == 1


class TestTLS:
    @pytest.mark.parametrize("how", ["parameter", "query"])
    async def test_rediss_with_a_private_ca(
        self, server: FakeDispatchServer, tls_redis: TlsRedis, prefix: str, how: str
    ) -> None:
        def store() -> da.RedisTokenStore:
            if how == "parameter":
                return da.RedisTokenStore(
                    tls_redis.url, key_prefix=prefix, ssl_ca_certs=str(tls_redis.ca_file)
                )
            url = f"{tls_redis.url}?ssl_ca_certs={tls_redis.ca_file}"
            return da.RedisTokenStore(url, key_prefix=prefix)

        for _ in range(2):
            async with session_for(server, token_store=store()) as session:
                await session.send_basic(numbers(1), text="hi")
        assert server.stats.token_calls == 1

    def test_a_ca_without_tls_is_refused(self) -> None:
        with pytest.raises(da.ConfigurationError, match="rediss"):
            da.RedisTokenStore("redis://127.0.0.1/0", ssl_ca_certs="/ca.pem")


async def mid_send(
    sending: asyncio.Future[da.DispatchResult], fail_over: Callable[[], object]
) -> da.DispatchResult:
    """*sending*'s result, *fail_over* run (in a thread) once it has begun and done before
    it ends."""
    await asyncio.sleep(0.2)
    await asyncio.to_thread(fail_over)
    assert not sending.done(), "the send ended before the failover did: nothing was tested"
    return await sending


class TestFailover:
    async def test_a_cluster_failover_mid_send_costs_at_most_one_token_call(
        self, server: FakeDispatchServer, redis_cluster: Cluster, prefix: str
    ) -> None:
        limiter = da.RedisRateLimiter(redis_cluster.url, requests_per_second=40, key_prefix=prefix)
        async with session_for(
            server,
            token_store=da.RedisTokenStore(redis_cluster.url, key_prefix=prefix),
            rate_limiter=limiter,
        ) as session:
            sending = asyncio.ensure_future(
                session.send_basic(numbers(40), text="hi", chunk_size=1)
            )
            primary = redis_cluster.primary_for(f"{{{prefix}}}token")
            result = await mid_send(sending, lambda: redis_cluster.fail_over(primary))
        assert result.ok
        assert server.stats.token_calls <= 2
        async with redis.asyncio.RedisCluster(host="127.0.0.1", port=primary) as admin:
            assert await admin.exists(f"{{{prefix}}}token") == 1  # shared, on the new primary
        assert sorted(server.stats.received.values()) == [1] * 40  # each number once

    async def test_a_sentinel_failover_mid_send_costs_at_most_one_token_call(
        self, server: FakeDispatchServer, redis_sentinels: SentinelSet, prefix: str
    ) -> None:
        url = redis_sentinels.url
        async with session_for(
            server,
            token_store=da.RedisTokenStore(url, key_prefix=prefix),
            rate_limiter=da.RedisRateLimiter(url, requests_per_second=40, key_prefix=prefix),
        ) as session:
            sending = asyncio.ensure_future(
                session.send_basic(numbers(80), text="hi", chunk_size=1)
            )
            result = await mid_send(sending, redis_sentinels.fail_over)
        assert result.ok
        assert server.stats.token_calls <= 2
        assert sorted(server.stats.received.values()) == [1] * 80  # each number once

"""A command written on a connection closed underneath it is Redis failing for a moment.

A Cluster client closes its nodes' connections when a ``MOVED`` makes it read the
topology again (every failover) while the fleet's other tasks write on them; redis-py
then raised ``AttributeError`` (issue 3546) and a worker of ``benchmarks/chaos.py
--cluster`` exited. On Python 3.11 redis-py's write runs one turn of the event loop
after its check that the connection is open; later Pythons write at once, so there the
write goes through before the close and the test shows only that nothing else breaks.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
import redis.exceptions

from dispatch_async import RedisConnection


def unconnected(client: Any) -> Any:
    """A new connection as *client* makes them (for a Cluster, to a node it found)."""
    if isinstance(client, redis.asyncio.RedisCluster):
        node = client.get_default_node()
        return node.connection_class(**node.connection_kwargs)
    return client.connection_pool.make_connection()


class TestAConnectionClosedUnderACommand:
    async def test_the_write_fails_as_a_connection_error(self, any_redis: str) -> None:
        connection = RedisConnection(any_redis)
        try:
            raw = unconnected(await connection.client())
            await raw.connect()
            writing = asyncio.create_task(raw.send_packed_command(raw.pack_command("PING")))
            await asyncio.sleep(0)  # one turn: the write checked the connection is open
            await raw.disconnect(nowait=True)  # as a Cluster re-reading its topology does
            (outcome,) = await asyncio.gather(writing, return_exceptions=True)
            if outcome is not None:  # closed before the write: Redis failing, said so
                assert isinstance(outcome, redis.exceptions.ConnectionError), repr(outcome)
                assert "closed while a command was written" in str(outcome)
        finally:
            await connection.aclose()

    async def test_a_client_given_by_the_caller_is_left_as_built(self, redis_server: str) -> None:
        given = redis.asyncio.Redis.from_url(redis_server)
        try:
            connection = RedisConnection(given)
            assert await connection.client() is given
            assert given.connection_pool.connection_class is redis.asyncio.Connection
        finally:
            await given.aclose()

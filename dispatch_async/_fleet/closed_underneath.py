"""A command written on a connection that redis-py closed underneath it is an outage.

redis-py checks that a connection is open, then writes to it; on Python 3.11 its write
timeout runs the write as a task of its own, one turn of the event loop later. If another
task closes the connection in that turn, the write fails with ``AttributeError`` (its
writer is gone) instead of a ``ConnectionError`` (redis-py issue 3546, fixed upstream by
pull request 4288 after redis-py 8.1). A Cluster client closes its nodes' connections
whenever a ``MOVED`` makes it read the topology again, as in every failover, while the
fleet's other tasks write on them: ``benchmarks/chaos.py --cluster`` saw a worker exit
on it. The connections the fleet makes raise ``ConnectionError`` there instead, which
every fleet feature already treats as Redis failing for a moment.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["guard_client", "guarded"]


@functools.cache
def guarded(connection_class: type) -> type:
    """*connection_class* (a redis-py asyncio connection class), writing as described."""
    import redis.exceptions

    class Guarded(connection_class):  # type: ignore[misc]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            try:
                await super().send_packed_command(command, check_health)
            except (AttributeError, TypeError) as exc:
                if self.is_connected:  # not closed underneath: a fault of another kind
                    raise
                raise redis.exceptions.ConnectionError(
                    "the connection to Redis was closed while a command was written"
                ) from exc

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{connection_class.__name__}"
    return Guarded


def guard_client(client: Any) -> Any:
    """*client* (a single Redis's or a Cluster's, made here, not yet connected), its
    connections made as `guarded` ones."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:  # a single Redis (or a Sentinel's primary)
        pool.connection_class = guarded(pool.connection_class)
        return client
    nodes = client.nodes_manager  # a Cluster: the nodes it knows, and those it will find
    kwargs = nodes.connection_kwargs  # RedisCluster always names its connection class
    kwargs["connection_class"] = guarded(kwargs["connection_class"])
    for node in nodes.startup_nodes.values():
        node.connection_class = guarded(node.connection_class)
    return client

"""The queue's writes that must outlive a failover: a worker's claim and its records.

A Redis primary answers a write before its replica has it, so a failover can lose it.
The sharp case is a Sentinel failover of a primary that is still up (``SENTINEL
FAILOVER``, or a network split): the old primary goes on taking writes from the
connections made before, for up to ten seconds until the sentinels make it a replica,
and then drops them all. A chunk claimed only there would be sent again by a worker on
the new primary; a chunk finished only there would be recorded maybe_sent.

So each such write is sent with ``WAIT`` for the primary's online replicas on the same
connection (one pipeline, one round trip). If they do not confirm it, or the connection
is cut, the client drops its idle connections (a Sentinel client then asks the sentinels
for the primary again) and looks at the server it now reaches (``INFO``): another server
(its ``run_id``) means a failover, and the write runs again there; the same one is asked
how many replicas it has online now (a primary that lost its replica has none to wait
for). After five unconfirmed tries the write is taken as it is, with a warning. A
Cluster's coordinated failover (``CLUSTER FAILOVER``) loses no write, and ``WAIT``
cannot follow a Cluster's routing: its writes are sent as they are.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine, Sequence
from typing import Any, Final, TypeVar

import attrs

from .link import QueueRedis, outage_errors

__all__ = ["Written", "primary_id", "write_durably"]

log = logging.getLogger("dispatch_async")

T = TypeVar("T")

#: Milliseconds a write waits for a replica to confirm it (a healthy link takes one).
WAIT_MS: Final = 1000
#: Writes sent before one is given up as unconfirmed (each waits ``WAIT_MS`` at most).
_TRIES: Final = 5
#: Seconds a client's view of its primary is kept before it is looked at again (a
#: replica added or back is waited for from then on).
_LOOK_EVERY: Final = 10.0
#: Seconds the sentinels may disagree on the primary (a failover only some of them have
#: heard of) before the one redis-py asks is believed.
_AGREE_WITHIN: Final = 5.0
#: Seconds a sentinel has to answer when all are asked (one that hangs is passed over).
_SENTINEL_ANSWER: Final = 1.0
#: Seconds a write may take in all, tries, looks and waits for the sentinels included:
#: then it fails as Redis failing does (a chunk's entry is left, and taken over).
WRITE_WITHIN: Final = 20.0


@attrs.frozen
class Written:
    """A script's reply, and whether the write ran again on a new primary (a failover
    happened since the first try, which the first try may or may not have reached)."""

    reply: Any
    moved: bool = False


@attrs.frozen
class _Server:
    """The primary a client reaches, as last seen."""

    run_id: bytes | str
    replicas: int
    #: When it was seen (the event loop's clock).
    seen: float


#: What each client's primary was last seen as; dropped with the client.
_SERVERS: weakref.WeakKeyDictionary[Any, _Server] = weakref.WeakKeyDictionary()


async def write_durably(
    redis: QueueRedis, script: Any, keys: Sequence[str], args: Sequence[Any]
) -> Written:
    """Run *script* (registered with *redis*) and return once the primary's replicas have
    its write, or it has none online; run it again on the new primary after a failover.

    The script must be safe to run twice by the same writer (a retry after a lost reply);
    the reply kept is the first one from the server that has the write.
    """
    if _is_cluster(redis):
        return Written(await script(keys=keys, args=args))
    return await _within(_write(redis, script, keys, args))


async def _write(
    redis: QueueRedis, script: Any, keys: Sequence[str], args: Sequence[Any]
) -> Written:
    server = _SERVERS.get(redis)
    if server is None or asyncio.get_running_loop().time() - server.seen > _LOOK_EVERY:
        server = await _look(redis)
    moved = False
    kept: Any = None
    for attempt in range(_TRIES):
        if attempt:  # the last try was not confirmed, or was cut: look again first
            await redis.connection_pool.disconnect(inuse_connections=False)
            before, server = server, await _look(redis)
            if server.run_id != before.run_id:
                log.warning("the queue's Redis failed over: writing again on the new primary")
                moved, kept = True, None
        if not server.replicas:
            reply = await script(keys=keys, args=args)
            return Written(reply if kept is None else kept, moved)
        try:
            reply, confirmed = await _write_and_wait(redis, script, keys, args, server.replicas)
        except outage_errors():
            if attempt == _TRIES - 1:
                raise
            log.info("a write to the queue's Redis was cut (an old primary demoted closes them)")
            continue
        kept = reply if kept is None else kept
        if confirmed >= server.replicas:
            return Written(kept, moved)
        log.info("a write to the queue's Redis was not confirmed by its replicas")
    log.warning(
        "no replica of the queue's Redis confirmed a write within %.0f s: going on; a "
        "failover now could lose it",
        _TRIES * WAIT_MS / 1000,
    )
    return Written(kept, moved)


async def primary_id(redis: QueueRedis) -> bytes | str | None:
    """The run id of the primary *redis* reaches now (behind Sentinel, the one the
    sentinels name); None on a Cluster. Two that differ mean a failover (or a restart)
    in between: writes made meanwhile may be gone."""
    return None if _is_cluster(redis) else (await _within(_look(redis))).run_id


async def _within(call: Coroutine[Any, Any, T]) -> T:
    """*call*'s result, or redis-py's ``TimeoutError`` after ``WRITE_WITHIN`` seconds."""
    from redis import exceptions

    try:
        async with asyncio.timeout(WRITE_WITHIN):
            return await call
    except TimeoutError:
        raise exceptions.TimeoutError(
            f"the queue's Redis did not take a write within {WRITE_WITHIN:.0f} s"
        ) from None


async def _write_and_wait(
    redis: QueueRedis, script: Any, keys: Sequence[str], args: Sequence[Any], replicas: int
) -> tuple[Any, int]:
    """The script's reply and how many replicas confirmed it: one round trip (``EVALSHA``
    and ``WAIT`` pipelined on one connection; the script loaded first if Redis lacks it)."""
    from redis import exceptions

    async def send() -> tuple[Any, int]:
        async with redis.pipeline(transaction=False) as pipe:
            # EVALSHA itself, not the script object: that one makes the pipeline ask
            # SCRIPT EXISTS first, a round trip more and a command the ACL need not allow.
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.wait(replicas, WAIT_MS)
            reply, confirmed = await pipe.execute()
        return reply, int(confirmed)

    try:
        return await send()
    except exceptions.NoScriptError:  # a new primary: the script did not run
        await redis.script_load(script.script)
        return await send()


async def _look(redis: QueueRedis) -> _Server:
    """The server *redis* reaches now: its ``run_id`` and replicas online.

    Behind Sentinel the sentinels are asked for the primary first (`_ask_sentinels`): if
    it changed, the client drops its idle connections, and this looks at the new
    primary, not at the old one that still answers. On a primary, ``WAIT 0 0`` checks
    that the user may wait (before any write that would then go unconfirmed).
    """
    pool = _sentinel_pool(redis)
    if pool is not None:
        await _ask_sentinels(pool)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.info("server")
        pipe.info("replication")
        found, replication = await pipe.execute()
    if replication.get("role") == "master":  # a replica refuses WAIT; a write, READONLY
        await redis.wait(0, 0)
    online = sum(
        1
        for name, replica in replication.items()
        if name.startswith("slave") and isinstance(replica, dict)
        and replica.get("state") == "online"
    )  # fmt: skip
    server = _SERVERS[redis] = _Server(found["run_id"], online, asyncio.get_running_loop().time())
    return server


async def _ask_sentinels(pool: Any) -> None:
    """Make *pool* use the primary the sentinels settled on.

    During a failover a sentinel still names the old primary (flagged
    ``failover_in_progress``) though its replica may take writes already, and right
    after it only some sentinels know of it, while redis-py asks the one that answered
    it last. So this waits (``_AGREE_WITHIN`` at most) until no failover is in progress
    and the sentinel redis-py asks names the primary of the newest configuration (the
    highest epoch). A change of primary makes the pool drop its idle connections.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _AGREE_WITHIN
    while True:
        found = await pool.get_master_address()
        newest = await _newest_primary(pool)
        if tuple(found) == newest or loop.time() >= deadline:
            return
        await asyncio.sleep(0.1)


async def _newest_primary(pool: Any) -> tuple[str, int] | None:
    """The primary named with the highest configuration epoch by the sentinels that
    answer within ``_SENTINEL_ANSWER`` (all asked at once); None while one of them is
    failing it over, or if none answers."""
    from redis import exceptions

    async def state_of(sentinel: Any) -> Any:
        try:
            async with asyncio.timeout(_SENTINEL_ANSWER):
                return (await sentinel.sentinel_masters()).get(pool.service_name)
        except (TimeoutError, exceptions.ConnectionError, exceptions.TimeoutError, OSError):
            return None

    states = await asyncio.gather(*map(state_of, pool.sentinel_manager.sentinels))
    known = [state for state in states if state]
    if not known or any("failover_in_progress" in state["flags"] for state in known):
        return None
    newest = max(known, key=lambda state: state["config-epoch"])
    return newest["ip"], int(newest["port"])


def _sentinel_pool(client: QueueRedis) -> Any:
    """*client*'s redis-py ``SentinelConnectionPool``, if it has one (else None)."""
    pool = client.connection_pool
    return pool if hasattr(pool, "get_master_address") else None


def _is_cluster(client: QueueRedis) -> bool:
    import redis.asyncio

    return isinstance(client, redis.asyncio.RedisCluster)

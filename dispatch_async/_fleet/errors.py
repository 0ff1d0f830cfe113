"""What a Redis answer that no wait can heal means, said as what to change.

A Cluster node's ``MOVED``, a replica's ``READONLY``, the ACL's ``NOPERM``... were taken
for an outage ("unreachable; waiting until it is back"): they now end the wait at once
with a `RedisConfigurationError` naming the cause and the fix.
"""

from __future__ import annotations

from .._exceptions import RedisConfigurationError

__all__ = ["misconfiguration"]

_GUIDE = "docs/guides/fleet.md, Which Redis"


#: (redis-py's error class name, the answer's first word, what it means and what to do).
_ANSWERS = (
    (
        "AskError",  # MovedError is one
        ("MOVED", "ASK"),
        "it is a node of a Redis Cluster, used as a single Redis. Give its URL to a fleet "
        "feature (the Cluster is detected with INFO: allow +info) or pass a "
        "redis.asyncio.RedisCluster",
    ),
    (
        "ClusterCrossSlotError",
        ("CROSSSLOT",),
        "keys used together are in different hash slots of a Redis Cluster: let the fleet "
        "detect the Cluster (allow +info), or pass a redis.asyncio.RedisCluster",
    ),
    (
        "ReadOnlyError",
        ("READONLY",),
        "it is a replica, which cannot be written: use the primary's address, or a "
        "redis+sentinel:// URL (or Sentinel's master_for client) to follow failovers",
    ),
    (
        "NoPermissionError",
        ("NOPERM",),
        "the Redis user may not run a command or use a key the fleet needs: grant the ACL "
        "the fleet guide lists, on the keys of your key_prefix",
    ),
    (
        "NoScriptError",
        ("NOSCRIPT",),
        "it forgot a Lua script it was just given: a proxy in front of several Redis "
        "servers? Connect to Redis itself, or its Cluster",
    ),
)


def misconfiguration(exc: BaseException, where: str) -> RedisConfigurationError | None:
    """The `RedisConfigurationError` *exc* from the Redis at *where* stands for, or None
    (an outage, or not an answer of Redis's)."""
    import redis.exceptions

    for name, words, advice in _ANSWERS:
        if isinstance(exc, getattr(redis.exceptions, name)) or str(exc).startswith(words):
            said = f"{type(exc).__name__}: {exc}"
            return RedisConfigurationError(f"Redis at {where} answered {said}: {advice} ({_GUIDE})")
    return None

"""The fleet: many processes sending one job as one client, through one Redis.

One job per module: `addresses` (the URL forms, Sentinel's among them), `errors` (what an
answer no wait can heal means), `connection` (the optional redis-py import, the client,
a Cluster detected, the keys' hash tags), `token_store` (one access token for every
process), `schedule` (the send times every request reserves), `learned_rate` (the rate
learned from the service's answers, shared) and `rate_limiter` (``requests_per_second``
for the whole fleet, on the two before).
The command line's queue (``dispatch-async worker``) is built on these public names.
"""

from __future__ import annotations

from .addresses import SentinelAddress, parse_sentinel_url
from .connection import DEFAULT_KEY_PREFIX, RedisConnection
from .rate_limiter import RedisRateLimiter
from .token_store import RedisTokenStore

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "RedisConnection",
    "RedisRateLimiter",
    "RedisTokenStore",
    "SentinelAddress",
    "parse_sentinel_url",
]

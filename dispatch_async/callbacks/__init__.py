"""Delivery tracking: the service's callbacks, read, stored and matched to your sends.

The service POSTs an event to the request's ``callback`` URL for every step of a
message (sent, delivered, read, a reply, a failure). `parse_event` reads one
(`DeliveryEvent`, its meaning a `DeliveryStatus`); a `DeliveryTracker` stores them in a
`DeliveryStore` (`SQLiteDeliveryStore`, `RedisDeliveryStore`) and answers what each
message's state is (`MessageState`). A `CallbackReceiver` is the endpoint the service
posts to: mount it with `asgi_app` (FastAPI, Starlette) or `aiohttp_handler`, or run
it on its own server (`CallbackServer`).
`resolve_maybe_sent` turns ``maybe_sent`` recipients the callbacks confirm into sent ones.
"""

from ._aiohttp import aiohttp_handler
from ._asgi import asgi_app
from ._events import DeliveryEvent, parse_event
from ._receiver import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, CallbackReceiver
from ._redis_store import DEFAULT_LOG_LENGTH, RedisDeliveryStore
from ._resolve import MaybeSentResolution, resolve_maybe_sent
from ._serve import CallbackServer
from ._sqlite import SQLiteDeliveryStore
from ._status import DeliveryStatus
from ._store import DeliveryStore, MessageState
from ._tracker import DEFAULT_MAX_BATCH, DEFAULT_POLL_INTERVAL, DeliveryTracker

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_LOG_LENGTH",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_POLL_INTERVAL",
    "CallbackReceiver",
    "CallbackServer",
    "DeliveryEvent",
    "DeliveryStatus",
    "DeliveryStore",
    "DeliveryTracker",
    "MaybeSentResolution",
    "MessageState",
    "RedisDeliveryStore",
    "SQLiteDeliveryStore",
    "aiohttp_handler",
    "asgi_app",
    "parse_event",
    "resolve_maybe_sent",
]

"""dispatch-async: an asyncio client for Pontaltech's Pointer RCS API v3.

Bulk RCS Business Messaging, with SMS fallback for phones without RCS.

Start with ``DispatchSession`` (``DispatchClient`` from synchronous code);
``dispatch_async.testing`` has a local simulator.
"""

from ._batch_settings import BatchOptions, BatchSettings
from ._blocking import DispatchClient
from ._clock import MONOTONIC, Clock
from ._e164 import to_e164
from ._endpoints import BASIC_TEXT_MAX_BYTES, basic_text_warning
from ._exceptions import (
    AuthenticationError,
    CallbackError,
    ClientStatusError,
    ConfigurationError,
    ConnectError,
    ConnectionLostError,
    DeadlineExceededError,
    DeliveryEventError,
    DeliveryStoreError,
    DispatchError,
    EventLoopError,
    FailedRecipientsError,
    ForbiddenError,
    InputError,
    InvalidRecipientError,
    MalformedResponseError,
    MissingFromResponseError,
    NetworkConfigurationError,
    RateLimitedError,
    RedirectError,
    RedisConfigurationError,
    RedisUnavailableError,
    RequestTimeoutError,
    RequestTooLargeError,
    ResponseTooLargeError,
    ServerStatusError,
    ServiceUnavailableError,
    SessionClosedError,
    StatusError,
    TokenUnavailableError,
    TransportError,
    UnauthorizedError,
    UnknownArgumentError,
)
from ._fleet import (
    DEFAULT_KEY_PREFIX,
    RedisConnection,
    RedisRateLimiter,
    RedisTokenStore,
    SentinelAddress,
    parse_sentinel_url,
)
from ._models import (
    Fallback,
    InvalidMessage,
    InvalidMessages,
    Recipient,
    ValidMessage,
    ValidMessages,
)
from ._network import ssl_context
from ._outcome import DispatchResult, FailedRecipient
from ._plan import PlannedChunk, plan
from ._retry import RetryPolicy
from ._screen import DUPLICATE as DUPLICATE_REASON
from ._screen import EXCLUDED as EXCLUDED_REASON
from ._session import DispatchSession
from ._signals import on_stop_signals
from ._version import __version__

__all__ = [
    "BASIC_TEXT_MAX_BYTES",
    "DEFAULT_KEY_PREFIX",
    "DUPLICATE_REASON",
    "EXCLUDED_REASON",
    "MONOTONIC",
    "AuthenticationError",
    "BatchOptions",
    "BatchSettings",
    "CallbackError",
    "ClientStatusError",
    "Clock",
    "ConfigurationError",
    "ConnectError",
    "ConnectionLostError",
    "DeadlineExceededError",
    "DeliveryEventError",
    "DeliveryStoreError",
    "DispatchClient",
    "DispatchError",
    "DispatchResult",
    "DispatchSession",
    "EventLoopError",
    "FailedRecipient",
    "FailedRecipientsError",
    "Fallback",
    "ForbiddenError",
    "InputError",
    "InvalidMessage",
    "InvalidMessages",
    "InvalidRecipientError",
    "MalformedResponseError",
    "MissingFromResponseError",
    "NetworkConfigurationError",
    "PlannedChunk",
    "RateLimitedError",
    "Recipient",
    "RedirectError",
    "RedisConfigurationError",
    "RedisConnection",
    "RedisRateLimiter",
    "RedisTokenStore",
    "RedisUnavailableError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "ResponseTooLargeError",
    "RetryPolicy",
    "SentinelAddress",
    "ServerStatusError",
    "ServiceUnavailableError",
    "SessionClosedError",
    "StatusError",
    "TokenUnavailableError",
    "TransportError",
    "UnauthorizedError",
    "UnknownArgumentError",
    "ValidMessage",
    "ValidMessages",
    "__version__",
    "basic_text_warning",
    "on_stop_signals",
    "parse_sentinel_url",
    "plan",
    "ssl_context",
    "to_e164",
]

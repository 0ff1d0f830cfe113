"""The one error hierarchy of dispatch-async.

Every exception the SDK raises on purpose is a ``DispatchError``::

    DispatchError
    ├── InputError (also ValueError)            bad arguments, found before anything is sent
    │   ├── InvalidRecipientError               a malformed recipient, with its position
    │   ├── UnknownArgumentError (also TypeError)  a keyword the method does not take
    │   └── ConfigurationError                  a bad base URL, setting or environment variable
    │       └── RedisConfigurationError         the fleet's Redis answered that a setting is
    │                                           wrong (a Cluster not detected, a replica, an ACL)
    ├── SessionClosedError (also RuntimeError)  the session is not open
    ├── EventLoopError (also RuntimeError)      used from an event loop it was not opened on,
    │                                           or a DispatchClient called in a running loop
    ├── AuthenticationError                     the secret was rejected: retrying cannot help
    ├── TransportError                          the request did not complete
    │   ├── ConnectError                        never reached the service (maybe_sent=False)
    │   │   ├── TokenUnavailableError           no access token could be had: the job stops
    │   │   ├── NetworkConfigurationError       will not heal: a host name that does not
    │   │   │                                   resolve, a certificate that fails, TLS to a
    │   │   │                                   plain port, a proxy that refuses, a base URL
    │   │   │                                   with no token endpoint (404); raised at once
    │   │   │                                   (never retried), and the job stops
    │   │   └── RedisUnavailableError           the fleet's Redis stayed unreachable for longer
    │   │                                       than a request may wait for it
    │   ├── ConnectionLostError                 dropped after the request was written
    │   ├── RequestTimeoutError (also TimeoutError)
    │   └── ResponseTooLargeError
    ├── StatusError                             not a 200; carries status, headers, body
    │   ├── RedirectError                       3xx: never followed
    │   ├── ClientStatusError                   4xx
    │   │   ├── UnauthorizedError               401 to a fresh token (also an
    │   │   │                                   AuthenticationError): the job stops
    │   │   ├── ForbiddenError                  403: this caller is refused, most likely
    │   │   │                                   its IP address is not on the account's
    │   │   │                                   allow-list (also an AuthenticationError)
    │   │   ├── RequestTooLargeError            413: a body larger than the server takes
    │   │   │                                   (the SDK sends its recipients in parts)
    │   │   └── RateLimitedError                429
    │   └── ServerStatusError                   5xx
    │       └── ServiceUnavailableError         503
    ├── MalformedResponseError                  a 200 that is not the documented shape
    ├── MissingFromResponseError                a 200 that leaves out a recipient we sent
    ├── DeadlineExceededError (also TimeoutError)
    ├── CallbackError                           a callback you passed raised (the __cause__)
    ├── DeliveryEventError (also ValueError)    a delivery callback's body that cannot be an
    │                                           event; ``status`` is the receiver's answer
    ├── DeliveryStoreError                      the delivery store could not write or read
    │                                           (its own error is the __cause__)
    └── FailedRecipientsError                   raise_for_failures() found failed recipients

Every error has ``maybe_sent``: whether the service may have acted on the request that
failed. It decides what is safe to send again. An error that stops a ``send_*`` job part
way (a rejected secret, a malformed recipient in a stream) carries ``result``: the
partial result, accounting for every recipient read so far.

``DispatchError`` and ``FailedRecipientsError`` are defined with the result they carry,
in `_outcome`; they are re-exported here with the rest of the tree.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from ._outcome import DispatchError, FailedRecipientsError
from ._redaction import redacted_excerpt, service_reason

__all__ = [
    "AuthenticationError",
    "CallbackError",
    "ClientStatusError",
    "ConfigurationError",
    "ConnectError",
    "ConnectionLostError",
    "DeadlineExceededError",
    "DeliveryEventError",
    "DeliveryStoreError",
    "DispatchError",
    "EventLoopError",
    "FailedRecipientsError",
    "ForbiddenError",
    "InputError",
    "InvalidRecipientError",
    "MalformedResponseError",
    "MissingFromResponseError",
    "NetworkConfigurationError",
    "RateLimitedError",
    "RedirectError",
    "RedisConfigurationError",
    "RedisUnavailableError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "ResponseTooLargeError",
    "ServerStatusError",
    "ServiceUnavailableError",
    "SessionClosedError",
    "StatusError",
    "TokenUnavailableError",
    "TransportError",
    "UnauthorizedError",
    "UnknownArgumentError",
    "status_error",
]

#: How much of an error body is kept: enough to read, never a whole page.
BODY_EXCERPT_CHARS = 500


class InputError(DispatchError, ValueError):
    """An argument is wrong; nothing was sent."""


class InvalidRecipientError(InputError, TypeError):
    """A recipient is malformed; ``position`` is its index in the caller's input."""

    position: int
    """The recipient's index in the caller's input."""
    problem: str
    """What is wrong with it."""

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"recipient at position {position}: {problem}")
        self.position = position
        self.problem = problem


class UnknownArgumentError(InputError, TypeError):
    """A keyword argument the method does not take: the message names the method and,
    when one is close, the argument meant ("did you mean 'chunk_size'?")."""


class ConfigurationError(InputError):
    """A session setting (base URL, secret, environment variable) is unusable."""


class RedisConfigurationError(ConfigurationError):
    """Redis answered that the fleet's settings are wrong: waiting cannot help.

    A ``MOVED``/``ASK``/``CROSSSLOT`` (a Redis Cluster used as one Redis), ``READONLY`` (a
    replica), ``NOPERM`` (the ACL), ``NOSCRIPT`` (a proxy that does not keep scripts). The
    message says which, and what to change.
    """


class SessionClosedError(DispatchError, RuntimeError):
    """The session was used before ``async with`` / after ``close()``."""


class EventLoopError(DispatchError, RuntimeError):
    """The session was used from an event loop other than the one it was opened on, or
    a `DispatchClient` was called in a thread running an event loop (it would stall it)."""


class AuthenticationError(DispatchError):
    """The service refused our credentials: retrying will not help."""


class TransportError(DispatchError):
    """The HTTP exchange did not complete."""


class ConnectError(TransportError):
    """No connection was established: the service cannot have acted."""

    maybe_sent = False


class TokenUnavailableError(ConnectError):
    """The token endpoint could not be reached, or kept failing, after its own retries.

    Nothing was sent for want of a token, and a job stops here; unlike
    ``AuthenticationError``, the credentials were not refused.
    """


class NetworkConfigurationError(ConnectError):
    """The way to the service is set up so that no request can get through: retrying
    cannot help, so none is made, and a job stops here.

    A host name that does not resolve, a certificate that fails verification, TLS spoken
    to a port that does not speak it, a proxy that refuses to connect (``CONNECT``
    answered 4xx: 403, 407), a base URL the token endpoint is not under (it answered 404:
    a prefix such as ``/rcs`` missing, or ``/api/v3`` given). Nothing reached the service
    (``maybe_sent`` False). The message names the host and the proxy, never the proxy's
    credentials. Unlike `TokenUnavailableError`, waiting will not help: someone must fix
    the configuration.
    """

    host: str | None
    """The host the request was for (the service's)."""
    proxy: str | None
    """The proxy it went through, as ``host:port``; None without one."""

    def __init__(self, message: str, *, host: str | None = None, proxy: str | None = None) -> None:
        super().__init__(message)
        self.host = host
        self.proxy = proxy


class RedisUnavailableError(ConnectError):
    """The fleet's Redis stayed unreachable for longer than a request may wait for it.

    Nothing was sent: the shared rate limit could not be asked for a turn.
    """


class ConnectionLostError(TransportError):
    """The connection broke after the request may have been written."""

    maybe_sent = True


class RequestTimeoutError(TransportError, TimeoutError):
    """No complete answer in time; the request may have been acted on."""

    maybe_sent = True


class ResponseTooLargeError(TransportError):
    """The answer was larger than the SDK is willing to read."""

    maybe_sent = True


class StatusError(DispatchError):
    """The service answered with a status other than 200.

    ``body`` is a truncated excerpt of what it said, safe to log.
    """

    status: int
    """The HTTP status."""
    headers: Mapping[str, str]
    """The answer's headers (names case-insensitive)."""
    body: str
    """An excerpt of the answer's body, truncated and with secrets masked."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        headers: Mapping[str, str] | None = None,
        body: str = "",
        maybe_sent: bool | None = None,
    ) -> None:
        super().__init__(message, maybe_sent=maybe_sent)
        self.status = status
        # Case-insensitive, as HTTP header names are.
        self.headers: Mapping[str, str] = CIMultiDictProxy(CIMultiDict(headers or {}))
        self.body = body


class RedirectError(StatusError):
    """A 3xx: the SDK never re-sends a dispatch somewhere else."""


class ClientStatusError(StatusError):
    """A 4xx: the service refused the request without acting on it."""


class UnauthorizedError(ClientStatusError, AuthenticationError):
    """A 401 that a fresh token did not cure: the service refuses this client."""


class ForbiddenError(ClientStatusError, AuthenticationError):
    """A 403: the service refuses this caller, whatever the token or secret.

    The service reports ``IP address is not allowed`` when the caller's address is not
    on the account's allow-list: the provider must add it. Retrying cannot help, so a
    job stops here, as for a refused secret.
    """

    @classmethod
    def for_status(cls, headers: Mapping[str, str], body: str = "") -> ForbiddenError:
        """The error for a 403 answer; *body* an excerpt already made safe to keep."""
        kept = {k: v for k, v in headers.items() if k.lower() in _SAFE_HEADERS}
        return cls(_FORBIDDEN, status=403, headers=kept, body=body)


_FORBIDDEN = (
    "the service refused this caller (HTTP 403): most likely this machine's IP address "
    "is not on the account's allow-list; ask the provider to add it"
)


class RequestTooLargeError(ClientStatusError):
    """A 413: the server (or a proxy before it, such as nginx's ``client_max_body_size``)
    refused the request's body as too large, without acting on it.

    A ``send_*`` call then sends the refused chunk's recipients again in smaller
    requests, down to one recipient each (`DispatchResult.split_to`); a recipient whose
    request alone is refused fails with this error, not sent.
    """

    request_bytes: int | None = None
    """The size of the refused request's body, in bytes (None if unknown)."""

    @classmethod
    def for_one_recipient(cls, refused: RequestTooLargeError) -> RequestTooLargeError:
        """The error of a recipient whose own request the server refused as too large."""
        size = "" if refused.request_bytes is None else f" ({refused.request_bytes:,} bytes)"
        error = cls(
            f"the server refused the request for this one recipient as too large{size}, "
            "HTTP 413: its vars are longer than the server takes (nginx: "
            "client_max_body_size); it was not sent",
            status=refused.status,
            headers=refused.headers,
            body=refused.body,
        )
        error.request_bytes = refused.request_bytes
        return error


class RateLimitedError(ClientStatusError):
    """A 429: the service is rate limiting this account."""

    retry_after: float | None = None
    """The wait the service asked for (Retry-After), in seconds; None if it gave none."""


class ServerStatusError(StatusError):
    """A 5xx: the service may have acted before it failed (except 503)."""

    maybe_sent = True


class ServiceUnavailableError(ServerStatusError):
    """A 503: the service says it did not act."""

    maybe_sent = False
    retry_after: float | None = None
    """The wait the service asked for (Retry-After), in seconds; None if it gave none."""


class MalformedResponseError(DispatchError):
    """A 200 whose body is not the documented shape: the service may have acted."""

    maybe_sent = True


class MissingFromResponseError(DispatchError):
    """A 200 that does not mention a recipient we sent: it may have been acted on."""

    maybe_sent = True


class DeadlineExceededError(DispatchError, TimeoutError):
    """The job's overall deadline passed before this recipient's request finished."""


class CallbackError(DispatchError):
    """A callback the caller passed (``before_send``) raised; ``__cause__`` is its error.

    The chunk it was called for was not sent, and the job stopped there.
    """


class DeliveryEventError(DispatchError, ValueError):
    """A delivery callback's body the receiver refuses: nothing of it is stored.

    ``status`` is what the receiver answers (400: not a JSON object, or no
    ``reference``; 413: larger than the receiver's limit). The message names the
    problem, never the body's content (it carries a phone number).
    """

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class DeliveryStoreError(DispatchError):
    """The delivery store (SQLite, Redis) failed; ``__cause__`` is its own error.

    An event whose write failed was not acknowledged: the service delivers it again.
    """


_STATUS_CLASSES: dict[int, type[StatusError]] = {
    401: UnauthorizedError,
    413: RequestTooLargeError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}


def status_error(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    retry_after: float | None = None,
    secrets: tuple[str, ...] = (),
) -> StatusError:
    """Build the error for a non-200 answer: the one place a status becomes a class.

    ``secrets`` are blanked out of the body excerpt, in case the service echoes them
    (in any standard encoding: see `_redaction`).
    """
    cls = _STATUS_CLASSES.get(status)
    if cls is None:
        if 300 <= status < 400:
            cls = RedirectError
        elif 400 <= status < 500:
            cls = ClientStatusError
        elif status >= 500:
            cls = ServerStatusError
        else:
            cls = StatusError
    excerpt = redacted_excerpt(body, secrets, BODY_EXCERPT_CHARS)
    if status == 403:
        return ForbiddenError.for_status(headers, excerpt)
    kept = {k: v for k, v in headers.items() if k.lower() in _SAFE_HEADERS}
    if cls is UnauthorizedError:
        message = "the service refused a fresh access token (HTTP 401)"
    elif 400 <= status < 500 and (reason := service_reason(body, secrets)):
        message = f"the service answered HTTP {status}: {reason}"  # why, for a log to show
    else:
        message = f"the service answered HTTP {status}"
    error = cls(message, status=status, headers=kept, body=excerpt)
    if isinstance(error, RateLimitedError | ServiceUnavailableError):
        error.retry_after = retry_after
    return error


# Only these answer headers are kept on errors: nothing that could carry a credential
# (not Location either: a redirect can carry a token in its query).
_SAFE_HEADERS = frozenset({"content-type", "content-length", "retry-after", "date", "x-request-id"})

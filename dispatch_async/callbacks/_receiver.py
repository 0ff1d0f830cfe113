"""``CallbackReceiver``: what every callback endpoint does, whatever the web framework.

The vendor documents no signature, so the endpoint authenticates with an unguessable
token in its URL (compared in constant time), and can restrict the callers' addresses.
Each refusal happens before anything is stored, and the 2xx comes only once the event
is durable: when the receiver dies first, the service's re-delivery covers it. The
framework adapters (``_asgi``, ``_aiohttp``) only move bytes in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import re
import secrets
from collections.abc import Collection
from typing import Final, NamedTuple

from .._exceptions import (
    ConfigurationError,
    DeliveryEventError,
    DeliveryStoreError,
    SessionClosedError,
)
from ._events import parse_event
from ._tracker import DeliveryTracker

__all__ = ["Answer", "CallbackReceiver", "error_body"]

log = logging.getLogger("dispatch_async.callbacks")

#: Largest callback body accepted: an event is well under 2 KiB.
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024
#: Seconds a caller has to send a whole body: a slow one holds a connection (slowloris).
DEFAULT_BODY_TIMEOUT: Final = 10.0
#: A shorter token could be guessed.
MIN_TOKEN_CHARS: Final = 16
#: What `new_token` makes (``secrets.token_urlsafe``), and all a URL path carries as is.
_URL_SAFE: Final = re.compile(r"[A-Za-z0-9_-]+")


class Answer(NamedTuple):
    """An HTTP answer: status and JSON body."""

    status: int
    body: bytes


_STORED: Final = Answer(200, b'{"status":"stored"}')
_NOT_FOUND: Final = Answer(404, b'{"error":"not found"}')
_FORBIDDEN: Final = Answer(403, b'{"error":"this address may not post callbacks"}')
_NOT_ALLOWED: Final = Answer(405, b'{"error":"POST only"}')
_TOO_LARGE: Final = Answer(413, b'{"error":"the body is larger than this receiver accepts"}')
_TOO_SLOW: Final = Answer(408, b'{"error":"the body did not arrive in time"}')
_UNAVAILABLE: Final = Answer(503, b'{"error":"not stored; deliver it again"}')


class CallbackReceiver:
    """Authenticates, checks and stores the service's callbacks into a tracker.

    Mount it with `asgi_app` (FastAPI, Starlette, any ASGI server) or `aiohttp_handler`;
    the callback URL you give the service ends with the token: `url` builds it.

    Args:
        tracker: where events go; open it before the first callback arrives.
        token: the secret last segment of the callback URL (`new_token` makes one):
            at least 16 characters of the URL-safe alphabet (letters, digits, ``-``
            and ``_``), the only ones a URL carries unchanged.
        previous_tokens: tokens also accepted, while the service still holds a URL
            being replaced (a rotation: see the delivery-tracking guide).
        allowed_ips: addresses or networks (``"203.0.113.0/24"``) that may post; None
            lets any address post. The address is the TCP peer's: behind a proxy, let
            the proxy restrict them.
        max_body_bytes: larger bodies get 413 unread.
        body_timeout: seconds to read a body in; a slower one gets 408. Headers are the
            web server's to bound: behind a proxy that enforces timeouts, on the Internet.

    Raises:
        ConfigurationError: a short token, one with a character outside the URL-safe
            alphabet, or an unreadable address.
    """

    def __init__(
        self,
        tracker: DeliveryTracker,
        *,
        token: str,
        previous_tokens: Collection[str] = (),
        allowed_ips: Collection[str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
    ) -> None:
        if isinstance(previous_tokens, str):
            raise ConfigurationError("previous_tokens: a collection of tokens, not one string")
        self.tracker = tracker
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self._token = _checked(token, "token")
        self._tokens = (self._token, *(_checked(t, "previous_tokens") for t in previous_tokens))
        self._networks = None if allowed_ips is None else [_network(ip) for ip in allowed_ips]

    def __repr__(self) -> str:
        return f"<CallbackReceiver {self.tracker!r}>"

    @staticmethod
    def new_token() -> str:
        """A fresh unguessable token (256 random bits, URL-safe)."""
        return secrets.token_urlsafe(32)

    def url(self, base: str) -> str:
        """The callback URL to give the service: *base* (where you mounted it) + token."""
        return f"{base.rstrip('/')}/{self._token.decode()}"

    def refuse(
        self, method: str, path: str, remote: str | None, length: int | None
    ) -> Answer | None:
        """The answer refusing a request before its body is read, or None to read it.

        *path* is the request's path (its last segment must be the token), *remote* the
        peer's address, *length* the declared Content-Length (None if not declared).
        """
        if self._networks is not None and not _allowed(remote, self._networks):
            log.warning("refused a callback from %s: not an allowed address (403)", remote)
            return _FORBIDDEN
        given = path.rstrip("/").rpartition("/")[2].encode()
        # Every token compared, so the time taken says nothing of which one matched.
        if sum(hmac.compare_digest(given, token) for token in self._tokens) == 0:
            log.info("refused a callback from %s: wrong or missing token (404)", remote)
            return _NOT_FOUND
        if method != "POST":
            return _NOT_ALLOWED
        if length is not None and length > self.max_body_bytes:
            log.warning("refused a callback from %s: %d bytes (413)", remote, length)
            return _TOO_LARGE
        return None

    def too_large(self, remote: str | None) -> Answer:
        """The answer to a body that grew past the limit while being read."""
        limit = self.max_body_bytes
        log.warning("refused a callback from %s: body over %d bytes (413)", remote, limit)
        return _TOO_LARGE

    def too_slow(self, remote: str | None) -> Answer:
        """The answer to a body that did not arrive within ``body_timeout``."""
        log.warning(
            "refused a callback from %s: body not read in %gs (408)", remote, self.body_timeout
        )
        return _TOO_SLOW

    async def accept(self, body: bytes, remote: str | None = None) -> Answer:
        """Parse and store one body: 200 once durable, 400 unreadable, 503 not stored."""
        taken = self._take(body, remote)
        if isinstance(taken, Answer):
            return taken
        with contextlib.suppress(DeliveryStoreError):
            await taken
        return self._settled(taken)

    def _take(self, body: bytes, remote: str | None) -> Answer | asyncio.Future[None]:
        # The answer now (400, 503), or the tracker's future: `_settled` answers from it.
        try:
            event = parse_event(body)
        except DeliveryEventError as exc:
            log.warning("refused a callback from %s: %s (400)", remote, exc.message)
            return Answer(exc.status, error_body(exc.message))
        try:
            done = self.tracker._submit(event)
        except SessionClosedError as exc:
            return _unavailable(exc)
        if log.isEnabledFor(logging.DEBUG):
            # Phone numbers are personal data: only ever at DEBUG.
            log.debug("callback %s %s for %s", event.reference, event.status, event.user_id)
        return done

    @staticmethod
    def _settled(done: asyncio.Future[None]) -> Answer:
        # The answer to a stored (or not) callback, once its future is done. The tracker
        # never cancels it and fails it only with DeliveryStoreError: the rest is defensive.
        if done.cancelled():
            return _UNAVAILABLE  # pragma: no cover - defensive: the tracker never cancels
        exc = done.exception()
        if exc is None:
            return _STORED
        if isinstance(exc, DeliveryStoreError | SessionClosedError):
            return _unavailable(exc)
        raise exc  # pragma: no cover - defensive: the tracker sets only DeliveryStoreError


def _unavailable(exc: DeliveryStoreError | SessionClosedError) -> Answer:
    log.error("could not store a callback (503): %s", exc.message)
    return _UNAVAILABLE


def _checked(token: object, name: str) -> bytes:
    """*token* as bytes, if a callback can present it; never quoted in the error."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(
            f"{name}: a callback token must be at least {MIN_TOKEN_CHARS} characters "
            "(CallbackReceiver.new_token() makes one)"
        )
    if not _URL_SAFE.fullmatch(token):
        raise ConfigurationError(
            f"{name}: a callback token may hold only letters, digits, '-' and '_', the "
            "alphabet of CallbackReceiver.new_token() (a URL may change or cut any other "
            "character, and every callback would get 404)"
        )
    return token.encode()


def error_body(message: str) -> bytes:
    """The JSON body of an error answer saying *message*."""
    return b'{"error":"' + message.replace('"', "'").encode() + b'"}'


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigurationError(f"allowed_ips: {text!r} is not an address or network") from None


def _allowed(
    remote: str | None, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> bool:
    if remote is None:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)

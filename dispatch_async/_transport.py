"""HTTP for the SDK: the one place aiohttp is called and its exceptions become ours.

Nothing here knows about tokens or recipients. It refuses unsafe base URLs, never
follows redirects, caps how much of an answer it reads, and says of every failure
whether the request could have reached the service.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping

import aiohttp
import aiohttp.payload
import attrs
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDictProxy
from yarl import URL

from ._exceptions import (
    ConfigurationError,
    ConnectError,
    ConnectionLostError,
    NetworkConfigurationError,
    RequestTimeoutError,
    ResponseTooLargeError,
    SessionClosedError,
    TransportError,
)
from ._keepalive import IdleLife, idle_connector, server_has_closed
from ._network import Route

__all__ = [
    "MAX_ANSWER_BYTES",
    "Answer",
    "Transport",
    "check_base_url",
    "client_timeout",
    "has_control_characters",
]

#: The most of one answer the SDK reads: a dispatch answer is ~100 bytes per recipient.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
_READ_SIZE = 256 * 1024


@attrs.frozen
class Answer:
    """A complete HTTP answer."""

    status: int
    headers: CIMultiDictProxy[str] = attrs.field(repr=False)
    body: bytes = attrs.field(repr=False)


def check_base_url(base_url: str | URL) -> URL:
    """Parse and vet the base URL: https, or http to a loopback host; no credentials in it."""
    try:
        url = URL(str(base_url))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"base_url is not a URL: {exc}") from None
    if url.scheme not in ("https", "http") or not url.host:
        raise ConfigurationError(
            "base_url must be an absolute http(s) URL, e.g. https://api.example.com"
        )
    if url.user is not None or url.password is not None:
        raise ConfigurationError("base_url must not carry a user or password; pass client_secret")
    if url.scheme == "http" and not _is_loopback(url.host):
        raise ConfigurationError(
            f"plain http is allowed only to a loopback host, not {url.host!r}: use https"
        )
    if url.query_string or url.fragment:
        raise ConfigurationError("base_url must not have a query or fragment")
    return url.with_path(url.path.rstrip("/"))


def client_timeout(timeout: float | aiohttp.ClientTimeout) -> aiohttp.ClientTimeout:
    """Seconds for one whole request (connecting at most 10 of them), or a ClientTimeout as is.

    *timeout* was checked with the other arguments (`_arguments`).
    """
    if isinstance(timeout, aiohttp.ClientTimeout):
        return timeout
    return aiohttp.ClientTimeout(total=timeout, connect=min(float(timeout), 10.0))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def has_control_characters(value: str) -> bool:
    """Whether a would-be header value could split the request (CR, LF or other controls)."""
    return _CONTROL.search(value) is not None


_CONTROL = re.compile("[\x00-\x1f\x7f]")  # a search in C: a header is checked per request


class Transport:
    """One aiohttp ClientSession (ours, or the caller's, which we then leave open)."""

    def __init__(
        self,
        base_url: URL,
        *,
        timeout: aiohttp.ClientTimeout,
        user_agent: str,
        http_session: aiohttp.ClientSession | None = None,
        max_connections: int = 100,
        route: Route = Route(),  # noqa: B008 - frozen
    ) -> None:
        self.base_url = base_url
        self.route = route
        # Plain http goes to the proxy as it is: the credentials go with each request (with
        # https, they go with the CONNECT only).
        plain = base_url.scheme == "http" and route.proxy_headers is not None
        self._to_proxy = dict(route.proxy_headers or {}) if plain else {}
        self._timeout = timeout
        self._user_agent = user_agent
        self._session = http_session
        self._owned = http_session is None
        self._max_connections = max_connections
        self._idle: IdleLife | None = None

    def open(self) -> None:
        """Create our ClientSession; call inside the running loop."""
        if self._session is None:
            connector = idle_connector(self._max_connections)
            self._idle = IdleLife(connector)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                raise_for_status=False,
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._owned:
            await session.close()

    def url(self, path: str) -> URL:
        """The absolute URL of *path* under the base URL."""
        return self.base_url.with_path(self.base_url.path.rstrip("/") + path, encoded=False)

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        data: bytes | Mapping[str, str] | None = None,
        request_timeout: aiohttp.ClientTimeout | None = None,
    ) -> Answer:
        """Send one request and read the whole answer (at most MAX_ANSWER_BYTES).

        *request_timeout* replaces the transport's own timeout for this request.
        """
        session = self._session
        if session is None:  # defensive: opened before any call; a call racing the close
            raise SessionClosedError("the session is not open")  # pragma: no cover
        url = self.url(path)
        headers = {"User-Agent": self._user_agent, **headers, **self._to_proxy}
        body = _Body(data) if isinstance(data, bytes) else None
        try:
            async with session.request(
                method,
                url,
                data=data if body is None else body,
                headers=headers,
                allow_redirects=False,
                timeout=request_timeout or self._timeout,
                # A caller's shared ClientSession may raise for statuses: we read them.
                raise_for_status=False,
                proxy=self.route.proxy,
                proxy_headers=self.route.proxy_headers,
                ssl=self.route.tls,
            ) as response:
                content = await _read_capped(response)
                if self._idle is not None:
                    self._idle.heed(response.headers)
                return Answer(response.status, response.headers, content)
        except (TimeoutError, aiohttp.ClientError) as exc:
            failure, cause = _failure(exc, url, body, self.route.proxy_name), _cause(exc)
        # Raised out here: raised inside the except block, the error would keep aiohttp's
        # exception as its __context__ even when not chained to it (see _cause).
        raise failure from cause


def _failure(exc: BaseException, url: URL, body: _Body | None, proxy: str | None) -> TransportError:
    """The error for a request that got no answer: whether it may have been acted on."""
    unhealable = _will_not_heal(exc, url, proxy)
    if unhealable is not None:
        return NetworkConfigurationError(unhealable, host=url.host, proxy=proxy)
    via = "" if proxy is None else f" through the proxy {proxy}"
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return ConnectError(f"could not connect to the proxy {proxy}: {_unreached(exc)}")
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy could not get through
        return ConnectError(
            f"the proxy {proxy} could not connect to {url.host}:{url.port} "
            f"(HTTP {exc.status}): the request never reached the service"
        )
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return ConnectError(f"could not connect to {url.host}:{url.port}{via}: {_unreached(exc)}")
    if body is not None and not body.handed_over:
        return ConnectError(
            f"the connection to {url.host} failed before the request was written "
            f"whole ({_safe(exc)}): the service cannot have acted on it"
        )
    if not isinstance(exc, TimeoutError):
        return ConnectionLostError(
            f"the connection to {url.host} failed after the request may have been "
            f"sent: {_safe(exc)}"
        )
    return RequestTimeoutError(f"no complete answer from {url.host} in time ({type(exc).__name__})")


def _will_not_heal(exc: BaseException, url: URL, proxy: str | None) -> str | None:
    """What is wrong, if *exc* is a failure that trying again cannot cure; else None."""
    via = "" if proxy is None else f" (through the proxy {proxy})"
    if isinstance(exc, aiohttp.ClientHttpProxyError) and 400 <= exc.status < 500:
        why = _PROXY_REFUSALS.get(exc.status, "its rules or our request")
        return (
            f"the proxy {proxy} refused to connect to {url.host}:{url.port} "
            f"(HTTP {exc.status}: {why}): the request never reached the service"
        )
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = getattr(exc.certificate_error, "verify_message", None) or _safe(exc)
        return (
            f"the certificate of {url.host} failed verification{via}: {reason}; "
            "nothing was sent (a private CA must be added to the trusted ones)"
        )
    if isinstance(exc, aiohttp.ClientSSLError):
        error = getattr(exc, "os_error", exc)  # aiohttp's own text holds the context's repr
        reason = _SSL_SOURCE.sub("", getattr(error, "strerror", None) or str(error))
        return (
            f"TLS with {url.host}:{url.port} failed{via}: {reason[:200]}; nothing was sent "
            "(is it an https port?)"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        if isinstance(error, socket.gaierror) and error.errno not in _DNS_MAY_HEAL:
            name = f"the proxy's host name {exc.host}" if proxy else f"the host name {url.host}"
            return f"{name} does not resolve ({error.strerror}): nothing was sent"
    return None


#: Why a proxy answers CONNECT with a 4xx (any 4xx: it will not take us there, whatever
#: the service does; a 5xx says it could not reach the service, which may heal).
_PROXY_REFUSALS: Mapping[int, str] = {
    401: "it wants credentials, or refused the ones given in the proxy URL",
    403: "its rules do not allow this host",
    407: "it wants credentials, or refused the ones given in the proxy URL",
}
_SSL_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)")
#: "Temporary failure in name resolution": a resolver's blip, which a retry can outlast.
_DNS_MAY_HEAL = frozenset({socket.EAI_AGAIN})


class _Body(aiohttp.payload.BytesPayload):
    """A request body that knows whether aiohttp finished handing it to the connection.

    While aiohttp is still writing it, part of it has not left this process: a
    connection that fails then was never sent the whole request, so the service cannot
    have acted on it. Once handed over, its fate is unknown.
    """

    handed_over = False

    # aiohttp < 3.12 (pyproject allows 3.10) writes the body with write(); later ones
    # call write_with_length() instead.
    async def write(self, writer: AbstractStreamWriter) -> None:  # pragma: no cover
        _refuse_closed(writer)
        await super().write(writer)
        self.handed_over = True

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        _refuse_closed(writer)
        await super().write_with_length(writer, content_length)
        self.handed_over = True


def _refuse_closed(writer: AbstractStreamWriter) -> None:
    # Nothing of the body has been written yet (nor, since aiohttp 3.12, the headers,
    # which go with it): on a connection the server has closed, write none of it.
    # aiohttp makes this OSError the request's failure; handed_over stays False.
    if server_has_closed(writer):
        raise ConnectionResetError("the server closed the connection before the request")


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    length = response.content_length
    if length is not None and length > MAX_ANSWER_BYTES:
        raise ResponseTooLargeError(f"the answer is {length} bytes, over {MAX_ANSWER_BYTES}")
    if length is not None and response.headers.get("Content-Encoding", "identity") == "identity":
        return await response.read()
    # Unknown length, or a compressed one: what counts is the size decoded.
    parts: list[bytes] = []
    size = 0
    while part := await response.content.read(_READ_SIZE):
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise ResponseTooLargeError(f"the answer is over {MAX_ANSWER_BYTES} bytes")
        parts.append(part)
    return b"".join(parts)


def _cause(exc: BaseException) -> BaseException | None:
    # aiohttp's ClientResponseError carries the request headers (our token) in its repr:
    # it is never chained, only described.
    return None if isinstance(exc, aiohttp.ClientResponseError) else exc


def _unreached(exc: BaseException) -> str:
    """Why no connection was made, without aiohttp's ``ssl:default`` on a plain http URL."""
    if not isinstance(exc, aiohttp.ClientConnectorError) or isinstance(exc, aiohttp.ClientSSLError):
        return _safe(exc)  # a TLS failure says what it is about
    error = exc.os_error
    code = error.errno
    # asyncio words a refusal "Connect call failed (...)": the errno's own text is clearer.
    text = os.strerror(code) if isinstance(code, int) and code > 0 else error.strerror
    return (text or str(error) or type(error).__name__)[:200]


def _safe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{type(exc).__name__} (HTTP {exc.status})"
    text = str(exc) or type(exc).__name__
    return text[:200]

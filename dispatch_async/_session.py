"""``DispatchSession``: the one object callers hold, for the lifetime of their app or job."""

from __future__ import annotations

import copy
import functools
import platform
import warnings
from collections.abc import AsyncGenerator, Callable, Iterable
from ssl import SSLContext
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import attrs
from yarl import URL

from . import _instrument
from ._arguments import check_arguments
from ._auth import Secret, TokenEndpoint, TokenKeeper, TokenRequest
from ._batch import STOPS_THE_JOB, Batcher
from ._batch_settings import BatchSettings, check_options
from ._endpoints import Endpoint
from ._environment import settings_from_env
from ._exceptions import (
    CallbackError,
    DispatchError,
    RequestTooLargeError,
    status_error,
)
from ._lifecycle import Lifecycle, State
from ._matching import result_from_answer, result_from_error
from ._network import route_to
from ._outcome import DispatchResult
from ._recipients import Chunk, Recipients
from ._redaction import url_secrets
from ._retry import RetryPolicy, parse_retry_after, retrying
from ._screen import without_unencodable
from ._sending import Sending
from ._split import Flight, PartSize, in_parts
from ._throttle import Limiter, Throttle
from ._token_store import TokenStore
from ._transport import Transport, check_base_url, client_timeout
from ._version import __version__
from ._wire import Envelope, UnencodableError, decode_answer, decode_json, encode_dispatch
from .instrumentation import Hook

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._batch_settings import BatchOptions

__all__ = ["DispatchSession"]

USER_AGENT = (
    f"dispatch-async/{__version__} aiohttp/{aiohttp.__version__} python/{platform.python_version()}"
)
_NOTHING_SENT: dict[str, list[Any]] = {"validMessages": [], "invalidMessages": []}


class DispatchSession(Sending):
    """A connection to the dispatch service: token, HTTP pool, rate limit and batcher.

    Use one per application (it is safe to share between concurrent tasks):

        async with DispatchSession(url, client_secret=secret, account="acme") as session:
            result = await session.send_template(numbers, template_id="pix_reminder")

    ``timeout`` is seconds for one whole request, or an ``aiohttp.ClientTimeout``.
    ``http_session`` lets you share your own aiohttp session (which we never close).
    ``requests_per_second="auto"`` learns the rate from 429s, up to ``max_requests_per_second``.
    ``token_store`` (`RedisTokenStore`) shares one token with other processes, ``rate_limiter``
    (`RedisRateLimiter`) a rate limit, on top of this process's; the session closes both.
    The batcher settings (``chunk_size``, ``max_concurrency``, ``dedupe``,
    ``prevalidate``, ``region``, ``deadline``, ``on_progress``, ``on_chunk``) can be
    overridden per call.
    ``hooks`` (see `dispatch_async.instrumentation`) replace the global hooks for this session.
    ``token_request`` is how the token request's body is encoded: ``"form"`` (as the API
    documentation says), ``"json"`` (as the vendor's example sends it), or ``"auto"``:
    the form, then JSON once if the token endpoint answers 400 or 415, keeping what
    worked. `check_credentials` fetches a token at start-up, so a wrong secret or a
    refused address shows before the first send. `with_options` gives a view with
    another timeout, retry policy or batch settings.

    The network (docs/guides/networks.md): ``proxy`` is the proxy's URL
    (``http://user:password@host:port``; its credentials are never shown); by default
    (``trust_env=True``) ``HTTPS_PROXY``/``HTTP_PROXY`` and ``NO_PROXY`` are honoured, and
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``, as they are when the session is made
    (``trust_env=False`` ignores them). ``ssl`` is the ``ssl.SSLContext`` to trust the
    service's certificate with: `ssl_context` adds a private CA to the system's. With your
    own ``http_session``, only ``proxy`` and ``ssl`` given here apply on top of its settings.
    """

    base_url: URL
    """The service's address, as checked: https, or http to a loopback host only."""
    account: str | None
    """The account sent with every dispatch unless a call names another."""
    retry: RetryPolicy
    """How requests the service did not act on are tried again."""
    settings: BatchSettings
    """The batch settings of every call, unless a call overrides them."""

    def __init__(
        self,
        base_url: str,
        *,
        client_secret: str,
        account: str | None = None,
        timeout: float | aiohttp.ClientTimeout = 30.0,
        retry: RetryPolicy | None = None,
        requests_per_second: float | Literal["auto"] | None = None,
        max_requests_per_second: float | None = None,
        http_session: aiohttp.ClientSession | None = None,
        user_agent: str | None = None,
        token_store: TokenStore | None = None,
        rate_limiter: Limiter | None = None,
        hooks: Iterable[Hook] | None = None,
        token_request: TokenRequest = "auto",  # noqa: S107 - an encoding, not a secret
        proxy: str | URL | None = None,
        trust_env: bool = True,
        ssl: SSLContext | None = None,
        **batch: Unpack[BatchOptions],
    ) -> None:
        check_arguments({k: v for k, v in locals().items() if k not in ("self", "batch")})
        check_options(batch, DispatchSession.__init__)
        self._secret = Secret(client_secret)
        self.base_url = check_base_url(base_url)
        self.account = account
        self.retry = retry if retry is not None else RetryPolicy()
        self.settings = BatchSettings(**batch)
        self._hooks = None if hooks is None else tuple(hooks)
        told = functools.partial(_instrument.rate_changed, self._hooks)
        self._throttle = Throttle(
            requests_per_second, max_requests_per_second, shared=rate_limiter, on_change=told
        )
        self._shared = (token_store, rate_limiter)  # closed with the session
        agent = user_agent or USER_AGENT
        self._timeout = client_timeout(timeout)
        route = route_to(
            self.base_url,
            proxy=proxy,
            trust_env=trust_env,
            tls=ssl,
            own_session=http_session is None,
        )
        self._transport = Transport(
            self.base_url,
            timeout=self._timeout,
            user_agent=agent,
            http_session=http_session,
            route=route,
        )
        watch = _instrument.TokenWatch(self._hooks)
        endpoint = TokenEndpoint(
            self._transport, self._secret, lambda: self.retry, encoding=token_request
        )
        self._tokens = TokenKeeper(
            watch.fetching(endpoint.fetch), store=token_store, on_token=watch.kept
        )
        self._life = Lifecycle()
        self._owns = True  # False in a view: the session it was made from owns it all

    @classmethod
    def from_env(cls, **kwargs: Any) -> DispatchSession:
        """A session configured from DISPATCH_BASE_URL, DISPATCH_CLIENT_SECRET, DISPATCH_ACCOUNT.

        Keyword arguments override the environment and are passed on.
        """
        base_url, settings = settings_from_env(kwargs)
        return cls(base_url, **settings)

    @property
    def requests_per_second(self) -> float | None:
        """The request rate now: as set, as learned (``"auto"``), or None (no limit)."""
        return self._throttle.rate

    def __repr__(self) -> str:
        return (
            f"<DispatchSession{'' if self._owns else ' view'} {self._life.state.value} "
            f"base_url={str(self.base_url)!r} account={self.account!r}>"
        )

    def with_options(
        self,
        *,
        timeout: float | aiohttp.ClientTimeout | None = None,
        retry: RetryPolicy | None = None,
        **batch: Unpack[BatchOptions],
    ) -> DispatchSession:
        """This session with another request timeout, retry policy or batch settings.

        The view shares the session's token (fetched under the session's own policy),
        connection pool, rate limit and hooks, and costs one shallow copy, so a web
        handler can make one per request. Closing a view does nothing: close the session.
        """
        check_arguments({"retry": retry, **({} if timeout is None else {"timeout": timeout})})
        check_options(batch, DispatchSession.with_options)
        view = copy.copy(self)
        view._owns = False
        if timeout is not None:
            view._timeout = client_timeout(timeout)
        view.retry = self.retry if retry is None else retry
        if batch:
            view.settings = attrs.evolve(self.settings, **batch)
        return view

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> DispatchSession:
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _open(self) -> None:
        """Open on first use, on the running loop; refuse any other loop after that."""
        if not self._life.open_here():
            self._transport.open()
            self._tokens.start()
            self._life.opened()

    async def close(self) -> None:
        """Stop the token refresh and close the HTTP pool. Safe to call twice; a no-op on a view."""
        if not self._owns or self._life.state is State.CLOSED:
            return
        if self._life.state is State.OPEN:
            self._open()  # on another loop, its tasks and sockets cannot be closed here
        self._life.closed()  # calls under way stop, each accounting for its recipients
        await self._tokens.close()
        await self._transport.close()
        for shared in self._shared:
            if shared is not None:
                await shared.aclose()

    def __del__(self) -> None:
        if getattr(self, "_owns", False) and self._life.state is State.OPEN:
            warnings.warn(
                f"unclosed {self!r}: use 'async with' or await close()",
                ResourceWarning,
                stacklevel=2,
            )

    async def check_credentials(self) -> None:
        """Fetch an access token now (or reuse the current one), so that bad credentials
        fail at start-up rather than on the first send.

        Raises `AuthenticationError` for a refused secret, `ForbiddenError` (a kind of
        it) when the service refuses this caller's address, `TokenUnavailableError`
        when the token endpoint cannot be reached, and at once `NetworkConfigurationError`
        when it never can be (a name that does not resolve, a certificate that fails, a
        refusing proxy, a base URL with no token endpoint under it).
        """
        self._open()
        await self._tokens.token()

    async def list_templates(self) -> Any:
        """The account's templates (``GET /api/v3/templates``), as the service's JSON."""
        self._open()
        return await self._life.unless_closed(
            retrying(self.retry, lambda: self._call("GET", "/api/v3/templates", None, Flight()))
        )

    # -- internals -----------------------------------------------------------------

    def _job(
        self,
        endpoint: Endpoint,
        fields: Envelope,
        recipients: Recipients,
        options: BatchOptions,
    ) -> AsyncGenerator[DispatchResult, None]:
        self._open()
        settings = attrs.evolve(self.settings, **options) if options else self.settings

        url = str(self._transport.url(endpoint.path))
        report = _instrument.start_call(self._hooks, endpoint.path, url)

        size = PartSize()  # what this call's server takes, once it refused a body (413)

        async def send(chunk: Chunk, flight: Flight) -> DispatchResult:
            return await self._send_chunk(endpoint, fields, chunk, flight, size)

        batcher = Batcher(
            recipients,
            settings,
            send if report is None else report.chunks(send),
            stop_on=self._life.closing,
        )
        return batcher.parts() if report is None else report.observe(batcher.parts(), batcher.total)

    async def _send_chunk(
        self, endpoint: Endpoint, fields: Envelope, chunk: Chunk, flight: Flight, size: PartSize
    ) -> DispatchResult:
        if not chunk.messages:  # everything was refused locally: nothing to send
            return result_from_answer(chunk, _NOTHING_SENT, requests=0)
        try:
            body = encode_dispatch(fields, chunk.messages)
        except UnencodableError:
            chunk = without_unencodable(chunk)
            if not chunk.messages:
                return result_from_answer(chunk, _NOTHING_SENT, requests=0)
            body = encode_dispatch(fields, chunk.messages)
        secrets = url_secrets(fields.callback, fields.webhook)  # the service may echo them
        refused = None
        if size.fits(len(chunk.messages)):
            try:
                return await self._post(endpoint, body, chunk, flight, secrets)
            except RequestTooLargeError as error:
                refused = error

        async def post(part: Chunk) -> DispatchResult:
            _instrument.sending_part(part)
            body = encode_dispatch(fields, part.messages)
            return await self._post(endpoint, body, part, flight, secrets)

        split = _instrument.split_reporter()
        return await in_parts(chunk, flight, size, post, refused=refused, on_split=split)

    async def _post(
        self,
        endpoint: Endpoint,
        body: bytes,
        chunk: Chunk,
        flight: Flight,
        secrets: tuple[str, ...],
    ) -> DispatchResult:
        """*chunk*'s request, retried as the policy allows; raises what stops the job, and
        `RequestTooLargeError` (the caller sends the chunk in parts). *secrets*: the keys of
        the request's callback URLs, kept out of error texts."""
        # Numbers normalised locally never match the answer as sent: no quick path to try.
        decode = decode_answer if chunk.given is None else decode_json

        def count_retry(error: BaseException, wait: float) -> None:
            flight.retries += 1
            _instrument.retried(error, wait, flight.retries)

        try:
            data = await retrying(
                self.retry,
                lambda: _instrument.attempt(
                    self._call("POST", endpoint.path, body, flight, decode, secrets)
                ),
                on_retry=count_retry,
            )
        except (*STOPS_THE_JOB, RequestTooLargeError):
            raise
        except DispatchError as error:  # reported to the hooks (logging by default)
            return result_from_error(chunk, error, requests=flight.requests, retries=flight.retries)
        return result_from_answer(chunk, data, requests=flight.requests, retries=flight.retries)

    async def _call(
        self,
        method: str,
        path: str,
        body: bytes | None,
        flight: Flight,
        decode: Callable[[bytes], Any] = decode_json,
        secrets: tuple[str, ...] = (),
    ) -> Any:
        """One request to /api/v3, re-sent once with a fresh token after a 401; *secrets*
        (the request's own) are blanked out of an error's body as the credentials are."""
        self._open()
        for refreshed in (False, True):
            # A token first: a rate slot taken while waiting for one would be spent later,
            # bunched with the next second's requests.
            await self._tokens.token()
            slot = await self._throttle.wait(self.retry.clock)
            token = await self._tokens.token()
            headers = {
                "Authorization": f"Bearer {token}",
                "X-Auth-Type": "JWT",
                "Accept": "application/json",
            }
            if body is not None:
                headers["Content-Type"] = "application/json"
            if flight.announce is not None:
                announce, flight.announce = flight.announce, None
                try:
                    await announce()
                except Exception as exc:
                    raise CallbackError("before_send raised; this chunk was not sent") from exc
            if (observed := _instrument.CURRENT.get()) is not None:
                headers = observed.sending(headers)  # a hook never overrides ours
            flight.in_request = True
            flight.requests += 1
            try:
                answer = await self._transport.request(
                    method, path, headers=headers, data=body, request_timeout=self._timeout
                )
            finally:
                flight.in_request = False
            await self._throttle.answered(slot, answer.status)
            if answer.status == 200:
                return decode(answer.body)
            if answer.status == 401 and not refreshed:
                # A 401 means the service did not act: drop the token, re-send once.
                self._tokens.invalidate(token)
                if observed is not None:
                    observed.token_refused()
                continue
            error = status_error(
                answer.status,
                answer.headers,
                answer.body,
                retry_after=parse_retry_after(answer.headers.get("Retry-After")),
                secrets=(token, self._secret.reveal(), *secrets),
            )
            if isinstance(error, RequestTooLargeError):
                error.request_bytes = None if body is None else len(body)
            pause = self.retry.pause_for(error)
            if pause:
                await self._throttle.pause(pause, self.retry.clock)
                _instrument.paused(self._hooks, answer.status, pause)
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

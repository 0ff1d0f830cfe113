"""``DispatchSession``: the one object callers hold, for the lifetime of their app or job."""

from __future__ import annotations

import enum
import logging
import os
import platform
import time
import warnings
from collections.abc import AsyncGenerator, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
import attrs

from . import _instrument
from ._auth import Secret, Token, TokenKeeper
from ._batch import BatchSettings, Flight, Job, collected
from ._exceptions import (
    AuthenticationError,
    ConfigurationError,
    DispatchError,
    SessionClosedError,
    StatusError,
    TransportError,
    status_error,
)
from ._models import DispatchResult, Fallback
from ._outcomes import answered, failed
from ._recipients import Chunk, Recipients
from ._request import BASIC, SINGLE, TEMPLATE, WEBHOOK, Endpoint, envelope
from ._retry import RetryPolicy, parse_retry_after, retrying
from ._throttle import Limiter, Throttle
from ._token_store import TokenStore
from ._transport import Transport, check_base_url, has_control_characters
from ._version import __version__
from ._wire import Envelope, decode_json, encode_dispatch, parse_token_answer
from .instrumentation import Hook

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._batch import BatchOptions

__all__ = ["DispatchSession"]

log = logging.getLogger("dispatch_async")

USER_AGENT = (
    f"dispatch-async/{__version__} aiohttp/{aiohttp.__version__} python/{platform.python_version()}"
)
_FORM = "application/x-www-form-urlencoded"


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class DispatchSession:
    """A connection to the dispatch service: token, HTTP pool, rate limit and batcher.

    Use one per application (it is safe to share between concurrent tasks)::

        async with DispatchSession(url, client_secret=secret, account="acme") as session:
            result = await session.send_template(numbers, template_id="pix_reminder")

    ``timeout`` is seconds for one whole request, or an ``aiohttp.ClientTimeout``.
    ``http_session`` lets you share your own aiohttp session (which we never close).
    ``token_store`` (`RedisTokenStore`) shares one token with other processes;
    ``rate_limiter`` (`RedisRateLimiter`) shares a rate limit with them (on top of
    ``requests_per_second``, which stays per process). The session closes both.
    The batcher settings (``chunk_size``, ``max_concurrency``, ``dedupe``,
    ``prevalidate``, ``region``, ``deadline``, ``on_progress``) can be overridden per call.
    ``hooks`` (see `dispatch_async.instrumentation`) replace the global hooks for this session.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client_secret: str,
        account: str | None = None,
        timeout: float | aiohttp.ClientTimeout = 30.0,
        retry: RetryPolicy | None = None,
        requests_per_second: float | None = None,
        http_session: aiohttp.ClientSession | None = None,
        user_agent: str | None = None,
        token_store: TokenStore | None = None,
        rate_limiter: Limiter | None = None,
        hooks: Iterable[Hook] | None = None,
        **batch: Unpack[BatchOptions],
    ) -> None:
        if not isinstance(client_secret, str) or not client_secret:
            raise ConfigurationError("client_secret must be a non-empty string")
        if account is not None and (not isinstance(account, str) or not account):
            raise ConfigurationError("account must be a non-empty string")
        self._secret = Secret(client_secret)
        self.base_url = check_base_url(base_url)
        self.account = account
        self.retry = retry if retry is not None else RetryPolicy()
        self.settings = BatchSettings(**batch)
        self._throttle = Throttle(requests_per_second, shared=rate_limiter)
        self._rate_limiter = rate_limiter
        self._token_store = token_store
        agent = user_agent or USER_AGENT
        if has_control_characters(agent):
            raise ConfigurationError("user_agent must not contain control characters")
        self._transport = Transport(
            self.base_url, timeout=_timeout(timeout), user_agent=agent, http_session=http_session
        )
        self._hooks = None if hooks is None else tuple(hooks)
        watch = _instrument.TokenWatch(self._hooks)
        self._tokens = TokenKeeper(
            watch.fetching(self._fetch_token), store=token_store, on_token=watch.kept
        )
        self._state = _State.UNOPENED

    @classmethod
    def from_env(cls, **kwargs: Any) -> DispatchSession:
        """A session configured from DISPATCH_BASE_URL, DISPATCH_CLIENT_SECRET, DISPATCH_ACCOUNT.

        Keyword arguments override the environment and are passed on.
        """
        settings: dict[str, Any] = {}
        for name, variable in (
            ("base_url", "DISPATCH_BASE_URL"),
            ("client_secret", "DISPATCH_CLIENT_SECRET"),
            ("account", "DISPATCH_ACCOUNT"),
        ):
            value = os.environ.get(variable)
            if value:
                settings[name] = value
        settings.update(kwargs)
        for name, variable in (
            ("base_url", "DISPATCH_BASE_URL"),
            ("client_secret", "DISPATCH_CLIENT_SECRET"),
        ):
            if name not in settings:
                raise ConfigurationError(f"{variable} is not set (or pass {name}=)")
        return cls(settings.pop("base_url"), **settings)

    def __repr__(self) -> str:
        return (
            f"<DispatchSession {self._state.value} base_url={str(self.base_url)!r} "
            f"account={self.account!r}>"
        )

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
        if self._state is _State.OPEN:
            return
        if self._state is _State.CLOSED:
            raise SessionClosedError("this session is closed; create a new one")
        self._transport.open()
        self._tokens.start()
        self._state = _State.OPEN

    async def close(self) -> None:
        """Stop the token refresh and close the HTTP pool. Safe to call twice."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        await self._tokens.close()
        await self._transport.close()
        for shared in (self._token_store, self._rate_limiter):
            if shared is not None:
                await shared.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is _State.OPEN:
            warnings.warn(
                f"unclosed {self!r}: use 'async with' or await close()",
                ResourceWarning,
                stacklevel=2,
            )

    # -- the endpoints -------------------------------------------------------------

    def stream_template(
        self,
        recipients: Recipients,
        *,
        template_id: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        webhook: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """Send a template (``POST /api/v3/template``), yielding a result per chunk."""
        fields = envelope(
            TEMPLATE,
            account=account or self.account,
            template_id=template_id,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
            webhook=webhook,
        )
        return self._job(TEMPLATE, fields, recipients, options)

    def stream_basic(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """Send *text* (``POST /api/v3/basic``), yielding a result per chunk."""
        fields = envelope(
            BASIC,
            account=account or self.account,
            text=text,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(BASIC, fields, recipients, options)

    def stream_single(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """Send *text* (``POST /api/v3/single``, on the wire the same as basic), per chunk."""
        fields = envelope(
            SINGLE,
            account=account or self.account,
            text=text,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(SINGLE, fields, recipients, options)

    def stream_webhook(
        self,
        recipients: Recipients,
        *,
        webhook: str,
        text: str | None = None,
        template_id: str | None = None,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """Send with the service reporting to *webhook* (``POST /api/v3/webhook``), per chunk."""
        fields = envelope(
            WEBHOOK,
            account=account or self.account,
            webhook=webhook,
            text=text,
            template_id=template_id,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(WEBHOOK, fields, recipients, options)

    # Each send_* takes exactly what its stream_* takes, and merges the parts into one result.
    send_template = collected(stream_template)
    send_basic = collected(stream_basic)
    send_single = collected(stream_single)
    send_webhook = collected(stream_webhook)

    async def list_templates(self) -> Any:
        """The account's templates (``GET /api/v3/templates``), as the service's JSON."""
        return await retrying(
            self.retry, lambda: self._call("GET", "/api/v3/templates", None, Flight())
        )

    # -- internals -----------------------------------------------------------------

    def _job(
        self,
        endpoint: Endpoint,
        fields: Envelope,
        recipients: Recipients,
        options: BatchOptions,
    ) -> AsyncGenerator[DispatchResult, None]:
        if self._state is not _State.OPEN:
            self._open()
        settings = attrs.evolve(self.settings, **options) if options else self.settings

        report = _instrument.start_call(self._hooks, endpoint.path)

        async def send(chunk: Chunk, flight: Flight) -> DispatchResult:
            return await self._send_chunk(endpoint, fields, chunk, flight)

        job = Job(recipients, settings, send if report is None else report.chunks(send))
        return job.parts() if report is None else report.observe(job.parts(), job.total)

    async def _send_chunk(
        self, endpoint: Endpoint, fields: Envelope, chunk: Chunk, flight: Flight
    ) -> DispatchResult:
        if not chunk.messages:  # everything was refused locally: nothing to send
            return answered(chunk, {"validMessages": [], "invalidMessages": []}, requests=0)
        body = encode_dispatch(fields, chunk.messages)

        def count_retry(error: BaseException, wait: float) -> None:
            flight.retries += 1
            _instrument.retried(error, wait, flight.retries)

        try:
            data = await retrying(
                self.retry,
                lambda: _instrument.attempt(self._call("POST", endpoint.path, body, flight)),
                on_retry=count_retry,
            )
        except AuthenticationError:
            raise
        except DispatchError as error:  # reported to the hooks (logging by default)
            return failed(chunk, error, requests=flight.requests, retries=flight.retries)
        return answered(chunk, data, requests=flight.requests, retries=flight.retries)

    async def _call(self, method: str, path: str, body: bytes | None, flight: Flight) -> Any:
        """One request to /api/v3, re-sent once with a fresh token after a 401."""
        if self._state is not _State.OPEN:
            self._open()
        for refreshed in (False, True):
            # A token first: a rate slot taken while waiting for one would be spent later,
            # bunched with the next second's requests.
            await self._tokens.token()
            await self._throttle.wait()
            token = await self._tokens.token()
            headers = {
                "Authorization": f"Bearer {token}",
                "X-Auth-Type": "JWT",
                "Accept": "application/json",
            }
            if body is not None:
                headers["Content-Type"] = "application/json"
            if (observed := _instrument.CURRENT.get()) is not None:
                headers = observed.sending(headers)  # a hook never overrides ours
            flight.in_request = True
            flight.requests += 1
            try:
                answer = await self._transport.request(method, path, headers=headers, data=body)
            finally:
                flight.in_request = False
            if answer.status == 200:
                return decode_json(answer.body)
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
                secrets=(token, self._secret.reveal()),
            )
            pause = self.retry.pause_for(error)
            if pause:
                self._throttle.pause(pause)
                _instrument.paused(self._hooks, answer.status, pause)
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    async def _fetch_token(self) -> Token:
        async def once() -> Token:
            started = time.monotonic()
            answer = await self._transport.request(
                "POST",
                "/oauth/token",
                headers={"Accept": _FORM, "Content-Type": _FORM},
                data={"grant_type": "client_credentials", "client_secret": self._secret.reveal()},
            )
            if answer.status == 200:
                issued = parse_token_answer(answer.body)
                if has_control_characters(issued.access_token):
                    raise AuthenticationError(
                        "the access token has control characters; refusing it"
                    )
                return Token.issued(issued.access_token, started, issued.expires_in)
            if answer.status in (401, 403):
                raise AuthenticationError(
                    f"the service rejected the client secret (HTTP {answer.status})"
                )
            if 300 <= answer.status < 500 and answer.status != 429:
                raise AuthenticationError(
                    f"the token endpoint refused the request (HTTP {answer.status}); "
                    "check the client secret and base_url"
                )
            raise status_error(
                answer.status,
                answer.headers,
                answer.body,
                retry_after=parse_retry_after(answer.headers.get("Retry-After")),
                secrets=(self._secret.reveal(),),
            )

        try:
            return await retrying(self.retry, once, should_retry=_token_retryable)
        except AuthenticationError:
            raise
        except DispatchError as error:
            # Every request needs a token: without one the job cannot go on.
            raise AuthenticationError(f"could not get an access token: {error}") from error


def _token_retryable(error: BaseException) -> bool:
    # Asking for a token twice is harmless, so any transport failure and any 429/5xx is retried.
    if isinstance(error, TransportError):
        return True
    return isinstance(error, StatusError) and (error.status == 429 or error.status >= 500)


def _timeout(timeout: float | aiohttp.ClientTimeout) -> aiohttp.ClientTimeout:
    if isinstance(timeout, aiohttp.ClientTimeout):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigurationError("timeout must be a positive number of seconds or a ClientTimeout")
    return aiohttp.ClientTimeout(total=timeout, connect=min(float(timeout), 10.0))

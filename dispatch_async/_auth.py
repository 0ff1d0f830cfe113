"""The access token: fetched once for everyone, refreshed ahead of expiry, never shown.

The ``TokenKeeper`` follows botocore's two windows. In the *advisory* window (from the
refresh point to expiry) a background task refreshes the token while callers keep
using the old one; a failure there is logged and retried. Once the token has expired
(the *mandatory* window) callers wait for a fresh one and see the error if none comes.
Every fetch is shared: however many callers need a token, one request is made.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import attrs
import orjson

from ._endpoints import TOKEN_PATH, token_not_found
from ._exceptions import (
    AuthenticationError,
    DispatchError,
    ForbiddenError,
    NetworkConfigurationError,
    StatusError,
    TokenUnavailableError,
    TransportError,
    status_error,
)
from ._lifetime import jwt_claims_lifetime, parse_lifetime
from ._retry import RetryPolicy, parse_retry_after, retrying
from ._token_store import StoredToken, TokenStore, TokenStoreUnavailable
from ._transport import Answer, Transport, has_control_characters
from ._wire import TokenAnswer, parse_token_answer

__all__ = [
    "DEFAULT_LIFETIME",
    "MAX_LIFETIME",
    "TOKEN_REQUESTS",
    "Secret",
    "Token",
    "TokenEndpoint",
    "TokenKeeper",
    "TokenRequest",
]

log = logging.getLogger("dispatch_async")

_FORM = "application/x-www-form-urlencoded"
_JSON = "application/json"

#: How the token request's body is encoded: "form" (the spec's), "json" (the vendor's
#: example), or "auto": the form, then once JSON if the endpoint refuses the form with
#: 400 or 415, remembering what worked.
TokenRequest = Literal["auto", "form", "json"]
TOKEN_REQUESTS: tuple[TokenRequest, ...] = ("auto", "form", "json")
#: Answers to a form body that say the endpoint may want JSON instead.
_WRONG_ENCODING = frozenset({400, 415})

#: Seconds a token is trusted for when neither its answer nor its claims give a readable
#: lifetime; a 401 before then still gets one fresh token and one re-send.
DEFAULT_LIFETIME = 60.0
#: A lifetime longer than this is capped: a token is never "valid forever".
MAX_LIFETIME = 24 * 3600.0
#: Refresh when this fraction of the lifetime is left (plus up to REFRESH_JITTER more),
#: so a fleet of sessions started together does not refresh in lockstep.
REFRESH_MARGIN = 0.2
REFRESH_JITTER = 0.05
#: Stop using a token this fraction of its lifetime (at most EXPIRY_SAFETY_MAX seconds)
#: before it expires: a request takes time to reach the service. A short-lived token gets
#: at least EXPIRY_SAFETY_FLOOR seconds (a request's way on a loaded machine), but never
#: more than EXPIRY_SAFETY_SHORT of its lifetime, so refresh-ahead still comes first.
EXPIRY_SAFETY = 0.05
EXPIRY_SAFETY_MAX = 10.0
EXPIRY_SAFETY_FLOOR = 0.5
EXPIRY_SAFETY_SHORT = 0.15
#: Waits between failed background refreshes, doubled each time up to the cap.
RETRY_FIRST_WAIT = 0.5
RETRY_MAX_WAIT = 30.0
#: With a shared store: seconds to wait for the refresh lock at a time, between two reads
#: of the store, and in all before giving up on the fleet and fetching locally.
STORE_LOCK_WAIT = 1.0
STORE_POLL = 0.05
STORE_WAIT_MAX = 30.0


class Secret:
    """A credential that never shows itself in a repr, a str or a log line."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The credential itself, for the one place that must send it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> str:
        raise TypeError("a Secret cannot be pickled")


@attrs.frozen
class Token:
    """An access token and when, on the monotonic clock, to refresh and stop using it."""

    value: str = attrs.field(repr=False)
    issued_at: float
    lifetime: float
    refresh_at: float
    expires_at: float

    @classmethod
    def issued(cls, value: str, issued_at: float, lifetime: float | None) -> Token:
        """A token fetched at *issued_at* (when the request started) for *lifetime* seconds."""
        seconds = min(lifetime or DEFAULT_LIFETIME, MAX_LIFETIME)
        margin = REFRESH_MARGIN + random.uniform(0, REFRESH_JITTER)  # noqa: S311 - not crypto
        floor = min(EXPIRY_SAFETY_FLOOR, seconds * EXPIRY_SAFETY_SHORT)
        safety = min(max(seconds * EXPIRY_SAFETY, floor), EXPIRY_SAFETY_MAX)
        return cls(
            value,
            issued_at,
            seconds,
            refresh_at=issued_at + seconds * (1 - margin),
            expires_at=issued_at + seconds - safety,
        )


class TokenEndpoint:
    """``POST /oauth/token`` (spec 4.1): one token, retried under the session's policy.

    *policy* is read at each fetch, so the session's current retry policy applies.
    *encoding* is a `TokenRequest`; with "auto" the one that worked is kept for the
    endpoint's life (a session's), so the form is tried again only while nothing worked.
    """

    def __init__(
        self,
        transport: Transport,
        secret: Secret,
        policy: Callable[[], RetryPolicy],
        *,
        encoding: TokenRequest,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._transport = transport
        self._secret = secret
        self._policy = policy
        self._encoding = encoding
        self._wall_clock = wall_clock
        self._warned_lifetime = False

    async def fetch(self) -> Token:
        """A new token; AuthenticationError if refused, TokenUnavailableError if unreachable
        (`NetworkConfigurationError`, what will not heal, as it is: a 404 is one)."""
        try:
            return await retrying(self._policy(), self._once, should_retry=_token_retryable)
        except (AuthenticationError, NetworkConfigurationError):
            raise
        except DispatchError as error:
            # Every request needs a token: without one the job cannot go on. The secret
            # was not refused, so this is not an AuthenticationError.
            raise TokenUnavailableError(f"could not get an access token: {error}") from error

    async def _once(self) -> Token:
        started = time.monotonic()
        encoding = "form" if self._encoding == "auto" else self._encoding
        answer = await self._post(encoding)
        if self._encoding == "auto" and answer.status in _WRONG_ENCODING:
            answer = await self._post("json")
            if answer.status not in _WRONG_ENCODING:
                # The endpoint read the JSON body (even to refuse the secret): keep to it.
                log.info("the token endpoint refused a form body and read JSON; using JSON")
                self._encoding = "json"
        if answer.status == 200:
            issued = parse_token_answer(answer.body)
            if has_control_characters(issued.access_token):
                raise AuthenticationError("the access token has control characters; refusing it")
            return Token.issued(issued.access_token, started, self._lifetime(issued))
        if answer.status == 403:
            raise ForbiddenError.for_status(answer.headers)
        if answer.status == 401:
            raise AuthenticationError("the service rejected the client secret (HTTP 401)")
        if answer.status == 404:
            raise token_not_found(self._transport.url(TOKEN_PATH))
        # No body kept from here: it may echo the form, and the form holds the secret.
        if 300 <= answer.status < 500 and answer.status != 429:
            raise AuthenticationError(
                f"the token endpoint refused the request (HTTP {answer.status}); "
                "check the client secret, base_url and token_request"
            )
        raise status_error(
            answer.status,
            answer.headers,
            b"",
            retry_after=parse_retry_after(answer.headers.get("Retry-After")),
        )

    async def _post(self, encoding: TokenRequest) -> Answer:
        fields = {"grant_type": "client_credentials", "client_secret": self._secret.reveal()}
        kind = _JSON if encoding == "json" else _FORM
        data = orjson.dumps(fields) if encoding == "json" else fields
        return await self._transport.request(
            "POST", TOKEN_PATH, headers={"Accept": kind, "Content-Type": kind}, data=data
        )

    def _lifetime(self, issued: TokenAnswer) -> float | None:
        """The earlier of the stated lifetime and the token's own claims; None if neither."""
        known = [
            seconds
            for seconds in (
                parse_lifetime(issued.expires_in),
                jwt_claims_lifetime(issued.access_token, self._wall_clock()),
            )
            if seconds is not None
        ]
        if known:
            return min(known)
        if not self._warned_lifetime:
            self._warned_lifetime = True
            log.warning(
                "the token answer gives no readable lifetime (expires_in %.24r, and the token "
                "has no usable exp claim); trusting it for %.0fs at a time",
                issued.expires_in,
                DEFAULT_LIFETIME,
            )
        return None


def _token_retryable(error: BaseException) -> bool:
    # Asking for a token twice is harmless: any transport failure that may heal is retried.
    if isinstance(error, TransportError):
        return not isinstance(error, NetworkConfigurationError)
    return isinstance(error, StatusError) and (error.status == 429 or error.status >= 500)


class TokenKeeper:
    """Owns the current token, the shared fetch, and the refresh-ahead task.

    *fetch* makes one token request (with its own retries) and returns the token. With a
    *store*, the token is shared by every process using that store: before fetching, the
    keeper takes the store's lock and reads it again, adopting a token another process
    fetched (see `_obtain_shared`); *wall_clock* is the clock the store's times are on.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Token]],
        *,
        clock: Callable[[], float] = time.monotonic,
        store: TokenStore | None = None,
        wall_clock: Callable[[], float] = time.time,
        on_token: Callable[[Token, float], None] | None = None,
    ) -> None:
        self._fetch = fetch
        self._on_token = on_token  # hears of each token kept, and how long it took
        self._clock = clock
        self._store = store
        self._wall_clock = wall_clock
        self._refused: str | None = None
        self._token: Token | None = None
        self._fetching: asyncio.Task[Token] | None = None
        self._changed = asyncio.Event()
        self._background: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "none" if self._token is None else f"expires in {self._remaining():.0f}s"
        return f"<TokenKeeper token={state}>"

    def _remaining(self) -> float:
        return self._token.expires_at - self._clock() if self._token else 0.0

    def start(self) -> None:
        """Start the refresh-ahead task; call inside the running loop."""
        if self._background is None:
            self._background = asyncio.get_running_loop().create_task(
                self._refresh_ahead(), name="dispatch-async token refresh"
            )

    async def close(self) -> None:
        """Cancel and await the background task and any fetch in flight."""
        tasks = [t for t in (self._background, self._fetching) if t is not None]
        self._background = self._fetching = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def token(self) -> str:
        """A token that is not expired, fetching one (shared) if needed."""
        current = self._token
        if current is not None and self._clock() < current.expires_at:
            return current.value
        return (await self._shared_fetch()).value

    def invalidate(self, value: str) -> None:
        """Forget *value* (the service refused it), unless a newer token replaced it already."""
        if self._token is not None and self._token.value == value:
            log.info("the service refused the access token; fetching a new one")
            self._refused = value
            self._token = None
            self._changed.set()

    async def _shared_fetch(self) -> Token:
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.get_running_loop().create_task(
                self._fetch_and_keep(), name="dispatch-async token fetch"
            )
            self._fetching.add_done_callback(_retrieve)
        # Shielded: one caller giving up must not cancel the fetch the others wait for.
        return await asyncio.shield(self._fetching)

    async def _fetch_and_keep(self) -> Token:
        started = self._clock()
        if self._store is None:
            token = await self._fetch()
        else:
            token = await self._obtain_shared(self._store)
        self._token = token
        self._changed.set()
        if self._on_token is not None:
            self._on_token(token, self._clock() - started)
        return token

    async def _obtain_shared(self, store: TokenStore) -> Token:
        """A token from *store* if it is not due for refresh, else fetched under its lock.

        Check, lock, check again: only the lock holder fetches (and saves); a process
        that does not get the lock waits for the holder's token to appear. An unreachable
        store is not fatal: the token is then fetched locally, unless the one in hand still
        works (a refresh ahead of time): then the refresh fails, and is tried again later,
        rather than fetch a token the fleet would not share.
        """
        give_up_at = self._clock() + STORE_WAIT_MAX
        try:
            while True:
                adopted = await self._adoptable(store)
                if adopted is not None:
                    return adopted
                async with store.lock(STORE_LOCK_WAIT) as held:
                    if held:
                        adopted = await self._adoptable(store)
                        if adopted is not None:
                            return adopted
                        token = await self._fetch()
                        await self._save(store, token)
                        return token
                if self._clock() >= give_up_at:
                    log.warning(
                        "no shared access token appeared within %.0fs; fetching one locally",
                        STORE_WAIT_MAX,
                    )
                    return await self._fetch()
                # Another process holds the lock, so it is fetching: wait for its token.
                poll_until = min(self._clock() + STORE_LOCK_WAIT, give_up_at)
                while self._clock() < poll_until:
                    await asyncio.sleep(STORE_POLL)
                    adopted = await self._adoptable(store)
                    if adopted is not None:
                        return adopted
        except TokenStoreUnavailable as exc:
            current = self._token
            if current is not None and self._clock() < current.expires_at:
                # Only the refresh-ahead task asks while the token works: it tries again.
                raise TokenStoreUnavailable(f"the token store is unreachable ({exc})") from exc
            log.warning("the token store is unreachable (%s); fetching a token locally", exc)
            return await self._fetch()

    async def _adoptable(self, store: TokenStore) -> Token | None:
        stored = await store.load()
        if stored is None or stored.value == self._refused:
            return None
        current = self._token
        if current is not None and current.value == stored.value:
            # Ours already: keep its refresh point rather than draw a new jitter.
            return current if self._clock() < current.refresh_at else None
        age = self._wall_clock() - stored.issued_at
        token = Token.issued(stored.value, self._clock() - age, stored.lifetime)
        if self._clock() >= token.refresh_at:
            return None  # due for refresh: the caller refreshes it
        return token

    async def _save(self, store: TokenStore, token: Token) -> None:
        ttl = token.expires_at - self._clock()
        if ttl <= 0:
            return
        issued_at = self._wall_clock() - (self._clock() - token.issued_at)
        try:
            await store.save(StoredToken(token.value, issued_at, token.lifetime), ttl)
        except TokenStoreUnavailable as exc:
            log.warning("could not share the new access token (%s); using it locally", exc)

    async def _refresh_ahead(self) -> None:
        failures = 0
        while True:
            self._changed.clear()
            token = self._token
            if token is None or (failures and self._clock() >= token.expires_at):
                # Nothing to refresh ahead of: callers fetch on demand, and wake us.
                failures = 0
                await self._changed.wait()
                continue
            delay = token.refresh_at - self._clock()
            if failures:
                delay = min(RETRY_FIRST_WAIT * 2 ** (failures - 1), RETRY_MAX_WAIT)
            if delay > 0 and await _wait_or_timeout(self._changed, delay):
                failures = 0
                continue  # a new token arrived (or was dropped): plan again
            try:
                await self._shared_fetch()
                failures = 0
            except (DispatchError, TokenStoreUnavailable) as exc:
                failures += 1
                log.warning(
                    "refreshing the access token failed (%s); the current one is kept, %.1fs left",
                    exc,
                    max(self._remaining(), 0.0),
                )
            except Exception:  # pragma: no cover - defensive: never let the refresh task die
                failures += 1
                log.exception("unexpected error while refreshing the access token")


async def _wait_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _retrieve(task: asyncio.Task[Token]) -> None:
    # Waiters see the exception; this keeps asyncio from calling it "never retrieved".
    if not task.cancelled():
        task.exception()

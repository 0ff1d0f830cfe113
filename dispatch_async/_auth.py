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

import attrs

from ._exceptions import DispatchError

__all__ = [
    "DEFAULT_LIFETIME",
    "MAX_LIFETIME",
    "Secret",
    "Token",
    "TokenKeeper",
]

log = logging.getLogger("dispatch_async")

#: Seconds a token is trusted for when the service gives no (or a zero) lifetime.
DEFAULT_LIFETIME = 60.0
#: A lifetime longer than this is capped: a token is never "valid forever".
MAX_LIFETIME = 24 * 3600.0
#: Refresh when this fraction of the lifetime is left (plus up to REFRESH_JITTER more),
#: so a fleet of sessions started together does not refresh in lockstep.
REFRESH_MARGIN = 0.2
REFRESH_JITTER = 0.05
#: Stop using a token this fraction of its lifetime (at most EXPIRY_SAFETY_MAX seconds)
#: before it expires: a request takes time to reach the service.
EXPIRY_SAFETY = 0.05
EXPIRY_SAFETY_MAX = 10.0
#: Waits between failed background refreshes, doubled each time up to the cap.
RETRY_FIRST_WAIT = 0.5
RETRY_MAX_WAIT = 30.0


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
        safety = min(seconds * EXPIRY_SAFETY, EXPIRY_SAFETY_MAX)
        return cls(
            value,
            issued_at,
            seconds,
            refresh_at=issued_at + seconds * (1 - margin),
            expires_at=issued_at + seconds - safety,
        )


class TokenKeeper:
    """Owns the current token, the shared fetch, and the refresh-ahead task.

    *fetch* makes one token request (with its own retries) and returns the token.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Token]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._token: Token | None = None
        self._fetching: asyncio.Task[Token] | None = None
        self._changed = asyncio.Event()
        self._background: asyncio.Task[None] | None = None
        self.fetches = 0

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
        self.fetches += 1
        token = await self._fetch()
        self._token = token
        self._changed.set()
        log.debug("fetched an access token valid for %.0fs", token.lifetime)
        return token

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
            except DispatchError as exc:
                failures += 1
                log.warning(
                    "refreshing the access token failed (%s); the current one is kept, "
                    "%.1fs left",
                    exc,
                    max(self._remaining(), 0.0),
                )
            except Exception:  # never let the refresh task die
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

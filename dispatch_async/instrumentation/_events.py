"""The events a session reports, and the one protocol a hook implements.

Events are values: frozen, slotted, and free of secrets (a token event carries its
lifetime, never the token). Recipients appear only as positions and counts, so any
field is safe as a log field; only ``endpoint``, ``status`` and ``outcome`` are meant
as metric labels (low cardinality).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

import attrs

__all__ = [
    "CallFinished",
    "CallStarted",
    "ChunkAnswered",
    "ChunkSent",
    "ChunkSplit",
    "Event",
    "Hook",
    "Paused",
    "RateChanged",
    "RetryScheduled",
    "TokenObtained",
]


@attrs.frozen
class CallStarted:
    """A ``send_*``/``stream_*`` call began."""

    call_id: int
    """This call's number in the process, shared by all its events."""
    endpoint: str
    """The endpoint's path (``/api/v3/template``)."""
    recipients: int | None
    """How many recipients the call has: None for an iterator (not known yet)."""
    url: str
    """The absolute URL every request of the call goes to (no credentials, no query)."""


@attrs.frozen
class CallFinished:
    """A call ended; ``outcomes`` counts recipients (valid, invalid, maybe_sent, not_sent)."""

    call_id: int
    """The call's number, as in its `CallStarted`."""
    endpoint: str
    """The endpoint's path."""
    recipients: int
    """How many recipients the call read."""
    outcomes: Mapping[str, int]
    """Recipients per outcome: ``valid``, ``invalid``, ``maybe_sent``, ``not_sent``."""
    duration: float
    """Seconds from the call's start to its end."""
    error: str | None = None
    """The class name of the exception that ended the call, if one did."""


@attrs.frozen
class ChunkSent:
    """One attempt at sending a chunk begins.

    ``headers`` starts empty: a hook may add trace-propagation headers to it, and they
    go out on this attempt's request (nothing else can be set this way). A header that
    cannot go out (not text, a line break, one the SDK or HTTP sets) is dropped and
    logged once; the chunk is sent all the same.
    """

    call_id: int
    """The call's number, as in its `CallStarted`."""
    endpoint: str
    """The endpoint's path."""
    start: int
    """The input position of the chunk's first recipient."""
    size: int
    """How many recipients the request carries."""
    attempt: int
    """1 for the first try, 2 for the first retry, ... (a resend after a refused token
    keeps its attempt's number)."""
    headers: dict[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    """Headers a hook adds to this attempt's request (trace context)."""


@attrs.frozen
class ChunkAnswered:
    """An attempt ended: ``status`` is None when no HTTP answer came (a transport error)."""

    call_id: int
    """The call's number, as in its `CallStarted`."""
    endpoint: str
    """The endpoint's path."""
    start: int
    """The input position of the chunk's first recipient."""
    size: int
    """How many recipients the request carried."""
    attempt: int
    """As in the `ChunkSent` it answers."""
    status: int | None
    """The HTTP status; None when no answer came."""
    duration: float
    """Seconds from the request leaving (after the rate limit) to its answer."""
    maybe_sent: bool
    """Whether the service may have acted on the request (True for a 200)."""
    error: str | None = None
    """Why the attempt failed, if it did (no secrets)."""


@attrs.frozen
class ChunkSplit:
    """The server refused a request as too large (HTTP 413): its recipients go out in parts.

    The refused request's recipients go out again in parts of ``part_size`` (half of
    it, a refused half halved again). The size the call's later chunks go out in is
    what went through, reported in `DispatchResult.split_to`.
    """

    call_id: int
    """The call's number, as in its `CallStarted`."""
    endpoint: str
    """The endpoint's path."""
    start: int
    """The input position of the refused request's first recipient."""
    size: int
    """How many recipients the refused request carried."""
    request_bytes: int | None
    """The refused request's body size in bytes (None if unknown)."""
    part_size: int
    """The most recipients of each part the refused request is sent again in."""


@attrs.frozen
class RetryScheduled:
    """A failed attempt will be tried again after ``wait`` seconds."""

    call_id: int
    """The call's number, as in its `CallStarted`."""
    endpoint: str
    """The endpoint's path."""
    start: int
    """The input position of the chunk's first recipient."""
    attempt: int
    """The attempt that failed."""
    error: str
    """Why it failed."""
    wait: float
    """Seconds until the next attempt."""


@attrs.frozen
class Paused:
    """The service answered ``status`` (429) with Retry-After: every request waits."""

    status: int
    """The status that asked for the pause (429)."""
    seconds: float
    """How long every request waits: the Retry-After, capped by the retry policy."""


@attrs.frozen
class RateChanged:
    """The learned request rate (``requests_per_second="auto"``) changed, or was first known."""

    requests_per_second: float
    """The rate now."""
    previous: float | None
    """The rate before, or None the first time this session sees it."""
    reason: Literal["start", "increase", "decrease"]
    """``"increase"`` (requests went through), ``"decrease"`` (a 429) or ``"start"``."""
    shared: bool
    """The rate is the fleet's, in Redis: another process may have changed it."""


@attrs.frozen
class TokenObtained:
    """An access token was fetched from the service or adopted from a shared store."""

    source: Literal["fetched", "adopted"]
    """``"fetched"`` from the service, or ``"adopted"`` from a shared token store."""
    duration: float
    """Seconds it took to obtain."""
    lifetime: float
    """Seconds the token is valid for, from when it was obtained."""


Event = (
    CallStarted
    | CallFinished
    | ChunkSent
    | ChunkAnswered
    | ChunkSplit
    | RetryScheduled
    | Paused
    | RateChanged
    | TokenObtained
)


class Hook(Protocol):
    """Anything called with each event; it must not block (it runs on the event loop)."""

    def __call__(self, event: Event) -> None: ...

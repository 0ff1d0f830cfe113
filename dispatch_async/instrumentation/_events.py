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
    "Event",
    "Hook",
    "Paused",
    "RateChanged",
    "RetryScheduled",
    "TokenObtained",
]


@attrs.frozen
class CallStarted:
    """A ``send_*``/``stream_*`` call began; ``recipients`` is None for an iterator."""

    call_id: int
    endpoint: str
    recipients: int | None


@attrs.frozen
class CallFinished:
    """A call ended; ``outcomes`` counts recipients (valid, invalid, maybe_sent, not_sent)."""

    call_id: int
    endpoint: str
    recipients: int
    outcomes: Mapping[str, int]
    duration: float
    error: str | None = None


@attrs.frozen
class ChunkSent:
    """One attempt at sending a chunk begins.

    ``headers`` starts empty: a hook may add trace-propagation headers to it, and they
    go out on this attempt's request (nothing else can be set this way). A header that
    cannot go out (not text, a line break, one the SDK or HTTP sets) is dropped and
    logged once; the chunk is sent all the same.
    """

    call_id: int
    endpoint: str
    start: int
    size: int
    attempt: int
    headers: dict[str, str] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen
class ChunkAnswered:
    """An attempt ended: ``status`` is None when no HTTP answer came (a transport error)."""

    call_id: int
    endpoint: str
    start: int
    size: int
    attempt: int
    status: int | None
    duration: float
    maybe_sent: bool
    error: str | None = None


@attrs.frozen
class RetryScheduled:
    """A failed attempt will be tried again after ``wait`` seconds."""

    call_id: int
    endpoint: str
    start: int
    attempt: int
    error: str
    wait: float


@attrs.frozen
class Paused:
    """The service answered ``status`` (429) with Retry-After: every request waits."""

    status: int
    seconds: float


@attrs.frozen
class RateChanged:
    """The learned request rate (``requests_per_second="auto"``) changed, or was first known.

    ``reason``: "increase" (requests went through), "decrease" (a 429) or "start";
    ``previous`` is None the first time this session sees the rate. ``shared``: the
    rate is the fleet's, in Redis, so another process may have changed it.
    """

    requests_per_second: float
    previous: float | None
    reason: Literal["start", "increase", "decrease"]
    shared: bool


@attrs.frozen
class TokenObtained:
    """An access token was fetched from the service or adopted from a shared store."""

    source: Literal["fetched", "adopted"]
    duration: float
    lifetime: float


Event = (
    CallStarted
    | CallFinished
    | ChunkSent
    | ChunkAnswered
    | RetryScheduled
    | Paused
    | RateChanged
    | TokenObtained
)


class Hook(Protocol):
    """Anything called with each event; it must not block (it runs on the event loop)."""

    def __call__(self, event: Event) -> None: ...

"""What a store of delivery state must do (`DeliveryStore`), and what it keeps per message.

A store writes batches of events durably and answers four questions: one message,
the messages of a number, the counts by status of a campaign, and the events since a
cursor (the change stream). Its folding rule is the status ladder's: a message's status
is the highest-ranked of its events (`DeliveryStatus.rank`), the lesser name at equal
ranks (so arrival order does not matter).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs
import orjson

from ._events import EARLIEST, LATEST, DeliveryEvent, event_from, number_key
from ._status import DeliveryStatus

__all__ = [
    "DeliveryStore",
    "EventRow",
    "MessageState",
    "event_row",
    "stored_event",
    "utc",
]


@attrs.frozen
class MessageState:
    """What the callbacks so far say about one message.

    ``status`` is the highest on the ladder of its events, ``channel`` the channel of the
    event that set it (or the last one known). ``first_event_at`` and ``last_event_at``
    are the events' own times (their receipt time when they had none). ``number`` is the
    ``user_id`` as the service wrote it.
    """

    reference: str
    """The message's id (``ValidMessage.id``)."""
    status: DeliveryStatus
    """The highest status on the ladder of its events."""
    channel: str | None
    """The channel of the event that set ``status`` (or the last one known)."""
    number: str | None
    """The ``user_id`` as the service wrote it."""
    campaign_name: str | None
    """The request's ``campaign_name``, as its events carry it."""
    first_event_at: dt.datetime
    """The earliest event's own time (its receipt time when it had none)."""
    last_event_at: dt.datetime
    """The latest event's own time (its receipt time when it had none)."""
    events: int
    """How many distinct events are stored for it."""


@runtime_checkable
class DeliveryStore(Protocol):
    """Where a `DeliveryTracker` keeps events: `SQLiteDeliveryStore`, `RedisDeliveryStore`.

    ``write`` returns only once the batch is durable; an event already stored (same
    ``key``) is ignored. Cursors are opaque strings of the store's making.
    """

    async def open(self) -> None:
        """Connect, and create what is missing (tables, indexes)."""

    async def write(self, events: Sequence[DeliveryEvent], received_at: float) -> None:
        """Store *events*, received at *received_at* (epoch seconds), in one commit."""

    async def message(self, reference: str) -> MessageState | None:
        """The state of one message, or None if no event names it."""

    async def messages_for(
        self, number: str, campaign_name: str | None = None
    ) -> list[MessageState]:
        """The messages whose events carry *number* (any formatting), oldest first."""

    async def events(self, reference: str) -> list[DeliveryEvent]:
        """One message's events, in the order they were stored."""

    async def counts(self, campaign_name: str | None) -> dict[DeliveryStatus, int]:
        """How many messages of a campaign are in each status (None: without a name)."""

    async def changes(self, after: str | None, limit: int) -> tuple[list[DeliveryEvent], str]:
        """Up to *limit* events stored after cursor *after*, and the cursor past them.

        ``after=None`` starts at the end: no events, the cursor of the latest one.
        """

    async def aclose(self) -> None:
        """Close connections; the data stays."""


class EventRow(NamedTuple):
    """One event as a store writes it: everything its indexes and folding need."""

    key: str
    reference: str
    digits: str
    number: str | None
    campaign: str | None
    status: str
    rank: int
    channel: str | None
    at: float
    received: float
    body: bytes


def event_row(event: DeliveryEvent, received_at: float) -> EventRow:
    """The row for *event*: its time is its own ``timestamp``, else its receipt.

    An empty ``user_id``, ``campaign_name`` or ``channel`` is the same as none.
    """
    moment = event.occurred_at
    status = event.status
    return EventRow(
        event.key,
        event.reference,
        number_key(event.user_id),
        event.user_id or None,
        event.campaign_name or None,
        status.value,
        status.rank,
        event.channel or None,
        received_at if moment is None else moment.timestamp(),
        received_at,
        event.canonical or orjson.dumps(event.to_json(), option=orjson.OPT_SORT_KEYS),
    )


def stored_event(body: bytes, key: str, received: float) -> DeliveryEvent:
    """An event read back from a store, with its original key and receipt time."""
    data: dict[str, Any] = orjson.loads(body)
    return attrs.evolve(event_from(data), key=key, received_at=utc(received))


def utc(epoch: float) -> dt.datetime:
    """Epoch seconds as an aware UTC datetime, held within the years 1 to 9999 (a time
    stored before `parse_time` refused the others still reads back)."""
    return dt.datetime.fromtimestamp(min(max(epoch, EARLIEST), LATEST), dt.UTC)

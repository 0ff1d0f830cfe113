"""One delivery callback as a value, and the pure function that reads it from bytes.

Lenient where the vendor is vague (unknown fields and ``type`` values kept, optional
fields may be missing), strict where storing it would go wrong (a body that is not a
JSON object, or an event without ``reference``, cannot be filed under a message).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs
import orjson

from .._exceptions import DeliveryEventError
from ._status import DeliveryStatus, status_of

__all__ = ["DeliveryEvent", "number_key", "parse_event"]

#: The documented string fields besides ``reference`` (and ``message``, an object).
_TEXT_FIELDS: Final = (
    "campaign_name",
    "event_id",
    "direction",
    "session_id",
    "user_id",
    "timestamp",
    "channel",
    "type",
)
_KNOWN: Final = frozenset({"reference", "message", *_TEXT_FIELDS})
#: The ``extra`` of every event without any: read-only, since all of them share it.
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


@attrs.frozen
class DeliveryEvent:
    """One event the service POSTed to the callback URL: the vendor's fields, typed.

    Every field but ``reference`` may be None (missing, null, or not a string: the raw
    value of a mistyped field is kept in ``extra``). ``type`` is as the service sent it;
    ``status`` is what it means (`DeliveryStatus`). ``key`` identifies the event: the
    same event delivered twice (the service retries) has the same key, whatever the
    order of its fields, and whether a null field is sent or left out. ``received_at``
    is set on events read back from a store.
    """

    reference: str
    """The message's id: ``id`` in ``validMessages``, the same in every event of it."""
    status: DeliveryStatus
    """What the event means (from ``type``, ``channel`` and ``direction``)."""
    type: str | None = None
    """As the service sent it: the RCS type sent (outbound), else the status or content."""
    direction: str | None = None
    """``outbound`` or ``inbound``."""
    channel: str | None = None
    """``RCS``, or ``SMS`` when the phone has no RCS and the fallback carried it."""
    user_id: str | None = None
    """The recipient's phone number (personal data: never logged above DEBUG)."""
    campaign_name: str | None = None
    """The request's ``campaign_name``."""
    event_id: str | None = None
    """Changes on external events (a click, a reply); otherwise stable."""
    session_id: str | None = None
    """The conversation's session; None for basic and single messages."""
    timestamp: str | None = None
    """When it happened, ISO 8601, as the service wrote it (see ``occurred_at``)."""
    message: Mapping[str, Any] | None = None
    """The event's ``message`` object, filled in some cases (a reply's content)."""
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    """Fields the vendor does not document, as they came."""
    key: str = attrs.field(default="", repr=False)
    """A digest of the event's content: a re-delivery of the event has the same key."""
    canonical: bytes = attrs.field(default=b"", repr=False, eq=False)
    """The event as JSON, keys sorted and null fields left out (what ``key`` digests;
    what a store keeps); made from the fields for an event made by hand."""
    received_at: dt.datetime | None = attrs.field(default=None, repr=False, eq=False)
    """When a store received it (None for an event just parsed)."""

    def __attrs_post_init__(self) -> None:
        # An event made by hand gets its key from its content, as a parsed one does:
        # with one key for all of them, a store would keep only the first.
        if not self.key:
            canonical = self.canonical or _canonical(self.to_json())
            object.__setattr__(self, "canonical", canonical)
            # Its status too: the body read back cannot say it without a ``type``.
            object.__setattr__(self, "key", _digest(canonical + self.status.value.encode()))

    @property
    def occurred_at(self) -> dt.datetime | None:
        """``timestamp`` as an aware datetime (UTC assumed without an offset), or None."""
        return parse_time(self.timestamp)

    def to_json(self) -> dict[str, Any]:
        """The event as the service sent it: documented fields, then the others."""
        body: dict[str, Any] = {"reference": self.reference}
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.message is not None:
            body["message"] = self.message
        body.update(self.extra)
        return body


def parse_event(body: bytes) -> DeliveryEvent:
    """Read one callback body.

    Raises:
        DeliveryEventError: the body is not a JSON object, or has no ``reference``
            (a non-empty string, or a number); ``status`` is 400.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise DeliveryEventError("the callback body is not JSON") from None
    if type(data) is not dict:
        raise DeliveryEventError("the callback body is not a JSON object")
    return event_from(data)


def event_from(data: dict[str, Any]) -> DeliveryEvent:
    """The event for a decoded callback body (see `parse_event`)."""
    reference = _text(data.get("reference"))
    if not reference:
        raise DeliveryEventError("the callback has no reference (the message's id)")
    raw = [data.get(name) for name in _TEXT_FIELDS]
    extra: dict[str, Any] = {}
    if all(value is None or type(value) is str for value in raw):
        values: list[str | None] = raw  # the usual body: every field a string or null
    else:
        values = [_text(value) for value in raw]
        extra.update(
            (name, value)
            for name, value, text in zip(_TEXT_FIELDS, raw, values, strict=True)
            if text is None and value is not None
        )
    campaign_name, event_id, direction, session_id, user_id, timestamp, channel, type_ = values
    message = data.get("message")
    if message is not None and type(message) is not dict:
        extra["message"] = message
        message = None
    if len(data) > len(_KNOWN) or not _KNOWN.issuperset(data):
        extra.update((k, v) for k, v in data.items() if k not in _KNOWN)
    canonical = _canonical(data)
    return DeliveryEvent(
        reference=reference,
        status=status_of(type_, channel, direction),
        type=type_,
        direction=direction,
        channel=channel,
        user_id=user_id,
        campaign_name=campaign_name,
        event_id=event_id,
        session_id=session_id,
        timestamp=timestamp,
        message=message,
        extra=extra or _EMPTY,
        key=_digest(canonical),
        canonical=canonical,
    )


def number_key(number: str | None) -> str:
    """The digits of a phone number: how an event's ``user_id`` is matched to a recipient.

    ``+55 (11) 98765-4321`` and ``5511987654321`` are the same number here.
    """
    if not number:
        return ""
    if number.isascii() and number.isdigit():  # as the service writes it: digits only
        return number
    return "".join(c for c in number if "0" <= c <= "9")


#: The epoch seconds of every moment a datetime holds in UTC, a day in from each end.
EARLIEST: Final = dt.datetime(1, 1, 2, tzinfo=dt.UTC).timestamp()
LATEST: Final = dt.datetime(9999, 12, 30, tzinfo=dt.UTC).timestamp()


def parse_time(text: str | None) -> dt.datetime | None:
    """An ISO 8601 timestamp as an aware datetime (UTC assumed without offset), or None.

    None too for a moment too near year 1 or 9999 to be read back in UTC
    (``0001-01-01T00:00:00+05:30`` is in year 0): it is stored at its receipt time.
    """
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment if EARLIEST <= moment.timestamp() <= LATEST else None


def _text(value: object) -> str | None:
    # Strings as they are, integers (ids sent as numbers) as their digits; anything else
    # is not a usable value of a string field.
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


def _digest(canonical: bytes) -> str:
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def _canonical(data: Mapping[str, Any]) -> bytes:
    # The same event re-delivered may come with its fields in another order or spacing,
    # or a null field left out: its canonical form is the same.
    if None in data.values():
        data = {k: v for k, v in data.items() if v is not None}
    try:
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels)
        raise DeliveryEventError("the callback body is nested too deeply") from None

"""The delivery-status vocabulary: what a callback's ``type``, ``channel`` and ``direction`` say.

The vendor documents the fields, not their values: the values below are what
integrations of the service report (``DELIVERED``, ``READ``, ``EXCEPTION``, ``ERROR``,
``bloqueado por duplicidade``, outbound ``basic``/``single``/``conversacional``, inbound
content types). Anything else is ``UNKNOWN``, never refused: the event keeps its raw
``type``.
"""

from __future__ import annotations

import enum
import functools
from typing import Final

__all__ = ["DeliveryStatus", "status_of"]


class DeliveryStatus(enum.StrEnum):
    """What one event says about its message, and what a message's events add up to.

    A message's status only moves up this ladder, whatever order its events arrive in
    (`rank`): ``unknown`` < ``sent`` < ``failed`` = ``blocked_duplicate`` < ``delivered``
    = ``delivered_sms`` < ``read`` < ``interaction``. A delivery receipt outranks a
    failure because it is proof: the failure was of one attempt (the RCS one, before the
    SMS fallback delivered it). Between equal ranks the lesser name stays (``delivered``
    over ``delivered_sms``, ``blocked_duplicate`` over ``failed``), so that the same
    events give the same status in any order of arrival.
    """

    UNKNOWN = "unknown"
    """An event whose type is not one of the observed values (kept as it came)."""
    SENT = "sent"
    """The outbound echo: the service sent the message (``type`` is the RCS type)."""
    FAILED = "failed"
    """``EXCEPTION`` or ``ERROR``: the service could not deliver it."""
    BLOCKED_DUPLICATE = "blocked_duplicate"
    """``bloqueado por duplicidade``: identical content to the same number within an hour."""
    DELIVERED = "delivered"
    """``DELIVERED`` on the RCS channel."""
    DELIVERED_SMS = "delivered_sms"
    """``DELIVERED`` on the SMS channel: the phone has no RCS and the fallback carried it."""
    READ = "read"
    """``READ``: the recipient opened it."""
    INTERACTION = "interaction"
    """An inbound reply or click (``type`` is its content type: ``text``, ``image``, ...)."""

    @property
    def rank(self) -> int:
        """Its place on the ladder: a message's status is its highest-ranked event."""
        return _RANK[self]

    @property
    def confirms_sent(self) -> bool:
        """Whether an event of this status proves the service acted on the message."""
        return self is not DeliveryStatus.UNKNOWN


_RANK: Final = {
    DeliveryStatus.UNKNOWN: 0,
    DeliveryStatus.SENT: 1,
    DeliveryStatus.FAILED: 2,
    DeliveryStatus.BLOCKED_DUPLICATE: 2,
    DeliveryStatus.DELIVERED: 3,
    DeliveryStatus.DELIVERED_SMS: 3,
    DeliveryStatus.READ: 4,
    DeliveryStatus.INTERACTION: 5,
}

_BY_TYPE: Final = {
    "read": DeliveryStatus.READ,
    "exception": DeliveryStatus.FAILED,
    "error": DeliveryStatus.FAILED,
    "bloqueado por duplicidade": DeliveryStatus.BLOCKED_DUPLICATE,
}
#: The RCS types an outbound echo names (the endpoints' billing categories).
_SENT_TYPES: Final = frozenset({"basic", "single", "conversacional", "conversational"})
#: What an inbound reply carries (observed); also ``interaction``, the vendor's own word.
_INBOUND_TYPES: Final = frozenset(
    {
        "interaction",
        "text",
        "image",
        "video",
        "audio",
        "document",
        "contact",
        "location",
        "richcard",
        "carousel",
    }
)


@functools.lru_cache(maxsize=1024)  # a handful of distinct values, one call per callback
def status_of(type_: str | None, channel: str | None, direction: str | None) -> DeliveryStatus:
    """The status one event reports, from its raw ``type``, ``channel`` and ``direction``.

    Case, surrounding space and ``_`` for space do not matter. An outbound event of a
    type that is not a status is the echo (``SENT``), whatever RCS type it names.
    """
    if not type_:
        return DeliveryStatus.UNKNOWN
    word = " ".join(type_.replace("_", " ").split()).casefold()
    if word == "delivered":
        sms = channel is not None and channel.strip().casefold() == "sms"
        return DeliveryStatus.DELIVERED_SMS if sms else DeliveryStatus.DELIVERED
    status = _BY_TYPE.get(word)
    if status is not None:
        return status
    side = (direction or "").strip().casefold()
    if side == "outbound" or (not side and word in _SENT_TYPES):
        return DeliveryStatus.SENT
    if word in _INBOUND_TYPES and side in ("inbound", ""):
        return DeliveryStatus.INTERACTION
    return DeliveryStatus.UNKNOWN

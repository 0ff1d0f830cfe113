"""Delivery tracking: the service's callbacks, read, stored and matched to your sends.

The service POSTs an event to the request's ``callback`` URL for every step of a
message (sent, delivered, read, a reply, a failure). `parse_event` reads one;
the delivery-status vocabulary is `DeliveryStatus`.
"""

from ._events import DeliveryEvent, parse_event
from ._status import DeliveryStatus

__all__ = [
    "DeliveryEvent",
    "DeliveryStatus",
    "parse_event",
]

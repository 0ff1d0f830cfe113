"""``resolve_maybe_sent``: what the callbacks say about recipients the answer left unknown.

A ``maybe_sent`` recipient has no id: the request failed after the service may have
acted. If it did act, the message's callbacks name the recipient's number (``user_id``)
and the call's ``campaign_name``. With a campaign name used by this job alone, any
callback that proves the service acted (`DeliveryStatus.confirms_sent`) confirms the
recipient as sent, its ``reference`` becoming the id. Silence proves nothing (callbacks
can be lost or late): a recipient without one stays ``maybe_sent``.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from .._e164 import to_e164
from .._models import ValidMessage, valid_messages
from .._outcome import DispatchResult, FailedRecipient
from ._events import number_key
from ._store import MessageState
from ._tracker import DeliveryTracker

__all__ = ["MaybeSentResolution", "resolve_maybe_sent"]


@attrs.frozen
class MaybeSentResolution:
    """What the callbacks confirmed about ``maybe_sent`` recipients.

    ``confirmed`` are sent after all: each a `ValidMessage` whose ``id`` is the
    callbacks' ``reference`` (``session_id`` is not known here: None), with its
    `MessageState` in ``states`` under that id. ``unconfirmed`` are still ``maybe_sent``.
    """

    confirmed: Sequence[ValidMessage]
    """Sent after all: each a `ValidMessage` whose ``id`` is the callbacks' ``reference``."""
    unconfirmed: Sequence[FailedRecipient]
    """Still ``maybe_sent``: no callback confirmed them (which proves nothing)."""
    states: Mapping[str, MessageState]
    """The `MessageState` of each confirmed message, under its id."""

    def apply(self, result: DispatchResult) -> DispatchResult:
        """*result* with the confirmed recipients moved from ``failed`` to ``valid``."""
        if not self.confirmed:
            return result
        moved = {message.position for message in self.confirmed}
        valid = [*result.valid, *self.confirmed]
        refs = {m.position: m.ref for m in valid if m.ref is not None}
        return attrs.evolve(
            result,
            valid=valid_messages(
                [m.id for m in valid],
                [m.number for m in valid],
                [m.position for m in valid],
                refs,
                [m.session_id for m in valid],
            ),
            failed=[f for f in result.failed if f.position not in moved],
        )


async def resolve_maybe_sent(
    failed: DispatchResult | Iterable[FailedRecipient],
    tracker: DeliveryTracker,
    *,
    campaign_name: str,
    sent_after: dt.datetime | Callable[[FailedRecipient], dt.datetime | None] | None = None,
    known_ids: Collection[str] = (),
    region: str | None = None,
) -> MaybeSentResolution:
    """Confirm the ``maybe_sent`` recipients the service's callbacks show it acted on.

    Args:
        failed: a result (its ``maybe_sent`` recipients are looked at, and the ids in
            its ``valid`` are never taken for another recipient), or failed recipients.
        tracker: where the callbacks were stored.
        campaign_name: the ``campaign_name`` of the call; give each job its own, or a
            callback of another job to the same number could be taken for this one.
        sent_after: when the call started (aware datetime): callbacks of messages whose
            first event is earlier are not taken. Or a function giving it for each
            recipient (None: any time), for recipients of several calls resolved
            together, as they must be when a number stands in more than one: a
            callback is only taken for a recipient whose call started before it.
            Mind the clocks: the events' times are the service's.
        known_ids: ids the service already gave for other recipients of the job (read
            back from a results file, say): never taken for a ``maybe_sent`` one.
        region: the call's ``region`` when it was sent with ``prevalidate``: a number
            written without ``+`` went out in E.164 through it, and its callbacks carry
            that form (needs the ``phonenumbers`` extra, as ``prevalidate`` does).

    Returns:
        The confirmed and the still unknown recipients. Recipients of one number take
        one callback reference each, oldest message first, in the order of their
        starts, then of their positions. A recipient is confirmed only when every way
        of giving the references to recipients that could have sent them confirms it:
        when a number has fewer usable references than recipients, none is (which ones
        went is not known).
    """
    taken: set[str] = set(known_ids)
    if isinstance(failed, DispatchResult):
        taken.update(message.id for message in failed.valid)
        candidates = [f for f in failed.failed if f.maybe_sent]
    else:
        candidates = [f for f in failed if f.maybe_sent]
    start_of = sent_after if callable(sent_after) else (lambda _: sent_after)
    by_number: dict[str, list[tuple[dt.datetime, FailedRecipient]]] = {}
    for recipient in candidates:
        number = recipient.recipient.number
        if region is not None:
            number = to_e164(number, region) or number
        start = start_of(recipient)
        by_number.setdefault(number_key(number), []).append(
            (_ANY_TIME if start is None else start, recipient)
        )
    confirmed: list[ValidMessage] = []
    moved: set[int] = set()
    states: dict[str, MessageState] = {}
    for digits, recipients in by_number.items():
        found = await tracker.messages_for(digits, campaign_name) if digits else []
        usable = [s for s in found if s.reference not in taken and s.status.confirms_sent]
        for recipient, state in _certain(recipients, usable):
            taken.add(state.reference)
            moved.add(id(recipient))
            states[state.reference] = state
            confirmed.append(
                ValidMessage(
                    id=state.reference,
                    number=recipient.recipient.number,
                    position=recipient.position,
                    ref=recipient.ref,
                )
            )
    # By identity: recipients of several calls may share a position.
    unconfirmed = sorted((f for f in candidates if id(f) not in moved), key=_POSITION)
    confirmed.sort(key=_POSITION)
    return MaybeSentResolution(confirmed, unconfirmed, states)


#: The start of a recipient that gives none: every callback can be its.
_ANY_TIME = dt.datetime.min.replace(tzinfo=dt.UTC)
_POSITION = operator.attrgetter("position")


def _certain(
    recipients: list[tuple[dt.datetime, FailedRecipient]], usable: list[MessageState]
) -> list[tuple[FailedRecipient, MessageState]]:
    """The recipients of one number that every explanation of *usable* confirms, each
    with a message.

    A message can be a recipient's only if it began after the recipient's start; each
    message is one recipient's, each recipient sent at most one. A recipient is certain
    when every largest such pairing pairs it. Recipients with one start are alike, so
    that is asked once per start: does the largest pairing shrink without one of them?
    """
    recipients = sorted(recipients, key=lambda pair: (pair[0], pair[1].position))
    starts = [start for start, _ in recipients]
    times = sorted(state.first_event_at for state in usable)
    pairs = _pairing(starts, times)
    most = len(pairs)
    certain: set[dt.datetime] = set()
    for start in set(starts):
        without = starts.copy()
        without.remove(start)
        if len(_pairing(without, times)) < most:
            certain.add(start)
    usable = sorted(usable, key=lambda state: state.first_event_at)  # stable: as found
    return [
        (recipients[at][1], usable[taken]) for at, taken in pairs if recipients[at][0] in certain
    ]


def _pairing(starts: list[dt.datetime], times: list[dt.datetime]) -> list[tuple[int, int]]:
    """A largest pairing of starts (ascending) to times (ascending) with time >= start.

    Each start in turn takes the earliest time left at or after it: a time passed over
    is before every later start too, so no pairing is larger.
    """
    pairs = []
    at = 0
    for index, start in enumerate(starts):
        while at < len(times) and times[at] < start:
            at += 1
        if at == len(times):
            break
        pairs.append((index, at))
        at += 1
    return pairs

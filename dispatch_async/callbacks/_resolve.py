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
from collections.abc import Collection, Iterable, Mapping, Sequence

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
    sent_after: dt.datetime | None = None,
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
            first event is earlier are not taken. Mind the clocks: the events' times are
            the service's.
        known_ids: ids the service already gave for other recipients of the job (read
            back from a results file, say): never taken for a ``maybe_sent`` one.
        region: the call's ``region`` when it was sent with ``prevalidate``: a number
            written without ``+`` went out in E.164 through it, and its callbacks carry
            that form (needs the ``phonenumbers`` extra, as ``prevalidate`` does).

    Returns:
        The confirmed and the still unknown recipients. Two recipients with the same
        number take one callback reference each, in input order, oldest message first;
        when a number has fewer usable references than recipients, none of them is
        confirmed (which ones went is not known).
    """
    taken: set[str] = set(known_ids)
    if isinstance(failed, DispatchResult):
        taken.update(message.id for message in failed.valid)
        candidates = [f for f in failed.failed if f.maybe_sent]
    else:
        candidates = [f for f in failed if f.maybe_sent]
    by_number: dict[str, list[FailedRecipient]] = {}
    for recipient in sorted(candidates, key=lambda f: f.position):
        number = recipient.recipient.number
        if region is not None:
            number = to_e164(number, region) or number
        by_number.setdefault(number_key(number), []).append(recipient)
    confirmed: list[ValidMessage] = []
    unconfirmed: list[FailedRecipient] = []
    states: dict[str, MessageState] = {}
    for digits, recipients in by_number.items():
        found = await tracker.messages_for(digits, campaign_name) if digits else []
        usable = [
            state
            for state in found
            if state.reference not in taken
            and state.status.confirms_sent
            and (sent_after is None or state.first_event_at >= sent_after)
        ]
        if len(usable) < len(recipients):
            # Which of them went is not known: a wrong guess is a message lost.
            unconfirmed.extend(recipients)
            continue
        for recipient, state in zip(recipients, usable, strict=False):
            taken.add(state.reference)
            states[state.reference] = state
            confirmed.append(
                ValidMessage(
                    id=state.reference,
                    number=recipient.recipient.number,
                    position=recipient.position,
                    ref=recipient.ref,
                )
            )
    unconfirmed.sort(key=lambda f: f.position)
    return MaybeSentResolution(confirmed, unconfirmed, states)

"""``maybe_sent`` resolved: a recipient the answer left unknown is confirmed as sent by a
callback for its number and the call's campaign, and stays unknown without one. The
results come from real sends to the simulator; the callbacks from the simulator posting
to a real receiver, or recorded straight into a real SQLite tracker."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

import dispatch_async as da
from dispatch_async.callbacks import (
    CallbackReceiver,
    DeliveryStatus,
    DeliveryTracker,
    MaybeSentResolution,
    aiohttp_handler,
    parse_event,
    resolve_maybe_sent,
)
from dispatch_async.testing import CallbackPlan, FakeDispatchServer, Fault

from .conftest import SECRET, numbers, session_for

CAMPAIGN = "job-7f3a"


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[DeliveryTracker]:
    async with DeliveryTracker(tmp_path / "deliveries.sqlite3") as opened:
        yield opened


@pytest.fixture
async def callback_url(tracker: DeliveryTracker) -> AsyncIterator[str]:
    receiver = CallbackReceiver(tracker, token=CallbackReceiver.new_token())
    app = web.Application()
    app.router.add_post("/cb/{token}", aiohttp_handler(receiver))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield receiver.url(f"http://127.0.0.1:{runner.addresses[0][1]}/cb")
    finally:
        await runner.cleanup()


async def maybe_sent_result(
    recipients: list[Any], *, callbacks: CallbackPlan | None = None, callback: str | None = None
) -> tuple[da.DispatchResult, FakeDispatchServer]:
    """A send whose only request the simulator acts on and then answers 500."""
    async with FakeDispatchServer(client_secret=SECRET, callbacks=callbacks) as server:
        server.script(Fault.status(500))
        async with session_for(server) as session:
            result = await session.send_basic(
                recipients, text="oi", campaign_name=CAMPAIGN, callback=callback
            )
        if server.callbacks is not None:
            await server.callbacks.settled()
    return result, server


async def record(
    tracker: DeliveryTracker,
    reference: str,
    number: str,
    *,
    type_: str = "basic",
    campaign: str = CAMPAIGN,
    at: str = "2024-07-01T12:00:00Z",
) -> None:
    body = {
        "reference": reference,
        "campaign_name": campaign,
        "direction": "outbound" if type_ == "basic" else "inbound",
        "user_id": number.lstrip("+"),
        "timestamp": at,
        "channel": "RCS",
        "type": type_,
    }
    await tracker.record(parse_event(orjson.dumps(body)))


class TestConfirms:
    async def test_callbacks_of_a_request_acted_on_before_a_500_confirm_its_recipients(
        self, tracker: DeliveryTracker, callback_url: str
    ) -> None:
        recipients = [da.Recipient(n, ref=f"row-{i}") for i, n in enumerate(numbers(3))]
        result, server = await maybe_sent_result(
            recipients, callbacks=CallbackPlan(read=0.0, seed=3), callback=callback_url
        )
        assert result.counts["maybe_sent"] == 3
        assert server.callbacks is not None
        assert server.callbacks.stats.acknowledged == 6

        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)

        assert resolution.unconfirmed == []
        assert [(m.number, m.position, m.ref) for m in resolution.confirmed] == [
            (n, i, f"row-{i}") for i, n in enumerate(numbers(3))
        ]
        for message in resolution.confirmed:
            state = resolution.states[message.id]
            assert state.status is DeliveryStatus.DELIVERED
            assert state.campaign_name == CAMPAIGN
            [echo, *_] = await tracker.events(message.id)
            assert echo.user_id == message.number.lstrip("+")

    async def test_applied_the_result_counts_them_as_sent(
        self, tracker: DeliveryTracker, callback_url: str
    ) -> None:
        result, _ = await maybe_sent_result(
            numbers(2), callbacks=CallbackPlan(seed=1), callback=callback_url
        )
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        resolved = resolution.apply(result)
        assert resolved.ok
        assert resolved.counts["valid"] == 2
        assert sorted(m.id for m in resolved.valid) == sorted(m.id for m in resolution.confirmed)
        assert resolved.positions == result.positions

    async def test_any_status_that_proves_the_service_acted_confirms(
        self, tracker: DeliveryTracker
    ) -> None:
        result, _ = await maybe_sent_result(numbers(4))
        types = ["EXCEPTION", "bloqueado por duplicidade", "READ", "text"]
        for i, (number, type_) in enumerate(zip(numbers(4), types, strict=True)):
            await record(tracker, f"ref-{i}", number, type_=type_)
        resolution = await resolve_maybe_sent(result.failed, tracker, campaign_name=CAMPAIGN)
        assert [m.id for m in resolution.confirmed] == ["ref-0", "ref-1", "ref-2", "ref-3"]


class TestSilenceProvesNothing:
    async def test_lost_callbacks_leave_recipients_maybe_sent(
        self, tracker: DeliveryTracker, callback_url: str
    ) -> None:
        result, _ = await maybe_sent_result(
            numbers(2), callbacks=CallbackPlan(drop=1.0), callback=callback_url
        )
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert resolution.confirmed == []
        assert resolution.unconfirmed == list(result.failed)
        assert resolution.apply(result) is result

    async def test_a_callback_of_another_campaign_confirms_nothing(
        self, tracker: DeliveryTracker
    ) -> None:
        result, _ = await maybe_sent_result(numbers(1))
        await record(tracker, "other-job", numbers(1)[0], campaign="last-week")
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert resolution.confirmed == []

    async def test_an_event_of_unknown_meaning_confirms_nothing(
        self, tracker: DeliveryTracker
    ) -> None:
        result, _ = await maybe_sent_result(numbers(1))
        await record(tracker, "r-1", numbers(1)[0], type_="SOMETHING_NEW")
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert resolution.confirmed == []

    async def test_a_message_older_than_the_send_confirms_nothing(
        self, tracker: DeliveryTracker
    ) -> None:
        result, _ = await maybe_sent_result(numbers(2))
        await record(tracker, "old", numbers(1)[0], at="2024-07-01T11:59:00Z")
        await record(tracker, "new", numbers(2)[1], at="2024-07-01T12:00:01Z")
        started = dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)
        resolution = await resolve_maybe_sent(
            result, tracker, campaign_name=CAMPAIGN, sent_after=started
        )
        assert [m.id for m in resolution.confirmed] == ["new"]
        assert [f.position for f in resolution.unconfirmed] == [0]


class TestPrevalidatedNumbers:
    async def test_a_local_number_sent_in_e164_is_matched_through_the_region(
        self, tracker: DeliveryTracker
    ) -> None:
        number = numbers(1)[0]
        local = number[3:]  # as a spreadsheet holds it; prevalidate sent +55...
        async with FakeDispatchServer(client_secret=SECRET) as server:
            server.script(Fault.status(500))
            async with session_for(server, prevalidate=True, region="BR") as session:
                result = await session.send_basic([local], text="oi", campaign_name=CAMPAIGN)
        await record(tracker, "r-1", number)
        unmatched = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert unmatched.confirmed == []
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN, region="BR")
        assert [(m.id, m.number) for m in resolution.confirmed] == [("r-1", local)]


class TestOneReferenceOneRecipient:
    async def test_an_id_the_answer_gave_is_never_taken_again(
        self, tracker: DeliveryTracker
    ) -> None:
        number = numbers(1)[0]
        async with FakeDispatchServer(client_secret=SECRET) as server:
            # The first chunk is answered; the second, the same number again, gets a 500.
            server.script(Fault.delay(0), Fault.status(500))
            async with session_for(server) as session:
                result = await session.send_basic(
                    [number, number],
                    text="oi",
                    campaign_name=CAMPAIGN,
                    chunk_size=1,
                    max_concurrency=1,
                )
        [answered] = result.valid
        await record(tracker, answered.id, number, at="2024-07-01T12:00:00Z")
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert resolution.confirmed == []
        await record(tracker, "second", number, at="2024-07-01T12:00:01Z")
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert [(m.id, m.position) for m in resolution.confirmed] == [("second", 1)]

    async def test_two_recipients_of_one_number_take_one_reference_each(
        self, tracker: DeliveryTracker
    ) -> None:
        number = numbers(1)[0]
        result, _ = await maybe_sent_result([number, number])
        await record(tracker, "late", number, at="2024-07-01T12:00:02Z")
        await record(tracker, "early", number, at="2024-07-01T12:00:01Z")
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert [(m.id, m.position) for m in resolution.confirmed] == [("early", 0), ("late", 1)]
        assert resolution.unconfirmed == []

    async def test_fewer_references_than_recipients_of_a_number_confirm_none_of_them(
        self, tracker: DeliveryTracker
    ) -> None:
        # Which rows went is not known (their content may differ): a wrong guess would
        # mark a message sent that never was.
        number, other = numbers(2)
        result, _ = await maybe_sent_result([number, number, number, other])
        await record(tracker, "late", number, at="2024-07-01T12:00:02Z")
        await record(tracker, "early", number, at="2024-07-01T12:00:01Z")
        await record(tracker, "other", other)
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert [(m.id, m.position) for m in resolution.confirmed] == [("other", 3)]
        assert [f.position for f in resolution.unconfirmed] == [0, 1, 2]

    async def test_recipients_certainly_not_sent_are_left_alone(
        self, tracker: DeliveryTracker
    ) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            server.script(Fault.status(400))
            async with session_for(server) as session:
                result = await session.send_basic(numbers(1), text="oi", campaign_name=CAMPAIGN)
        assert result.counts["not_sent"] == 1
        await record(tracker, "r-1", numbers(1)[0])
        resolution = await resolve_maybe_sent(result, tracker, campaign_name=CAMPAIGN)
        assert (resolution.confirmed, resolution.unconfirmed) == ([], [])

    async def test_ids_known_from_elsewhere_are_never_taken(self, tracker: DeliveryTracker) -> None:
        number = numbers(1)[0]
        result, _ = await maybe_sent_result([number])
        await record(tracker, "answered-in-another-run", number)
        resolution = await resolve_maybe_sent(
            result.failed,
            tracker,
            campaign_name=CAMPAIGN,
            known_ids={"answered-in-another-run"},
        )
        assert resolution.confirmed == []


class TestRecipientsOfSeveralCalls:
    """A number in two calls (a job stopped, then resumed and stopped again), resolved
    together, each recipient with its own call's start: a callback is only a recipient's
    whose call started before it."""

    FIRST = dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)
    SECOND = dt.datetime(2024, 7, 1, 13, 0, tzinfo=dt.UTC)

    async def resolve(
        self, tracker: DeliveryTracker, *callbacks: tuple[str, str]
    ) -> MaybeSentResolution:
        number = numbers(1)[0]
        first, _ = await maybe_sent_result([da.Recipient(number, ref="first")])
        second, _ = await maybe_sent_result([da.Recipient(number, ref="second")])
        for reference, at in callbacks:
            await record(tracker, reference, number, at=at)
        starts = {"first": self.FIRST, "second": self.SECOND}
        return await resolve_maybe_sent(
            [*first.failed, *second.failed],
            tracker,
            campaign_name=CAMPAIGN,
            sent_after=lambda failed: starts[failed.ref],
        )

    async def test_a_callback_either_call_could_have_caused_confirms_neither(
        self, tracker: DeliveryTracker
    ) -> None:
        resolution = await self.resolve(tracker, ("r-1", "2024-07-01T13:00:01Z"))
        assert resolution.confirmed == []
        assert [f.ref for f in resolution.unconfirmed] == ["first", "second"]

    async def test_a_callback_from_before_the_later_call_is_the_earlier_ones(
        self, tracker: DeliveryTracker
    ) -> None:
        resolution = await self.resolve(tracker, ("r-1", "2024-07-01T12:10:00Z"))
        assert [(m.id, m.ref) for m in resolution.confirmed] == [("r-1", "first")]
        assert [f.ref for f in resolution.unconfirmed] == ["second"]

    async def test_a_callback_after_each_start_confirms_both(
        self, tracker: DeliveryTracker
    ) -> None:
        resolution = await self.resolve(
            tracker, ("late", "2024-07-01T13:00:01Z"), ("early", "2024-07-01T12:10:00Z")
        )
        assert sorted((m.ref, m.id) for m in resolution.confirmed) == [
            ("first", "early"),
            ("second", "late"),
        ]
        assert resolution.unconfirmed == []

    async def test_a_callback_older_than_every_call_confirms_none(
        self, tracker: DeliveryTracker
    ) -> None:
        resolution = await self.resolve(
            tracker, ("old", "2024-07-01T11:00:00Z"), ("r-1", "2024-07-01T13:00:01Z")
        )
        assert resolution.confirmed == []

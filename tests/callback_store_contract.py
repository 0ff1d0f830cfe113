"""What every delivery store must do, as test classes: each store's test module subclasses
them with a ``tracker`` fixture (a `DeliveryTracker` on that store, opened) and a
``second_tracker`` fixture (another tracker on the same data, as another process)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools

import orjson
import pytest

from dispatch_async.callbacks import DeliveryEvent, DeliveryStatus, DeliveryTracker, parse_event

S = DeliveryStatus
_ids = itertools.count()


def reference() -> str:
    return f"00000000-0000-4000-8000-{next(_ids):012d}"


def event(
    ref: str,
    type_: str,
    *,
    at: str = "2024-07-01T12:00:00Z",
    number: str = "5511987654321",
    campaign: str | None = "july",
    channel: str = "RCS",
    event_id: str = "e-1",
    **extra: object,
) -> DeliveryEvent:
    body = {
        "reference": ref,
        "campaign_name": campaign,
        "event_id": event_id,
        "direction": "outbound" if type_ == "basic" else "inbound",
        "session_id": None,
        "user_id": number,
        "timestamp": at,
        "channel": channel,
        "type": type_,
        **extra,
    }
    return parse_event(orjson.dumps(body))


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


async def collect(tracker: DeliveryTracker, count: int) -> list[DeliveryEvent]:
    """The next *count* events of the tracker's change stream (bounded wait)."""
    seen: list[DeliveryEvent] = []
    stream = tracker.__aiter__()
    async with asyncio.timeout(10):
        async for item in stream:
            seen.append(item)
            if len(seen) == count:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    return seen


class TracksOneMessage:
    async def test_an_event_makes_the_message_known(self, tracker: DeliveryTracker) -> None:
        ref = reference()
        await tracker.record(event(ref, "basic", at="2024-07-01T12:00:00Z"))
        state = await tracker.message(ref)
        assert state is not None
        assert state.reference == ref
        assert state.status is S.SENT
        assert state.channel == "RCS"
        assert state.number == "5511987654321"
        assert state.campaign_name == "july"
        assert state.first_event_at == state.last_event_at == utc("2024-07-01T12:00:00+00:00")
        assert state.events == 1

    async def test_events_made_by_hand_are_each_stored(self, tracker: DeliveryTracker) -> None:
        first, second = reference(), reference()
        await tracker.record(DeliveryEvent(reference=first, status=S.DELIVERED))
        await tracker.record(DeliveryEvent(reference=second, status=S.READ))
        await tracker.record(DeliveryEvent(reference=second, status=S.DELIVERED))
        assert [len(await tracker.events(r)) for r in (first, second)] == [1, 2]

    async def test_events_of_equal_rank_give_one_state_whatever_their_order(
        self, tracker: DeliveryTracker
    ) -> None:
        for first, second, status, channel in (
            (("DELIVERED", "RCS"), ("DELIVERED", "SMS"), S.DELIVERED, "RCS"),
            (
                ("EXCEPTION", "RCS"),
                ("bloqueado por duplicidade", "SMS"),
                S.BLOCKED_DUPLICATE,
                "SMS",
            ),
        ):
            for order in ((first, second), (second, first)):
                ref = reference()
                for type_, on in order:
                    await tracker.record(event(ref, type_, channel=on))
                state = await tracker.message(ref)
                assert state is not None
                assert (state.status, state.channel) == (status, channel), order

    @pytest.mark.parametrize(
        "at",
        [
            "0001-01-01T00:00:00+05:30",  # year 0 in UTC
            "9999-12-31T23:59:59-05:00",  # year 10000 in UTC
            "9999-12-31T23:59:59.999999Z",  # rounds to year 10000 as epoch seconds
        ],
    )
    async def test_an_event_at_a_time_no_datetime_holds_is_filed_at_its_receipt(
        self, tracker: DeliveryTracker, at: str
    ) -> None:
        ref = reference()
        before = dt.datetime.now(dt.UTC)
        stored = event(ref, "DELIVERED", at=at, number="5511900000042")
        assert stored.occurred_at is None
        await tracker.record(stored)
        state = await tracker.message(ref)
        assert state is not None
        assert state.status is S.DELIVERED
        assert before - dt.timedelta(seconds=1) <= state.first_event_at <= dt.datetime.now(dt.UTC)
        assert [s.reference for s in await tracker.messages_for("5511900000042")] == [ref]
        assert [e.timestamp for e in await tracker.events(ref)] == [at]

    async def test_an_unknown_reference_has_no_state(self, tracker: DeliveryTracker) -> None:
        assert await tracker.message(reference()) is None
        assert await tracker.events(reference()) == []

    async def test_the_status_climbs_the_ladder(self, tracker: DeliveryTracker) -> None:
        ref = reference()
        for type_, status in (("basic", S.SENT), ("DELIVERED", S.DELIVERED), ("READ", S.READ)):
            await tracker.record(event(ref, type_))
            state = await tracker.message(ref)
            assert state is not None
            assert state.status is status

    async def test_a_late_delivery_never_moves_a_read_message_back(
        self, tracker: DeliveryTracker
    ) -> None:
        ref = reference()
        await tracker.record(event(ref, "READ", at="2024-07-01T12:00:05Z"))
        await tracker.record(event(ref, "DELIVERED", at="2024-07-01T12:00:02Z"))
        await tracker.record(event(ref, "basic", at="2024-07-01T12:00:00Z"))
        state = await tracker.message(ref)
        assert state is not None
        assert state.status is S.READ
        assert state.events == 3
        assert state.first_event_at == utc("2024-07-01T12:00:00+00:00")
        assert state.last_event_at == utc("2024-07-01T12:00:05+00:00")

    async def test_a_delivery_outranks_a_failure_and_the_channel_follows_it(
        self, tracker: DeliveryTracker
    ) -> None:
        ref = reference()
        await tracker.record(event(ref, "EXCEPTION", channel="RCS"))
        await tracker.record(event(ref, "DELIVERED", channel="SMS"))
        await tracker.record(event(ref, "ERROR", channel="RCS", event_id="e-2"))
        state = await tracker.message(ref)
        assert state is not None
        assert (state.status, state.channel) == (S.DELIVERED_SMS, "SMS")

    async def test_a_redelivered_event_is_stored_once(self, tracker: DeliveryTracker) -> None:
        ref = reference()
        first = event(ref, "DELIVERED")
        again = parse_event(orjson.dumps(dict(reversed(first.to_json().items()))))
        await tracker.record(first)
        await tracker.record(again)
        await asyncio.gather(*(tracker.record(first) for _ in range(5)))
        state = await tracker.message(ref)
        assert state is not None
        assert state.events == 1
        assert [e.key for e in await tracker.events(ref)] == [first.key]

    async def test_events_come_back_as_they_were_sent_in_order(
        self, tracker: DeliveryTracker
    ) -> None:
        ref = reference()
        sent = [
            event(ref, "basic"),
            event(ref, "READ", message={"x": 1}),
            event(ref, "text", event_id="e-2", extra_field=[1, 2]),
        ]
        for item in sent:
            await tracker.record(item)
        stored = await tracker.events(ref)
        assert stored == sent
        assert [e.extra for e in stored] == [{}, {}, {"extra_field": [1, 2]}]
        assert all(e.received_at is not None for e in stored)


class AnswersQuestions:
    async def test_finds_the_messages_of_a_number_in_any_formatting(
        self, tracker: DeliveryTracker
    ) -> None:
        number = f"55119{next(_ids):08d}"
        old, new, other = reference(), reference(), reference()
        await tracker.record(event(new, "basic", number=number, at="2024-07-02T00:00:00Z"))
        await tracker.record(event(old, "basic", number=f"+{number}", at="2024-07-01T00:00:00Z"))
        await tracker.record(event(other, "basic", number=number, campaign="august"))
        pretty = f"+{number[:2]} ({number[2:4]}) {number[4:9]}-{number[9:]}"
        found = await tracker.messages_for(pretty)
        assert [s.reference for s in found] == [old, other, new]
        assert [s.reference for s in await tracker.messages_for(number, "july")] == [old, new]
        assert await tracker.messages_for("5511000000000") == []

    async def test_counts_the_messages_of_a_campaign_by_status(
        self, tracker: DeliveryTracker
    ) -> None:
        campaign = f"c-{next(_ids)}"
        refs = [reference() for _ in range(4)]
        for ref in refs:
            await tracker.record(event(ref, "basic", campaign=campaign))
        await tracker.record(event(refs[0], "DELIVERED", campaign=campaign))
        await tracker.record(event(refs[1], "READ", campaign=campaign))
        await tracker.record(event(refs[1], "DELIVERED", campaign=campaign))
        await tracker.record(event(refs[2], "DELIVERED", channel="SMS", campaign=campaign))
        await tracker.record(event(refs[3], "bloqueado por duplicidade", campaign=campaign))
        assert await tracker.counts(campaign) == {
            S.DELIVERED: 1,
            S.READ: 1,
            S.DELIVERED_SMS: 1,
            S.BLOCKED_DUPLICATE: 1,
        }
        assert await tracker.counts("no-such-campaign") == {}

    async def test_events_without_a_campaign_are_counted_under_none(
        self, tracker: DeliveryTracker
    ) -> None:
        before = (await tracker.counts(None)).get(S.SENT, 0)
        await tracker.record(event(reference(), "basic", campaign=None))
        assert (await tracker.counts(None)).get(S.SENT, 0) == before + 1


class StreamsChanges:
    async def test_streams_each_event_stored_since_it_opened_once_in_order(
        self, tracker: DeliveryTracker
    ) -> None:
        ref = reference()
        delivered = event(ref, "DELIVERED")
        read = event(ref, "READ")
        await tracker.record(delivered)
        listening = asyncio.create_task(collect(tracker, 2))
        await tracker.record(delivered)  # a re-delivery: not a change
        await tracker.record(read)
        assert [e.key for e in await listening] == [delivered.key, read.key]

    async def test_sees_what_another_process_stored(
        self, tracker: DeliveryTracker, second_tracker: DeliveryTracker
    ) -> None:
        ref = reference()
        listening = asyncio.create_task(collect(tracker, 1))
        await second_tracker.record(event(ref, "READ"))
        [seen] = await listening
        assert seen.reference == ref
        state = await tracker.message(ref)
        assert state is not None
        assert state.status is S.READ

    async def test_the_stream_ends_when_the_tracker_closes(self, tracker: DeliveryTracker) -> None:
        async def drain() -> list[DeliveryEvent]:
            return [item async for item in tracker]

        listening = asyncio.create_task(drain())
        await tracker.aclose()
        async with asyncio.timeout(5):
            assert await listening == []

    async def test_streams_the_events_its_close_writes(self, tracker: DeliveryTracker) -> None:
        started = asyncio.Event()

        async def drain() -> list[DeliveryEvent]:
            started.set()
            return [item async for item in tracker]

        listening = asyncio.create_task(drain())
        await started.wait()
        refs = [reference() for _ in range(5)]
        records = [asyncio.create_task(tracker.record(event(r, "READ"))) for r in refs]
        await asyncio.sleep(0)  # one turn: each record() has queued its event
        await tracker.aclose()  # writes them: every record() returns (a 200)
        await asyncio.gather(*records)
        async with asyncio.timeout(5):
            assert sorted(e.reference for e in await listening) == refs


class CommitsInGroups:
    async def test_concurrent_events_share_commits(self, tracker: DeliveryTracker) -> None:
        writes: list[int] = []
        store = tracker.store
        original = store.write

        async def counting(events: list[DeliveryEvent], received_at: float) -> None:
            writes.append(len(events))
            await original(events, received_at)

        store.write = counting  # type: ignore[method-assign]
        refs = [reference() for _ in range(300)]
        await asyncio.gather(*(tracker.record(event(r, "basic")) for r in refs))
        assert sum(writes) == 300
        assert len(writes) < 30
        for ref in refs[::50]:
            assert await tracker.message(ref) is not None

    async def test_closing_writes_what_was_recorded(
        self, tracker: DeliveryTracker, second_tracker: DeliveryTracker
    ) -> None:
        refs = [reference() for _ in range(50)]
        recording = [asyncio.create_task(tracker.record(event(r, "basic"))) for r in refs]
        await asyncio.sleep(0)  # one turn of the loop: every task has queued its event
        await tracker.aclose()
        await asyncio.gather(*recording)  # all acknowledged: so all must be stored
        for ref in refs:
            assert await second_tracker.message(ref) is not None

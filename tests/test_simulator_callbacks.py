"""The simulator's delivery callbacks: real HTTP posts from FakeDispatchServer to a receiver
on 127.0.0.1, vendor-shaped, with the faults a network brings."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

import dispatch_async as da
from dispatch_async.callbacks import (
    CallbackReceiver,
    CallbackServer,
    DeliveryStatus,
    DeliveryTracker,
    SQLiteDeliveryStore,
    aiohttp_handler,
)
from dispatch_async.testing import CallbackPlan, FakeDispatchServer, Fault

from .conftest import SECRET, numbers, session_for

# On uvloop too: a FastAPI app under uvicorn runs its receiver there (issue 35).
pytestmark = pytest.mark.both_loops

pytest_plugins = ["pytester"]

DOCUMENTED = {
    "reference",
    "campaign_name",
    "event_id",
    "direction",
    "session_id",
    "user_id",
    "timestamp",
    "channel",
    "type",
}


class Recorder:
    """A bare receiver that keeps every body it is posted, answering from a script."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []  # answers to give, in order; then 200
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(orjson.loads(await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [b for b in self.bodies if b["type"] == type_]


async def _serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    app = web.Application()
    app.router.add_post("/hook/{token}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    recording = Recorder()
    runner, base = await _serve(recording.handle)
    recording.url = f"{base}/k3Y-0f-th1s-rece1ver-0nly"
    try:
        yield recording
    finally:
        await runner.cleanup()


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[DeliveryTracker]:
    async with DeliveryTracker(tmp_path / "deliveries.sqlite3") as opened:
        yield opened


@pytest.fixture
async def callback_url(tracker: DeliveryTracker) -> AsyncIterator[str]:
    """The URL of a real CallbackReceiver on 127.0.0.1, storing into ``tracker``."""
    receiver = CallbackReceiver(tracker, token=CallbackReceiver.new_token())
    runner, base = await _serve(aiohttp_handler(receiver))
    try:
        yield receiver.url(base)
    finally:
        await runner.cleanup()


def simulator(**plan: Any) -> FakeDispatchServer:
    plan.setdefault("seed", 7)
    return FakeDispatchServer(client_secret=SECRET, callbacks=CallbackPlan(**plan))


class TestShape:
    async def test_each_message_gets_the_echo_then_delivered_then_read(
        self, recorder: Recorder
    ) -> None:
        async with simulator(read=1.0) as server, session_for(server) as session:
            result = await session.send_basic(
                numbers(3), text="oi", campaign_name="july", callback=recorder.url
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
        ids = set(result.valid.ids)
        for id_ in ids:
            mine = [b for b in recorder.bodies if b["reference"] == id_]
            assert [b["type"] for b in mine] == ["basic", "DELIVERED", "READ"]
            assert [b["direction"] for b in mine] == ["outbound", "inbound", "inbound"]
            assert len({b["event_id"] for b in mine}) == 1  # the same until read
        for body in recorder.bodies:
            assert set(body) == DOCUMENTED
            assert body["campaign_name"] == "july"
            assert body["channel"] == "RCS"
            assert body["session_id"] is None
            assert dt.datetime.fromisoformat(body["timestamp"]).tzinfo is not None
        assert {b["user_id"] for b in recorder.bodies} == {n[1:] for n in numbers(3)}

    async def test_conversational_sends_echo_conversacional_with_their_session(
        self, recorder: Recorder
    ) -> None:
        async with simulator(read=0.0) as server, session_for(server) as session:
            result = await session.send_template(
                numbers(2), template_id="pix_reminder", callback=recorder.url
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
        echoes = recorder.of_type("conversacional")
        assert {(e["reference"], e["session_id"]) for e in echoes} == {
            (m.id, m.session_id) for m in result.valid
        }
        assert all(m.session_id for m in result.valid)

    async def test_the_webhook_endpoint_posts_to_its_webhook(self, recorder: Recorder) -> None:
        async with simulator() as server, session_for(server) as session:
            result = await session.send_webhook(numbers(2), webhook=recorder.url, text="oi")
            assert server.callbacks is not None
            await server.callbacks.settled()
        assert {b["reference"] for b in recorder.bodies} == set(result.valid.ids)

    async def test_only_the_first_messages_get_callbacks_when_limited(
        self, recorder: Recorder
    ) -> None:
        async with simulator(read=0.0, messages=3) as server, session_for(server) as session:
            first = await session.send_basic(numbers(2), text="oi", callback=recorder.url)
            second = await session.send_basic(numbers(3, 100), text="oi", callback=recorder.url)
            third = await session.send_basic(numbers(1, 200), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        assert len(third.valid) == 1
        expected = {*first.valid.ids, second.valid.ids[0]}
        assert {b["reference"] for b in recorder.bodies} == expected
        assert len(recorder.bodies) == 2 * 3  # the echo and DELIVERED of each

    async def test_invalid_numbers_get_no_callbacks(self, recorder: Recorder) -> None:
        async with simulator() as server, session_for(server) as session:
            result = await session.send_basic(
                [*numbers(1), "not-a-number"], text="oi", callback=recorder.url
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
        assert len(result.invalid) == 1
        assert {b["reference"] for b in recorder.bodies} == set(result.valid.ids)


class TestOutcomes:
    async def test_phones_without_rcs_get_the_sms_fallback(self, recorder: Recorder) -> None:
        async with simulator(sms_fallback=1.0) as server, session_for(server) as session:
            await session.send_basic(
                numbers(2), text="oi", fallback=da.Fallback.sms("oi"), callback=recorder.url
            )
            await session.send_basic(numbers(2, start=10), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        delivered = recorder.of_type("DELIVERED")
        assert {b["user_id"] for b in delivered} == {n[1:] for n in numbers(2)}
        assert {b["channel"] for b in delivered} == {"SMS"}
        assert {b["user_id"] for b in recorder.of_type("EXCEPTION")} == {
            n[1:] for n in numbers(2, start=10)
        }
        assert not recorder.of_type("READ")

    async def test_undelivered_messages_get_exception_or_error(self, recorder: Recorder) -> None:
        async with simulator(delivered=0.0) as server, session_for(server) as session:
            await session.send_basic(numbers(20), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        failures = recorder.of_type("EXCEPTION") + recorder.of_type("ERROR")
        assert len(failures) == 20
        assert recorder.of_type("EXCEPTION")
        assert recorder.of_type("ERROR")
        assert not recorder.of_type("DELIVERED")

    async def test_identical_content_to_a_number_within_an_hour_is_blocked(
        self, recorder: Recorder
    ) -> None:
        async with simulator() as server, session_for(server) as session:
            first = await session.send_basic(numbers(1), text="oi", callback=recorder.url)
            again = await session.send_basic(numbers(1), text="oi", callback=recorder.url)
            other = await session.send_basic(numbers(1), text="tchau", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            assert server.callbacks.stats.blocked == 1
        [blocked] = recorder.of_type("bloqueado por duplicidade")
        assert blocked["reference"] == again.valid[0].id
        assert [b["type"] for b in recorder.bodies if b["reference"] == again.valid[0].id] == [
            "bloqueado por duplicidade"
        ]
        for sent in (first, other):
            assert any(b["reference"] == sent.valid[0].id for b in recorder.of_type("DELIVERED"))

    async def test_replies_are_inbound_with_a_new_event_id(self, recorder: Recorder) -> None:
        async with simulator(read=1.0, replied=1.0) as server, session_for(server) as session:
            await session.send_basic(numbers(1), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        [reply] = recorder.of_type("text")
        [read] = recorder.of_type("READ")
        assert reply["direction"] == "inbound"
        assert reply["event_id"] != read["event_id"]
        assert reply["message"] == {"text": "ok"}


class TestNetworkFaults:
    async def test_duplicates_are_posted_twice_and_stored_once(
        self, callback_url: str, tracker: DeliveryTracker
    ) -> None:
        async with simulator(duplicates=1.0, read=1.0) as server, session_for(server) as session:
            result = await session.send_basic(numbers(5), text="oi", callback=callback_url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            stats = server.callbacks.stats
        assert stats.acknowledged == 2 * stats.events == 30
        for id_ in result.valid.ids:
            assert len(await tracker.events(id_)) == 3

    async def test_reordered_events_still_end_read(
        self, callback_url: str, tracker: DeliveryTracker
    ) -> None:
        async with simulator(reorder=1.0, read=1.0) as server, session_for(server) as session:
            result = await session.send_basic(numbers(20), text="oi", callback=callback_url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        assert await tracker.counts(None) == {DeliveryStatus.READ: 20}
        orders = [[e.type for e in await tracker.events(id_)] for id_ in result.valid.ids]
        assert any(order != ["basic", "DELIVERED", "READ"] for order in orders)

    async def test_dropped_events_are_never_posted(self, recorder: Recorder) -> None:
        async with simulator(drop=1.0) as server, session_for(server) as session:
            await session.send_basic(numbers(3), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            assert server.callbacks.stats.dropped == server.callbacks.stats.events > 0
        assert recorder.bodies == []

    async def test_delayed_events_all_arrive(self, recorder: Recorder) -> None:
        async with simulator(delay=0.02) as server, session_for(server) as session:
            await session.send_basic(numbers(4), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            assert len(recorder.bodies) == server.callbacks.stats.events

    async def test_an_answer_other_than_2xx_is_delivered_again(self, recorder: Recorder) -> None:
        recorder.statuses = [500, 503]
        async with simulator(delivered=0.0) as server, session_for(server) as session:
            await session.send_basic(numbers(1), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            stats = server.callbacks.stats
        assert (stats.failed_attempts, stats.acknowledged, stats.given_up) == (2, 2, 0)
        assert recorder.bodies[0] == recorder.bodies[1] == recorder.bodies[2]

    async def test_re_delivery_is_bounded(self, recorder: Recorder) -> None:
        recorder.statuses = [500] * 100
        plan = {"max_attempts": 3, "retry_wait": 0.0, "delivered": 0.0}
        async with simulator(**plan) as server, session_for(server) as session:
            await session.send_basic(numbers(1), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
            stats = server.callbacks.stats
        assert (stats.given_up, stats.failed_attempts, len(recorder.bodies)) == (2, 6, 6)

    async def test_never_posts_outside_this_machine(self) -> None:
        async with simulator() as server, session_for(server) as session:
            await session.send_basic(
                numbers(2), text="oi", callback="https://hooks.example.com/rcs"
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
            assert server.callbacks.stats.refused_urls == 1
            assert server.callbacks.stats.events == 0


class TestFaultsOfTheService:
    async def test_a_request_acted_on_before_a_500_still_gets_callbacks(
        self, callback_url: str, tracker: DeliveryTracker
    ) -> None:
        async with simulator() as server, session_for(server) as session:
            server.script(Fault.status(500))
            result = await session.send_basic(
                numbers(2), text="oi", campaign_name="c-500", callback=callback_url
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
        assert result.counts["maybe_sent"] == 2
        for number in numbers(2):
            [state] = await tracker.messages_for(number, "c-500")
            assert state.status is not DeliveryStatus.UNKNOWN

    @pytest.mark.parametrize(
        "fault", [Fault.delay(0.01), Fault.omit(1), Fault.digits_only()], ids=repr
    )
    async def test_answers_after_acting_show_the_ids_the_callbacks_carry(
        self, recorder: Recorder, fault: Fault
    ) -> None:
        async with simulator() as server, session_for(server) as session:
            server.script(fault)
            result = await session.send_basic(numbers(3), text="oi", callback=recorder.url)
            assert server.callbacks is not None
            await server.callbacks.settled()
        referenced = {b["reference"] for b in recorder.bodies}
        assert len(referenced) == 3
        assert set(result.valid.ids) <= referenced
        assert result.valid.ids


def files_of(database: Path) -> list[str]:
    return [end for end in ("", "-wal", "-shm") if Path(f"{database}{end}").exists()]


class TestCallbackServer:
    async def test_receives_the_simulators_callbacks_and_cleans_up(self) -> None:
        async with CallbackServer() as receiver:
            async with simulator(read=1.0) as server, session_for(server) as session:
                await session.send_basic(
                    numbers(2), text="oi", campaign_name="c", callback=receiver.url
                )
                assert server.callbacks is not None
                await server.callbacks.settled()
            assert await receiver.tracker.counts("c") == {DeliveryStatus.READ: 2}
            store = receiver.tracker.store
            assert isinstance(store, SQLiteDeliveryStore)
            assert files_of(store.path) == ["", "-wal", "-shm"]
        assert files_of(store.path) == []

    async def test_keeps_the_tracker_it_was_given(self, tmp_path: Path) -> None:
        tracker = DeliveryTracker(tmp_path / "kept.sqlite3")
        async with CallbackServer(tracker, path="/hooks/rcs/") as receiver:
            assert receiver.url.startswith(f"http://127.0.0.1:{receiver.port}/hooks/rcs/")
        assert files_of(tmp_path / "kept.sqlite3") == [""]
        assert "closed" in repr(tracker)

    def test_the_pytest_fixture_gives_a_started_server(self, pytester: pytest.Pytester) -> None:
        pytester.makepyfile(
            """
            import pytest
            from dispatch_async.callbacks import DeliveryStatus
            from dispatch_async.testing import CallbackPlan, FakeDispatchServer
            import dispatch_async as da

            @pytest.mark.asyncio
            async def test_it(callback_server):
                plan = CallbackPlan(read=1.0)
                async with FakeDispatchServer(callbacks=plan) as server:
                    async with da.DispatchSession(
                        server.url, client_secret="test-secret", account="a"
                    ) as session:
                        result = await session.send_basic(
                            ["+5511987654321"], text="oi", callback=callback_server.url
                        )
                    await server.callbacks.settled()
                state = await callback_server.tracker.message(result.valid[0].id)
                assert state.status is DeliveryStatus.READ
            """
        )
        result = pytester.runpytest_inprocess(
            "-p",
            "no:dispatch_async",
            "-p",
            "dispatch_async.testing._pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-W",
            "error",
        )
        result.assert_outcomes(passed=1)

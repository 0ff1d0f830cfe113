"""``before_send``: told of every chunk just before its request leaves, and able to stop the job."""

from __future__ import annotations

import asyncio

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import TEMPLATE, numbers


class Announcements:
    """A ``before_send`` that remembers what it was told, and what the server had by then."""

    def __init__(self, server: FakeDispatchServer) -> None:
        self.server = server
        self.positions: list[range] = []
        self.received_before: list[int] = []

    async def __call__(self, positions: range) -> None:
        self.positions.append(positions)
        self.received_before.append(self.server.stats.recipients_received)


class TestItIsToldOfEveryChunk:
    async def test_it_is_awaited_with_each_chunks_positions_before_the_request_leaves(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        told = Announcements(server)
        await session.send_template(
            numbers(25), **TEMPLATE, chunk_size=10, max_concurrency=1, before_send=told
        )
        assert told.positions == [range(10), range(10, 20), range(20, 25)]
        # One chunk at a time: when chunk k is announced the server has seen k chunks.
        assert told.received_before == [0, 10, 20]

    async def test_a_retried_chunk_is_announced_once(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        told = Announcements(server)
        server.script(Fault.status(503), Fault.status(503))
        result = await session.send_template(
            numbers(10), **TEMPLATE, chunk_size=10, before_send=told
        )
        assert result.ok
        assert server.stats.requests == 3
        assert told.positions == [range(10)]

    async def test_a_chunk_refused_wholly_on_this_machine_is_not_announced(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        told = Announcements(server)
        given = numbers(5) * 2
        await session.send_template(given, **TEMPLATE, chunk_size=5, dedupe=True, before_send=told)
        assert told.positions == [range(5)]
        assert server.stats.dispatch_calls == 1

    async def test_no_more_chunks_are_announced_and_unanswered_than_run_at_once(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.latency = 0.01
        announced = answered = 0
        most = 0

        async def before_send(positions: range) -> None:
            nonlocal announced, most
            announced += 1
            most = max(most, announced - answered)

        def progress(done: int, total: int | None) -> None:
            nonlocal answered
            answered += 1

        await session.send_template(
            iter(numbers(400)),
            **TEMPLATE,
            chunk_size=10,
            max_concurrency=4,
            before_send=before_send,
            on_progress=progress,
        )
        assert announced == 40
        assert 1 < most <= 4


class TestWhenItRaises:
    async def test_the_job_stops_and_the_chunk_it_was_told_of_is_not_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        disk_full = OSError(28, "No space left on device")
        calls = 0

        async def before_send(positions: range) -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise disk_full

        given = numbers(100)
        with pytest.raises(da.CallbackError) as caught:
            await session.send_template(
                given, **TEMPLATE, chunk_size=10, max_concurrency=1, before_send=before_send
            )
        error = caught.value
        assert error.__cause__ is disk_full
        assert server.stats.recipients_received == 20
        result = error.result
        assert result is not None
        assert [v.number for v in result.valid] == given[:20]
        assert [f.recipient.number for f in result.failed] == given[20:]
        assert not any(f.maybe_sent for f in result.failed)

    async def test_its_error_is_named_without_the_callers_message_being_lost(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        async def before_send(positions: range) -> None:
            raise RuntimeError("journal is read-only")

        with pytest.raises(da.CallbackError, match="before_send") as caught:
            await session.send_template(numbers(3), **TEMPLATE, before_send=before_send)
        assert "journal is read-only" in str(caught.value.__cause__)
        assert server.stats.dispatch_calls == 0


class TestWhenTheJobEndsDuringIt:
    async def test_a_chunk_still_being_announced_at_the_deadline_was_not_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        never = asyncio.Event()

        async def before_send(positions: range) -> None:
            await never.wait()

        result = await session.send_template(
            numbers(10), **TEMPLATE, deadline=0.05, before_send=before_send
        )
        assert server.stats.dispatch_calls == 0
        assert len(result.failed) == 10
        assert not any(f.maybe_sent for f in result.failed)

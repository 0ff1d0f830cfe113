"""``on_chunk``: what went is in the caller's hands before a cancel or a timeout can strike."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import HANG, numbers

BASIC = {"text": "Seu boleto vence amanha"}


class Handed:
    """Every part ``on_chunk`` was given, and what they say about each number."""

    def __init__(self) -> None:
        self.parts: list[da.DispatchResult] = []

    def __call__(self, part: da.DispatchResult) -> None:
        self.parts.append(part)

    @property
    def ids(self) -> dict[str, str]:
        return {v.number: v.id for part in self.parts for v in part.valid}

    @property
    def maybe_sent(self) -> set[str]:
        return {f.recipient.number for part in self.parts for f in part.failed if f.maybe_sent}


async def cancel_by_task(
    call: Awaitable[da.DispatchResult], when: Callable[[], Awaitable[None]]
) -> None:
    job = asyncio.ensure_future(call)
    await when()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job


async def cancel_by_timeout(
    call: Awaitable[da.DispatchResult], when: Callable[[], Awaitable[None]]
) -> None:
    cut = asyncio.timeout(None)

    async def expire() -> None:
        await when()
        cut.reschedule(asyncio.get_running_loop().time())

    async def bounded() -> None:
        async with cut:
            await call

    expiry = asyncio.create_task(expire())
    with pytest.raises(TimeoutError):
        await bounded()
    await expiry


class TestACancelledCallHandsOverWhatWent:
    @pytest.mark.parametrize(
        "cancel", [cancel_by_task, cancel_by_timeout], ids=["cancel", "timeout"]
    )
    async def test_every_recipient_the_service_accepted_reached_on_chunk(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        caplog: pytest.LogCaptureFixture,
        cancel: Callable[..., Awaitable[None]],
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="dispatch_async")
        given = numbers(200)
        # Five chunks answered, then two the service acts on and never answers: both
        # slots held, the call is mid-way when it is cut.
        server.script_for(given[50], Fault.hang())
        server.script_for(given[60], Fault.hang())
        handed = Handed()
        call = session.send_basic(given, **BASIC, chunk_size=10, max_concurrency=2, on_chunk=handed)

        async def both_hang() -> None:
            await server.wait_until(lambda: server.in_flight == 2)

        async with asyncio.timeout(HANG):  # a cut the call ignored would wait for ever
            await cancel(call, both_hang)
        await server.wait_until(lambda: server.in_flight == 0)

        accepted = server.stats.received
        assert accepted == Counter(given[:70])
        assert set(handed.ids) == set(given[:50])
        assert all(handed.ids.values()), "every answered recipient with its id"
        assert handed.maybe_sent == set(given[50:70])
        assert set(handed.ids) | handed.maybe_sent == set(accepted)
        warnings = [
            r for r in caplog.records if r.levelno == logging.WARNING and r.name == "dispatch_async"
        ]
        assert [r.getMessage() for r in warnings] == [
            "the call was cancelled: 50 recipients sent, 20 maybe sent"
        ]

    async def test_the_warning_names_no_phone_number(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.INFO, logger="dispatch_async")
        given = numbers(20)
        server.script_for(given[10], Fault.hang())
        job = asyncio.ensure_future(session.send_basic(given, **BASIC, chunk_size=10))
        await server.wait_until(lambda: server.in_flight == 1)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert caplog.records, "the cancellation was logged"
        assert not [r for r in caplog.records if any(n[3:] in r.getMessage() for n in given)]


class TestOnChunkInAnUninterruptedCall:
    async def test_each_part_is_handed_once_and_they_make_the_result(
        self, session: da.DispatchSession
    ) -> None:
        handed = Handed()
        result = await session.send_basic(numbers(35), **BASIC, chunk_size=10, on_chunk=handed)
        assert sorted(len(p.positions) for p in handed.parts) == [5, 10, 10, 10]
        assert handed.ids == {v.number: v.id for v in result.valid}
        assert len(handed.ids) == 35

    async def test_a_stream_hands_each_part_before_yielding_it(
        self, session: da.DispatchSession
    ) -> None:
        handed = Handed()
        async for part in session.stream_basic(
            numbers(30), **BASIC, chunk_size=10, on_chunk=handed
        ):
            assert handed.parts[-1] is part
        assert len(handed.parts) == 3

    async def test_an_on_chunk_that_raises_is_logged_and_the_call_goes_on(
        self, session: da.DispatchSession, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(part: da.DispatchResult) -> None:
            raise OSError("disk full")

        result = await session.send_basic(numbers(20), **BASIC, chunk_size=10, on_chunk=broken)
        assert len(result.valid) == 20
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
            "the on_chunk callback failed"
        ] * 2

    async def test_a_wrong_on_chunk_is_refused_before_sending(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        with pytest.raises(da.ConfigurationError, match="on_chunk must be a callable"):
            await session.send_basic(numbers(2), **BASIC, on_chunk="log")  # type: ignore[typeddict-item]
        assert server.stats.recipients_received == 0

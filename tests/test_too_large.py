"""A body the server will not take (HTTP 413): the chunk goes out again in smaller parts.

Against the simulator refusing bodies over ``max_body_bytes`` with 413, as nginx's
``client_max_body_size`` does (tests/network/test_nginx_body_limit.py: nginx itself).
Each recipient here carries about 1 kB of vars, so 1,000 of them make a 1 MB body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import dispatch_async as da
import dispatch_async.instrumentation as ins
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.conftest import HANG, TEMPLATE, numbers, session_for

#: A request of ~500 recipients fits; one of 1,000 does not.
FITS_500 = 600_000
#: A request of ~250 recipients fits; one of 334 does not.
FITS_250 = 300_000


def recipients(count: int, start: int = 0) -> list[da.Recipient]:
    return [
        da.Recipient(n, vars={"note": "x" * 1000}, ref=f"row{i}")
        for i, n in enumerate(numbers(count, start), start)
    ]


async def send(
    limit: int, given: list[da.Recipient], **settings: Any
) -> tuple[da.DispatchResult, FakeDispatchServer]:
    """*given* sent through a simulator refusing bodies over *limit* bytes; what it saw."""
    async with (
        FakeDispatchServer(max_body_bytes=limit) as server,
        session_for(server, **settings) as session,
    ):
        return await session.send_template(given, **TEMPLATE), server


def sent_once(server: FakeDispatchServer, count: int) -> bool:
    received = server.stats.received
    return len(received) == count and set(received.values()) == {1}


class Recorder:
    def __init__(self) -> None:
        self.events: list[ins.Event] = []

    def __call__(self, event: ins.Event) -> None:
        self.events.append(event)

    def of(self, kind: type[ins.Event]) -> Iterator[ins.Event]:
        return (e for e in self.events if isinstance(e, kind))


class TestARefusedChunk:
    async def test_is_sent_again_in_halves_each_recipient_once(self) -> None:
        result, server = await send(FITS_500, recipients(1000))
        assert result.counts["valid"] == 1000
        assert not result.failed
        assert sent_once(server, 1000)
        assert server.stats.status_counts[413] == 1
        assert result.requests == 3
        assert result.split_to == 500
        assert list(result.valid.positions) == list(range(1000))
        assert [v.ref for v in result.valid] == [f"row{i}" for i in range(1000)]

    async def test_halves_refused_are_halved_again(self) -> None:
        result, server = await send(FITS_250, recipients(1000), hooks=[])
        assert result.ok
        assert sent_once(server, 1000)
        assert result.split_to == 250
        assert result.summary().endswith("; split to 250 per request")

    async def test_keeps_its_local_rejects(self) -> None:
        given = recipients(1000)
        given[700] = given[3]  # a repeat, refused locally by dedupe
        result, server = await send(FITS_500, given, dedupe=True)
        assert result.counts == {**result.counts, "valid": 999, "invalid": 1, "failed": 0}
        assert result.invalid[0].position == 700
        assert result.positions == range(1000)
        assert sent_once(server, 999)


class TestLaterChunks:
    async def test_go_out_in_parts_at_once(self) -> None:
        result, server = await send(FITS_250, recipients(2000), chunk_size=500, max_concurrency=1)
        assert result.ok
        assert sent_once(server, 2000)
        assert server.stats.status_counts[413] == 1
        assert result.split_to == 250

    async def test_in_flight_when_the_first_refusal_came_are_split_too(self) -> None:
        result, server = await send(FITS_500, recipients(4000), max_concurrency=4)
        assert result.ok
        assert sent_once(server, 4000)
        assert 1 <= server.stats.status_counts[413] <= 4
        assert server.stats.max_concurrent <= 4


class TestARecipientTooLargeAlone:
    async def test_is_not_sent_and_says_why(self) -> None:
        given = recipients(10)
        given[6] = da.Recipient(given[6].number, vars={"note": "x" * 20_000})
        result, server = await send(15_000, given)
        assert result.counts["valid"] == 9
        [failed] = result.failed
        assert failed.position == 6
        assert not failed.maybe_sent
        assert isinstance(failed.error, da.RequestTooLargeError)
        assert failed.error.status == 413
        assert "this one recipient" in str(failed.error)
        assert failed.error.request_bytes is not None
        assert failed.error.request_bytes > 20_000
        assert sent_once(server, 9)

    def test_says_its_size_when_known(self) -> None:
        refused = da.RequestTooLargeError("413", status=413)
        assert "bytes" not in str(da.RequestTooLargeError.for_one_recipient(refused))
        refused.request_bytes = 1_234_567
        assert "1,234,567 bytes" in str(da.RequestTooLargeError.for_one_recipient(refused))

    async def test_in_a_chunk_of_one_is_not_sent(self) -> None:
        given = [da.Recipient(numbers(1)[0], vars={"note": "x" * 20_000})]
        result, _ = await send(15_000, given)
        [failed] = result.failed
        assert isinstance(failed.error, da.RequestTooLargeError)
        assert not failed.maybe_sent
        assert result.split_to is None  # nothing was split
        assert result.requests == 1

    @pytest.mark.parametrize("where", [0, 75, 149])
    async def test_leaves_the_calls_other_chunks_in_parts_of_the_size_that_went_through(
        self, where: int
    ) -> None:
        """One recipient too large alone is no news of the server's limit: the call's
        other chunks go out whole, not one recipient per request."""
        given = recipients(600)
        given[where] = da.Recipient(given[where].number, vars={"note": "x" * 400_000})
        result, server = await send(FITS_250, given, chunk_size=150, max_concurrency=1, hooks=[])
        assert result.counts["valid"] == 599
        [failed] = result.failed
        assert failed.position == where
        assert isinstance(failed.error, da.RequestTooLargeError)
        assert sent_once(server, 599)
        assert result.split_to is None
        assert server.stats.status_counts[413] <= 9  # the first chunk's, halved to one
        # The first chunk: halved down to the one recipient (a 413 and a part at each
        # step); the three others whole.
        assert result.requests <= 1 + 2 * 8 + 3


class TestAChunkEndedMidway:
    """A chunk stopped while its parts go out keeps what was answered."""

    async def test_by_a_close_keeps_the_parts_answered(self) -> None:
        async with FakeDispatchServer(max_body_bytes=FITS_250) as server:
            # Parts of 250: [0, 250) and [250, 500) answered, [500, 750) hangs, the rest
            # is never sent.
            server.script_for(numbers(1, 500)[0], Fault.hang())
            session = session_for(server)
            async with session:
                call = asyncio.create_task(session.send_template(recipients(1000), **TEMPLATE))
                await server.wait_until(lambda: server.stats.faults_injected == 1, timeout=HANG)
                await session.close()
                with pytest.raises(da.SessionClosedError) as stopped:
                    await call
        result = stopped.value.result
        assert result is not None
        assert list(result.valid.positions) == list(range(500))
        maybe = [f.position for f in result.failed if f.maybe_sent]
        unsent = [f.position for f in result.failed if not f.maybe_sent]
        assert maybe == list(range(500, 750))
        assert unsent == list(range(750, 1000))
        assert server.stats.recipients_received == 750  # the hang acted: maybe sent indeed

    async def test_by_a_refused_token_keeps_the_parts_answered(self) -> None:
        async with FakeDispatchServer(max_body_bytes=FITS_500) as server:
            # [0, 500) answered; [500, 1000) is refused twice (a fresh token too): the job stops.
            server.script_for(numbers(1, 500)[0], Fault.revoke_token(), Fault.revoke_token())
            async with session_for(server) as session:
                with pytest.raises(da.UnauthorizedError) as stopped:
                    await session.send_template(recipients(1000), **TEMPLATE)
        result = stopped.value.result
        assert result is not None
        assert list(result.valid.positions) == list(range(500))
        assert [f.position for f in result.failed] == list(range(500, 1000))
        assert not any(f.maybe_sent for f in result.failed)
        assert sent_once(server, 500)


class TestTheSplitIsReported:
    async def test_to_the_hooks_with_each_parts_span(self) -> None:
        recorder = Recorder()
        await send(FITS_500, recipients(1000), hooks=[recorder])
        [split] = recorder.of(ins.ChunkSplit)
        assert isinstance(split, ins.ChunkSplit)
        assert (split.start, split.size, split.part_size) == (0, 1000, 500)
        assert split.request_bytes is not None
        assert split.request_bytes > FITS_500
        sent = [(e.start, e.size) for e in recorder.of(ins.ChunkSent)]  # type: ignore[attr-defined]
        assert sent == [(0, 1000), (0, 500), (500, 500)]

    async def test_by_the_logging_hook_as_a_warning(self, caplog: pytest.LogCaptureFixture) -> None:
        await send(FITS_500, recipients(1000), hooks=[ins.LoggingHook()])
        [record] = [r for r in caplog.records if "ChunkSplit" in r.getMessage()]
        assert record.levelname == "WARNING"
        assert "part_size=500" in record.getMessage()

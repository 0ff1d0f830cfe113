"""``plan``: the dry run of a send, chunk by chunk, with nothing sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer

from .conftest import TEMPLATE, loop_turns, numbers, spreadsheet_numbers


async def planned(
    recipients: Any, into: list[da.PlannedChunk] | None = None, **options: Any
) -> list[da.PlannedChunk]:
    """The planned chunks, also appended to *into* so they are kept when it raises."""
    chunks = [] if into is None else into
    async for chunk in da.plan(recipients, **options):
        chunks.append(chunk)
    return chunks


class TestItDescribesWhatASendWouldDo:
    async def test_chunks_cover_every_position_in_order(self) -> None:
        chunks = await planned(numbers(25), chunk_size=10)
        assert [c.positions for c in chunks] == [range(10), range(10, 20), range(20, 25)]
        assert [n for c in chunks for n in c.numbers] == numbers(25)
        assert not any(c.refused for c in chunks)

    async def test_what_it_plans_to_send_is_exactly_what_a_send_then_sends(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = [*numbers(8), "11 9000-00003", "+55 11 90000-0001", "not a number", "+15"]
        options: dict[str, Any] = {
            "chunk_size": 4,
            "dedupe": True,
            "prevalidate": True,
            "region": "BR",
        }
        chunks = await planned(given, **options)
        result = await session.send_template(given, **TEMPLATE, **options)
        planned_numbers = [n for c in chunks for n in c.numbers]
        assert sorted(planned_numbers) == sorted(server.stats.received.elements())
        assert server.stats.dispatch_calls == sum(1 for c in chunks if c.numbers)
        refused = [(i.number, i.reason) for c in chunks for i in c.refused]
        assert refused == [(i.number, i.reason) for i in result.invalid]
        assert len(refused) == 4

    async def test_checking_a_large_chunk_lets_other_tasks_run(self) -> None:
        given = spreadsheet_numbers(40_000)
        async with loop_turns() as turns:
            started = turns[0]
            (chunk,) = await planned(given, prevalidate=True, region="BR", chunk_size=40_000)
            # Over 40 ms of checks on any machine (a microsecond a number at the very
            # least); other tasks get a turn at least every few ms of it.
            assert turns[0] - started >= 10
        assert list(chunk.numbers) == [da.to_e164(n, "BR") for n in given if n != "123"]
        assert [r.position for r in chunk.refused] == list(range(9, 40_000, 10))

    async def test_prevalidate_plans_the_e164_form(self) -> None:
        (chunk,) = await planned(["(11) 98765-4321"], prevalidate=True, region="BR")
        assert chunk.numbers == ("+5511987654321",)


class TestBadInputIsRefusedAsASendWouldRefuseIt:
    async def test_a_bad_recipient_in_a_list_is_refused_before_any_chunk(self) -> None:
        seen: list[da.PlannedChunk] = []
        with pytest.raises(da.InvalidRecipientError) as caught:
            await planned([*numbers(30), 42], seen, chunk_size=10)
        assert caught.value.position == 30
        assert seen == []

    async def test_a_stream_plans_what_came_before_the_bad_recipient_then_raises(self) -> None:
        def rows() -> Iterator[Any]:
            yield from numbers(15)
            yield {"number": ""}

        seen: list[da.PlannedChunk] = []
        with pytest.raises(da.InvalidRecipientError) as caught:
            await planned(rows(), seen, chunk_size=10)
        assert caught.value.position == 15
        assert [c.positions for c in seen] == [range(10), range(10, 15)]

    async def test_a_bad_option_is_a_configuration_error(self) -> None:
        with pytest.raises(da.ConfigurationError, match="chunk_size"):
            await planned(numbers(3), chunk_size=0)

    async def test_one_recipient_where_a_collection_belongs_is_refused(self) -> None:
        with pytest.raises(da.InputError, match="collection"):
            await planned("+5511900000001")


async def test_an_async_source_is_read_lazily() -> None:
    read = 0

    async def rows() -> AsyncIterator[str]:
        nonlocal read
        for number in numbers(100):
            read += 1
            yield number

    source = rows()
    async with aclosing(da.plan(source, chunk_size=10)) as plan:
        first = await anext(plan)
    await source.aclose()
    assert first.positions == range(10)
    assert read == 10

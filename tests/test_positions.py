"""Outcomes map back to the caller's input: ``.position`` on each, and the caller's ``ref``.

Every outcome (valid, invalid, failed) carries the index of its recipient in the input,
whatever the input's shape and however the chunks end; a ``Recipient``'s ``ref`` comes
back on its outcome and never goes on the wire. The same number twice, with other vars,
maps back to each of its own positions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async._matching import result_from_answer
from dispatch_async._recipients import Chunk
from dispatch_async._wire import decode_answer
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import TEMPLATE, numbers, session_for

INVALID = "+0123456789"  # the simulator rejects it


def outcome_positions(result: da.DispatchResult) -> dict[int, tuple[str, str]]:
    """{position: (bucket, number)} over every outcome of *result*."""
    seen: dict[int, tuple[str, str]] = {}
    outcomes = [
        *(("valid", v.position, v.number) for v in result.valid),
        *(("invalid", i.position, i.number) for i in result.invalid),
        *(("failed", f.position, f.recipient.number) for f in result.failed),
    ]
    for bucket, position, number in outcomes:
        assert position not in seen, f"position {position} has two outcomes"
        seen[position] = (bucket, number)
    return seen


def refs_by_position(result: da.DispatchResult) -> dict[int, Any]:
    return {
        **{v.position: v.ref for v in result.valid},
        **{i.position: i.ref for i in result.invalid},
        **{f.position: f.ref for f in result.failed},
    }


def mixed(count: int) -> list[da.Recipient]:
    """Recipients with refs, every third one a number the service rejects."""
    good = numbers(count)
    return [
        da.Recipient(INVALID if i % 3 == 2 else good[i], vars={"row": str(i)}, ref=f"row-{i}")
        for i in range(count)
    ]


async def _rows(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _generated(items: list[Any]) -> Iterator[Any]:
    yield from items


class TestEveryOutcomeHasItsPosition:
    @pytest.mark.parametrize("shape", ["list", "tuple", "generator", "async generator"])
    async def test_valid_and_invalid_outcomes_carry_their_input_position_and_ref(
        self, session: da.DispatchSession, shape: str
    ) -> None:
        items = mixed(11)
        given: Any = {
            "list": items,
            "tuple": tuple(items),
            "generator": _generated(items),
            "async generator": _rows(items),
        }[shape]
        result = await session.send_template(given, **TEMPLATE, chunk_size=4)
        seen = outcome_positions(result)
        assert sorted(seen) == list(range(11))
        for position, (bucket, number) in seen.items():
            assert number == items[position].number
            assert bucket == ("invalid" if position % 3 == 2 else "valid")
        assert refs_by_position(result) == {i: f"row-{i}" for i in range(11)}

    async def test_the_columns_give_the_same_positions_as_the_outcomes(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(mixed(10), **TEMPLATE, chunk_size=3)
        assert isinstance(result.valid, da.ValidMessages)
        assert isinstance(result.invalid, da.InvalidMessages)
        assert list(result.valid.positions) == [v.position for v in result.valid]
        assert list(result.invalid.positions) == [2, 5, 8]
        assert result.valid[3].position == result.valid.positions[3] == 4
        assert [v.position for v in result.valid[2:4]] == [3, 4]

    async def test_the_id_and_number_columns_of_a_merged_result_match_its_outcomes(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(mixed(10), **TEMPLATE, chunk_size=3)
        assert isinstance(result.valid, da.ValidMessages)
        ids = [v.id for v in result.valid]
        assert len(set(ids)) == len(ids) == 7
        assert list(result.valid.ids) == ids
        assert [result.valid.ids[i] for i in range(7)] == ids  # indexed: built once
        assert list(result.valid.ids) == ids
        assert list(result.valid.numbers) == [v.number for v in result.valid]

    async def test_each_streamed_part_has_positions_within_its_own_range(
        self, session: da.DispatchSession
    ) -> None:
        items = mixed(10)
        seen: dict[int, tuple[str, str]] = {}
        async for part in session.stream_template(_rows(items), **TEMPLATE, chunk_size=4):
            mine = outcome_positions(part)
            assert sorted(mine) == list(part.positions)
            for position, ref in refs_by_position(part).items():
                assert ref == items[position].ref
            seen.update(mine)
        assert sorted(seen) == list(range(10))

    async def test_plain_strings_and_dicts_have_positions_and_no_ref(
        self, session: da.DispatchSession
    ) -> None:
        given: list[Any] = ["+5511900000001", {"number": INVALID}, {"number": "+5511900000002"}]
        result = await session.send_template(given, **TEMPLATE)
        assert [(v.position, v.ref) for v in result.valid] == [(0, None), (2, None)]
        assert [(i.position, i.ref) for i in result.invalid] == [(1, None)]


class TestOutcomesAndColumnsAreSequences:
    async def test_a_merged_column_equals_the_list_of_its_items_and_shows_as_one(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(mixed(10), **TEMPLATE, chunk_size=3)
        assert isinstance(result.valid, da.ValidMessages)
        ids = [v.id for v in result.valid]
        assert result.valid.ids == ids
        assert result.valid.ids != [*ids[:-1], "another id"]
        assert result.valid.ids != 7  # not a sequence: not equal, no error
        assert repr(result.valid.ids) == repr(ids)

    async def test_the_outcomes_equal_the_list_of_the_same_outcomes(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(mixed(4), **TEMPLATE)
        assert isinstance(result.valid, da.ValidMessages)
        assert result.valid.ids[2] == list(result.valid)[2].id  # one chunk: its own column
        assert result.valid == list(result.valid)
        assert result.valid != list(result.valid)[:-1]
        assert result.valid != 3

    async def test_without_session_ids_each_message_has_none(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        # Numbers answered as digits only: matched one by one, no session id column kept.
        server.script(Fault.digits_only())
        result = await session.send_basic(numbers(4), text="x")
        assert isinstance(result.valid, da.ValidMessages)
        session_ids = result.valid.session_ids
        assert (len(session_ids), list(session_ids)) == (4, [None] * 4)
        assert session_ids[3] is None
        assert list(session_ids[1:3]) == [None, None]
        assert len(session_ids[::3]) == 2
        with pytest.raises(IndexError):
            session_ids[4]

    async def test_a_result_without_failures_raises_nothing_and_is_returned(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_basic(numbers(2), text="x")
        assert result.raise_for_failures() is result


class TestTheSameNumberTwice:
    async def test_two_rows_of_one_number_map_back_to_their_own_positions_and_refs(
        self, session: da.DispatchSession, server: FakeDispatchServer
    ) -> None:
        number = "+5511900000001"
        items = [
            da.Recipient(number, vars={"name": "Ana"}, ref="ana"),
            da.Recipient("+5511900000002", ref="other"),
            da.Recipient(number, vars={"name": "Bia"}, ref="bia"),
        ]
        result = await session.send_template(items, **TEMPLATE)
        assert [(v.number, v.position, v.ref) for v in result.valid] == [
            (number, 0, "ana"),
            ("+5511900000002", 1, "other"),
            (number, 2, "bia"),
        ]
        assert server.stats.received[number] == 2

    def test_an_answer_in_another_order_maps_a_repeated_number_in_input_order(self) -> None:
        sent = ["+1", "+2", "+1", "+3"]
        chunk = Chunk(10, 4, [{"number": n, "vars": {"i": str(i)}} for i, n in enumerate(sent)])
        answer = {
            "validMessages": [
                {"id": "a", "number": "+3"},
                {"id": "b", "number": "+1"},
                {"id": "c", "number": "+2"},
            ],
            "invalidMessages": [{"number": "+1", "reason": "no"}],
        }
        result = result_from_answer(chunk, decode_answer(orjson.dumps(answer)))
        assert [(v.id, v.position) for v in result.valid] == [("a", 13), ("b", 10), ("c", 11)]
        assert [i.position for i in result.invalid] == [12]

    async def test_a_digits_only_answer_still_maps_repeats_to_their_positions(
        self, server: FakeDispatchServer
    ) -> None:
        given = ["+5511900000001", "+5511900000002", "+5511900000001"]
        server.script_for(given[0], Fault.digits_only())
        async with session_for(server) as session:
            items = [da.Recipient(n, ref=i) for i, n in enumerate(given)]
            result = await session.send_template(items, **TEMPLATE)
        assert [(v.number, v.position, v.ref) for v in result.valid] == [
            (given[0], 0, 0),
            (given[1], 1, 1),
            (given[2], 2, 2),
        ]


class TestRejectedAndFailedRecipients:
    async def test_local_duplicates_carry_the_position_and_ref_of_the_repeat(
        self, server: FakeDispatchServer
    ) -> None:
        items = [
            da.Recipient("+5511900000001", ref="first"),
            da.Recipient("+5511900000002", ref="b"),
            da.Recipient("+5511900000001", ref="repeat"),
        ]
        async with session_for(server, dedupe=True) as session:
            result = await session.send_template(items, **TEMPLATE)
        assert [(v.position, v.ref) for v in result.valid] == [(0, "first"), (1, "b")]
        assert [(i.reason, i.position, i.ref) for i in result.invalid] == [
            (da.DUPLICATE_REASON, 2, "repeat")
        ]

    async def test_failed_recipients_carry_their_position_and_ref(
        self, server: FakeDispatchServer
    ) -> None:
        items = mixed(6)
        server.script_for(items[3].number, Fault.status(400))
        async with session_for(server) as session:
            result = await session.send_template(items, **TEMPLATE, chunk_size=3)
        assert [(f.position, f.ref, f.maybe_sent) for f in result.failed] == [
            (3, "row-3", False),
            (4, "row-4", False),
            (5, "row-5", False),
        ]
        assert [f.recipient.ref for f in result.failed] == ["row-3", "row-4", "row-5"]
        assert sorted(outcome_positions(result)) == list(range(6))

    @pytest.mark.parametrize(
        ("fault", "failed"),
        [(Fault.status(400), [0, 1]), (Fault.omit(1), [1])],
        ids=["refused-request", "left-out-of-the-answer"],
    )
    async def test_a_failed_recipient_is_the_callers_own_spelling_vars_and_ref(
        self, server: FakeDispatchServer, fault: Fault, failed: list[int]
    ) -> None:
        items = [
            da.Recipient("(11) 90000-0001", vars={"row": "0"}, ref="row-0"),
            da.Recipient("(11) 90000-0002", vars={"row": "1"}, ref="row-1"),
        ]
        server.script_for("+5511900000001", fault)
        async with session_for(server, prevalidate=True, region="BR") as session:
            result = await session.send_template(items, **TEMPLATE)
        # The number as given, not the E.164 one sent: the caller joins on it.
        assert [f.recipient for f in result.failed] == [items[i] for i in failed]

    async def test_recipients_an_answer_leaves_out_fail_at_their_own_positions(
        self, server: FakeDispatchServer
    ) -> None:
        items = [da.Recipient(n, ref=n[-1]) for n in numbers(4)]
        server.script_for(items[0].number, Fault.omit(2))
        async with session_for(server) as session:
            result = await session.send_template(items, **TEMPLATE)
        assert [(v.position, v.ref) for v in result.valid] == [(0, "0"), (1, "1")]
        assert [(f.position, f.ref, f.maybe_sent) for f in result.failed] == [
            (2, "2", True),
            (3, "3", True),
        ]

    async def test_a_bad_recipient_in_a_stream_leaves_the_rows_before_it_with_positions(
        self, session: da.DispatchSession
    ) -> None:
        items: list[Any] = [*mixed(5), 42]
        with pytest.raises(da.InvalidRecipientError) as caught:
            await session.send_template(_rows(items), **TEMPLATE, chunk_size=4)
        assert caught.value.result is not None
        assert refs_by_position(caught.value.result) == {i: f"row-{i}" for i in range(5)}


class TestRefNeverGoesOnTheWire:
    async def test_the_request_bodies_hold_numbers_and_vars_but_no_ref(
        self, server: FakeDispatchServer
    ) -> None:
        bodies: list[bytes] = []

        async def sent(_: object, __: object, params: aiohttp.TraceRequestChunkSentParams) -> None:
            bodies.append(params.chunk)

        tracing = aiohttp.TraceConfig()
        tracing.on_request_chunk_sent.append(sent)
        marker = "ref-marker-7f3a"
        unencodable = SimpleNamespace(row=1)  # would break any JSON encoder
        items = [
            da.Recipient("+5511900000001", vars={"name": "Ana"}, ref=marker),
            da.Recipient("+5511900000002", ref=unencodable),
        ]
        async with (
            aiohttp.ClientSession(trace_configs=[tracing]) as http,
            session_for(server, http_session=http) as session,
        ):
            result = await session.send_template(items, **TEMPLATE)
        dispatches = [orjson.loads(b) for b in bodies if b.startswith(b"{")]
        dispatches = [d for d in dispatches if "messages" in d]
        assert [d["messages"] for d in dispatches] == [
            [
                {"number": "+5511900000001", "vars": {"name": "Ana"}},
                {"number": "+5511900000002", "vars": {}},
            ]
        ]
        assert not any(marker.encode() in body for body in bodies)
        assert [v.ref for v in result.valid] == [marker, unencodable]


_POOL = ["+5511900000001", "+5511900000002", "+5521987654321", INVALID, "123"]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(_POOL), st.sampled_from(["str", "dict", "Recipient", "ref"])),
        max_size=30,
    ),
    chunk_size=st.integers(1, 7),
    shape=st.sampled_from(["list", "generator", "async generator"]),
    dedupe=st.booleans(),
    faulty_chunk=st.one_of(st.none(), st.integers(0, 5)),
)
async def test_every_recipient_ends_in_exactly_one_list_at_its_own_position(
    rows: list[tuple[str, str]],
    chunk_size: int,
    shape: str,
    dedupe: bool,
    faulty_chunk: int | None,
) -> None:
    items: list[Any] = []
    for index, (number, form) in enumerate(rows):
        if form == "str":
            items.append(number)
        elif form == "dict":
            items.append({"number": number, "vars": {"i": str(index)}})
        else:
            ref = ("row", index) if form == "ref" else None
            items.append(da.Recipient(number, vars={"i": str(index)}, ref=ref))
    given: Any = {
        "list": items,
        "generator": _generated(items),
        "async generator": _rows(items),
    }[shape]
    async with FakeDispatchServer() as server:
        if faulty_chunk is not None and faulty_chunk * chunk_size < len(rows):
            server.script_for(rows[faulty_chunk * chunk_size][0], Fault.status(503))
        async with session_for(
            server, retry=da.RetryPolicy(wait=False, attempts=1), dedupe=dedupe
        ) as session:
            result = await session.send_template(given, **TEMPLATE, chunk_size=chunk_size)
    seen = outcome_positions(result)
    assert sorted(seen) == list(range(len(rows)))
    for position, (_, number) in seen.items():
        assert number == rows[position][0]
    expected_refs = {i: ("row", i) if form == "ref" else None for i, (_, form) in enumerate(rows)}
    assert refs_by_position(result) == expected_refs

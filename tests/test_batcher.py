"""The batcher: any input, cut into chunks, sent concurrently, merged back in input order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async import _screen
from dispatch_async._recipients import Chunk
from dispatch_async._screen import Screen
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import TEMPLATE, loop_turns, numbers, session_for, spreadsheet_numbers

ENDPOINT_FIELDS = [
    ("template", {"template_id": "t"}),
    ("basic", {"text": "hi"}),
    ("single", {"text": "hi"}),
    ("webhook", {"webhook": "https://hooks.example/x"}),
]


class Timeline:
    """When the simulator saw each request arrive, on the monotonic clock; no sleeping."""

    def __init__(self, server: FakeDispatchServer) -> None:
        self._server = server
        self.arrivals: list[float] = []

    async def watch_until(self, condition: Callable[[], bool]) -> None:
        def observe() -> bool:
            now = time.monotonic()
            while len(self.arrivals) < self._server.stats.requests:
                self.arrivals.append(now)
            return condition()

        await self._server.wait_until(observe)


class TestChunking:
    async def test_10050_recipients_in_chunks_of_1000_take_11_requests_within_the_limit(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.latency = 0.02  # long enough that concurrent requests overlap
        given = numbers(10_050)
        result = await session.send_template(given, **TEMPLATE, chunk_size=1000, max_concurrency=4)
        assert server.stats.dispatch_calls == 11
        assert result.requests == 11
        assert server.stats.max_concurrent == 4
        assert [v.number for v in result.valid] == given
        assert server.stats.recipients_received == 10_050
        assert not server.stats.duplicates

    async def test_the_last_chunk_holds_the_remainder(self, session: da.DispatchSession) -> None:
        parts = [
            p async for p in session.stream_template(numbers(10_050), **TEMPLATE, chunk_size=1000)
        ]
        spans = sorted((p.positions.start, len(p.positions)) for p in parts)
        assert spans == [(i * 1000, 1000) for i in range(10)] + [(10_000, 50)]

    async def test_a_list_shorter_than_a_chunk_is_one_request(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(numbers(3), **TEMPLATE)
        assert server.stats.dispatch_calls == 1
        assert len(result.valid) == 3

    async def test_a_concurrency_of_one_sends_one_chunk_at_a_time(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.latency = 0.01
        await session.send_template(numbers(50), **TEMPLATE, chunk_size=10, max_concurrency=1)
        assert server.stats.dispatch_calls == 5
        assert server.stats.max_concurrent == 1

    async def test_a_generator_of_200000_is_read_lazily_and_sent_whole(self) -> None:
        chunk_size, concurrency = 2000, 4
        read = 0
        ahead: list[int] = []

        def rows() -> Iterator[str]:
            nonlocal read
            for i in range(200_000):
                read += 1
                yield f"+55119{i:08d}"

        def progress(done: int, total: int | None) -> None:
            assert total is None
            ahead.append(read - done)

        async with (
            FakeDispatchServer(fast_ids=True) as server,
            session_for(server) as session,
        ):
            result = await session.send_template(
                rows(),
                **TEMPLATE,
                chunk_size=chunk_size,
                max_concurrency=concurrency,
                on_progress=progress,
            )
            assert len(result.valid) == 200_000
            assert result.ok
            assert server.stats.dispatch_calls == 100
            assert server.stats.recipients_received == 200_000
            assert not server.stats.duplicates
        assert result.valid[199_999].number == "+5511900199999"
        # Never more than the chunks in flight and as many read ahead.
        assert max(ahead) <= 2 * concurrency * chunk_size
        assert len(ahead) == 100


async def agen(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


class _AsyncRows:
    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __aiter__(self) -> AsyncIterator[Any]:
        return agen(self._items)


SHAPES: dict[str, Callable[[list[Any]], Any]] = {
    "list": list,
    "tuple": tuple,
    "generator": lambda items: (item for item in items),
    "iterator": iter,
    "map": lambda items: map(str, items),
    "async generator": agen,
    "async iterable": _AsyncRows,
}


class TestInputShapes:
    @pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
    async def test_any_iterable_or_async_iterable_is_sent_whole_and_in_order(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        shape: Callable[[list[Any]], Any],
    ) -> None:
        given = numbers(25)
        result = await session.send_template(shape(given), **TEMPLATE, chunk_size=10)
        assert [v.number for v in result.valid] == given
        assert result.positions == range(25)
        assert server.stats.dispatch_calls == 3

    async def test_a_sequence_that_cannot_be_sliced_is_sent_whole_and_in_order(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        # A deque is a Sequence without slices; wire-form dicts take the no-copy path.
        given = numbers(25)
        wire = deque({"number": number, "vars": {"pixCode": "000201"}} for number in given)
        result = await session.send_template(wire, **TEMPLATE, chunk_size=10)
        assert [v.number for v in result.valid] == given
        assert server.stats.received == Counter(given)

    async def test_strings_recipients_and_mappings_can_be_mixed(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b, c = numbers(3)
        given: list[Any] = [
            a,
            da.Recipient(b, vars={"pixCode": "000201"}),
            {"number": c, "vars": {"name": "Ana"}},
        ]
        result = await session.send_template(given, **TEMPLATE)
        assert [v.number for v in result.valid] == [a, b, c]
        assert server.stats.received == Counter([a, b, c])

    @pytest.mark.parametrize("shape", [list, agen], ids=["list", "async generator"])
    async def test_no_recipients_is_an_empty_result_and_no_request(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        shape: Callable[[list[Any]], Any],
    ) -> None:
        result = await session.send_template(shape([]), **TEMPLATE)
        assert (len(result.valid), len(result.invalid), len(result.failed)) == (0, 0, 0)
        assert server.stats.requests == 0

    @pytest.mark.parametrize(
        "recipients",
        ["+5511900000001", {"number": "+5511900000001"}, da.Recipient("+5511900000001"), 5],
        ids=["a string", "a mapping", "a recipient", "an int"],
    )
    async def test_one_recipient_where_a_collection_belongs_is_refused_before_sending(
        self, server: FakeDispatchServer, session: da.DispatchSession, recipients: Any
    ) -> None:
        with pytest.raises(da.InputError, match="recipients must be"):
            await session.send_template(recipients, **TEMPLATE)
        assert server.stats.requests == 0

    async def test_numbers_the_service_rejects_go_to_invalid_with_its_reason(
        self, session: da.DispatchSession
    ) -> None:
        good = numbers(2)
        result = await session.send_template([good[0], "123", good[1], "abc"], **TEMPLATE)
        assert [v.number for v in result.valid] == good
        assert [(i.number, i.reason) for i in result.invalid] == [
            ("123", "number must be a valid phone number"),
            ("abc", "number must be a valid phone number"),
        ]
        assert result.ok

    @pytest.mark.parametrize(("path", "fields"), ENDPOINT_FIELDS)
    async def test_every_send_method_goes_through_the_batcher(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        fields: dict[str, str],
        path: str,
    ) -> None:
        result = await getattr(session, f"send_{path}")(numbers(5), **fields, chunk_size=2)
        assert len(result.valid) == 5
        assert server.stats.calls_by_path == Counter({path: 3})

    @pytest.mark.parametrize(("path", "fields"), ENDPOINT_FIELDS)
    async def test_every_stream_method_yields_one_part_per_chunk(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        fields: dict[str, str],
        path: str,
    ) -> None:
        stream = getattr(session, f"stream_{path}")
        parts = [p async for p in stream(numbers(5), **fields, chunk_size=2)]
        assert sorted(len(p.valid) for p in parts) == [1, 2, 2]
        assert server.stats.calls_by_path == Counter({path: 3})


class TestOrdering:
    async def test_results_are_in_input_order_when_chunks_complete_out_of_order(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(40)
        server.script_for(given[0], Fault.delay(0.2))
        completed = [
            p.positions.start
            async for p in session.stream_template(given, **TEMPLATE, chunk_size=10)
        ]
        assert completed[-1] == 0  # the slow first chunk came back last
        server.script_for(given[0], Fault.delay(0.2))
        result = await session.send_template(given, **TEMPLATE, chunk_size=10)
        assert [v.number for v in result.valid] == given
        assert result.positions == range(40)

    async def test_a_stream_covers_every_position_exactly_once(
        self, session: da.DispatchSession
    ) -> None:
        parts = [p async for p in session.stream_template(numbers(23), **TEMPLATE, chunk_size=4)]
        covered = sorted(i for p in parts for i in p.positions)
        assert covered == list(range(23))


class TestDedupe:
    async def test_a_repeated_number_is_invalid_as_a_duplicate_and_sent_once(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b, c = numbers(3)
        result = await session.send_template([a, b, a, c, b], **TEMPLATE, chunk_size=2, dedupe=True)
        assert [v.number for v in result.valid] == [a, b, c]
        assert [(i.number, i.reason) for i in result.invalid] == [
            (a, "duplicate"),
            (b, "duplicate"),
        ]
        assert server.stats.received == Counter([a, b, c])

    async def test_without_dedupe_a_repeated_number_is_sent_each_time(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        result = await session.send_template([a, b, a], **TEMPLATE, chunk_size=2)
        assert [v.number for v in result.valid] == [a, b, a]
        assert len({v.id for v in result.valid}) == 3
        assert server.stats.received[a] == 2

    async def test_dedupe_remembers_numbers_for_one_call_only(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a = numbers(1)
        await session.send_template(a, **TEMPLATE, dedupe=True)
        second = await session.send_template(a, **TEMPLATE, dedupe=True)
        assert len(second.valid) == 1
        assert server.stats.received[a[0]] == 2


class TestPrevalidate:
    async def test_a_number_phonenumbers_rejects_never_leaves_the_machine(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(
            ["(11) 98765-4321", "123", "+5511900000001"],
            **TEMPLATE,
            prevalidate=True,
            region="BR",
        )
        # The caller's own spelling comes back, so results join to their records.
        assert [v.number for v in result.valid] == ["(11) 98765-4321", "+5511900000001"]
        [rejected] = result.invalid
        assert rejected.number == "123"
        assert "checked locally" in rejected.reason
        assert server.stats.received == Counter(["+5511987654321", "+5511900000001"])

    async def test_a_chunk_wholly_rejected_locally_sends_no_request(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(
            ["123", "456", *numbers(2)], **TEMPLATE, chunk_size=2, prevalidate=True
        )
        assert [i.number for i in result.invalid] == ["123", "456"]
        assert len(result.valid) == 2
        assert server.stats.dispatch_calls == 1

    async def test_with_dedupe_two_spellings_of_one_number_are_duplicates(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(
            ["+55 11 98765-4321", "(11) 98765-4321"],
            **TEMPLATE,
            prevalidate=True,
            region="BR",
            dedupe=True,
        )
        assert [v.number for v in result.valid] == ["+55 11 98765-4321"]
        assert [(i.number, i.reason) for i in result.invalid] == [("(11) 98765-4321", "duplicate")]
        assert server.stats.received == Counter(["+5511987654321"])

    async def test_checking_a_large_chunk_lets_other_tasks_run_and_changes_no_outcome(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        # One request's body stays under the size at which aiohttp warns.
        given = spreadsheet_numbers(12_000)
        warm = numbers(1, 50_000_000)
        await session.send_template(warm, **TEMPLATE)  # the token, fetched now
        turns_at_send: list[int] = []

        async def before_send(positions: range) -> None:
            turns_at_send.append(turns[0])

        async with loop_turns() as turns:
            started = turns[0]
            result = await session.send_template(
                given,
                **TEMPLATE,
                prevalidate=True,
                region="BR",
                chunk_size=12_000,
                before_send=before_send,
            )
        # Checking 12,000 numbers takes over 12 ms on any machine (a microsecond each at
        # the very least); other tasks get a turn every millisecond or so of it. (Without
        # that, the few awaits of the send itself give them 4.)
        assert turns_at_send[0] - started >= 12
        expected = [n for n in given if n != "123"]
        assert [v.number for v in result.valid] == expected
        assert [i.position for i in result.invalid] == list(range(9, 12_000, 10))
        assert server.stats.received == Counter([*warm, *(da.to_e164(n, "BR") for n in expected)])


class _PerfCounter:
    """``time`` and ``asyncio`` for `Screen.apply`: its clock gives *times* (the last one
    again once they run out); its turns (``sleep(0)``) are counted."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)
        self.turns = 0

    def perf_counter(self) -> float:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]

    async def sleep(self, seconds: float) -> None:
        self.turns += 1


class TestTheChecksOfAChunk:
    # 47 numbers: the clock is looked at after the 16th and the 32nd.
    @pytest.mark.parametrize(
        ("times", "turns"),
        [
            ((0.0,), 0),  # checking took no time: no turn
            ((0.0, 0.001), 1),  # a millisecond passed by the 16th, none since
            ([i / 1000 for i in range(50)], 2),  # each look a millisecond later
        ],
        ids=["no-time", "one-millisecond", "a-millisecond-a-look"],
    )
    async def test_other_tasks_get_a_turn_after_each_millisecond_of_checks(
        self, monkeypatch: pytest.MonkeyPatch, times: list[float], turns: int
    ) -> None:
        fake = _PerfCounter(*times)
        monkeypatch.setattr(_screen, "time", fake)
        monkeypatch.setattr(_screen, "asyncio", fake)
        chunk = Chunk(0, 47, [{"number": n, "vars": {}} for n in numbers(47)])
        screened = await Screen(dedupe=True, prevalidate=False, region=None).apply(chunk)
        assert len(screened.messages) == 47
        assert fake.turns == turns

    async def test_the_callers_numbers_are_kept_apart_only_when_one_is_changed(self) -> None:
        # Numbers sent as given keep the answer's quick path open (decode_answer).
        given = ["+5511900000001", "(11) 90000-0002", "+5511900000001"]
        chunk = Chunk(0, 3, [{"number": n, "vars": {}} for n in given])
        deduped = await Screen(dedupe=True, prevalidate=False, region=None).apply(chunk)
        assert deduped.given is None
        assert list(deduped.message_positions()) == [0, 1]
        checked = await Screen(dedupe=True, prevalidate=True, region="BR").apply(chunk)
        assert checked.given == given[:2]
        assert [m["number"] for m in checked.messages] == ["+5511900000001", "+5511900000002"]


class TestProgress:
    async def test_reports_recipients_done_out_of_the_list_length(
        self, session: da.DispatchSession
    ) -> None:
        calls: list[tuple[int, int | None]] = []
        await session.send_template(
            numbers(25), **TEMPLATE, chunk_size=10, on_progress=lambda d, t: calls.append((d, t))
        )
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)
        assert {total for _, total in calls} == {25}
        assert calls[-1] == (25, 25)
        assert len(calls) == 3

    async def test_the_total_is_unknown_for_a_generator(self, session: da.DispatchSession) -> None:
        calls: list[tuple[int, int | None]] = []
        await session.send_template(
            iter(numbers(25)),
            **TEMPLATE,
            chunk_size=10,
            on_progress=lambda d, t: calls.append((d, t)),
        )
        assert calls[-1] == (25, None)

    async def test_a_failing_callback_is_logged_and_the_job_goes_on(
        self, session: da.DispatchSession, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(done: int, total: int | None) -> None:
            raise RuntimeError("progress bar exploded")

        with caplog.at_level(logging.ERROR, logger="dispatch_async"):
            result = await session.send_template(
                numbers(20), **TEMPLATE, chunk_size=10, on_progress=broken
            )
        assert len(result.valid) == 20
        assert [r.getMessage() for r in caplog.records] == ["the progress callback failed"] * 2

    async def test_before_send_is_told_each_chunks_input_positions(
        self, session: da.DispatchSession
    ) -> None:
        told: list[range] = []

        async def journal(positions: range) -> None:
            told.append(positions)

        await session.send_template(
            iter(numbers(25)), **TEMPLATE, chunk_size=10, max_concurrency=1, before_send=journal
        )
        assert told == [range(10), range(10, 20), range(20, 25)]


class TestDeadlineOption:
    async def test_a_deadline_that_does_not_pass_changes_nothing(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(numbers(30), **TEMPLATE, chunk_size=10, deadline=30)
        assert len(result.valid) == 30
        assert result.ok

    @pytest.mark.parametrize("deadline", [0, -1, True, "5"])
    async def test_a_deadline_must_be_a_positive_number_of_seconds(
        self, session: da.DispatchSession, deadline: Any
    ) -> None:
        with pytest.raises(da.ConfigurationError, match="deadline"):
            await session.send_template(numbers(1), **TEMPLATE, deadline=deadline)


class TestRequestsPerSecond:
    async def test_the_session_never_sends_faster_than_its_rate(
        self, server: FakeDispatchServer
    ) -> None:
        rate = 20.0
        async with session_for(server, requests_per_second=rate, chunk_size=1) as session:
            timeline = Timeline(server)
            watching = timeline.watch_until(lambda: server.stats.requests >= 6)
            result, _ = await asyncio.gather(
                session.send_template(numbers(6), **TEMPLATE), watching
            )
        assert len(result.valid) == 6
        arrivals = timeline.arrivals
        assert len(arrivals) == 6
        # A leaky bucket of one: request k waits its turn, k/rate after the first (a little
        # clock slack). A loaded machine can see one arrival late, shortening the gap after
        # it (one run in four did): so every second request is a whole turn apart, and the
        # five turns take four at least however late the first was seen.
        assert all(b - a >= 0.8 / rate for a, b in zip(arrivals, arrivals[2:], strict=False))
        assert arrivals[-1] - arrivals[0] >= 4 * 0.8 / rate
        assert server.stats.max_concurrent == 1

    async def test_the_rate_is_shared_by_concurrent_calls(self, server: FakeDispatchServer) -> None:
        rate = 20.0
        async with session_for(server, requests_per_second=rate, chunk_size=1) as session:
            timeline = Timeline(server)
            first, second, _ = await asyncio.gather(
                session.send_template(numbers(3), **TEMPLATE),
                session.send_template(numbers(3, start=3), **TEMPLATE),
                timeline.watch_until(lambda: server.stats.requests >= 6),
            )
        assert len(first.valid) + len(second.valid) == 6
        assert timeline.arrivals[-1] - timeline.arrivals[0] >= 5 * 0.8 / rate

    async def test_a_rate_must_be_positive(self, server: FakeDispatchServer) -> None:
        with pytest.raises(da.ConfigurationError, match="requests_per_second"):
            session_for(server, requests_per_second=0)

    # A limiter's ``learner`` is the fleet's learned rate (RedisRateLimiter's); another
    # object of that name is none of the session's business.
    @pytest.mark.parametrize("learner", [None, "a learner of another kind"])
    async def test_a_shared_limiter_lets_each_dispatch_request_through(
        self, server: FakeDispatchServer, learner: object
    ) -> None:
        limiter = _CountingLimiter(learner)
        async with session_for(server, rate_limiter=limiter) as session:
            result = await session.send_template(numbers(3), **TEMPLATE, chunk_size=1)
        assert result.ok
        assert limiter.acquired == server.stats.dispatch_calls == 3


class _CountingLimiter:
    """A rate limit shared beyond this process (`Limiter`) that counts what it let through."""

    def __init__(self, learner: object) -> None:
        self.learner = learner
        self.acquired = 0

    async def acquire(self) -> None:
        self.acquired += 1

    async def aclose(self) -> None:
        pass


class TestSettingsAndOverrides:
    async def test_session_settings_apply_to_every_call(self, server: FakeDispatchServer) -> None:
        async with session_for(server, chunk_size=3, dedupe=True) as session:
            a = numbers(1)[0]
            result = await session.send_template([a, a, *numbers(5, start=1)], **TEMPLATE)
        assert server.stats.dispatch_calls == 3  # 7 recipients in chunks of 3
        assert [i.reason for i in result.invalid] == ["duplicate"]
        assert server.stats.received[a] == 1

    async def test_a_per_call_override_applies_to_that_call_only(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, chunk_size=5) as session:
            await session.send_template(numbers(10), **TEMPLATE, chunk_size=2)
            assert server.stats.dispatch_calls == 5
            await session.send_template(numbers(10), **TEMPLATE)
            assert server.stats.dispatch_calls == 7
            assert session.settings.chunk_size == 5

    async def test_max_concurrency_can_be_overridden_per_call(
        self, server: FakeDispatchServer
    ) -> None:
        server.latency = 0.02
        async with session_for(server, max_concurrency=1) as session:
            await session.send_template(numbers(30), **TEMPLATE, chunk_size=10, max_concurrency=3)
        assert server.stats.max_concurrent == 3

    @pytest.mark.parametrize(
        "override",
        [
            {"chunk_size": 0},
            {"max_concurrency": -1},
            {"chunk_size": 2.5},
            {"max_concurrency": True},
        ],
    )
    async def test_a_bad_override_is_refused_before_anything_is_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession, override: dict[str, Any]
    ) -> None:
        with pytest.raises(da.ConfigurationError):
            await session.send_template(numbers(3), **TEMPLATE, **override)
        assert server.stats.requests == 0

    async def test_from_env_takes_batcher_settings(
        self, server: FakeDispatchServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("DISPATCH_BASE_URL", server.url)
        monkeypatch.setenv("DISPATCH_CLIENT_SECRET", server.client_secret)
        monkeypatch.setenv("DISPATCH_ACCOUNT", "acme")
        async with da.DispatchSession.from_env(chunk_size=4, max_concurrency=2) as session:
            result = await session.send_template(numbers(10), **TEMPLATE)
        assert len(result.valid) == 10
        assert server.stats.dispatch_calls == 3


class TestSlowSources:
    async def test_a_slow_source_does_not_hold_back_a_finished_part(
        self, session: da.DispatchSession
    ) -> None:
        second_chunk_may_come = asyncio.Event()

        async def rows() -> AsyncIterator[str]:
            for number in numbers(10):
                yield number
            # The source stalls until the caller has seen the first part.
            await second_chunk_may_come.wait()
            for number in numbers(10, start=10):
                yield number

        seen: list[range] = []
        async with asyncio.timeout(5):
            async for part in session.stream_basic(rows(), text="x", chunk_size=10):
                seen.append(part.positions)
                second_chunk_may_come.set()
        assert seen == [range(10), range(10, 20)]

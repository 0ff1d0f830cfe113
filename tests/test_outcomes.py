"""What happened to each recipient: the fault of one chunk lands on that chunk alone.

Every test sends a few chunks, scripts a fault on one of them (``script_for`` its first
number) and checks that exactly that chunk's recipients end where the outcome model says,
with the right ``maybe_sent``, that the other chunks are untouched, and that nothing the
service may have acted on was sent again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async._matching import _interleaved, result_from_answer
from dispatch_async._recipients import Chunk
from dispatch_async._wire import AnswerColumns, decode_answer, decode_json
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import HANG, TEMPLATE, numbers, session_for

CHUNK = 5


def chunks(given: list[str]) -> list[list[str]]:
    return [given[i : i + CHUNK] for i in range(0, len(given), CHUNK)]


async def send_with_fault_on_second_chunk(
    server: FakeDispatchServer, session: da.DispatchSession, *faults: Fault
) -> tuple[da.DispatchResult, list[str], list[str]]:
    """Send three chunks with *faults* scripted on the middle one; (result, hit, others)."""
    given = numbers(3 * CHUNK)
    first, hit, last = chunks(given)
    server.script_for(hit[0], *faults)
    result = await session.send_template(given, **TEMPLATE, chunk_size=CHUNK)
    assert server.pending_faults == 0, "the script did not play out"
    return result, hit, first + last


NOT_SENT: dict[str, tuple[Callable[[], list[Fault]], type[da.DispatchError]]] = {
    "400": (lambda: [Fault.status(400)], da.ClientStatusError),
    "404": (lambda: [Fault.status(404)], da.ClientStatusError),
    "409": (lambda: [Fault.status(409)], da.ClientStatusError),
    "422": (lambda: [Fault.status(422)], da.ClientStatusError),
    "429 until retries run out": (
        lambda: [Fault.status(429, retry_after="0")] * 5,
        da.RateLimitedError,
    ),
    "503 until retries run out": (lambda: [Fault.status(503)] * 5, da.ServiceUnavailableError),
}

MAYBE_SENT: dict[str, tuple[Callable[[], Fault], type[da.DispatchError]]] = {
    "500": (lambda: Fault.status(500), da.ServerStatusError),
    "502": (lambda: Fault.status(502), da.ServerStatusError),
    "504": (lambda: Fault.status(504), da.ServerStatusError),
    "dropped after sending": (Fault.drop, da.ConnectionLostError),
    "a 200 that is not JSON": (Fault.not_json, da.MalformedResponseError),
    "a 200 with valid entries missing ids": (Fault.wrong_shape, da.MalformedResponseError),
    "a 200 that is a JSON list": (
        lambda: Fault.wrong_shape(body=[1, 2]),
        da.MalformedResponseError,
    ),
    "a 200 whose lists are not arrays": (
        lambda: Fault.wrong_shape(body={"validMessages": {}, "invalidMessages": []}),
        da.MalformedResponseError,
    ),
}


class TestTheServiceCertainlyDidNotAct:
    @pytest.mark.parametrize("case", NOT_SENT.values(), ids=NOT_SENT.keys())
    async def test_a_refusal_marks_its_chunk_not_sent_and_leaves_the_others_alone(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        case: tuple[Callable[[], list[Fault]], type[da.DispatchError]],
    ) -> None:
        faults, error_type = case
        result, hit, others = await send_with_fault_on_second_chunk(server, session, *faults())
        assert [f.recipient.number for f in result.failed] == hit
        assert all(f.maybe_sent is False for f in result.failed)
        assert all(type(f.error) is error_type for f in result.failed)
        assert [v.number for v in result.valid] == others
        assert not any(server.stats.received[n] for n in hit)

    async def test_retries_are_bounded_by_the_attempts_of_the_policy(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, retry=da.RetryPolicy(wait=False, attempts=3)) as session:
            given = numbers(CHUNK)
            server.script_for(given[0], *[Fault.status(503)] * 10)
            result = await session.send_template(given, **TEMPLATE)
        assert server.stats.status_counts[503] == 3
        assert (result.requests, result.retries) == (3, 2)
        assert result.counts["not_sent"] == CHUNK

    async def test_retries_are_bounded_by_the_total_time_of_the_policy(
        self, server: FakeDispatchServer
    ) -> None:
        # Without max_time the doubling waits (up to an hour each) would be a hang.
        policy = da.RetryPolicy(attempts=1000, max_time=0.3, first_wait=0.05, max_wait=3600)
        async with session_for(server, retry=policy) as session:
            given = numbers(CHUNK)
            server.script_for(given[0], *[Fault.status(503)] * 1000)
            async with asyncio.timeout(HANG):
                result = await session.send_template(given, **TEMPLATE)
        assert result.counts["not_sent"] == CHUNK
        assert 1 < server.stats.status_counts[503] < 1000

    async def test_a_connection_never_made_is_retried_then_not_sent(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, retry=da.RetryPolicy(wait=False, attempts=3)) as session:
            await session.send_template(numbers(1), **TEMPLATE)  # holds a token now
            await server.close()
            result = await session.send_template(numbers(CHUNK), **TEMPLATE)
        assert [type(f.error) for f in result.failed] == [da.ConnectError] * CHUNK
        assert result.counts["not_sent"] == CHUNK
        assert (result.requests, result.retries) == (3, 2)


class TestTheServiceMayHaveActed:
    @pytest.mark.parametrize("case", MAYBE_SENT.values(), ids=MAYBE_SENT.keys())
    async def test_a_fault_marks_its_chunk_maybe_sent_and_is_never_sent_again(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        case: tuple[Callable[[], Fault], type[da.DispatchError]],
    ) -> None:
        fault, error_type = case
        result, hit, others = await send_with_fault_on_second_chunk(server, session, fault())
        assert [f.recipient.number for f in result.failed] == hit
        assert all(f.maybe_sent is True for f in result.failed)
        assert all(type(f.error) is error_type for f in result.failed)
        assert [v.number for v in result.valid] == others
        assert result.requests == 3
        assert all(server.stats.received[n] == 1 for n in hit)
        assert not server.stats.duplicates

    async def test_a_connection_closed_before_the_service_acted_is_still_maybe_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        # The client cannot tell this from a drop after acting: the request was written.
        result, hit, others = await send_with_fault_on_second_chunk(
            server, session, Fault.drop_before()
        )
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, True) for n in hit
        ]
        assert [v.number for v in result.valid] == others
        assert result.requests == 3  # not re-sent

    async def test_a_read_timeout_after_sending_is_maybe_sent(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, timeout=0.3) as session:
            result, hit, others = await send_with_fault_on_second_chunk(
                server, session, Fault.hang()
            )
        assert [type(f.error) for f in result.failed] == [da.RequestTimeoutError] * CHUNK
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, True) for n in hit
        ]
        assert [v.number for v in result.valid] == others
        assert result.requests == 3

    async def test_recipients_a_200_leaves_out_are_maybe_sent_and_the_rest_valid(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result, hit, others = await send_with_fault_on_second_chunk(server, session, Fault.omit(2))
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (hit[3], True),
            (hit[4], True),
        ]
        assert all(isinstance(f.error, da.MissingFromResponseError) for f in result.failed)
        assert sorted(v.number for v in result.valid) == sorted(others + hit[:3])
        assert not server.stats.duplicates

    async def test_missing_ids_fail_the_valid_entries_but_keep_the_service_rejections(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = [*numbers(2), "123"]
        server.script(Fault.wrong_shape())
        result = await session.send_template(given, **TEMPLATE)
        assert [f.recipient.number for f in result.failed] == given[:2]
        assert [i.number for i in result.invalid] == ["123"]

    async def test_a_500_is_re_sent_only_when_the_policy_opts_in(
        self, server: FakeDispatchServer
    ) -> None:
        policy = da.RetryPolicy(wait=False, statuses={429, 503, 500})
        async with session_for(server, retry=policy) as session:
            given = numbers(CHUNK)
            server.script_for(given[0], Fault.status(500))
            result = await session.send_template(given, **TEMPLATE)
        assert len(result.valid) == CHUNK
        assert result.retries == 1
        # The price of opting in: the service acted on the first attempt too.
        assert server.stats.duplicates == Counter(dict.fromkeys(given, 2))


class TestRetriesOfWhatWasNotActedOn:
    @pytest.mark.parametrize(
        "fault",
        [Fault.status(429, retry_after="0"), Fault.status(503), Fault.revoke_token()],
        ids=["429", "503", "401"],
    )
    async def test_a_chunk_refused_once_is_sent_again_and_succeeds(
        self, server: FakeDispatchServer, session: da.DispatchSession, fault: Fault
    ) -> None:
        result, hit, others = await send_with_fault_on_second_chunk(server, session, fault)
        assert sorted(v.number for v in result.valid) == sorted(others + hit)
        assert result.ok
        # One re-send of the refused chunk; after a revoked token, others may need one too.
        assert result.requests == server.stats.requests == 4 + server.stats.revoked_token_uses
        assert not server.stats.duplicates

    async def test_a_401_fetches_one_new_token_and_re_sends_once(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result, _, _ = await send_with_fault_on_second_chunk(server, session, Fault.revoke_token())
        assert server.stats.token_calls == 2  # shared by every chunk that was refused
        assert result.retries == 0  # the refresh is not a retry of the policy

    async def test_a_429_storm_on_every_chunk_ends_with_everything_sent_once(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(8 * CHUNK)
        server.script(*[Fault.status(429, retry_after="0")] * 16)
        result = await session.send_template(given, **TEMPLATE, chunk_size=CHUNK)
        assert [v.number for v in result.valid] == given
        assert server.stats.status_counts[429] == 16
        assert result.retries == 16
        assert server.stats.received == Counter(given)

    async def test_one_429_with_retry_after_pauses_every_worker_of_the_session(
        self, server: FakeDispatchServer
    ) -> None:
        retry_after = 0.3
        async with session_for(server, retry=da.RetryPolicy(), chunk_size=1) as session:
            await session.send_template(numbers(1, start=99), **TEMPLATE)  # token in hand
            server.reset_stats()
            a, b, c, d = numbers(4)
            server.script_for(a, Fault.status(429, retry_after=str(retry_after)))
            server.script_for(b, Fault.delay(0.05))  # b's worker is free well before the end

            arrivals: list[float] = []
            told_at: list[float] = []
            answered_b: list[float] = []

            def observe() -> bool:
                now, stats = time.monotonic(), server.stats
                arrivals.extend([now] * (stats.requests - len(arrivals)))
                if stats.status_counts[429] and not told_at:
                    told_at.append(now)
                if stats.status_counts[200] and not answered_b:
                    answered_b.append(now)
                return stats.status_counts[200] == 4

            result, _ = await asyncio.gather(
                session.send_template([a, b, c, d], **TEMPLATE, max_concurrency=2),
                server.wait_until(observe),
            )
        assert [v.number for v in result.valid] == [a, b, c, d]
        assert server.stats.status_counts[429] == 1
        assert answered_b[0] - told_at[0] < retry_after / 2
        # a's retry, c and d: every request after the 429 waited out the Retry-After.
        later = arrivals[2:]
        assert len(later) == 3
        assert min(later) - told_at[0] >= retry_after - 0.01

    async def test_a_retry_after_in_http_date_form_is_honoured(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, retry=da.RetryPolicy(first_wait=0)) as session:
            given = numbers(1)
            server.script_for(
                given[0], Fault.status(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")
            )
            result = await session.send_template(given, **TEMPLATE)
        assert result.ok  # a date in the past: retry at once
        assert result.retries == 1


class TestReconciliation:
    async def test_digits_only_numbers_are_matched_back_to_the_callers_numbers(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = [*numbers(3), "+55 11 9000-0000x"]  # the last one the service rejects
        server.script(Fault.digits_only())
        result = await session.send_template(given, **TEMPLATE)
        assert [v.number for v in result.valid] == given[:3]
        assert [i.number for i in result.invalid] == given[3:]
        assert not result.failed
        assert not result.unexpected

    def test_an_answer_read_carefully_keeps_every_field_it_gave(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        sent = numbers(4)
        digits = [n.removeprefix("+") for n in sent]  # the careful path's matching
        chunk = Chunk(20, 4, [{"number": n, "vars": {}} for n in sent])
        answer = {
            "validMessages": [
                {"id": "a", "number": digits[0], "session_id": "s-a"},
                {"id": "b", "number": digits[1], "session_id": 5},
                {"id": "z", "number": "+5599999999999"},
                "junk",
            ],
            "invalidMessages": [{"number": digits[2], "reason": "no RCS here"}],
        }
        with caplog.at_level(logging.WARNING, logger="dispatch_async"):
            result = result_from_answer(chunk, decode_answer(orjson.dumps(answer)), retries=2)
        assert [(v.id, v.number, v.position, v.session_id) for v in result.valid] == [
            ("a", sent[0], 20, "s-a"),
            ("b", sent[1], 21, None),
        ]
        assert [(i.number, i.position, i.reason) for i in result.invalid] == [
            (sent[2], 22, "no RCS here")
        ]
        [missing] = result.failed
        assert (missing.recipient.number, missing.position, missing.maybe_sent) == (
            sent[3],
            23,
            True,
        )
        assert isinstance(missing.error, da.MissingFromResponseError)
        assert str(missing.error) == "the answer did not mention this recipient"
        assert list(result.unexpected) == [
            {"id": "z", "number": "+5599999999999"},
            {"entry": "junk"},
        ]
        assert (result.requests, result.retries) == (1, 2)
        assert [r.getMessage() for r in caplog.records] == [
            "chunk at 20: the answer left 1 recipient(s) unaccounted for and named 2 "
            "number(s) that were not sent"
        ]

    @pytest.mark.parametrize("listed", ["validMessages", "invalidMessages"])
    def test_a_list_the_answer_leaves_out_is_empty(self, listed: str) -> None:
        [number] = numbers(1)
        entry = {"id": "a", "number": number, "reason": "no", "extra": 1}  # the careful path
        chunk = Chunk(0, 1, [{"number": number, "vars": {}}])
        result = result_from_answer(chunk, orjson.loads(orjson.dumps({listed: [entry]})))
        assert not result.failed
        assert len(result.valid if listed == "validMessages" else result.invalid) == 1

    @pytest.mark.parametrize(
        ("answer", "problem"),
        [
            ([], "the answer is a JSON list, not an object"),
            ({"validMessages": {}}, "validMessages and invalidMessages must be arrays"),
        ],
    )
    def test_an_answer_of_the_wrong_shape_fails_every_recipient_as_maybe_sent(
        self, answer: object, problem: str
    ) -> None:
        chunk = Chunk(0, 2, [{"number": n, "vars": {}} for n in numbers(2)])
        result = result_from_answer(chunk, orjson.loads(orjson.dumps(answer)), retries=3)
        assert [(f.position, f.maybe_sent, str(f.error)) for f in result.failed] == [
            (0, True, problem),
            (1, True, problem),
        ]
        assert (result.requests, result.retries) == (1, 3)

    def test_numbers_the_service_writes_its_own_way_are_matched_by_their_digits(self) -> None:
        sent = numbers(3)
        chunk = Chunk(0, 3, [{"number": n, "vars": {}} for n in sent])
        written = ["+55 11 90000-0000", "(55) 11 9000-00001", "55.11.90000.0002"]
        answer = {
            "validMessages": [
                {"id": "a", "number": written[0], "session_id": "s-a"},
                {"id": "b", "number": written[1], "session_id": "s-b"},
            ],
            "invalidMessages": [{"number": written[2], "reason": "no RCS here"}],
        }
        result = result_from_answer(chunk, decode_answer(orjson.dumps(answer)))
        assert [(v.id, v.number, v.session_id) for v in result.valid] == [
            ("a", sent[0], "s-a"),
            ("b", sent[1], "s-b"),
        ]
        assert [(i.number, i.reason) for i in result.invalid] == [(sent[2], "no RCS here")]
        assert not result.failed
        assert not result.unexpected

    @pytest.mark.parametrize(
        ("answered", "left", "named"),
        [((0,), 1, 0), ((0, 1, 7), 0, 1)],
        ids=["one left out", "one stranger"],
    )
    def test_an_answer_that_does_not_add_up_is_logged(
        self,
        caplog: pytest.LogCaptureFixture,
        answered: tuple[int, ...],
        left: int,
        named: int,
    ) -> None:
        chunk = Chunk(40, 2, [{"number": n, "vars": {}} for n in numbers(2)])
        answer = {"validMessages": [{"id": f"id{i}", "number": numbers(1, i)[0]} for i in answered]}
        with caplog.at_level(logging.WARNING, logger="dispatch_async"):
            result = result_from_answer(chunk, decode_answer(orjson.dumps(answer)))
        assert (len(result.failed), len(result.unexpected)) == (left, named)
        assert [r.getMessage() for r in caplog.records] == [
            f"chunk at 40: the answer left {left} recipient(s) unaccounted for and named {named} "
            "number(s) that were not sent"
        ]

    async def test_failures_name_each_recipient_as_the_caller_wrote_it(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = ["(11) 98765-4321", "+55 11 90000-0001", "11 90000-0002", "(11) 90000-0003"]
        server.script(Fault.omit(1))  # the first chunk's answer leaves its last one out
        server.script(Fault.status(400))  # the second chunk is refused
        result = await session.send_template(
            given, **TEMPLATE, chunk_size=2, max_concurrency=1, prevalidate=True, region="BR"
        )
        assert [v.number for v in result.valid] == given[:1]
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (given[1], True),
            (given[2], False),
            (given[3], False),
        ]
        assert server.stats.received == Counter(["+5511987654321", "+5511900000001"])

    async def test_digits_only_on_one_chunk_leaves_the_others_alone(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result, hit, others = await send_with_fault_on_second_chunk(
            server, session, Fault.digits_only()
        )
        assert sorted(v.number for v in result.valid) == sorted(others + hit)
        assert result.ok
        assert not result.unexpected

    async def test_a_number_twice_in_one_chunk_is_counted_twice(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        result = await session.send_template([a, b, a], **TEMPLATE)
        assert [v.number for v in result.valid] == [a, b, a]
        assert len({v.id for v in result.valid}) == 3
        assert server.stats.received == Counter({a: 2, b: 1})

    async def test_a_number_twice_in_one_chunk_is_counted_twice_in_digits_only_answers(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        server.script(Fault.digits_only())
        result = await session.send_template([a, b, a], **TEMPLATE)
        assert sorted(v.number for v in result.valid) == sorted([a, b, a])
        assert not result.failed
        assert not result.unexpected

    async def test_omitting_one_of_a_repeated_number_fails_exactly_one(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        server.script(Fault.omit(1))
        result = await session.send_template([a, b, a], **TEMPLATE)
        assert [v.number for v in result.valid] == [a, b]
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [(a, True)]

    async def test_an_entry_that_matches_nothing_sent_is_reported_not_merged(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(2)
        stranger = {"id": "3b1c6f0e-0000-4000-8000-000000000001", "number": "+5521999999999"}
        answer = {
            "validMessages": [
                {"id": f"3b1c6f0e-0000-4000-8000-00000000001{i}", "number": n}
                for i, n in enumerate(given)
            ]
            + [stranger],
            "invalidMessages": [],
        }
        server.script(Fault.wrong_shape(body=answer))
        result = await session.send_template(given, **TEMPLATE)
        assert [v.number for v in result.valid] == given
        assert list(result.unexpected) == [stranger]
        assert result.ok

    async def test_a_number_answered_twice_but_sent_once_is_unexpected_the_second_time(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        [a] = numbers(1)
        twice = [{"id": f"00000000-0000-4000-8000-00000000000{i}", "number": a} for i in (1, 2)]
        server.script(Fault.wrong_shape(body={"validMessages": twice, "invalidMessages": []}))
        result = await session.send_template([a], **TEMPLATE)
        assert [v.id for v in result.valid] == [twice[0]["id"]]
        assert list(result.unexpected) == [twice[1]]

    async def test_an_answer_that_swaps_a_number_fails_the_one_left_out_and_reports_the_other(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        answer = {
            "validMessages": [
                {"id": "00000000-0000-4000-8000-000000000001", "number": a},
                {"id": "00000000-0000-4000-8000-000000000002", "number": "+5521999999999"},
            ],
            "invalidMessages": [],
        }
        server.script(Fault.wrong_shape(body=answer))
        result = await session.send_template([a, b], **TEMPLATE)
        assert [v.number for v in result.valid] == [a]
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [(b, True)]
        assert [u["number"] for u in result.unexpected] == ["+5521999999999"]

    async def test_a_rejection_without_a_reason_is_still_a_rejection(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(
            Fault.wrong_shape(body={"validMessages": [], "invalidMessages": [{"number": "1"}]})
        )
        result = await session.send_template(["1"], **TEMPLATE)
        [rejected] = result.invalid
        assert rejected.number == "1"
        assert re.search("no reason", rejected.reason)


class TestSummary:
    async def test_recipients_never_sent_count_no_request_and_no_retry(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows: list[object] = numbers(15)
        rows[13] = 5511900000013  # a bad recipient: the job stops before its chunk
        with pytest.raises(da.InvalidRecipientError) as caught:
            await session.send_template(iter(rows), **TEMPLATE, chunk_size=10)
        result = caught.value.result
        assert result is not None
        assert [(f.position, f.maybe_sent) for f in result.failed] == [
            (10, False),
            (11, False),
            (12, False),
        ]
        assert (result.requests, result.retries) == (1, 0)  # the first chunk's only
        assert server.stats.dispatch_calls == 1

    async def test_a_chunk_refused_wholly_on_this_machine_counts_no_request_and_no_retry(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(["123", "456"], **TEMPLATE, prevalidate=True)
        assert [i.number for i in result.invalid] == ["123", "456"]
        assert (result.requests, result.retries) == (0, 0)
        assert server.stats.dispatch_calls == 0

    async def test_counts_and_summary_add_up_across_buckets(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = [*numbers(3 * CHUNK - 1), "123"]
        first, hit, _ = chunks(given)
        server.script_for(hit[0], Fault.status(500))
        server.script_for(first[0], Fault.status(400))
        result = await session.send_template(given, **TEMPLATE, chunk_size=CHUNK)
        assert result.counts == {
            "valid": 4,
            "invalid": 1,
            "failed": 10,
            "maybe_sent": 5,
            "not_sent": 5,
        }
        assert result.summary().startswith("15 recipients: 4 sent, 1 invalid, 10 failed")
        with pytest.raises(da.FailedRecipientsError) as caught:
            result.raise_for_failures()
        assert caught.value.result is result
        assert caught.value.maybe_sent is True

    async def test_the_summary_counts_one_in_the_singular(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(numbers(1), **TEMPLATE)
        assert result.summary() == (
            "1 recipient: 1 sent, 0 invalid, 0 failed (0 maybe sent, 0 not sent); "
            "1 request, 0 retries"
        )


# Numbers of a sent list in the order-check properties, and one more never sent.
NUMBER = st.sampled_from("abcdefg")


def split(
    sent: list[str], data: st.DataObject, flags: list[bool] | None = None
) -> tuple[list[str], list[str]]:
    """*sent* split in two, order kept, as a service that keeps the order answers it."""
    if flags is None:
        flags = data.draw(st.lists(st.booleans(), min_size=len(sent), max_size=len(sent)))
    valid = [n for n, ok in zip(sent, flags, strict=True) if ok]
    invalid = [n for n, ok in zip(sent, flags, strict=True) if not ok]
    return valid, invalid


class TestOrderCheck:
    """The quick check that an answer is the sent list split in two, order kept."""

    @given(st.lists(st.sampled_from("abcdef"), max_size=12), st.data())
    def test_never_accepts_an_answer_that_does_not_account_for_every_number(
        self, sent: list[str], data: st.DataObject
    ) -> None:
        # A true split of what was sent, then broken on purpose: a number dropped, one
        # added (another, or a repeat), or one replaced by another.
        valid, invalid = split(sent, data)
        answer = data.draw(st.sampled_from([valid, invalid]))
        how = data.draw(st.sampled_from(["drop", "add", "replace"] if answer else ["add"]))
        if how == "add":
            answer.insert(data.draw(st.integers(0, len(answer))), data.draw(NUMBER))
        else:
            at = data.draw(st.integers(0, len(answer) - 1))
            replaced = answer.pop(at)
            if how == "replace":
                answer.insert(at, data.draw(NUMBER.filter(lambda n: n != replaced)))
        assert Counter(valid + invalid) != Counter(sent), "broken on purpose"
        assert not _interleaved(sent, valid, invalid)

    @given(st.lists(NUMBER, min_size=2, max_size=7, unique=True), st.data())
    def test_never_accepts_an_answer_out_of_the_order_sent(
        self, sent: list[str], data: st.DataObject
    ) -> None:
        # Two numbers in the same list of a true split, then swapped.
        flags = data.draw(st.lists(st.booleans(), min_size=len(sent), max_size=len(sent)))
        first = data.draw(st.integers(0, len(sent) - 2))
        second = data.draw(st.integers(first + 1, len(sent) - 1))
        flags[second] = flags[first]
        valid, invalid = split(sent, data, flags)
        answer = valid if flags[first] else invalid
        a, b = answer.index(sent[first]), answer.index(sent[second])
        answer[a], answer[b] = answer[b], answer[a]
        assert Counter(valid + invalid) == Counter(sent), "every number is there"
        assert not _interleaved(sent, valid, invalid)

    @given(st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=20), st.data())
    def test_accepts_any_order_keeping_split(self, sent: list[str], data: st.DataObject) -> None:
        valid, invalid = split(sent, data)
        assert _interleaved(sent, valid, invalid)


def _outcome_of(result: da.DispatchResult) -> tuple[object, ...]:
    failures = [(f.recipient, type(f.error), str(f.error), f.maybe_sent) for f in result.failed]
    return list(result.valid), list(result.invalid), failures, list(result.unexpected)


_ANSWER_TEXT = st.one_of(st.sampled_from(["", "+1", "+2", "+3", "1", "x"]), st.text(max_size=3))
# JSON integers as orjson writes them: 64-bit.
_ANSWER_VALUE = st.one_of(
    _ANSWER_TEXT, st.none(), st.integers(-(2**63), 2**64 - 1), st.lists(st.none(), max_size=1)
)
_ENTRY = st.one_of(
    st.dictionaries(st.sampled_from(["id", "number", "reason", "extra"]), _ANSWER_VALUE),
    _ANSWER_VALUE,
)


class TestTypedAnswer:
    """The C-level decode of an answer ends every recipient exactly where orjson's does."""

    @given(
        st.lists(st.sampled_from(["+1", "+2", "+3", "+4"]), min_size=1, max_size=6),
        st.dictionaries(
            st.sampled_from(["validMessages", "invalidMessages", "other"]),
            st.one_of(st.lists(_ENTRY, max_size=7), _ANSWER_VALUE),
        ),
    )
    def test_typed_decode_gives_what_the_careful_decode_gives(
        self, sent: list[str], answer: dict[str, object]
    ) -> None:
        chunk = Chunk(0, len(sent), [{"number": n, "vars": {}} for n in sent])
        body = orjson.dumps(answer)
        typed = result_from_answer(chunk, decode_answer(body))
        careful = result_from_answer(chunk, decode_json(body))
        assert _outcome_of(typed) == _outcome_of(careful)

    @given(st.lists(st.sampled_from(["+1", "+2", "+3", "+4"]), min_size=1, max_size=6), st.data())
    def test_an_echoed_answer_takes_the_typed_columns(
        self, sent: list[str], data: st.DataObject
    ) -> None:
        flags = data.draw(st.lists(st.booleans(), min_size=len(sent), max_size=len(sent)))
        valid = [
            {"id": f"id{i}", "number": n}
            for i, (n, ok) in enumerate(zip(sent, flags, strict=True))
            if ok
        ]
        invalid = [
            {"number": n, "reason": "no"} for n, ok in zip(sent, flags, strict=True) if not ok
        ]
        body = orjson.dumps({"validMessages": valid, "invalidMessages": invalid})
        decoded = decode_answer(body)
        assert isinstance(decoded, AnswerColumns)
        chunk = Chunk(0, len(sent), [{"number": n, "vars": {}} for n in sent])
        result = result_from_answer(chunk, decoded)
        assert _outcome_of(result) == _outcome_of(result_from_answer(chunk, decode_json(body)))
        assert len(result.valid) + len(result.invalid) == len(sent)

    @pytest.mark.parametrize("decode", [decode_answer, decode_json])
    def test_a_session_id_that_is_not_a_string_is_none_and_the_others_are_kept(
        self, decode: Callable[[bytes], object]
    ) -> None:
        chunk = Chunk(0, 3, [{"number": n, "vars": {}} for n in ["+1", "+2", "+3"]])
        valid = [
            {"id": "a", "number": "+1", "session_id": "s-1"},
            {"id": "b", "number": "+2", "session_id": 7},
            {"id": "c", "number": "+3"},
        ]
        body = orjson.dumps({"validMessages": valid, "invalidMessages": []})
        result = result_from_answer(chunk, decode(body))
        assert [(v.id, v.session_id) for v in result.valid] == [
            ("a", "s-1"),
            ("b", None),
            ("c", None),
        ]

    @pytest.mark.parametrize("decode", [decode_answer, decode_json])
    def test_an_empty_id_fails_its_recipient_as_maybe_sent(
        self, decode: Callable[[bytes], object]
    ) -> None:
        chunk = Chunk(0, 2, [{"number": n, "vars": {}} for n in ["+1", "+2"]])
        valid = [{"id": "", "number": "+1"}, {"id": "b", "number": "+2"}]
        result = result_from_answer(chunk, decode(orjson.dumps({"validMessages": valid})))
        assert [v.id for v in result.valid] == ["b"]
        [failure] = result.failed
        assert (failure.recipient.number, failure.maybe_sent) == ("+1", True)
        assert str(failure.error) == (
            "the service listed this recipient as valid without a usable id"
        )

    @pytest.mark.parametrize(
        "body",
        [
            b"not json",
            b'{"validMessages": []} trailing',
            b'{"validMessages": [], "other": "\xed\xa0\x80"}',
            b'{"validMessages": [{"id": "1", "number": "\xed\xa0\x80"}]}',
        ],
    )
    def test_garbage_is_refused_as_the_careful_decode_refuses_it(self, body: bytes) -> None:
        with pytest.raises(da.MalformedResponseError) as caught:
            decode_json(body)
        assert str(caught.value) == f"the answer is not JSON ({len(body)} bytes)"
        with pytest.raises(da.MalformedResponseError):
            decode_answer(body)

"""Jobs that cannot go on, run out of time, or are cancelled: nothing lost, nothing left behind."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing
from typing import Any, overload

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import HANG, TEMPLATE, numbers, session_for, stalling


def client_tasks() -> set[asyncio.Task[Any]]:
    """Every task except the simulator's connection handlers (aiohttp's RequestHandler),
    which live as long as the connections the client keeps alive."""
    return {
        task
        for task in asyncio.all_tasks()
        if not getattr(task.get_coro(), "__qualname__", "").startswith("RequestHandler.")
    }


async def one_loop_turn() -> None:
    """Let callbacks already queued run: an abandoned async generator's finalizer starts
    its closing task one turn after the call that dropped it has returned."""
    await asyncio.sleep(0)


class Rows:
    """A generator input that counts how much of it the batcher has read."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.read = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.read += 1
            yield item

    async def aiter(self) -> AsyncIterator[Any]:
        for item in self:
            yield item


async def drain(stream: AsyncIterator[da.DispatchResult], *, into: list[da.DispatchResult]) -> None:
    """Collect a stream's parts into *into*, so they are kept when it raises."""
    async for part in stream:
        into.append(part)


def accounted(result: da.DispatchResult) -> list[str]:
    """Every caller number the result mentions, bucket by bucket."""
    return (
        [v.number for v in result.valid]
        + [i.number for i in result.invalid]
        + [f.recipient.number for f in result.failed]
    )


class TestTheSecretIsRejectedMidJob:
    @staticmethod
    def reject_the_secret_after(server: FakeDispatchServer, recipients: int) -> Any:
        """A progress callback that rotates the secret and kills every token once
        *recipients* are done: every later request gets 401, and so does the refresh."""

        def progress(done: int, total: int | None) -> None:
            if done >= recipients and server.client_secret != "rotated":
                server.client_secret = "rotated"
                server.expire_tokens()

        return progress

    async def send_until_rejected(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        rows: Rows,
        *,
        concurrency: int,
        after: int,
    ) -> da.DispatchResult:
        """Send *rows* in chunks of 10 until the secret is rejected; the partial result."""
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(
                iter(rows),
                **TEMPLATE,
                chunk_size=10,
                max_concurrency=concurrency,
                on_progress=self.reject_the_secret_after(server, after),
            )
        assert caught.value.result is not None
        return caught.value.result

    async def test_send_raises_and_its_result_accounts_for_every_recipient_read(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows = Rows(numbers(100))
        result = await self.send_until_rejected(server, session, rows, concurrency=1, after=30)
        assert rows.read < 100  # it stopped reading
        assert result.positions == range(rows.read)
        assert accounted(result) == rows.items[: rows.read]
        assert [v.number for v in result.valid] == rows.items[:30]
        assert all(f.maybe_sent is False for f in result.failed)
        assert server.stats.received == Counter(rows.items[:30])
        assert server.stats.expired_token_uses >= 1

    async def test_with_chunks_in_flight_nothing_the_service_accepted_is_lost(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows = Rows(numbers(200))
        result = await self.send_until_rejected(server, session, rows, concurrency=4, after=10)
        assert sorted(accounted(result)) == sorted(rows.items[: rows.read])
        assert Counter(v.number for v in result.valid) == server.stats.received
        assert all(not f.maybe_sent for f in result.failed)
        assert result.failed  # the job did stop part way

    async def test_a_stream_yields_every_completed_part_before_raising(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows = Rows(numbers(100))
        parts: list[da.DispatchResult] = []
        stream = session.stream_template(
            iter(rows),
            **TEMPLATE,
            chunk_size=10,
            max_concurrency=2,
            on_progress=self.reject_the_secret_after(server, 20),
        )
        with pytest.raises(da.AuthenticationError):
            await drain(stream, into=parts)
        covered = sorted(i for p in parts for i in p.positions)
        assert covered == list(range(rows.read))
        assert Counter(v.number for p in parts for v in p.valid) == server.stats.received

    async def test_the_session_works_again_once_the_secret_is_right(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        secret = server.client_secret
        with pytest.raises(da.AuthenticationError):
            await session.send_template(
                iter(numbers(30)),
                **TEMPLATE,
                chunk_size=10,
                max_concurrency=1,
                on_progress=self.reject_the_secret_after(server, 10),
            )
        server.client_secret = secret
        result = await session.send_template(numbers(5), **TEMPLATE)
        assert len(result.valid) == 5

    async def test_the_chunk_it_stopped_counts_its_requests_and_retries(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        assert (await session.send_template(numbers(1, start=900), **TEMPLATE)).ok  # a token
        given = numbers(5)
        # A 503 (retried), then a 401 on the re-send, and the secret refused for a new token.
        server.script_for(given[0], Fault.status(503), Fault.revoke_token())
        server.script_token(Fault.status(401))
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(given, **TEMPLATE)
        result = caught.value.result
        assert result is not None
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, False) for n in given
        ]
        assert (result.requests, result.retries) == (2, 1)
        assert server.stats.requests == 3  # the first call's, then the chunk's two

    async def test_a_list_has_every_recipient_accounted_for(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(100)
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(
                given,
                **TEMPLATE,
                chunk_size=10,
                max_concurrency=1,
                on_progress=self.reject_the_secret_after(server, 30),
            )
        result = caught.value.result
        assert result is not None
        # A list is read whole before anything is sent: so the caller can retry from it.
        assert result.positions == range(100)
        assert accounted(result) == given
        assert [f.recipient.number for f in result.failed if not f.maybe_sent] == given[30:]


class TestAMalformedRecipientInAnIterator:
    @pytest.mark.parametrize("asynchronous", [False, True], ids=["generator", "async generator"])
    async def test_send_raises_before_the_chunk_holding_it_is_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession, asynchronous: bool
    ) -> None:
        items: list[Any] = numbers(40)
        items[25] = 5511900000025  # an int, not a number string
        rows = Rows(items)
        with pytest.raises(da.InvalidRecipientError) as caught:
            await session.send_template(
                rows.aiter() if asynchronous else iter(rows), **TEMPLATE, chunk_size=10
            )
        error = caught.value
        assert error.position == 25
        assert error.problem == "expected a number string, a Recipient or a mapping, not int"
        assert error.result is not None
        assert error.result.positions == range(25)
        assert [v.number for v in error.result.valid] == items[:20]
        assert [(f.recipient.number, f.maybe_sent) for f in error.result.failed] == [
            (n, False) for n in items[20:25]
        ]
        assert server.stats.received == Counter(items[:20])

    async def test_one_that_opens_its_chunk_stops_the_job_after_the_chunks_before(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        items: list[Any] = numbers(40)
        items[20] = None
        with pytest.raises(da.InvalidRecipientError) as caught:
            await session.send_template(iter(items), **TEMPLATE, chunk_size=10)
        assert caught.value.position == 20
        assert caught.value.result is not None
        assert caught.value.result.positions == range(20)
        assert [v.number for v in caught.value.result.valid] == items[:20]
        assert server.stats.received == Counter(items[:20])

    async def test_a_stream_yields_the_completed_parts_then_raises(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        items: list[Any] = numbers(40)
        items[25] = {"number": items[25], "name": "Ana"}
        parts: list[da.DispatchResult] = []
        stream = session.stream_template(iter(items), **TEMPLATE, chunk_size=10)
        with pytest.raises(da.InvalidRecipientError, match="position 25"):
            await drain(stream, into=parts)
        assert sorted(i for p in parts for i in p.positions) == list(range(25))
        assert sum(len(p.valid) for p in parts) == 20

    async def test_a_bad_recipient_anywhere_in_a_list_stops_the_call_before_anything_is_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        items: list[Any] = [*numbers(2500), None]
        with pytest.raises(da.InvalidRecipientError, match="position 2500"):
            await session.send_template(items, **TEMPLATE, chunk_size=10)
        assert server.stats.requests == 0

    async def test_an_iterator_that_breaks_stops_the_job_with_its_error_as_the_cause(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        def rows() -> Iterator[str]:
            yield from numbers(15)
            raise OSError("the disk went away")

        with pytest.raises(da.InputError, match="reading the recipients failed") as caught:
            await session.send_template(rows(), **TEMPLATE, chunk_size=10)
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.result is not None
        assert len(caught.value.result.valid) == 10
        assert server.stats.recipients_received == 10


class TestTheDeadline:
    async def test_it_returns_with_in_flight_chunks_maybe_sent_and_unsent_ones_not(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(50)
        server.script_for(given[0], Fault.hang())
        server.script_for(given[10], Fault.hang())
        async with asyncio.timeout(HANG):  # the hung requests would hold it for ever
            result = await session.send_template(
                given, **TEMPLATE, chunk_size=10, max_concurrency=2, deadline=0.2
            )
        assert result.positions == range(50)
        assert [f.recipient.number for f in result.failed] == given
        assert all(isinstance(f.error, da.DeadlineExceededError) for f in result.failed)
        assert [f.maybe_sent for f in result.failed] == [True] * 20 + [False] * 30
        assert [str(f.error) for f in result.failed] == [
            "the deadline passed while this was in flight"
        ] * 20 + ["the deadline passed before this was sent"] * 30
        assert server.stats.received == Counter(given[:20])
        await server.wait_until(lambda: server.in_flight == 0)  # the hung requests were cut

    async def test_chunks_that_finished_before_it_keep_their_results(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(50)
        server.script_for(given[0], Fault.hang())
        result = await session.send_template(
            given, **TEMPLATE, chunk_size=10, max_concurrency=2, deadline=0.2
        )
        assert [v.number for v in result.valid] == given[10:]
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, True) for n in given[:10]
        ]

    async def test_a_chunk_waiting_out_a_retry_after_when_it_passes_was_not_sent(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, retry=da.RetryPolicy()) as session:
            given = numbers(5)
            server.script_for(given[0], Fault.status(429, retry_after="3600"))
            async with asyncio.timeout(HANG):  # waiting the Retry-After out is a hang
                result = await session.send_template(given, **TEMPLATE, deadline=0.2)
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, False) for n in given
        ]
        assert (result.requests, result.retries) == (1, 1)  # the 429, then its wait
        assert not server.stats.received

    async def test_with_an_iterator_every_recipient_read_is_accounted_for(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows = Rows(numbers(1000))
        server.script_for(rows.items[0], Fault.hang())
        server.script_for(rows.items[10], Fault.hang())
        result = await session.send_template(
            iter(rows), **TEMPLATE, chunk_size=10, max_concurrency=2, deadline=0.2
        )
        # Two chunks in flight and two read ahead, no more: it reads no faster than it sends.
        assert rows.read == 40
        assert result.positions == range(rows.read)
        assert accounted(result) == rows.items[: rows.read]
        assert result.counts["maybe_sent"] == 20

    async def test_a_source_that_stops_yielding_is_cut_by_it_too(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        before = client_tasks()
        async with asyncio.timeout(HANG):
            result = await session.send_template(
                stalling(numbers(15)), **TEMPLATE, chunk_size=10, deadline=0.5
            )
        assert [v.number for v in result.valid] == numbers(10)
        assert server.stats.recipients_received == 10
        # The five read into the next chunk when the deadline cut its read: not sent.
        assert result.positions == range(15)
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, False) for n in numbers(15)[10:]
        ]
        assert all(isinstance(f.error, da.DeadlineExceededError) for f in result.failed)
        await one_loop_turn()
        assert client_tasks() <= before, "the read of the next chunk was cancelled"

    async def test_a_source_that_stops_between_two_chunks_leaves_no_empty_part(
        self, session: da.DispatchSession
    ) -> None:
        parts: list[da.DispatchResult] = []
        async with asyncio.timeout(HANG):
            await drain(
                session.stream_template(
                    stalling(numbers(10)), **TEMPLATE, chunk_size=10, deadline=0.2
                ),
                into=parts,
            )
        # The deadline cut the read of a next chunk that had nothing yet: no part for it.
        assert [part.positions for part in parts] == [range(10)]

    async def test_one_already_past_when_the_call_starts_sends_nothing(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(30)
        # The smallest positive float: gone before the clock can tick.
        result = await session.send_template(
            given, **TEMPLATE, chunk_size=10, deadline=sys.float_info.min
        )
        assert result.positions == range(30)
        assert [(f.recipient.number, f.maybe_sent, str(f.error)) for f in result.failed] == [
            (n, False, "the deadline passed before this was sent") for n in given
        ]
        assert server.stats.dispatch_calls == 0

    async def test_a_bad_recipient_in_a_read_it_cut_stops_the_job_after_the_good_ones(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        good = numbers(13)

        async def rows() -> AsyncIterator[Any]:
            for number in good:
                yield number
            yield 5511900000013  # an int, not a number string
            await asyncio.Event().wait()  # then nothing more for now
            yield "never"

        async with asyncio.timeout(HANG):
            with pytest.raises(da.InvalidRecipientError) as caught:
                await session.send_template(rows(), **TEMPLATE, chunk_size=10, deadline=0.5)
        assert caught.value.position == 13
        result = caught.value.result
        assert result is not None
        assert [v.number for v in result.valid] == good[:10]
        # The three read before the bad one, into the chunk the deadline cut: not sent.
        assert result.positions == range(13)
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, False) for n in good[10:]
        ]
        assert server.stats.recipients_received == 10


class TestACallbackThatRaises:
    async def test_an_exclude_that_raises_stops_the_job_and_nothing_more_is_read(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        rows = Rows(numbers(100))

        def exclude(number: str) -> bool:
            if number == rows.items[25]:
                raise RuntimeError("the opt-out list went away")
            return False

        with pytest.raises(da.CallbackError, match="exclude raised RuntimeError") as caught:
            await session.send_template(
                iter(rows), **TEMPLATE, chunk_size=10, max_concurrency=1, exclude=exclude
            )
        result = caught.value.result
        assert result is not None
        assert [v.number for v in result.valid] == rows.items[:20]
        # The chunk it raised on is failed, not sent; the one read ahead is all that was read.
        assert rows.read == 30
        assert [(f.position, f.maybe_sent) for f in result.failed] == [
            (i, False) for i in range(20, 30)
        ]
        assert all(isinstance(f.error, da.CallbackError) for f in result.failed)
        assert server.stats.recipients_received == 20

    async def test_the_first_error_that_stops_the_job_is_the_one_raised(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(40)
        excluded_raised = asyncio.Event()

        def exclude(number: str) -> bool:
            if number == given[25]:
                excluded_raised.set()
                raise RuntimeError("the opt-out list went away")
            return False

        async def journal(positions: range) -> None:
            if positions.start == 10:  # still in flight when the exclude stops the job
                await excluded_raised.wait()
                raise OSError("the journal's disk is full")

        with pytest.raises(da.CallbackError) as caught:
            await session.send_template(
                given,
                **TEMPLATE,
                chunk_size=10,
                max_concurrency=2,
                exclude=exclude,
                before_send=journal,
            )
        assert str(caught.value) == "exclude raised RuntimeError; this chunk was not sent"
        result = caught.value.result
        assert result is not None
        assert [v.number for v in result.valid] == given[:10]
        assert sorted({str(f.error) for f in result.failed}) == [
            "before_send raised; this chunk was not sent",
            "exclude raised RuntimeError; this chunk was not sent",
        ]
        assert server.stats.recipients_received == 10


class TestTheSessionClosesMidCall:
    async def test_a_chunk_in_flight_is_failed_maybe_sent_and_the_call_raises(
        self, server: FakeDispatchServer
    ) -> None:
        given = numbers(20)
        server.script_for(given[10], Fault.hang())
        session = session_for(server)
        call = asyncio.create_task(
            session.send_template(given, **TEMPLATE, chunk_size=10, max_concurrency=1)
        )
        await server.wait_until(lambda: server.in_flight == 1 and server.stats.requests == 2)
        async with asyncio.timeout(HANG):  # the hung request would hold it for ever
            await session.close()
            with pytest.raises(da.SessionClosedError) as caught:
                await call
        assert str(caught.value) == "the session was closed during the call"
        result = caught.value.result
        assert result is not None
        assert [v.number for v in result.valid] == given[:10]
        assert [(f.recipient.number, f.maybe_sent, str(f.error)) for f in result.failed] == [
            (n, True, "the session was closed while this was in flight") for n in given[10:]
        ]
        assert all(isinstance(f.error, da.SessionClosedError) for f in result.failed)

    async def test_a_stream_waiting_on_its_source_stops_at_once(
        self, server: FakeDispatchServer
    ) -> None:
        session = session_for(server)
        parts: list[da.DispatchResult] = []
        a_part_came = asyncio.Event()

        async def consume() -> None:
            async for part in session.stream_basic(stalling(numbers(15)), text="x", chunk_size=10):
                parts.append(part)
                a_part_came.set()

        call = asyncio.create_task(consume())
        async with asyncio.timeout(HANG):
            await a_part_came.wait()
            await session.close()
            with pytest.raises(da.SessionClosedError):
                await call
        assert [v.number for p in parts for v in p.valid] == numbers(10)
        # The five read into the next chunk when the close cut its read: not sent.
        assert [(f.recipient.number, f.maybe_sent) for p in parts for f in p.failed] == [
            (n, False) for n in numbers(15)[10:]
        ]
        assert server.stats.recipients_received == 10


class _TrippingList(Sequence[Any]):
    """A list that runs *action* once, when the whole-list check reads item *at*."""

    def __init__(self, items: list[Any], at: int, action: Callable[[], None]) -> None:
        self._items = items
        self._at = at
        self._action: Callable[[], None] | None = action

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if index == self._at and self._action is not None:
            action, self._action = self._action, None
            action()
        return self._items[index]


class TestCancellation:
    @pytest.mark.parametrize("how", ["in the running step", "queued on the loop"])
    async def test_a_cancel_during_the_whole_list_check_sends_nothing(
        self, server: FakeDispatchServer, session: da.DispatchSession, how: str
    ) -> None:
        # Ctrl-C under asyncio.run cancels mid-step; another thread's cancel is queued.
        assert (await session.send_template(numbers(1, start=9000), **TEMPLATE)).ok  # warm
        announced: list[range] = []

        async def journal(positions: range) -> None:
            announced.append(positions)

        loop = asyncio.get_running_loop()

        def cancel_the_call() -> None:
            if how == "in the running step":
                call.cancel()
            else:
                loop.call_soon(call.cancel)

        given = _TrippingList(numbers(4000), at=2000, action=cancel_the_call)
        call = asyncio.create_task(
            session.send_template(
                given, **TEMPLATE, chunk_size=500, max_concurrency=4, before_send=journal
            )
        )
        with pytest.raises(asyncio.CancelledError):
            await call
        # Answered in order on one pool: whatever the cancelled call sent came before this.
        assert (await session.send_template(numbers(1, start=9001), **TEMPLATE)).ok
        assert announced == []
        assert server.stats.recipients_received == 2

    async def test_a_timeout_around_send_stops_it_promptly_and_leaves_nothing_behind(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(50)
        server.script_for(given[0], Fault.hang())
        server.script_for(given[10], Fault.hang())
        # The token first: a token fetch is shared, and outlives a caller that gives up
        # (until the session closes); a loaded machine's could outlast the timeout.
        await session.check_credentials()
        before = client_tasks()
        cut = asyncio.timeout(None)

        async def expire_when_both_hang() -> None:
            # Not a fixed 0.2 s: on a loaded machine that came before the token did.
            await server.wait_until(lambda: server.in_flight == 2)
            cut.reschedule(asyncio.get_running_loop().time())

        async def send_within_the_timeout() -> None:
            async with cut:
                await session.send_template(given, **TEMPLATE, chunk_size=10, max_concurrency=2)

        expiry = asyncio.create_task(expire_when_both_hang())
        # A send that ignored the cancellation would wait for the hung requests: the outer
        # bound turns that into a failure (its TimeoutError is not the one expected).
        async with asyncio.timeout(HANG):
            with pytest.raises(TimeoutError):
                await send_within_the_timeout()
        await expiry
        await one_loop_turn()
        assert client_tasks() == before
        await server.wait_until(lambda: server.in_flight == 0)  # its connections were closed
        assert client_tasks() == before
        assert server.stats.received == Counter(given[:20])  # nothing new was started
        again = await session.send_template(given[20:], **TEMPLATE)
        assert len(again.valid) == 30

    async def test_cancelling_the_task_propagates_cancelled_error_promptly(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(50)
        server.script_for(given[0], Fault.hang())
        server.script_for(given[10], Fault.hang())
        before = client_tasks()
        job = asyncio.create_task(
            session.send_template(iter(given), **TEMPLATE, chunk_size=10, max_concurrency=2)
        )
        await server.wait_until(lambda: server.in_flight == 2)
        job.cancel()
        async with asyncio.timeout(HANG):  # the hung requests would hold it for ever
            with pytest.raises(asyncio.CancelledError):
                await job
        await one_loop_turn()
        assert client_tasks() == before
        await server.wait_until(lambda: server.in_flight == 0)
        assert client_tasks() == before
        assert server.stats.received == Counter(given[:20])
        assert len((await session.send_template(given[20:], **TEMPLATE)).valid) == 30

    async def test_cancelling_while_a_chunk_waits_out_a_retry_after_is_prompt(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, retry=da.RetryPolicy()) as session:
            given = numbers(5)
            server.script_for(given[0], Fault.status(429, retry_after="3600"))
            before = client_tasks()
            job = asyncio.create_task(session.send_template(given, **TEMPLATE))
            await server.wait_until(lambda: server.stats.status_counts[429] == 1)
            job.cancel()
            async with asyncio.timeout(HANG):  # waiting the Retry-After out is a hang
                with pytest.raises(asyncio.CancelledError):
                    await job
            await one_loop_turn()
            assert client_tasks() == before
            assert not server.stats.received

    async def test_breaking_out_of_a_stream_cancels_the_rest_and_leaves_nothing_behind(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(50)
        server.script_for(given[10], Fault.hang())
        server.script_for(given[20], Fault.hang())
        before = client_tasks()
        stream = session.stream_template(given, **TEMPLATE, chunk_size=10, max_concurrency=3)
        async with aclosing(stream) as parts:
            async for part in parts:
                first = part
                break
        assert [v.number for v in first.valid] == given[:10]
        await one_loop_turn()
        assert client_tasks() == before
        await server.wait_until(lambda: server.in_flight == 0)
        assert client_tasks() == before
        assert server.stats.received == Counter(given[:30])  # nothing after the break
        assert len((await session.send_template(given[30:], **TEMPLATE)).valid) == 20

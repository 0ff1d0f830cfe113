"""``exclude=``: numbers never to send (an opt-out list), for every call of a session."""

from __future__ import annotations

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer

from .conftest import TEMPLATE, numbers, session_for


class TestExcludedRecipientsAreNeverSent:
    async def test_a_set_on_the_session_refuses_them_as_invalid_with_their_reason(
        self, server: FakeDispatchServer
    ) -> None:
        given = numbers(6)
        opted_out = frozenset({given[1], given[4]})
        async with session_for(server, exclude=opted_out, chunk_size=2) as session:
            result = await session.send_template(given, **TEMPLATE)
        assert [(i.number, i.reason) for i in result.invalid] == [
            (given[1], da.EXCLUDED_REASON),
            (given[4], da.EXCLUDED_REASON),
        ]
        assert sorted(v.number for v in result.valid) == sorted(set(given) - opted_out)
        assert set(server.stats.received) == set(given) - opted_out
        assert result.positions == range(6), "every recipient is accounted for"

    async def test_a_callable_per_call_is_asked_about_the_number_as_it_would_be_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        asked: list[str] = []

        def opted_out(number: str) -> bool:
            asked.append(number)
            return number == "+5511987654321"

        given = ["(11) 98765-4321", "11 91234-5678"]
        result = await session.send_template(
            given, **TEMPLATE, prevalidate=True, region="BR", exclude=opted_out
        )
        assert asked == ["+5511987654321", "+5511912345678"]
        assert [(i.number, i.reason) for i in result.invalid] == [
            ("(11) 98765-4321", da.EXCLUDED_REASON)
        ]
        assert list(server.stats.received) == ["+5511912345678"]

    async def test_an_excluded_number_is_not_seen_by_dedupe_and_a_view_can_add_a_list(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        a, b = numbers(2)
        view = session.with_options(exclude={a}, dedupe=True)
        result = await view.send_template([a, b, a], **TEMPLATE)
        assert [i.reason for i in result.invalid] == [da.EXCLUDED_REASON] * 2
        assert list(server.stats.received) == [b]
        assert session.settings.exclude is None

    async def test_the_dry_run_refuses_them_as_the_send_would(self) -> None:
        given = numbers(3)
        chunks = [c async for c in da.plan(given, exclude={given[0]})]
        assert [n for c in chunks for n in c.numbers] == given[1:]
        assert [(i.number, i.reason) for c in chunks for i in c.refused] == [
            (given[0], da.EXCLUDED_REASON)
        ]


class TestAWrongExcludeStopsBeforeSending:
    @pytest.mark.parametrize(
        ("value", "given"),
        [(["+5511987654321"], "list"), ("+5511987654321", "str"), (set, "type")],
        ids=["list", "str", "class"],
    )
    async def test_anything_but_a_set_or_a_callable_is_refused(
        self, server: FakeDispatchServer, session: da.DispatchSession, value: object, given: str
    ) -> None:
        with pytest.raises(da.ConfigurationError, match=rf"exclude must be a set.*\b{given}\b"):
            await session.send_template(numbers(2), **TEMPLATE, exclude=value)  # type: ignore[arg-type]
        assert server.stats.requests == 0

    async def test_a_callable_that_raises_stops_the_job_and_accounts_for_everyone(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        def broken(number: str) -> bool:
            raise LookupError("the opt-out database is down")

        with pytest.raises(da.CallbackError) as caught:
            await session.send_template(numbers(5), **TEMPLATE, exclude=broken, chunk_size=2)
        assert isinstance(caught.value.__cause__, LookupError)
        assert str(caught.value) == "exclude raised LookupError; this chunk was not sent"
        result = caught.value.result
        assert result is not None
        assert result.positions == range(5)
        assert all(not failure.maybe_sent for failure in result.failed)
        assert server.stats.requests == 0

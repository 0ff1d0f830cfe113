"""``with_options``: a view with its own timeout, retries or batch settings, sharing the rest."""

from __future__ import annotations

import asyncio

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import numbers


class TestSharing:
    async def test_views_share_the_sessions_token(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        views = [session.with_options(timeout=5), session.with_options(deadline=10.0)]
        results = await asyncio.gather(
            session.send_basic(numbers(1), text="x"),
            *(view.send_basic(numbers(1, i + 1), text="x") for i, view in enumerate(views)),
        )
        assert all(r.ok for r in results)
        assert server.stats.token_calls == 1

    async def test_a_view_shares_the_sessions_rate_limit_pause(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        # A 429 with Retry-After seen through the view pauses the session's requests too.
        view = session.with_options(retry=da.RetryPolicy(attempts=1))
        server.script(Fault.status(429, retry_after="0.4"))
        loop = asyncio.get_running_loop()
        [failure] = (await view.send_basic(numbers(1), text="x")).failed
        assert isinstance(failure.error, da.RateLimitedError)
        started = loop.time()
        assert (
            await session.with_options(retry=da.RetryPolicy()).send_basic(numbers(1, 1), text="x")
        ).ok
        assert loop.time() - started >= 0.3

    async def test_closing_a_view_leaves_the_session_open(
        self, session: da.DispatchSession
    ) -> None:
        view = session.with_options(timeout=5)
        async with view:
            assert (await view.send_basic(numbers(1), text="x")).ok
        await view.close()
        assert "view open" in repr(view)
        assert (await session.send_basic(numbers(1, 1), text="x")).ok

    async def test_closing_the_session_closes_its_views(self, server: FakeDispatchServer) -> None:
        session = da.DispatchSession(server.url, client_secret=server.client_secret, account="a")
        view = session.with_options(timeout=5)
        async with session:
            assert (await view.send_basic(numbers(1), text="x")).ok
        with pytest.raises(da.SessionClosedError):
            await view.send_basic(numbers(1), text="x")


class TestTheOptionsApply:
    async def test_a_view_without_retries_fails_at_once_where_the_session_retries(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        no_retries = session.with_options(retry=da.RetryPolicy(attempts=1))
        server.script(Fault.status(503))
        result = await no_retries.send_basic(numbers(1), text="x")
        [failure] = result.failed
        assert isinstance(failure.error, da.ServiceUnavailableError)
        assert result.requests == 1
        server.script(Fault.status(503))
        retried = await session.send_basic(numbers(1, 1), text="x")
        assert retried.ok
        assert retried.retries == 1

    async def test_a_views_timeout_cuts_its_requests_only(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        quick = session.with_options(timeout=0.2, retry=da.RetryPolicy(attempts=1))
        server.script(Fault.delay(0.6))
        [failure] = (await quick.send_basic(numbers(1), text="x")).failed
        assert isinstance(failure.error, da.RequestTimeoutError)
        server.script(Fault.delay(0.6))
        assert (await session.send_basic(numbers(1, 1), text="x")).ok

    async def test_a_views_deadline_bounds_its_calls(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        budget = session.with_options(deadline=0.3)
        server.script(Fault.hang())
        [failure] = (await budget.send_basic(numbers(1), text="x")).failed
        assert isinstance(failure.error, da.DeadlineExceededError)
        assert session.settings.deadline is None

    def test_a_bad_option_is_refused_at_once(self, session: da.DispatchSession) -> None:
        with pytest.raises(da.ConfigurationError, match="timeout"):
            session.with_options(timeout=0)
        with pytest.raises(da.ConfigurationError, match="chunk_size"):
            session.with_options(chunk_size=0)

"""``with_options``: a view with its own timeout, retries or batch settings, sharing the rest."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET, numbers


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


class TestEveryArgumentIsCheckedUpFront:
    """A wrong type is refused where it is given, naming the argument and the type given."""

    URL = "http://127.0.0.1:1"

    @pytest.mark.parametrize(
        ("name", "value", "given"),
        [
            ("retry", False, "bool"),
            ("retry", 0, "int"),
            ("timeout", "30", "str"),
            ("user_agent", 5, "int"),
            ("hooks", 5, "int"),
            ("hooks", [5], "list"),
            ("token_store", "redis://127.0.0.1", "str"),
            ("rate_limiter", 5, "int"),
            ("http_session", "shared", "str"),
            ("account", 5, "int"),
            ("requests_per_second", "fast", "str"),
            ("max_requests_per_second", "10", "str"),
            ("dedupe", "no", "str"),
            ("prevalidate", 1, "int"),
            ("region", 5, "int"),
            ("on_progress", "print", "str"),
            ("before_send", 5, "int"),
            ("chunk_size", 2.5, "float"),
        ],
    )
    def test_the_session_refuses_a_wrong_type_naming_argument_and_type(
        self, name: str, value: object, given: str
    ) -> None:
        if name == "max_requests_per_second":
            extra: dict[str, Any] = {"requests_per_second": "auto"}
        else:
            extra = {}
        with pytest.raises(da.ConfigurationError, match=rf"\b{name}\b.*\b{given}\b"):
            da.DispatchSession(self.URL, client_secret=SECRET, **extra, **{name: value})

    @pytest.mark.parametrize(
        ("name", "value", "given"),
        [
            ("retry", False, "bool"),
            ("retry", 0, "int"),
            ("timeout", "30", "str"),
            ("dedupe", "no", "str"),
            ("region", 5, "int"),
            ("deadline", "5", "str"),
            ("on_progress", 5, "int"),
        ],
    )
    async def test_a_view_refuses_a_wrong_type_before_anything_is_sent(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        name: str,
        value: object,
        given: str,
    ) -> None:
        with pytest.raises(da.ConfigurationError, match=rf"\b{name}\b.*\b{given}\b"):
            session.with_options(**{name: value})
        assert server.stats.requests == 0

    async def test_a_per_call_option_of_the_wrong_type_is_refused_before_anything_is_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        with pytest.raises(da.ConfigurationError, match=r"dedupe.*str"):
            await session.send_basic(numbers(2), text="x", dedupe="no")  # type: ignore[arg-type]
        assert server.stats.requests == 0

    def test_every_argument_of_the_session_is_checked(self) -> None:
        # Derived from the signatures: an argument added later is covered, or this fails.
        names = [
            name
            for name in inspect.signature(da.DispatchSession.__init__).parameters
            if name not in ("self", "base_url", "batch")
        ]
        names += list(da.BatchOptions.__annotations__)
        unchecked = []
        for name in names:
            try:
                da.DispatchSession(self.URL, **{"client_secret": SECRET, name: object()})
            except da.ConfigurationError as error:
                if name not in str(error) or "object" not in str(error):
                    unchecked.append(f"{name}: {error}")
            else:
                unchecked.append(f"{name}: accepted")
        assert unchecked == []

    def test_the_secret_is_never_shown_even_when_it_is_the_wrong_type(self) -> None:
        with pytest.raises(da.ConfigurationError, match=r"client_secret.*int") as caught:
            da.DispatchSession(self.URL, client_secret=981273645)  # type: ignore[arg-type]
        assert "981273645" not in str(caught.value)

    def test_the_client_and_its_views_refuse_a_wrong_type_without_starting_a_thread(
        self,
    ) -> None:
        threads = threading.active_count()
        with pytest.raises(da.ConfigurationError, match=r"retry.*bool"):
            da.DispatchClient(self.URL, client_secret=SECRET, retry=False)  # type: ignore[arg-type]
        with pytest.raises(da.ConfigurationError, match=r"hooks.*int"):
            da.DispatchClient(self.URL, client_secret=SECRET, hooks=5)  # type: ignore[arg-type]
        with da.DispatchClient(self.URL, client_secret=SECRET) as client:
            with pytest.raises(da.ConfigurationError, match=r"retry.*int"):
                client.with_options(retry=0)  # type: ignore[arg-type]
            with pytest.raises(da.ConfigurationError, match=r"dedupe.*str"):
                client.with_options(dedupe="no")  # type: ignore[typeddict-item]
        assert threading.active_count() == threads

"""A session is opened once, closed once, and leaves nothing behind."""

from __future__ import annotations

import asyncio
import gc

import aiohttp
import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import HANG, SECRET, numbers, stalling

NUMBER = "+5511987654321"


def own_tasks() -> set[asyncio.Task[object]]:
    """Tasks of the client side: the simulator's handlers share this loop but are not ours."""
    current = asyncio.current_task()
    server_side = ("/aiohttp/web_", "/dispatch_async/testing/")
    return {
        t
        for t in asyncio.all_tasks()
        if t is not current
        and not any(part in t.get_coro().cr_code.co_filename for part in server_side)  # type: ignore[union-attr]
    }


class TestOpenAndClose:
    async def test_close_is_idempotent(self, server: FakeDispatchServer) -> None:
        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme")
        async with session:
            await session.send_basic([NUMBER], text="x")
        await session.close()
        await session.close()
        assert "closed" in repr(session)

    async def test_a_closed_session_cannot_be_used_or_reopened(
        self, server: FakeDispatchServer
    ) -> None:
        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme")
        async with session:
            pass
        with pytest.raises(da.SessionClosedError):
            await session.send_basic([NUMBER], text="x")
        with pytest.raises(da.SessionClosedError):
            async with session:
                pass
        assert server.stats.requests == 0

    async def test_a_session_opens_itself_on_first_use(self, server: FakeDispatchServer) -> None:
        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme")
        try:
            result = await session.send_basic([NUMBER], text="x")
            assert result.ok
        finally:
            await session.close()

    async def test_close_leaves_no_task_behind(self, server: FakeDispatchServer) -> None:
        server.token_lifetime = 1.0
        before = own_tasks()
        async with da.DispatchSession(server.url, client_secret=SECRET, account="acme") as s:
            await s.send_basic([NUMBER], text="x")
            assert len(own_tasks() - before) >= 1  # the refresh task
        assert own_tasks() - before == set()

    async def test_an_injected_http_session_is_used_and_left_open(
        self, server: FakeDispatchServer
    ) -> None:
        async with aiohttp.ClientSession() as http:
            async with da.DispatchSession(
                server.url, client_secret=SECRET, account="acme", http_session=http
            ) as session:
                assert (await session.send_basic([NUMBER], text="x")).ok
            assert not http.closed

    async def test_a_session_never_used_closes_and_stays_closed(
        self, server: FakeDispatchServer
    ) -> None:
        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme")
        await session.close()
        assert "closed" in repr(session)
        with pytest.raises(da.SessionClosedError):
            await session.send_basic([NUMBER], text="x")
        assert server.stats.requests == 0

    def test_a_stream_started_outside_a_coroutine_is_refused(self) -> None:
        session = da.DispatchSession("http://127.0.0.1:9", client_secret=SECRET, account="a")
        with pytest.raises(da.EventLoopError, match="no event loop is running"):
            session.stream_basic([NUMBER], text="x")
        assert "unopened" in repr(session)

    def test_an_unclosed_session_warns_when_collected(self) -> None:
        async def leak() -> None:
            async with FakeDispatchServer() as server:
                session = da.DispatchSession(server.url, client_secret=SECRET, account="a")
                await session.send_basic([NUMBER], text="x")
                await session._transport.close()  # release sockets; the state stays open
                await session._tokens.close()

        asyncio.run(leak())
        with pytest.warns(ResourceWarning, match="unclosed <DispatchSession"):
            gc.collect()


class TestClosingDuringACall:
    async def test_a_call_stops_promptly_and_accounts_for_every_recipient(
        self, server: FakeDispatchServer
    ) -> None:
        # Seven chunks hang in the service (it received them); one waits 30 s to be
        # retried after a 503 (not received); twelve wait their turn.
        given = numbers(200)
        server.script(*[Fault.hang()] * 7, Fault.status(503, retry_after="30"))
        # The client, not just the server, must be past the 503: on Python 3.13 the close
        # came while the answer was still being read, and the chunk was "maybe sent".
        waiting = asyncio.Event()

        def hook(event: object) -> None:
            if isinstance(event, da.instrumentation.RetryScheduled):
                waiting.set()

        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme", hooks=[hook])
        call = asyncio.create_task(
            session.send_basic(given, text="x", chunk_size=10, max_concurrency=8)
        )
        await server.wait_until(lambda: server.stats.recipients_received == 70)
        async with asyncio.timeout(5):
            await waiting.wait()
        async with asyncio.timeout(5):  # not the 30 s the retry would wait
            await session.close()
            with pytest.raises(da.SessionClosedError) as caught:
                await call
        result = caught.value.result
        assert result is not None
        assert not result.valid
        assert sorted(f.position for f in result.failed) == list(range(200))
        maybe_sent = {f.recipient.number for f in result.failed if f.maybe_sent}
        assert maybe_sent == set(server.stats.received)
        assert len(maybe_sent) == 70
        assert server.stats.dispatch_calls == 7  # nothing was sent after the close

    async def test_a_call_waiting_on_its_source_stops_at_once(
        self, server: FakeDispatchServer
    ) -> None:
        session = da.DispatchSession(server.url, client_secret=SECRET, account="acme")
        call = asyncio.create_task(
            session.send_basic(stalling(numbers(15)), text="x", chunk_size=10)
        )
        await server.wait_until(lambda: server.stats.recipients_received == 10)
        async with asyncio.timeout(HANG):
            await session.close()
            with pytest.raises(da.SessionClosedError) as caught:
                await call
        result = caught.value.result
        assert result is not None
        assert [v.number for v in result.valid] == numbers(10)
        # The five read into the next chunk when the close cut its read: not sent.
        assert [(f.recipient.number, f.maybe_sent) for f in result.failed] == [
            (n, False) for n in numbers(15)[10:]
        ]
        assert server.stats.recipients_received == 10

    async def test_a_templates_listing_under_way_stops_with_session_closed_error(
        self, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.hang())  # the listing waits for its token
        requested = asyncio.Event()

        async def on_request_start(*_: object) -> None:
            requested.set()

        tracing = aiohttp.TraceConfig()
        tracing.on_request_start.append(on_request_start)
        async with aiohttp.ClientSession(trace_configs=[tracing]) as http:
            session = da.DispatchSession(
                server.url, client_secret=SECRET, account="acme", http_session=http
            )
            call = asyncio.create_task(session.list_templates())
            async with asyncio.timeout(HANG):
                await requested.wait()
                await session.close()
                with pytest.raises(da.SessionClosedError, match="closed during the call"):
                    await call


class TestCancellation:
    async def test_cancelling_a_send_leaves_no_task_and_the_session_usable(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_basic([NUMBER], text="x")
        before = own_tasks()
        server.script(Fault.hang())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await session.send_basic([NUMBER], text="x")
        assert own_tasks() - before == set()
        assert (await session.send_basic(["+5511900000001"], text="x")).ok

    async def test_a_hanging_service_is_cut_by_the_request_timeout(
        self, server: FakeDispatchServer
    ) -> None:
        server.script(Fault.hang())
        async with da.DispatchSession(
            server.url, client_secret=SECRET, account="acme", timeout=0.3
        ) as session:
            result = await session.send_basic([NUMBER], text="x")
        [failure] = result.failed
        assert isinstance(failure.error, da.RequestTimeoutError)
        assert isinstance(failure.error, TimeoutError)
        assert failure.maybe_sent is True

    async def test_an_aiohttp_client_timeout_is_used_as_given(
        self, server: FakeDispatchServer
    ) -> None:
        server.script(Fault.hang())
        async with da.DispatchSession(
            server.url,
            client_secret=SECRET,
            account="acme",
            timeout=aiohttp.ClientTimeout(total=None, sock_read=0.1),
        ) as session:
            async with asyncio.timeout(5):  # not the 30 s of a default timeout
                result = await session.send_basic([NUMBER], text="x")
        [failure] = result.failed
        assert isinstance(failure.error, da.RequestTimeoutError)
        assert failure.maybe_sent is True


class TestFromEnvironment:
    async def test_reads_the_three_variables(
        self, server: FakeDispatchServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("DISPATCH_BASE_URL", server.url)
        monkeypatch.setenv("DISPATCH_CLIENT_SECRET", SECRET)
        monkeypatch.setenv("DISPATCH_ACCOUNT", "acme")
        async with da.DispatchSession.from_env(chunk_size=10) as session:
            assert session.account == "acme"
            assert session.settings.chunk_size == 10
            assert (await session.send_basic([NUMBER], text="x")).ok

    def test_a_missing_variable_is_named_and_the_secret_never_shown(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("DISPATCH_BASE_URL", raising=False)
        monkeypatch.setenv("DISPATCH_CLIENT_SECRET", "very-secret-value")
        with pytest.raises(da.ConfigurationError, match="DISPATCH_BASE_URL") as caught:
            da.DispatchSession.from_env()
        assert "very-secret-value" not in str(caught.value)

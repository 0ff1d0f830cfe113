"""A service (or a network) that misbehaves: every recipient still accounted for, nothing
re-sent that may have been acted on, no secret in any error, no unbounded read."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import tracemalloc
import urllib.parse
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

import dispatch_async as da
from dispatch_async import _transport
from dispatch_async._endpoints import BASIC, envelope
from dispatch_async.callbacks import CallbackReceiver
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET, TEMPLATE, numbers, session_for

# On uvloop too: the SDK's transport in an app under uvicorn runs there (issue 35).
pytestmark = pytest.mark.both_loops

LEAKED = "opaque-0123456789abcdef"


def chain(error: BaseException) -> Iterator[BaseException]:
    """The error and everything reachable from it through __cause__ and __context__."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def everything_said(error: BaseException) -> str:
    """Every message, repr and carried attribute of the error's whole chain."""
    said = []
    for e in chain(error):
        said += [repr(e), str(e), repr(e.args)]
        said += [repr(getattr(e, name, "")) for name in ("body", "headers", "doc", "message")]
    return "\n".join(said)


def forms_of(secret: str) -> list[str]:
    """A secret as it can appear in an echoed body: literal, URL-encoded, JSON-escaped."""
    return [
        secret,
        urllib.parse.quote_plus(secret),
        urllib.parse.quote(secret, safe=""),
        json.dumps(secret)[1:-1],
    ]


# -- the session against a real aiohttp app of the test's own ----------------------


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def token_route(app: web.Application) -> None:
    async def token(request: web.Request) -> web.Response:
        return web.json_response(
            {"access_token": "tok", "expires_in": "3600", "token_type": "Bearer"}
        )

    app.router.add_post("/oauth/token", token)


class TestACallersOwnHttpSession:
    @pytest.mark.parametrize("status", [503, 429, 401])
    async def test_raise_for_status_on_it_changes_nothing(
        self, server: FakeDispatchServer, status: int
    ) -> None:
        server.script(Fault.status(status, retry_after="0"))
        async with (
            aiohttp.ClientSession(raise_for_status=True) as http,
            session_for(server, http_session=http) as session,
        ):
            result = await session.send_template(numbers(3), **TEMPLATE)
        assert result.ok
        assert server.stats.recipients_received == 3
        assert not server.stats.duplicates


class TestABodyThatNeverLeftWhole:
    # aiohttp advises a file-like object for a body this large; the size is what makes
    # the write outlast the socket buffers.
    @pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
    async def test_is_not_sent_and_is_retried_like_a_connect_error(self) -> None:
        """A server that reads the headers, then resets the connection mid-body."""
        resets = 0
        answered = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal resets
            await reader.readuntil(b"\r\n\r\n")
            sock = writer.get_extra_info("socket")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            resets += 1
            writer.transport.abort()
            answered.set()

        raw = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = raw.sockets[0].getsockname()[1]
        transport = _transport.Transport(
            _transport.check_base_url(f"http://127.0.0.1:{port}"),
            timeout=aiohttp.ClientTimeout(total=10),
            user_agent="test",
        )
        transport.open()
        try:
            with pytest.raises(da.ConnectError) as caught:
                await transport.request(
                    "POST", "/api/v3/template", headers={}, data=b"x" * (64 * 1024 * 1024)
                )
        finally:
            await transport.close()
            raw.close()
            await raw.wait_closed()
        assert caught.value.maybe_sent is False
        assert "before the request was written whole" in str(caught.value)
        assert resets == 1
        assert da.RetryPolicy().should_retry(caught.value)


class TestCompressedAnswers:
    async def test_the_decoded_size_is_capped_and_memory_stays_bounded(self) -> None:
        bomb = gzip.compress(b" " * (_transport.MAX_ANSWER_BYTES + 8 * 1024 * 1024))
        app = web.Application()
        token_route(app)

        async def dispatch(request: web.Request) -> web.Response:
            return web.Response(
                body=bomb,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )

        app.router.add_post("/api/v3/template", dispatch)
        runner, url = await serve(app)
        try:
            async with da.DispatchSession(
                url, client_secret="s", account="a", retry=da.RetryPolicy(wait=False)
            ) as session:
                tracemalloc.start()
                try:
                    result = await session.send_template(numbers(1), **TEMPLATE)
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
        finally:
            await runner.cleanup()
        [failure] = result.failed
        assert isinstance(failure.error, da.ResponseTooLargeError)
        assert failure.maybe_sent is True
        assert len(bomb) < 1024 * 1024
        assert peak < _transport.MAX_ANSWER_BYTES + 16 * 1024 * 1024


class TestNoAnswerBytesInErrors:
    async def test_a_token_answer_with_a_bom_does_not_show_the_token(
        self, server: FakeDispatchServer
    ) -> None:
        body = b'\xef\xbb\xbf{"access_token":"' + LEAKED.encode() + b'","expires_in":"60"}'
        server.script_token(Fault.not_json(body=body, content_type="application/json"))
        async with session_for(server) as session:
            with pytest.raises(da.AuthenticationError) as caught:
                await session.send_template(numbers(2), **TEMPLATE)
        assert LEAKED not in everything_said(caught.value)

    async def test_a_token_answer_with_trailing_text_does_not_show_the_token(
        self, server: FakeDispatchServer
    ) -> None:
        body = b'{"access_token":"' + LEAKED.encode() + b'"}<!-- proxy -->'
        server.script_token(Fault.not_json(body=body, content_type="application/json"))
        async with session_for(server) as session:
            with pytest.raises(da.AuthenticationError) as caught:
                await session.send_template(numbers(2), **TEMPLATE)
        assert LEAKED not in everything_said(caught.value)

    async def test_a_dispatch_answer_that_is_not_json_is_described_not_quoted(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(Fault.not_json(body=f"Authorization: Bearer {LEAKED}\r\n".encode()))
        result = await session.send_template(numbers(2), **TEMPLATE)
        assert len(result.failed) == 2
        for failure in result.failed:
            assert isinstance(failure.error, da.MalformedResponseError)
            assert LEAKED not in everything_said(failure.error)
            assert "Authorization" not in everything_said(failure.error)

    @pytest.mark.parametrize("form", range(4))
    async def test_a_token_endpoint_echoing_the_form_never_shows_the_secret(
        self, form: int
    ) -> None:
        secret = 's3cr3t+/="x\\y'
        echoed = forms_of(secret)[form]
        async with FakeDispatchServer(client_secret=secret) as server:
            server.script_token(Fault.status(500, body=f"bad form: client_secret={echoed}"))
            async with session_for(server, retry=da.RetryPolicy(attempts=1)) as session:
                with pytest.raises(da.DispatchError) as caught:
                    await session.send_template(numbers(1), **TEMPLATE)
        said = everything_said(caught.value)
        assert not any(shown in said for shown in forms_of(secret))

    @pytest.mark.parametrize("form", range(4))
    @pytest.mark.parametrize("field", ["callback", "webhook"])
    @pytest.mark.parametrize("where", ["/callbacks/{}", "/callbacks/{}/", "/hook?key={}&v=1"])
    async def test_an_answer_quoting_the_callback_url_never_shows_its_token(
        self, server: FakeDispatchServer, form: int, field: str, where: str
    ) -> None:
        token = CallbackReceiver.new_token()
        url = "https://hooks.example.com" + where.format(token)
        echoed = forms_of(url)[form]
        server.script(Fault.status(400, body=f'{{"error": "invalid {field}: {echoed}"}}'))
        async with session_for(server, retry=da.RetryPolicy(attempts=1)) as session:
            if field == "callback":
                result = await session.send_basic(numbers(2), text="oi", callback=url)
            else:
                result = await session.send_webhook(numbers(2), webhook=url, text="oi")
        assert len(result.failed) == 2
        for failure in result.failed:
            assert isinstance(failure.error, da.ClientStatusError)
            said = everything_said(failure.error)
            assert f"invalid {field}" in said
            assert not any(shown in said for shown in forms_of(token))

    def test_a_request_holding_a_callback_url_does_not_show_it_in_its_repr(self) -> None:
        fields = envelope(BASIC, account="a", text="oi", callback="https://h/cb/" + LEAKED)
        assert LEAKED not in repr(fields)

    async def test_a_status_error_keeps_no_location_header(self) -> None:
        app = web.Application()
        token_route(app)

        async def dispatch(request: web.Request) -> web.Response:
            headers = {"Location": f"https://elsewhere.test/?token={LEAKED}", "X-Request-Id": "r1"}
            return web.Response(status=400, text="no", headers=headers)

        app.router.add_post("/api/v3/template", dispatch)
        runner, url = await serve(app)
        try:
            async with da.DispatchSession(url, client_secret="s", account="a") as session:
                result = await session.send_template(numbers(1), **TEMPLATE)
        finally:
            await runner.cleanup()
        error = result.failed[0].error
        assert isinstance(error, da.StatusError)
        assert error.headers.get("X-Request-Id") == "r1"
        assert LEAKED not in everything_said(error)


class TestTheTokenEndpointUnreachable:
    async def test_is_a_connect_error_not_a_refused_secret(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        async with da.DispatchSession(
            f"http://127.0.0.1:{port}",
            client_secret="s",
            account="a",
            retry=da.RetryPolicy(wait=False, attempts=2),
        ) as session:
            given = numbers(25)
            with pytest.raises(da.ConnectError) as caught:
                await session.send_template(given, **TEMPLATE, chunk_size=10)
        error = caught.value
        assert not isinstance(error, da.AuthenticationError)
        assert "access token" in str(error)
        assert error.result is not None
        assert [f.recipient.number for f in error.result.failed] == given
        assert not any(f.maybe_sent for f in error.result.failed)

    async def test_tls_to_a_server_without_it_is_a_connect_error_naming_the_tls_failure(
        self, server: FakeDispatchServer
    ) -> None:
        # It will not heal: raised as it is, not as TokenUnavailableError (tests/network/).
        async with da.DispatchSession(
            server.url.replace("http://", "https://"),
            client_secret=SECRET,
            account="a",
            retry=da.RetryPolicy(wait=False, attempts=1),
        ) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.check_credentials()
        assert isinstance(caught.value, da.ConnectError)
        assert "SSL" in str(caught.value)
        assert server.stats.token_calls == 0


class TestAnAnswerThatIsNotHTTP:
    async def test_is_a_lost_connection_that_may_have_been_sent_and_shows_no_token(self) -> None:
        token = "tok-" + LEAKED

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            if head.startswith(b"POST /oauth/token "):
                body = json.dumps({"access_token": token, "expires_in": "3600"}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )
            else:
                writer.write(b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        listening = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        try:
            async with da.DispatchSession(
                f"http://127.0.0.1:{port}", client_secret=SECRET, account="a"
            ) as session:
                result = await session.send_template(numbers(2), **TEMPLATE)
        finally:
            listening.close()
            await listening.wait_closed()
        assert [f.maybe_sent for f in result.failed] == [True, True]
        error = result.failed[0].error
        assert isinstance(error, da.ConnectionLostError)
        assert "ClientResponseError (HTTP 400)" in str(error)
        assert LEAKED not in everything_said(error)


class TestARefusedFreshToken:
    async def test_stops_the_job_with_every_recipient_accounted_for(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(*[Fault.status(401)] * 400)
        given = numbers(2000)
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(given, **TEMPLATE, chunk_size=10, max_concurrency=2)
        result = caught.value.result
        assert result is not None
        assert len(result.failed) == 2000
        assert not any(f.maybe_sent for f in result.failed)
        assert server.stats.dispatch_calls == 0
        assert server.stats.token_calls <= 3
        assert server.stats.requests <= 4


class TestUnencodableText:
    async def test_a_lone_surrogate_in_vars_is_refused_locally_and_the_rest_is_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given: list[object] = [*numbers(5)]
        given[2] = {"number": given[2], "vars": {"name": "bad \udce9 byte"}}
        result = await session.send_template(given, **TEMPLATE)
        assert len(result.valid) == 4
        [refused] = result.invalid
        assert refused.number == numbers(5)[2]
        assert "UTF-8" in refused.reason
        assert server.stats.recipients_received == 4

    async def test_with_numbers_checked_locally_each_keeps_the_form_it_was_given_in(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given: list[object] = ["(11) 90000-0001", "(11) 90000-0002", "(11) 90000-0003"]
        given[1] = {"number": given[1], "vars": {"name": "bad \udce9 byte"}}
        result = await session.send_template(given, **TEMPLATE, prevalidate=True, region="BR")
        assert [(v.number, v.position) for v in result.valid] == [
            ("(11) 90000-0001", 0),
            ("(11) 90000-0003", 2),
        ]
        assert [(i.number, i.position, i.reason) for i in result.invalid] == [
            (
                "(11) 90000-0002",
                1,
                "text that is not valid UTF-8 (a lone surrogate): it cannot be sent",
            )
        ]
        assert server.stats.recipients_received == 2

    async def test_a_number_that_cannot_be_encoded_is_shown_escaped(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        bad = "+5511900\udce90001"
        result = await session.send_template([*numbers(2), bad], **TEMPLATE)
        assert len(result.valid) == 2
        [refused] = result.invalid
        assert (refused.number, refused.position) == (repr(bad), 2)

    async def test_a_lone_surrogate_in_the_message_text_is_refused_before_sending(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        with pytest.raises(da.InputError, match="text"):
            await session.send_basic(numbers(2), text="hi \udce9")
        assert server.stats.requests == 0


class TestASessionOnAnotherEventLoop:
    async def test_is_refused_with_a_clear_error(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_template(numbers(1), **TEMPLATE)

        def elsewhere() -> BaseException | None:
            try:
                asyncio.run(session.send_template(numbers(1), **TEMPLATE))
            except BaseException as exc:
                return exc
            return None

        error = await asyncio.to_thread(elsewhere)
        assert isinstance(error, da.EventLoopError)
        assert isinstance(error, RuntimeError)
        assert "event loop" in str(error)
        assert server.stats.dispatch_calls == 1
        # The session still works where it was opened.
        assert (await session.send_template(numbers(1, 1), **TEMPLATE)).ok


async def test_the_shared_secret_is_the_one_a_default_simulator_accepts() -> None:
    # Tests that start a FakeDispatchServer() without a secret rely on this.
    async with (
        FakeDispatchServer() as server,
        da.DispatchSession(server.url, client_secret=SECRET, account="acme") as session,
    ):
        assert (await session.send_template(numbers(1), **TEMPLATE)).ok
    assert server.stats.tokens_issued == 1

"""The callback receiver, mounted both ways users mount it: as an aiohttp.web handler on a
real server on 127.0.0.1, and as an ASGI app (alone and inside FastAPI); and on the HTTP
server of its own that `CallbackServer` runs. Every behaviour is checked through each."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import orjson
import pytest
from aiohttp import StreamReader, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.test_utils import make_mocked_request
from fastapi import FastAPI

import dispatch_async as da
from dispatch_async.callbacks import (
    CallbackReceiver,
    CallbackServer,
    DeliveryEvent,
    DeliveryStatus,
    DeliveryTracker,
    aiohttp_handler,
    asgi_app,
)
from dispatch_async.callbacks._http import Site

# On uvloop too: a FastAPI app under uvicorn runs its receiver there (issue 35).
pytestmark = pytest.mark.both_loops

TOKEN = "k3Y-0f-th1s-rece1ver-0nly"
NUMBER = "5511987654321"


def event_body(reference: str = "m-1", type_: str = "DELIVERED", **fields: object) -> bytes:
    return orjson.dumps(
        {
            "reference": reference,
            "campaign_name": "july",
            "event_id": "e-1",
            "direction": "inbound",
            "user_id": NUMBER,
            "timestamp": "2024-07-01T12:00:00Z",
            "channel": "RCS",
            "type": type_,
            **fields,
        }
    )


class Post(Protocol):
    async def __call__(
        self,
        body: bytes | Callable[[], AsyncIterator[bytes]] = b"",
        *,
        token: str = TOKEN,
        method: str = "POST",
    ) -> tuple[int, dict[str, Any]]: ...


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[DeliveryTracker]:
    async with DeliveryTracker(tmp_path / "deliveries.sqlite3") as opened:
        yield opened


@pytest.fixture
def settings() -> dict[str, Any]:
    """Receiver settings beyond the token; a test changes them before ``post`` is made."""
    return {}


@pytest.fixture
def receiver(tracker: DeliveryTracker, settings: dict[str, Any]) -> CallbackReceiver:
    return CallbackReceiver(tracker, token=TOKEN, **settings)


async def _serve_aiohttp(receiver: CallbackReceiver) -> AsyncIterator[Post]:
    app = web.Application()
    app.router.add_route("*", "/callbacks/{token}", aiohttp_handler(receiver))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async for poster in _client(runner.addresses[0][1]):
            yield poster
    finally:
        await runner.cleanup()


async def _serve_own(receiver: CallbackReceiver) -> AsyncIterator[Post]:
    """The HTTP server of `CallbackServer` (and ``callbacks serve``)."""
    site = Site(receiver, "/callbacks")
    port = await site.start("127.0.0.1", 0)
    try:
        async for poster in _client(port):
            yield poster
    finally:
        await site.aclose()


async def _client(port: int) -> AsyncIterator[Post]:
    async with aiohttp.ClientSession() as client:

        async def post(
            body: bytes | Callable[[], AsyncIterator[bytes]] = b"",
            *,
            token: str = TOKEN,
            method: str = "POST",
        ) -> tuple[int, dict[str, Any]]:
            data = body if isinstance(body, bytes) else body()
            url = f"http://127.0.0.1:{port}/callbacks/{token}"
            async with client.request(method, url, data=data) as response:
                raw = await response.read()
                return response.status, orjson.loads(raw) if raw.startswith(b"{") else {}

        yield post


async def _serve_asgi(app: Callable[..., Awaitable[None]], prefix: str) -> AsyncIterator[Post]:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:

        async def post(
            body: bytes | Callable[[], AsyncIterator[bytes]] = b"",
            *,
            token: str = TOKEN,
            method: str = "POST",
        ) -> tuple[int, dict[str, Any]]:
            content = body if isinstance(body, bytes) else body()
            response = await client.request(method, f"{prefix}/{token}", content=content)
            raw = response.content
            return response.status_code, orjson.loads(raw) if raw.startswith(b"{") else {}

        yield post


@pytest.fixture(params=["aiohttp", "own-server", "asgi", "fastapi"])
async def post(request: pytest.FixtureRequest, receiver: CallbackReceiver) -> AsyncIterator[Post]:
    if request.param == "aiohttp":
        async for poster in _serve_aiohttp(receiver):
            yield poster
    elif request.param == "own-server":
        async for poster in _serve_own(receiver):
            yield poster
    elif request.param == "asgi":
        async for poster in _serve_asgi(asgi_app(receiver), ""):
            yield poster
    else:
        api = FastAPI()
        api.mount("/hooks/rcs", asgi_app(receiver))
        async for poster in _serve_asgi(api, "/hooks/rcs"):
            yield poster


class TestStores:
    async def test_a_valid_event_is_stored_and_answered_200(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        status, answer = await post(event_body("m-1", "READ"))
        assert (status, answer) == (200, {"status": "stored"})
        state = await tracker.message("m-1")
        assert state is not None
        assert state.status is DeliveryStatus.READ

    async def test_a_redelivered_event_is_answered_200_and_stored_once(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        assert (await post(event_body()))[0] == 200
        assert (await post(event_body()))[0] == 200
        assert len(await tracker.events("m-1")) == 1

    async def test_answers_only_once_the_event_is_durable(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        store = tracker.store
        original = store.write
        writing, release = asyncio.Event(), asyncio.Event()

        async def gated(events: list[DeliveryEvent], at: float) -> None:
            writing.set()
            await release.wait()
            await original(events, at)

        store.write = gated  # type: ignore[method-assign]
        posting = asyncio.create_task(post(event_body("m-slow")))
        async with asyncio.timeout(5):
            await writing.wait()
        assert not posting.done()
        release.set()
        assert (await posting)[0] == 200
        assert await tracker.message("m-slow") is not None

    async def test_a_store_that_fails_gets_503_and_the_service_delivers_again(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        store = tracker.store
        original = store.write
        failures = [OSError("disk full")]

        async def failing_once(events: list[DeliveryEvent], at: float) -> None:
            if failures:
                raise failures.pop()
            await original(events, at)

        store.write = failing_once  # type: ignore[method-assign]
        assert (await post(event_body()))[0] == 503
        assert await tracker.message("m-1") is None
        assert (await post(event_body()))[0] == 200
        assert await tracker.message("m-1") is not None

    async def test_a_body_sent_in_chunks_without_a_length_is_stored(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            body = event_body()
            for start in range(0, len(body), 100):
                yield body[start : start + 100]

        assert (await post(chunks)) == (200, {"status": "stored"})
        assert await tracker.message("m-1") is not None

    async def test_an_event_at_a_time_no_datetime_holds_gets_200_and_reads_back(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        assert (await post(event_body(timestamp="0001-01-01T00:00:00+05:30")))[0] == 200
        state = await tracker.message("m-1")
        assert state is not None
        assert state.first_event_at.year >= 2024  # its receipt time
        assert [s.reference for s in await tracker.messages_for(NUMBER)] == ["m-1"]

    async def test_a_closed_tracker_gets_503(self, post: Post, tracker: DeliveryTracker) -> None:
        await tracker.aclose()
        assert (await post(event_body()))[0] == 503


class TestRefuses:
    @pytest.mark.parametrize(
        ("body", "why"),
        [
            (b"", "not JSON"),
            (b"reference=m-1&type=READ", "not JSON"),
            (b"[1, 2]", "not a JSON object"),
            (b'{"type": "READ", "user_id": "5511987654321"}', "no reference"),
        ],
    )
    async def test_an_unreadable_body_gets_400_and_nothing_stored(
        self, post: Post, tracker: DeliveryTracker, body: bytes, why: str
    ) -> None:
        status, answer = await post(body)
        assert status == 400
        assert why in answer["error"]
        assert NUMBER not in answer["error"]
        assert await tracker.counts("july") == {}
        assert (await post(event_body()))[0] == 200  # and the receiver goes on

    @pytest.mark.parametrize("token", ["wrong-token-of-the-same-len", "x", TOKEN[:-1], "%00"])
    async def test_a_wrong_token_gets_404_and_nothing_stored(
        self, post: Post, tracker: DeliveryTracker, token: str
    ) -> None:
        assert (await post(event_body(), token=token))[0] == 404
        assert await tracker.message("m-1") is None

    async def test_the_token_is_compared_in_constant_time(
        self, post: Post, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compared: list[tuple[bytes, bytes]] = []
        real = hmac.compare_digest

        def spy(a: bytes, b: bytes) -> bool:
            compared.append((a, b))
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        await post(event_body(), token="not-the-token-at-all")
        assert compared == [(b"not-the-token-at-all", TOKEN.encode())]

    async def test_only_post_is_answered(self, post: Post, tracker: DeliveryTracker) -> None:
        assert (await post(method="GET"))[0] == 405
        assert (await post(method="GET", token="wrong-token-wrong-token"))[0] in (404, 405)

    @pytest.mark.parametrize("settings", [{"max_body_bytes": 300}])
    async def test_a_declared_body_over_the_limit_gets_413(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        assert (await post(event_body(padding="x" * 400)))[0] == 413
        assert await tracker.message("m-1") is None
        assert (await post(event_body()))[0] == 200

    @pytest.mark.parametrize("settings", [{"max_body_bytes": 300}])
    async def test_a_streamed_body_over_the_limit_gets_413(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            body = event_body(padding="x" * 400)
            for start in range(0, len(body), 100):
                yield body[start : start + 100]

        assert (await post(chunks))[0] == 413
        assert await tracker.message("m-1") is None

    @pytest.mark.parametrize("settings", [{"allowed_ips": ["203.0.113.0/24", "10.9.8.7"]}])
    async def test_an_address_off_the_allow_list_gets_403(
        self, post: Post, tracker: DeliveryTracker
    ) -> None:
        assert (await post(event_body()))[0] == 403
        assert await tracker.message("m-1") is None

    @pytest.mark.parametrize("settings", [{"allowed_ips": ["127.0.0.0/8"]}])
    async def test_an_address_on_the_allow_list_is_served(self, post: Post) -> None:
        assert (await post(event_body()))[0] == 200


class TestSlowCallers:
    """A caller that trickles its body, or hangs up mid-body, ties nothing up."""

    @staticmethod
    async def _aiohttp(receiver: CallbackReceiver) -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/callbacks/{token}", aiohttp_handler(receiver))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    @staticmethod
    async def _start_post(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"POST /callbacks/{TOKEN} HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n{{"
        writer.write(head.encode())
        await writer.drain()
        return reader, writer

    async def test_a_body_not_sent_in_time_gets_408_from_aiohttp(
        self, tracker: DeliveryTracker
    ) -> None:
        receiver = CallbackReceiver(tracker, token=TOKEN, body_timeout=0.2)
        runner = await self._aiohttp(receiver)
        try:
            reader, writer = await self._start_post(runner.addresses[0][1])
            async with asyncio.timeout(10):
                status = await reader.readline()
            writer.close()
            await writer.wait_closed()
        finally:
            await runner.cleanup()
        assert status.startswith(b"HTTP/1.1 408")

    async def test_a_body_not_sent_in_time_gets_408_from_the_asgi_app(
        self, tracker: DeliveryTracker
    ) -> None:
        receiver = CallbackReceiver(tracker, token=TOKEN, body_timeout=0.2)
        never = asyncio.Event()
        chunks = [{"type": "http.request", "body": b"{", "more_body": True}]

        async def receive() -> dict[str, Any]:
            if chunks:
                return chunks.pop()
            await never.wait()
            raise AssertionError("unreachable")

        sent = await run_asgi(receiver, receive)
        assert sent[0]["status"] == 408

    async def test_a_body_ending_before_its_content_length_gets_400_from_aiohttp(
        self, tracker: DeliveryTracker
    ) -> None:
        # aiohttp's own request, its body ending early (a real server ends a short body with
        # ConnectionResetError instead, the test below).
        payload = StreamReader(BaseProtocol(asyncio.get_running_loop()), 2**16)
        payload.feed_data(event_body()[:20])
        payload.feed_eof()
        request = make_mocked_request(
            "POST", f"/callbacks/{TOKEN}", headers={"Content-Length": "100"}, payload=payload
        )
        answer = await aiohttp_handler(CallbackReceiver(tracker, token=TOKEN))(request)
        assert answer.status == 400
        assert answer.body == b'{"error":"the body ended before its Content-Length"}'
        assert await tracker.message("m-1") is None

    async def test_a_caller_hanging_up_mid_body_is_no_error(
        self, tracker: DeliveryTracker, caplog: pytest.LogCaptureFixture
    ) -> None:
        runner = await self._aiohttp(CallbackReceiver(tracker, token=TOKEN))
        try:
            _, writer = await self._start_post(runner.addresses[0][1])
            writer.close()
            await writer.wait_closed()
        finally:
            await runner.cleanup()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def run_asgi(
    receiver: CallbackReceiver, receive: Callable[[], Awaitable[Any]], **scope: Any
) -> list[MutableMapping[str, Any]]:
    """Runs the app on one POST to the token's path (*scope* changes it), its messages
    from *receive*; what it sent back."""
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    whole = {
        "type": "http",
        "method": "POST",
        "path": f"/{TOKEN}",
        "headers": [],
        "client": ("127.0.0.1", 4000),
        **scope,
    }
    async with asyncio.timeout(10):
        await asgi_app(receiver)(whole, receive, send)
    return sent


class TestTheASGIAppOnItsOwn:
    """What an ASGI server alone (no framework in front) may hand the app."""

    @staticmethod
    async def _run(
        receiver: CallbackReceiver, messages: list[dict[str, Any]], **scope: Any
    ) -> list[MutableMapping[str, Any]]:
        """Runs the app on one scope fed ``messages``; what it sent back."""
        incoming: list[MutableMapping[str, Any]] = list(messages)

        async def receive() -> MutableMapping[str, Any]:
            return incoming.pop(0)

        return await run_asgi(receiver, receive, **scope)

    async def test_it_starts_and_stops_with_the_server_through_lifespan(
        self, receiver: CallbackReceiver
    ) -> None:
        sent = await self._run(
            receiver,
            [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}],
            type="lifespan",
        )
        assert sent == [
            {"type": "lifespan.startup.complete"},
            {"type": "lifespan.shutdown.complete"},
        ]

    async def test_a_websocket_is_not_answered(
        self, receiver: CallbackReceiver, tracker: DeliveryTracker
    ) -> None:
        sent = await self._run(receiver, [{"type": "websocket.connect"}], type="websocket")
        assert sent == []
        assert await tracker.message("m-1") is None

    async def test_a_caller_hanging_up_mid_body_is_not_answered_and_nothing_stored(
        self, receiver: CallbackReceiver, tracker: DeliveryTracker
    ) -> None:
        body = event_body()
        sent = await self._run(
            receiver,
            [
                {"type": "http.request", "body": body[:10], "more_body": True},
                {"type": "http.disconnect"},
            ],
        )
        assert sent == []
        assert await tracker.message("m-1") is None

    async def test_a_body_in_several_messages_is_read_whole(
        self, receiver: CallbackReceiver, tracker: DeliveryTracker
    ) -> None:
        body = event_body()
        sent = await self._run(
            receiver,
            [
                {"type": "http.request", "body": body[:10], "more_body": True},
                {"type": "http.request", "body": body[10:]},
            ],
        )
        assert sent[0]["status"] == 200
        assert sent[1]["body"] == b'{"status":"stored"}'
        assert await tracker.message("m-1") is not None

    @pytest.mark.parametrize("settings", [{"max_body_bytes": 300}])
    async def test_an_unreadable_content_length_is_ignored_and_the_body_judged_by_its_size(
        self, receiver: CallbackReceiver, tracker: DeliveryTracker
    ) -> None:
        headers = [(b"host", b"receiver"), (b"Content-Length", b"a lot")]
        large = event_body(padding="x" * 400)
        refused = await self._run(
            receiver, [{"type": "http.request", "body": large}], headers=headers
        )
        assert refused[0]["status"] == 413
        small = await self._run(
            receiver, [{"type": "http.request", "body": event_body()}], headers=headers
        )
        assert small[0]["status"] == 200
        assert await tracker.message("m-1") is not None

    @pytest.mark.parametrize("settings", [{"allowed_ips": ["127.0.0.0/8"]}])
    @pytest.mark.parametrize("client", [None, ("not-an-address", 4000)])
    async def test_with_an_allow_list_a_caller_without_a_readable_address_gets_403(
        self, receiver: CallbackReceiver, client: tuple[str, int] | None
    ) -> None:
        sent = await self._run(
            receiver, [{"type": "http.request", "body": event_body()}], client=client
        )
        assert sent[0]["status"] == 403

    @pytest.mark.parametrize("settings", [{"allowed_ips": ["127.0.0.0/8"]}])
    async def test_an_ipv4_address_written_as_ipv6_is_checked_as_ipv4(
        self, receiver: CallbackReceiver
    ) -> None:
        inside = await self._run(
            receiver,
            [{"type": "http.request", "body": event_body()}],
            client=("::ffff:127.0.0.1", 4000),
        )
        outside = await self._run(
            receiver,
            [{"type": "http.request", "body": event_body()}],
            client=("::ffff:10.0.0.1", 4000),
        )
        ipv6 = await self._run(
            receiver, [{"type": "http.request", "body": event_body()}], client=("::1", 4000)
        )
        assert [inside[0]["status"], outside[0]["status"], ipv6[0]["status"]] == [200, 403, 403]


PREVIOUS = "the-previous-t0ken-still-out"


class TestRotation:
    """A URL rotated: the service may still deliver to the old one for a while."""

    @pytest.fixture
    def settings(self) -> dict[str, Any]:
        return {"previous_tokens": [PREVIOUS]}

    @pytest.mark.parametrize("token", [TOKEN, PREVIOUS])
    async def test_the_current_and_the_previous_token_are_both_stored(
        self, post: Post, tracker: DeliveryTracker, token: str
    ) -> None:
        assert (await post(event_body(), token=token))[0] == 200
        assert await tracker.message("m-1") is not None

    async def test_any_other_token_gets_404(self, post: Post, tracker: DeliveryTracker) -> None:
        assert (await post(event_body(), token=PREVIOUS[:-1] + "x"))[0] == 404
        assert await tracker.message("m-1") is None

    async def test_every_token_is_compared_whichever_matches(
        self, post: Post, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compared: list[bytes] = []
        real = hmac.compare_digest

        def spy(a: bytes, b: bytes) -> bool:
            compared.append(b)
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        await post(event_body(), token=TOKEN)
        assert compared == [TOKEN.encode(), PREVIOUS.encode()]

    def test_the_url_carries_the_current_token(self, receiver: CallbackReceiver) -> None:
        assert receiver.url("https://example.com/cb") == f"https://example.com/cb/{TOKEN}"


class TestLogs:
    async def test_numbers_appear_only_at_debug_and_the_token_never(
        self, post: Post, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="dispatch_async")
        await post(event_body())
        await post(b'{"user_id": "5511987654321"}')
        await post(event_body(), token="wrong-token-wrong-token")
        assert any(NUMBER in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
        for record in caplog.records:
            text = record.getMessage()
            assert TOKEN not in text
            if record.levelno > logging.DEBUG:
                assert NUMBER not in text


class TestConfiguration:
    def test_a_short_token_is_refused(self, tracker: DeliveryTracker) -> None:
        with pytest.raises(da.ConfigurationError, match="at least 16"):
            CallbackReceiver(tracker, token="short")

    def test_an_empty_token_given_to_a_server_is_refused_not_replaced(
        self, tracker: DeliveryTracker
    ) -> None:
        with pytest.raises(da.ConfigurationError, match="at least 16"):
            CallbackServer(tracker, token="")

    @pytest.mark.parametrize("char", ["#", "?", "%", " ", "ç", "/", ".", "~", "+", "="])
    @pytest.mark.parametrize("where", ["token", "previous_tokens"])
    def test_a_token_a_url_would_change_is_refused_without_being_shown(
        self, tracker: DeliveryTracker, char: str, where: str
    ) -> None:
        secret = "s3cret-part-of-the-t0ken" + char + "tail"
        given: dict[str, Any] = {"token": secret if where == "token" else TOKEN}
        if where == "previous_tokens":
            given["previous_tokens"] = [secret]
        with pytest.raises(da.ConfigurationError, match="letters, digits, '-' and '_'") as caught:
            CallbackReceiver(tracker, **given)
        assert where in str(caught.value)
        assert "s3cret" not in str(caught.value)

    def test_a_server_refuses_such_a_token_before_it_starts(self, tracker: DeliveryTracker) -> None:
        with pytest.raises(da.ConfigurationError, match="letters, digits"):
            CallbackServer(tracker, token="a-token-with-a-#-in-it-0123")

    def test_new_tokens_are_accepted(self, tracker: DeliveryTracker) -> None:
        for _ in range(100):
            CallbackReceiver(tracker, token=CallbackReceiver.new_token())

    def test_previous_tokens_as_one_string_is_refused(self, tracker: DeliveryTracker) -> None:
        with pytest.raises(da.ConfigurationError, match="not one string"):
            CallbackReceiver(tracker, token=TOKEN, previous_tokens=PREVIOUS)

    def test_an_unreadable_address_is_refused(self, tracker: DeliveryTracker) -> None:
        with pytest.raises(da.ConfigurationError, match=r"'example\.com'"):
            CallbackReceiver(tracker, token=TOKEN, allowed_ips=["example.com"])

    def test_new_tokens_are_long_and_distinct(self) -> None:
        tokens = {CallbackReceiver.new_token() for _ in range(100)}
        assert len(tokens) == 100
        assert all(len(t) >= 43 and "/" not in t for t in tokens)

    def test_url_ends_with_the_token(self, receiver: CallbackReceiver) -> None:
        assert receiver.url("https://example.com/callbacks/") == (
            f"https://example.com/callbacks/{TOKEN}"
        )
        assert TOKEN not in repr(receiver)

"""The HTTP that `CallbackServer` speaks itself: keep-alive, pipelining, chunked bodies,
and requests it will not read, spoken to it over a raw socket on 127.0.0.1.

What a callback endpoint does with an event (tokens, limits, 2xx once durable) is checked
in test_callback_receiver.py, on this server as on the mounted ones.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import orjson
import pytest

from dispatch_async.callbacks import CallbackServer, DeliveryEvent, DeliveryTracker, _framing, _http

TOKEN = "k3Y-0f-th1s-rece1ver-0nly"
PATH = f"/callbacks/{TOKEN}"

# On uvloop too: a FastAPI app under uvicorn runs its receiver there (issue 35).
pytestmark = pytest.mark.both_loops


def event(reference: str) -> bytes:
    return orjson.dumps({"reference": reference, "type": "DELIVERED", "channel": "RCS"})


def post(body: bytes, *, path: str = PATH, headers: str = "", version: str = "1.1") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}"
    return head.encode() + b"\r\n" + body


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CallbackServer]:
    async with CallbackServer(DeliveryTracker(tmp_path / "d.sqlite3"), token=TOKEN) as started:
        yield started


@pytest.fixture
async def connection(
    server: CallbackServer,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    yield reader, writer
    writer.close()
    await writer.wait_closed()


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lowercase names), body."""
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(5):
        return await reader.read() == b""


class TestKeepAlive:
    async def test_answers_requests_on_one_connection_one_after_the_other(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        for reference in ("m-1", "m-2", "m-3"):
            writer.write(post(event(reference)))
            status, headers, body = await answer(reader)
            assert (status, body) == (200, b'{"status":"stored"}')
            assert "date" in headers
            assert "connection" not in headers
        for reference in ("m-1", "m-2", "m-3"):
            assert await server.tracker.message(reference) is not None

    async def test_pipelined_requests_are_answered_in_order(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1")) + post(b"not json") + post(event("m-2")))
        assert [(await answer(reader))[0] for _ in range(3)] == [200, 400, 200]
        assert await server.tracker.message("m-2") is not None

    async def test_http_1_0_is_answered_then_closed(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1"), version="1.0"))
        status, headers, _ = await answer(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await closed(reader)

    async def test_connection_close_is_honoured(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1"), headers="Connection: close\r\n"))
        assert (await answer(reader))[0] == 200
        assert await closed(reader)

    async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(
        self,
        monkeypatch: pytest.MonkeyPatch,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        monkeypatch.setattr(_http, "KEEPALIVE_TIMEOUT", 0.0)
        reader, _ = connection
        assert await closed(reader)


class TestBodies:
    async def test_a_chunked_body_is_read_and_stored(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        body = event("m-chunked")
        chunks = b"".join(
            b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
            for i in range(0, len(body), 7)
        )
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head.encode() + chunks + b"0\r\nTrailer: x\r\n\r\n")
        assert (await answer(reader))[0] == 200
        assert await server.tracker.message("m-chunked") is not None
        writer.write(post(event("m-after")))  # the connection is still in step
        assert (await answer(reader))[0] == 200

    async def test_chunked_bodies_one_after_the_other_are_each_read_whole(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        for reference in ("m-1", "m-2", "m-3"):
            body = event(reference)
            writer.write(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            assert (await answer(reader))[0] == 200
            assert await server.tracker.message(reference) is not None

    async def test_a_body_arriving_in_pieces_is_waited_for(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        request = post(event("m-slow"))
        for start in range(0, len(request), 10):
            writer.write(request[start : start + 10])
            await writer.drain()
        assert (await answer(reader))[0] == 200
        assert await server.tracker.message("m-slow") is not None

    async def test_a_chunked_body_arriving_in_pieces_is_waited_for(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        body = event("m-pieces")
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        pieces = [
            head.encode() + b"%x" % len(body),  # a chunk size line, unfinished
            b"\r\n" + body[:5],  # a chunk without all its data
            body[5:] + b"\r\n0\r\n",  # the last chunk, without its trailer
            b"Trailer: x\r\n\r\n",
        ]
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            for _ in range(3):  # yield to the loop: the server reads each piece on its own
                await asyncio.sleep(0)
        assert (await answer(reader))[0] == 200
        assert await server.tracker.message("m-pieces") is not None
        writer.write(post(event("m-after")))  # the connection is still in step
        assert (await answer(reader))[0] == 200

    async def test_empty_lines_before_a_request_are_skipped(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(b"\r\n\r\n" + post(event("m-1")) + b"\r\n" + post(event("m-2")))
        assert [(await answer(reader))[0] for _ in range(2)] == [200, 200]
        assert await server.tracker.message("m-2") is not None

    async def test_a_head_too_large_to_remember_is_read_each_time(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        padding = f"X-Padding: {'x' * 2000}\r\n"
        for reference in ("m-1", "m-2"):
            writer.write(post(event(reference), headers=padding))
            assert (await answer(reader))[0] == 200
            assert await server.tracker.message(reference) is not None

    async def test_expect_100_continue_gets_100_before_the_body_is_sent(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        body = event("m-1")
        request = post(body, headers="Expect: 100-continue\r\n")
        writer.write(request[: -len(body)])
        assert (await answer(reader))[0] == 100
        for start in range(0, len(body), 10):  # the body in pieces: one 100 all the same
            writer.write(body[start : start + 10])
            for _ in range(3):  # yield to the loop: the server reads each piece on its own
                await asyncio.sleep(0)
        assert (await answer(reader))[0] == 200
        writer.write(post(event("m-2")))
        assert (await answer(reader))[0] == 200


class TestRefusals:
    @pytest.mark.parametrize(
        "chunks",
        [
            b"zz\r\n{}\r\n0\r\n\r\n",  # a size that is not hexadecimal
            b"2\r\n{}}\r\n0\r\n\r\n",  # more data than the size said
            b"2" * 2000,  # a size line that never ends
        ],
    )
    async def test_a_chunked_body_it_cannot_read_gets_400_and_the_connection_closed(
        self,
        server: CallbackServer,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        chunks: bytes,
    ) -> None:
        reader, writer = connection
        head = f"POST {PATH} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        writer.write(head + chunks)
        status, headers, body = await answer(reader)
        assert (status, headers["connection"]) == (400, "close")
        assert b"chunk" in body
        assert await closed(reader)

    async def test_another_transfer_coding_gets_501(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(f"POST {PATH} HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".encode())
        assert (await answer(reader))[0] == 501

    @pytest.mark.parametrize(
        "line",
        [
            "GARBAGE\r\n\r\n",
            f"POST {PATH} HTTP/2.0\r\n\r\n",
            f"POST {PATH}\r\n\r\n",
            f"POST callbacks/{TOKEN} HTTP/1.1\r\n\r\n",  # a target that is not a path
        ],
    )
    async def test_a_request_line_it_cannot_read_gets_4xx_or_505(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], line: str
    ) -> None:
        reader, writer = connection
        writer.write(line.encode())
        assert (await answer(reader))[0] in (400, 505)
        assert await closed(reader)

    async def test_a_head_over_the_limit_gets_431(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1"), headers=f"X-Big: {'x' * _framing.MAX_HEAD_BYTES}\r\n"))
        assert (await answer(reader))[0] == 431

    @pytest.mark.parametrize("path", ["/elsewhere/" + TOKEN, "/" + TOKEN, "/callbacks/x/" + TOKEN])
    async def test_the_token_outside_the_server_path_gets_404(
        self,
        server: CallbackServer,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        path: str,
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1"), path=path))
        assert (await answer(reader))[0] == 404
        assert await server.tracker.message("m-1") is None

    async def test_a_query_string_and_an_absolute_target_are_read(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1"), path=f"{PATH}?attempt=2"))
        assert (await answer(reader))[0] == 200
        writer.write(post(event("m-2"), path=f"http://127.0.0.1:{server.port}{PATH}"))
        assert (await answer(reader))[0] == 200


PROBE = event("probe")
CHUNKED = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()


def chunked(size_line: bytes, data: bytes = PROBE, end: bytes = b"\r\n0\r\n\r\n") -> bytes:
    return CHUNKED + size_line + b"\r\n" + data + end


def head(*fields: str, version: str = "1.1") -> bytes:
    lines = [f"POST {PATH} HTTP/{version}", "Host: x", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + PROBE


#: Requests that two HTTP parsers could read differently (each a way to smuggle one
#: request inside another), with the status each gets before its connection closes.
PROBES = {
    "CL and TE": (head(f"Content-Length: {len(PROBE)}", "Transfer-Encoding: chunked"), 400),
    "two Content-Lengths": (head(f"Content-Length: {len(PROBE)}", "Content-Length: 3"), 400),
    "Content-Length +N": (head(f"Content-Length: +{len(PROBE)}"), 400),
    "Content-Length -1": (head("Content-Length: -1"), 400),
    "Content-Length of 4,301 digits": (head("Content-Length: " + "9" * 4301), 400),
    "Content-Length of 19 digits": (head("Content-Length: " + "1" * 19), 400),
    "obs-fold": (head(f"Content-Length: {len(PROBE)}", "X-A: b", " folded"), 400),
    "space before the colon": (head(f"Content-Length : {len(PROBE)}"), 400),
    "TE: chunked, identity": (head("Transfer-Encoding: chunked, identity"), 501),
    "TE twice": (head("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 501),
    "chunk data not followed by CRLF": (chunked(b"%x" % (len(PROBE) - 1)), 400),
    "chunk size overflow": (chunked(b"1" + b"0" * 16 + b"%x" % len(PROBE)), 413),
    "chunk size 0x": (chunked(b"0x%x" % len(PROBE)), 400),
    "chunk size +": (chunked(b"+%x" % len(PROBE)), 400),
    "chunk size _": (chunked(b"%x_%x" % divmod(len(PROBE), 16)), 400),
    "chunk size after a space": (chunked(b" %x" % len(PROBE)), 400),
    "bare LF in a chunk extension": (chunked(b"%x;a\nb" % len(PROBE)), 400),
    "bare CR in a chunk extension": (chunked(b"%x;a\rb" % len(PROBE)), 400),
    "bare LF ending a chunk size": (
        CHUNKED + b"%x\n" % len(PROBE) + PROBE + b"\r\n0\r\n\r\n",
        400,
    ),
    "bare LF in a trailer": (chunked(b"%x" % len(PROBE), end=b"\r\n0\r\nA: b\nC: d\r\n\r\n"), 400),
    "bare LF in the head": (
        f"POST {PATH} HTTP/1.1\r\nHost: x\nContent-Length: {len(PROBE)}\r\n\r\n".encode() + PROBE,
        400,
    ),
    "bare LF ending the request line": (
        f"POST {PATH} HTTP/1.1\nContent-Length: {len(PROBE)}\r\n\r\n".encode() + PROBE,
        400,
    ),
    "NUL in a value": (head(f"Content-Length: {len(PROBE)}", "X-A: a\x00b"), 400),
    "control byte in a value": (head(f"Content-Length: {len(PROBE)}", "X-A: a\x01b"), 400),
    "DEL in a value": (head(f"Content-Length: {len(PROBE)}", "X-A: a\x7fb"), 400),
    "Expect other than 100-continue": (head(f"Content-Length: {len(PROBE)}", "Expect: x"), 417),
    "HTTP/1.2": (head(f"Content-Length: {len(PROBE)}", version="1.2"), 505),
}


class TestFramingProbes:
    """Each probe on a fresh connection, then a well-formed request (a desync canary): the
    probe gets its error and the connection closes; the canary is never misread."""

    @pytest.mark.parametrize(("probe", "status"), PROBES.values(), ids=PROBES.keys())
    async def test_a_request_read_two_ways_is_refused_and_the_connection_closed(
        self,
        server: CallbackServer,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        probe: bytes,
        status: int,
    ) -> None:
        reader, writer = connection
        writer.write(probe + post(event("canary")))
        answered, headers, _ = await answer(reader)
        assert (answered, headers["connection"]) == (status, "close")
        assert await closed(reader)
        assert await server.tracker.message("probe") is None
        assert await server.tracker.message("canary") is None

    @pytest.mark.parametrize(
        "size_line",
        [b"%x" % len(PROBE), b"%X" % len(PROBE), b"00%x" % len(PROBE), b"%x ; a=b" % len(PROBE)],
    )
    async def test_a_well_formed_chunk_size_is_read_and_the_connection_kept(
        self,
        server: CallbackServer,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        size_line: bytes,
    ) -> None:
        reader, writer = connection
        writer.write(chunked(size_line) + post(event("canary")))
        assert [(await answer(reader))[0] for _ in range(2)] == [200, 200]
        assert await server.tracker.message("probe") is not None
        assert await server.tracker.message("canary") is not None


class TestBounds:
    async def test_trailers_past_the_head_limit_get_400_and_the_connection_closed(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        trailer = b"X-T: " + b"t" * 1000 + b"\r\n"
        writer.write(chunked(b"%x" % len(PROBE), end=b"\r\n0\r\n"))
        for _ in range(2 * _framing.MAX_HEAD_BYTES // len(trailer)):
            writer.write(trailer)
        status, headers, body = await answer(reader)
        assert (status, headers["connection"]) == (400, "close")
        assert b"chunk framing" in body
        assert await closed(reader)
        assert await server.tracker.message("probe") is None

    async def test_chunk_extensions_past_the_head_limit_get_400(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        piece = b"1;" + b"e" * 1000 + b"\r\n{\r\n"
        writer.write(CHUNKED + piece * (2 * _framing.MAX_HEAD_BYTES // len(piece)))
        assert (await answer(reader))[0] == 400
        assert await closed(reader)


class TestBodyTimeout:
    @pytest.mark.parametrize("chunks", [False, True])
    async def test_a_body_not_sent_in_time_gets_408_and_the_connection_closed(
        self, tmp_path: Path, chunks: bool
    ) -> None:
        async with CallbackServer(
            DeliveryTracker(tmp_path / "d.sqlite3"), token=TOKEN, body_timeout=0.1
        ) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            request = chunked(b"%x" % len(PROBE)) if chunks else post(PROBE)
            writer.write(request[:-10])  # the head, and part of the body
            status, headers, body = await answer(reader)
            assert (status, headers["connection"]) == (408, "close")
            assert b"in time" in body
            assert await closed(reader)
            writer.close()
            await writer.wait_closed()
            assert await server.tracker.message("probe") is None

    def test_the_guide_states_the_default(self) -> None:
        guide = (Path(__file__).parent.parent / "docs/guides/delivery-tracking.md").read_text()
        default = inspect.signature(CallbackServer).parameters["body_timeout"].default
        assert f"`body_timeout` ({default:g} s) | 408" in guide


class TestClosing:
    async def test_a_request_being_stored_when_the_server_closes_is_answered(
        self, tmp_path: Path
    ) -> None:
        server = CallbackServer(DeliveryTracker(tmp_path / "d.sqlite3"), token=TOKEN)
        await server.start()
        store = server.tracker.store
        original = store.write
        writing = asyncio.Event()

        async def slow(events: Sequence[DeliveryEvent], at: float) -> None:
            writing.set()
            await asyncio.sleep(0)
            await original(events, at)

        store.write = slow  # type: ignore[method-assign]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post(event("m-1")))
        async with asyncio.timeout(5):
            await writing.wait()
        closing = asyncio.create_task(server.aclose())
        status, headers, _ = await answer(reader)
        assert (status, headers["connection"]) == (200, "close")
        await closing
        writer.close()
        await writer.wait_closed()
        async with DeliveryTracker(tmp_path / "d.sqlite3") as tracker:
            assert await tracker.message("m-1") is not None

    async def test_an_open_idle_connection_is_closed_with_the_server(
        self, server: CallbackServer, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = connection
        writer.write(post(event("m-1")))
        assert (await answer(reader))[0] == 200
        await server.aclose()
        assert await closed(reader)
        await server.aclose()  # a second close does nothing

    async def test_a_server_that_cannot_listen_raises_and_closes_its_tracker(
        self, server: CallbackServer, tmp_path: Path
    ) -> None:
        taken = CallbackServer(
            DeliveryTracker(tmp_path / "other.sqlite3"), token=TOKEN, port=server.port
        )
        with pytest.raises(OSError, match="in use"):
            await taken.start()
        assert repr(taken.tracker).endswith(" closed>")

    async def test_a_caller_gone_while_its_request_is_stored_is_not_answered_and_no_error(
        self,
        server: CallbackServer,
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        store = server.tracker.store
        original = store.write
        writing, release, written, lost = (asyncio.Event() for _ in range(4))

        async def gated(events: Sequence[DeliveryEvent], at: float) -> None:
            writing.set()
            await release.wait()
            await original(events, at)
            written.set()

        store.write = gated  # type: ignore[method-assign]
        connection_lost = _http._Connection.connection_lost

        def seen(connection: _http._Connection, exc: Exception | None) -> None:
            connection_lost(connection, exc)
            lost.set()

        monkeypatch.setattr(_http._Connection, "connection_lost", seen)
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post(event("m-1")))
        try:
            async with asyncio.timeout(5):
                await writing.wait()
                writer.close()
                await writer.wait_closed()
                await lost.wait()
        finally:
            release.set()
        async with asyncio.timeout(5):
            await written.wait()
        assert await server.tracker.message("m-1") is not None
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class TestBackpressure:
    async def test_requests_pipelined_faster_than_stored_pause_reading_until_stored(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        paused = asyncio.Event()
        buffer_updated = _http._Connection.buffer_updated

        def watched(connection: _http._Connection, nbytes: int) -> None:
            buffer_updated(connection, nbytes)
            if connection.transport is not None and not connection.transport.is_reading():
                paused.set()

        monkeypatch.setattr(_http._Connection, "buffer_updated", watched)
        async with CallbackServer(
            DeliveryTracker(tmp_path / "d.sqlite3"), token=TOKEN, max_body_bytes=1000
        ) as server:
            store = server.tracker.store
            original = store.write
            writing, release = asyncio.Event(), asyncio.Event()

            async def gated(events: Sequence[DeliveryEvent], at: float) -> None:
                writing.set()
                await release.wait()
                await original(events, at)

            store.write = gated  # type: ignore[method-assign]
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(post(event("m-0")))
            async with asyncio.timeout(5):
                await writing.wait()
            pipelined = b"".join(post(event(f"m-{i}")) for i in range(1, 201))
            assert len(pipelined) > _framing.MAX_HEAD_BYTES + 1000
            writer.write(pipelined)
            try:
                async with asyncio.timeout(5):
                    await paused.wait()
                assert server._site is not None
                (connection,) = server._site.connections
                connection.sweep(time.monotonic() + 3600)  # not closed while storing
                assert connection.transport is not None
                assert not connection.transport.is_closing()
            finally:
                release.set()
            statuses = [(await answer(reader))[0] for _ in range(201)]
            assert statuses == [200] * 201
            assert connection.transport is not None
            assert connection.transport.is_reading()
            assert await server.tracker.message("m-200") is not None
            writer.close()
            await writer.wait_closed()

"""The receiver's own HTTP/1.1 server: just the HTTP a callback endpoint needs.

aiohttp's server costs about 130 µs of CPU per request on the 2-core machine the
benchmarks run on (``benchmarks/README.md``), more than the receiver's whole budget at
5,000 callbacks/s; this one costs about 20 µs. It reads keep-alive HTTP/1.1 (and 1.0)
requests with a ``Content-Length`` or a chunked body, answers them in order, and closes
the connection after anything it does not read exactly (a malformed head, both
``Content-Length`` and ``Transfer-Encoding``, a refusal), so no request can be smuggled
past it. The bytes are read by ``_framing`` (pure); this module does the I/O, the
timeouts (``body_timeout``: 408) and the answers. Mounting the receiver in an app
(``aiohttp_handler``, ``asgi_app``) is unchanged.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Final, cast

from ._framing import MAX_HEAD_BYTES, ChunkedBody, Head, Malformed
from ._receiver import Answer, CallbackReceiver, error_body

__all__ = ["Site"]


#: Seconds a request may take to arrive whole, from its first byte.
REQUEST_TIMEOUT: Final = 30.0
#: Seconds an idle keep-alive connection stays open (aiohttp's default too).
KEEPALIVE_TIMEOUT: Final = 75.0
#: Seconds a stop waits for the answers being stored (a stuck store does not hold it up).
SHUTDOWN_TIMEOUT: Final = 5.0

#: Heads kept parsed, at most, and the largest kept (at most 1 MiB in all).
_CACHED_HEADS: Final = 1024
_CACHED_HEAD_BYTES: Final = 1024
#: Bytes read at a time (into one buffer for all connections: reads happen one at a time).
_READ_SIZE: Final = 64 * 1024

_REASONS: Final = {
    100: b"Continue",
    200: b"OK",
    400: b"Bad Request",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    417: b"Expectation Failed",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    503: b"Service Unavailable",
    505: b"HTTP Version Not Supported",
}


class _Refused(Exception):
    """A request the receiver refuses (`CallbackReceiver.refuse`) before its body."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


class _Date:
    """The ``Date`` header, made once a second."""

    def __init__(self) -> None:
        self.second = 0
        self.header = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second = second
            self.header = f"Date: {email.utils.formatdate(second, usegmt=True)}\r\n".encode()
        return self.header


_DATE: Final = _Date()


class _Connection(asyncio.BufferedProtocol):
    """One client's connection: its requests read and answered one after the other.

    Buffered: the loop reads into the site's one buffer, where a plain protocol makes
    asyncio allocate 256 KiB for every read (about 20 µs here, for a 400-byte callback).
    """

    def __init__(self, site: Site) -> None:
        self.site = site
        self.receiver = site.receiver
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.waiting: asyncio.Future[None] | None = None  # the request being stored
        self.close_after = False
        self.since = time.monotonic()  # last answer, or the current request's first byte
        self.scanned = 0  # how far the buffer was searched for the end of a head
        self.head: Head | None = None  # the head of a request whose body is arriving
        self.chunks: ChunkedBody | None = None  # its chunked body, as read so far
        self.body_since = 0.0  # when that head came

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's transport: uvloop's has asyncio.Transport's methods without being one.
        self.transport = cast("asyncio.Transport", transport)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        self.site.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.site.connections.discard(self)
        self.transport = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.site.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self.buffer and self.waiting is None:
            self.since = time.monotonic()
        self.buffer += self.site.read_buffer[:nbytes]  # copied before the next read
        if self.waiting is None:
            self._next()
        elif len(self.buffer) > MAX_HEAD_BYTES + self.receiver.max_body_bytes:
            assert self.transport is not None
            self.transport.pause_reading()  # pipelined faster than it is stored

    def sweep(self, now: float) -> None:
        """Close it if it idled past the keep-alive or a request is arriving too slowly;
        a body slower than the receiver's ``body_timeout`` gets its 408 first."""
        if self.waiting is not None or self.transport is None:
            return
        if self.head is not None and now - self.body_since > self.receiver.body_timeout:
            self._answer(self.receiver.too_slow(self.remote), close=True)
        elif now - self.since > (REQUEST_TIMEOUT if self.buffer else KEEPALIVE_TIMEOUT):
            self.transport.close()

    def _next(self) -> None:
        while self.transport is not None and self.waiting is None and not self.close_after:
            if self.head is None:
                while self.buffer.startswith(b"\r\n"):  # RFC 9112 2.2: empty lines between
                    del self.buffer[:2]
            try:
                request = self._request()
            except Malformed as bad:
                self._answer(Answer(bad.status, error_body(bad.message)), close=True)
                return
            except _Refused as refused:  # before its body is read
                self._answer(refused.answer, close=True)
                return
            if request is None:
                return
            head, body = request
            self.since = time.monotonic()
            taken = self.receiver._take(body, self.remote)
            if isinstance(taken, Answer):
                self._answer(taken, close=head.close)
                continue
            self.close_after = head.close
            self.waiting = taken
            taken.add_done_callback(self._stored)

    def _request(self) -> tuple[Head, bytes] | None:
        """The next whole request in the buffer (consumed), or None while incomplete.
        Each read goes on where the last stopped: nothing is scanned twice."""
        buffer = self.buffer
        head = self.head
        if head is None:
            end = buffer.find(b"\r\n\r\n", self.scanned, MAX_HEAD_BYTES + 4)
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise Malformed(431, "the request head is too large")
                self.scanned = max(len(buffer) - 3, 0)
                return None
            data = bytes(buffer[:end])
            head = self.site.heads.get(data)
            if head is None:
                head = Head(data)
                if len(data) <= _CACHED_HEAD_BYTES and len(self.site.heads) < _CACHED_HEADS:
                    self.site.heads[data] = head
            path = head.path if head.path.rstrip("/").rpartition("/")[0] == self.site.prefix else ""
            refused = self.receiver.refuse(head.method, path, self.remote, head.length)
            if refused is not None:
                raise _Refused(refused)
            if head.expect and len(buffer) == head.size and self.transport is not None:
                # The head has come, none of the body: the client waits for this.
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        chunks = self.chunks
        if head.chunked:
            if chunks is None:
                chunks = ChunkedBody(head.size, self.receiver.max_body_bytes)
            consumed = chunks.read(buffer)
        else:
            consumed = head.size + (head.length or 0)
            if len(buffer) < consumed:
                consumed = None
        if consumed is None:  # kept, to go on with on the next read
            if self.head is None:  # the body's time starts with its head
                self.head, self.chunks, self.body_since = head, chunks, time.monotonic()
            return None
        body = bytes(buffer[head.size : consumed]) if chunks is None else bytes(chunks.body)
        del buffer[:consumed]
        if self.head is not None:
            self.head = self.chunks = None
        if self.scanned:
            self.scanned = 0
        return head, body

    def _stored(self, done: asyncio.Future[None]) -> None:
        self.waiting = None
        self._answer(self.receiver._settled(done), close=self.close_after)
        if self.transport is not None:
            self.since = time.monotonic()
            self.transport.resume_reading()
            self._next()

    def _answer(self, answer: Answer, *, close: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        status = answer.status
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n%s"
            % (
                status,
                _REASONS.get(status, b"Unknown"),
                len(answer.body),
                _DATE.now(),
                b"Connection: close\r\n" if close else b"",
                answer.body,
            )
        )
        if close:
            self.close_after = True
            transport.close()


class Site:
    """Listens for *receiver*'s callbacks at ``<prefix>/<token>``."""

    def __init__(self, receiver: CallbackReceiver, prefix: str) -> None:
        self.receiver = receiver
        self.prefix = prefix.rstrip("/")
        self.connections: set[_Connection] = set()
        self.read_buffer = memoryview(bytearray(_READ_SIZE))
        #: Heads read before: a client sends the same one again and again (its
        #: Content-Length aside), and reading it costs more than the rest of the HTTP.
        self.heads: dict[bytes, Head] = {}
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port listened on."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        self._sweeper = asyncio.create_task(self._sweep(), name="dispatch-async-callbacks-idle")
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening, answer the requests being stored, close every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in self.connections:
            connection.close_after = True  # the answer being stored is the last
        waiting = [c.waiting for c in self.connections if c.waiting is not None]
        if waiting:  # their answers are written before this returns
            await asyncio.wait(waiting, timeout=SHUTDOWN_TIMEOUT)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await server.wait_closed()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.sweep(now)

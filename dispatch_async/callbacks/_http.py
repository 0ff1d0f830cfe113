"""The receiver's own HTTP/1.1 server: just the HTTP a callback endpoint needs.

aiohttp's server costs about 130 µs of CPU per request on the 2-core machine the
benchmarks run on (``benchmarks/README.md``), more than the receiver's whole budget at
5,000 callbacks/s; this one costs about 20 µs. It reads keep-alive HTTP/1.1 (and 1.0)
requests with a ``Content-Length`` or a chunked body, answers them in order, and closes
the connection after anything it does not read exactly (a malformed head, both
``Content-Length`` and ``Transfer-Encoding``, a refusal), so no request can be smuggled
past it. Mounting the receiver in an app (``aiohttp_handler``, ``asgi_app``) is unchanged.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from typing import Final, cast

from ._receiver import Answer, CallbackReceiver

__all__ = ["Site"]


#: A request's line and headers, at most (a callback's are a few hundred bytes).
MAX_HEAD_BYTES: Final = 16 * 1024
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


class _Bad(Exception):
    """A request this server will not read on: answered, then the connection closed."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def _bad(status: int, message: str) -> _Bad:
    return _Bad(Answer(status, b'{"error":"' + message.encode() + b'"}'))


#: Header fields as RFC 9112 has them: a token, a colon, a value on one line. A space
#: before the colon or a folded line (both ways to smuggle a request) does not match.
_FIELDS: Final = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*\r\n)*")


class _Head:
    """What a request's head says: everything but its body. Never changed once made."""

    __slots__ = ("chunked", "close", "expect", "length", "method", "path", "size")

    def __init__(self, data: bytes) -> None:
        line_end = data.find(b"\r\n")
        parts = (data if line_end < 0 else data[:line_end]).split(b" ")
        if len(parts) != 3 or not parts[0].isalpha():
            raise _bad(400, "not an HTTP request line")
        method, target, version = parts
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _bad(505, "HTTP/1.1 or 1.0 only")
        self.method = method.decode("ascii")
        self.path = _path(target)
        self.size = len(data) + 4
        # Each field on a line of its own: b"\r\nname:" finds it, never inside a value.
        fields = b"" if line_end < 0 else data[line_end:] + b"\r\n"
        if _FIELDS.fullmatch(fields, 2) is None:
            raise _bad(400, "malformed header")
        fields = fields.lower()
        length = _values(fields, b"\r\ncontent-length:")
        if length and (not length[0].isdigit() or len(set(length)) > 1):
            raise _bad(400, "malformed Content-Length")
        self.length = int(length[0]) if length else None
        self.chunked = b"\r\ntransfer-encoding:" in fields
        if self.chunked and _values(fields, b"\r\ntransfer-encoding:") != [b"chunked"]:
            raise _bad(501, "only the chunked transfer coding is understood")
        if self.chunked and self.length is not None:
            raise _bad(400, "both Content-Length and Transfer-Encoding")
        self.expect = b"\r\nexpect:" in fields
        if self.expect and _values(fields, b"\r\nexpect:") != [b"100-continue"]:
            raise _bad(417, "only Expect: 100-continue is understood")
        self.close = version == b"HTTP/1.0"
        if b"\r\nconnection:" in fields:
            values = _values(fields, b"\r\nconnection:")
            tokens = {token.strip() for value in values for token in value.split(b",")}
            self.close = b"close" in tokens or (self.close and b"keep-alive" not in tokens)


def _values(fields: bytes, name: bytes) -> list[bytes]:
    """The values of every field *name* (lowercase, with its ``\\r\\n`` and colon)."""
    values = []
    at = fields.find(name)
    while at >= 0:
        start = at + len(name)
        end = fields.find(b"\r\n", start)
        values.append(fields[start:end].strip(b" \t"))
        at = fields.find(name, end)
    return values


def _path(target: bytes) -> str:
    if target.startswith((b"http://", b"https://")):  # absolute-form (RFC 9112 3.2.2)
        target = b"/" + target.split(b"/", 3)[3] if target.count(b"/") >= 3 else b"/"
    if not target.startswith(b"/"):
        raise _bad(400, "not a path")
    return target.partition(b"?")[0].decode("ascii", "replace")


def _chunks(data: bytearray, start: int, limit: int) -> tuple[bytes, int] | None:
    """A chunked body from *start*: (body, where it ends), or None while incomplete."""
    body = bytearray()
    at = start
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            if len(data) - at > 1024:
                raise _bad(400, "malformed chunk size")
            return None
        size_text = bytes(data[at:line_end]).partition(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _bad(400, "malformed chunk size") from None
        if size < 0 or len(body) + size > limit:
            raise _bad(413, "the body is larger than this receiver accepts")
        at = line_end + 2
        if size == 0:
            break
        if len(data) < at + size + 2:
            return None
        if data[at + size : at + size + 2] != b"\r\n":
            raise _bad(400, "malformed chunk")
        body += data[at : at + size]
        at += size + 2
    while True:  # trailer fields, ignored, up to the empty line
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        if line_end == at:
            return bytes(body), at + 2
        at = line_end + 2


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

    def expired(self, now: float) -> bool:
        """Whether it idled past the keep-alive, or a request is arriving too slowly."""
        if self.waiting is not None:
            return False
        limit = REQUEST_TIMEOUT if self.buffer else KEEPALIVE_TIMEOUT
        return now - self.since > limit

    def _next(self) -> None:
        while self.transport is not None and self.waiting is None and not self.close_after:
            while self.buffer.startswith(b"\r\n"):  # RFC 9112 2.2: empty lines between
                del self.buffer[:2]
            try:
                request = self._request()
            except _Bad as bad:
                self._answer(bad.answer, close=True)
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

    def _request(self) -> tuple[_Head, bytes] | None:
        """The next whole request in the buffer (consumed), or None while incomplete."""
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise _bad(431, "the request head is too large")
            return None
        data = bytes(buffer[:end])
        head = self.site.heads.get(data)
        if head is None:
            head = _Head(data)
            if len(data) <= _CACHED_HEAD_BYTES and len(self.site.heads) < _CACHED_HEADS:
                self.site.heads[data] = head
        path = head.path if head.path.rstrip("/").rpartition("/")[0] == self.site.prefix else ""
        refused = self.receiver.refuse(head.method, path, self.remote, head.length)
        if refused is not None:
            raise _Bad(refused)
        if head.expect and len(buffer) == head.size and self.transport is not None:
            # The head has come, none of the body: the client waits for this (once,
            # since any later read brings body bytes).
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if head.chunked:
            found = _chunks(buffer, head.size, self.receiver.max_body_bytes)
            if found is None:
                return None
            body, consumed = found
        else:
            consumed = head.size + (head.length or 0)
            if len(buffer) < consumed:
                return None
            body = bytes(buffer[head.size : consumed])
        del buffer[:consumed]
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
        self.heads: dict[bytes, _Head] = {}
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
            for connection in [c for c in self.connections if c.expired(now)]:
                if connection.transport is not None:
                    connection.transport.close()

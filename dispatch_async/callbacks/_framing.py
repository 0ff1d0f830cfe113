"""HTTP/1.1 request framing read from bytes: a request's head, and a chunked body.

Pure (bytes in; a head, a body or `Malformed` out), so each rule is tested without a
server (``tests/test_callback_framing.py``); ``_http`` does the I/O. Strict where a
looser reading lets two parsers disagree on where a request ends (request smuggling):
exactly the grammar of RFC 9112, no control byte in a field (RFC 9110 5.5), one
``Content-Length`` of at most 18 digits, ``chunked`` alone, ``1*HEXDIG`` chunk sizes.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_HEAD_BYTES", "ChunkedBody", "Head", "Malformed"]

#: A request's line and headers, at most (a callback's are a few hundred bytes); a
#: chunked body's framing (sizes, extensions, trailers) is bounded the same.
MAX_HEAD_BYTES: Final = 16 * 1024
#: A chunk-size line, at most (its extensions included).
_MAX_SIZE_LINE: Final = 1024
#: A longer Content-Length is no size any receiver takes (and Python's int() refuses
#: more than 4,300 digits with a ValueError).
_MAX_LENGTH_DIGITS: Final = 18


class Malformed(Exception):
    """A request this server will not read on: answered with *status*, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


_TOKEN: Final = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
#: A field value's bytes: visible, obs-text, space and tab; never CR, LF, NUL or DEL.
_VALUE: Final = rb"[\t\x20-\x7e\x80-\xff]*"
_REQUEST_LINE: Final = re.compile(rb"[A-Za-z]+ [\x21-\x7e]+ HTTP/[0-9]\.[0-9]")
#: Header fields as RFC 9112 has them: a token, a colon, a value on one line. A space
#: before the colon or a folded line (both ways to smuggle a request) does not match.
_FIELDS: Final = re.compile(rb"(?:" + _TOKEN + rb":" + _VALUE + rb"\r\n)*")
_FIELD: Final = re.compile(_TOKEN + rb":" + _VALUE)
#: chunk-size [ chunk-ext ]: hex digits only (no sign, prefix, "_" or space before).
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]+)(?:[ \t]*;" + _VALUE + rb")?")


class Head:
    """What a request's head says: everything but its body. Never changed once made."""

    __slots__ = ("chunked", "close", "expect", "length", "method", "path", "size")

    def __init__(self, data: bytes) -> None:
        """Read *data*, the head without its final ``\\r\\n\\r\\n``; raises `Malformed`."""
        line_end = data.find(b"\r\n")
        line = data if line_end < 0 else data[:line_end]
        if _REQUEST_LINE.fullmatch(line) is None:
            raise Malformed(400, "not an HTTP request line")
        method, target, version = line.split(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise Malformed(505, "HTTP/1.1 or 1.0 only")
        self.method = method.decode("ascii")
        self.path = _path(target)
        self.size = len(data) + 4
        # Each field on a line of its own: b"\r\nname:" finds it, never inside a value.
        fields = b"" if line_end < 0 else data[line_end:] + b"\r\n"
        if _FIELDS.fullmatch(fields, 2) is None:
            raise Malformed(400, "malformed header")
        fields = fields.lower()
        length = _values(fields, b"\r\ncontent-length:")
        if length and (
            not length[0].isdigit() or len(length[0]) > _MAX_LENGTH_DIGITS or len(set(length)) > 1
        ):
            raise Malformed(400, "malformed Content-Length")
        self.length = int(length[0]) if length else None
        self.chunked = b"\r\ntransfer-encoding:" in fields
        if self.chunked and _values(fields, b"\r\ntransfer-encoding:") != [b"chunked"]:
            raise Malformed(501, "only the chunked transfer coding is understood")
        if self.chunked and self.length is not None:
            raise Malformed(400, "both Content-Length and Transfer-Encoding")
        self.expect = b"\r\nexpect:" in fields
        if self.expect and _values(fields, b"\r\nexpect:") != [b"100-continue"]:
            raise Malformed(417, "only Expect: 100-continue is understood")
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
        raise Malformed(400, "not a path")
    return target.partition(b"?")[0].decode("ascii")


class ChunkedBody:
    """A chunked body (RFC 9112 7.1) read as it arrives, each piece once.

    `read` goes on from the last whole piece (a size line, a chunk, a trailer line), so a
    body trickled a byte at a time costs no re-scan of what came before. Its data is
    bounded by *limit* (413 past it), its framing by `MAX_HEAD_BYTES` (400).
    """

    __slots__ = ("at", "body", "framing", "limit", "trailers")

    def __init__(self, start: int, limit: int) -> None:
        self.at = start  # where the next piece starts
        self.body = bytearray()
        self.framing = 0  # bytes of sizes, extensions and trailers read so far
        self.limit = limit
        self.trailers = False  # past the last chunk

    def read(self, data: bytes | bytearray) -> int | None:
        """Where the body ends in *data* once it is whole (`body` then holds it), else None.

        *data* is what came so far, from the same start each time. Raises `Malformed`.
        """
        at = self.at
        while True:
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                waiting = len(data) - at
                if data.find(b"\n", at) >= 0:  # an LF without its CR
                    raise Malformed(400, "malformed chunk size or trailer")
                if not self.trailers and waiting > _MAX_SIZE_LINE:
                    raise Malformed(400, "malformed chunk size")
                if self.framing + waiting > MAX_HEAD_BYTES:
                    raise Malformed(400, "chunk framing larger than this receiver accepts")
                return None
            framing = self.framing + line_end + 2 - at
            if framing > MAX_HEAD_BYTES:
                raise Malformed(400, "chunk framing larger than this receiver accepts")
            if self.trailers:  # trailer fields, ignored, up to the empty line
                if line_end != at and _FIELD.fullmatch(data, at, line_end) is None:
                    raise Malformed(400, "malformed trailer")
                self.at, self.framing = line_end + 2, framing
                if line_end == at:
                    return self.at
                at = self.at
                continue
            size_line = _CHUNK_SIZE.fullmatch(data, at, line_end)
            if size_line is None:
                raise Malformed(400, "malformed chunk size")
            size = int(size_line[1], 16)
            if len(self.body) + size > self.limit:
                raise Malformed(413, "the body is larger than this receiver accepts")
            start = line_end + 2
            if size == 0:
                self.at, self.framing, self.trailers = start, framing, True
                at = start
                continue
            if len(data) < start + size + 2:
                return None
            if data[start + size : start + size + 2] != b"\r\n":
                raise Malformed(400, "malformed chunk")
            self.body += data[start : start + size]
            self.at, self.framing = start + size + 2, framing
            at = self.at

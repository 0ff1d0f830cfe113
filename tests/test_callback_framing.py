"""The receiver's HTTP framing as pure functions of bytes (``callbacks/_framing.py``): what
a head says, and a chunked body read as it arrives. Over a socket, with a desync canary
after each refusal: test_callback_http.py."""

from __future__ import annotations

import pytest

from dispatch_async.callbacks._framing import MAX_HEAD_BYTES, ChunkedBody, Head, Malformed


class CountingBuffer(bytearray):
    """A buffer that counts the bytes its searches run over."""

    scanned = 0

    def find(self, sub: object, start: object = None, end: object = None) -> int:  # type: ignore[override]
        begin = 0 if start is None else int(start)  # type: ignore[call-overload]
        found = super().find(sub, begin)  # type: ignore[call-overload]
        self.scanned += (len(self) if found < 0 else found) - begin
        return int(found)


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nA: b\r\n\r\n"


class TestHead:
    def test_reads_what_a_callback_sends(self) -> None:
        head = Head(
            b"POST /cb/t?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\nConnection: close"
        )
        assert (head.method, head.path, head.length, head.chunked, head.close) == (
            "POST",
            "/cb/t",
            12,
            False,
            True,
        )

    @pytest.mark.parametrize(
        ("field", "status"),
        [
            (b"Content-Length: " + b"9" * 4301, 400),  # past int()'s 4,300 digits
            (b"Content-Length: 0x10", 400),
            (b"X-A: a\x00b", 400),
            (b"X-A: a\x1bb", 400),
            (b"X-A: a\rb", 400),
            (b"Transfer-Encoding: chunked, identity", 501),
        ],
    )
    def test_refuses_what_two_parsers_could_read_differently(
        self, field: bytes, status: int
    ) -> None:
        with pytest.raises(Malformed) as caught:
            Head(b"POST /cb/t HTTP/1.1\r\n" + field)
        assert caught.value.status == status

    def test_keeps_tabs_and_non_ascii_in_values(self) -> None:
        assert Head(b"POST /cb/t HTTP/1.1\r\nX-A: a\tb \xc3\xa7").path == "/cb/t"


class TestChunkedBody:
    def test_a_whole_body_is_read_with_where_it_ends(self) -> None:
        data = chunked(b'{"reference": "m-1"}', 7) + b"POST /next"
        reading = ChunkedBody(0, 1000)
        end = reading.read(data)
        assert end == len(data) - len(b"POST /next")
        assert reading.body == b'{"reference": "m-1"}'

    def test_a_body_trickled_a_byte_at_a_time_is_scanned_once(self) -> None:
        body = bytes(range(32, 127)) * 40
        data = chunked(body, 3)
        buffer = CountingBuffer()
        reading = ChunkedBody(0, len(body))
        ends = []
        for byte in data:
            buffer.append(byte)
            ends.append(reading.read(buffer))
        assert ends == [None] * (len(data) - 1) + [len(data)]
        assert reading.body == body
        # Each read looks at what it has not finished: a size line, at most (never
        # what came before; quadratic would be some len(data) ** 2 / 2).
        assert buffer.scanned < 10 * len(data)

    @pytest.mark.parametrize(
        "framing",
        [
            b"1;" + b"e" * 200 + b"\r\nx\r\n",  # chunk extensions
            b"1\r\nx\r\n",  # one-byte chunks
        ],
    )
    def test_its_framing_is_bounded_like_a_head(self, framing: bytes) -> None:
        data = framing * (2 * MAX_HEAD_BYTES // len(framing)) + b"0\r\n\r\n"
        with pytest.raises(Malformed, match="framing") as caught:
            ChunkedBody(0, len(data)).read(data)
        assert caught.value.status == 400

    def test_trailers_are_bounded_like_a_head_while_they_arrive(self) -> None:
        data = b"0\r\n" + b"X-T: t\r\n" * (MAX_HEAD_BYTES // 8)
        with pytest.raises(Malformed, match="framing"):
            ChunkedBody(0, 100).read(data + b"X-T: " + b"t" * 100)

    def test_data_past_the_limit_is_413(self) -> None:
        with pytest.raises(Malformed) as caught:
            ChunkedBody(0, 10).read(b"6\r\nabcdef\r\n6\r\n")
        assert caught.value.status == 413

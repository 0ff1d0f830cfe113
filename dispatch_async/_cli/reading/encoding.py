"""Which encoding a CSV is in: UTF-8, or Windows-1252 as Excel's pt-BR exports are.

Excel's "CSV (separado por vírgulas)" writes Windows-1252; "CSV UTF-8" and Google
Sheets write UTF-8. The rule is deterministic, and says why when it refuses:

- a UTF-8 BOM: UTF-8;
- a UTF-16 or UTF-32 BOM, or a NUL byte: not a CSV text file (Excel's "Unicode Text", an
  .xlsx): refused;
- otherwise the bytes beyond ASCII decide. Every one part of a valid UTF-8 character:
  UTF-8. None of them: Windows-1252 (Portuguese in Windows-1252 is never valid UTF-8:
  ``ã`` is one byte that UTF-8 only uses to start a three-byte character). Both in one
  file, or a byte Windows-1252 does not define: refused, naming the first line of each,
  since reading it either way would send garbled text or drop rows;
- only ASCII: UTF-8 (the same text either way).

A regular file is scanned whole before its first row is read, so a refusal comes before
anything is sent. A pipe or stdin cannot be read twice: the first line with a byte
beyond ASCII decides (within its first MiB), and a later row that is not in that
encoding is a malformed row. ``--encoding`` skips the guess, but a file that starts with
a UTF-8 BOM is refused with ``--encoding windows-1252``: it says it is UTF-8.

Not a statistical detector (charset-normalizer): on Excel's pt-BR exports it answers
cp1250 or big5, which turn ``João`` into ``Joăo``, and takes two seconds for 10 MB.
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Iterator
from typing import IO, Final

import attrs

from .problems import InputProblem

__all__ = ["ENCODINGS", "UTF8", "WINDOWS_1252", "Encoding", "detect_encoding", "encoding_name"]

UTF8: Final = "utf-8"
WINDOWS_1252: Final = "windows-1252"
#: What ``--encoding`` takes, as a journal stores it, with the names people write.
ENCODINGS: Final = {
    "utf-8": UTF8,
    "utf8": UTF8,
    "windows-1252": WINDOWS_1252,
    "cp1252": WINDOWS_1252,
}
_NAMES: Final = {UTF8: "UTF-8", WINDOWS_1252: "Windows-1252"}

_BLOCK = 1 << 20
_BOM_SIZE = len(codecs.BOM_UTF8)
_UTF16_32_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")
# One well-formed UTF-8 character beyond ASCII (RFC 3629: no overlong forms, no surrogates).
_UTF8_CHARACTER = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)
#: The bytes Windows-1252 leaves undefined (each found with memchr: a regex is 10x slower).
_UNDEFINED_1252 = (b"\x81", b"\x8d", b"\x8f", b"\x90", b"\x9d")


def encoding_name(codec: str) -> str:
    """How a person writes *codec*: "UTF-8", "Windows-1252"."""
    return _NAMES.get(codec, codec)


@attrs.frozen
class Encoding:
    """The encoding a CSV was read in, and whether it was found (or given)."""

    codec: str
    detected: bool = False

    @property
    def name(self) -> str:
        return encoding_name(self.codec)

    def describe(self, *, resumed: bool = False) -> str:
        """For stderr: "Windows-1252 (detected; --encoding forces one)".

        *resumed*: the codec came from the job's journal (what its first run read), which
        the person resuming never typed.
        """
        if self.detected:
            return f"{self.name} (detected; --encoding forces one)"
        return f"{self.name} ({'from the journal' if resumed else 'given'})"


def detect_encoding(stream: IO[bytes], given: str | None) -> tuple[IO[bytes], Encoding]:
    """The encoding of the CSV *stream*, and the stream to read it from (from the start).

    *given*: ``--encoding``'s codec, taken as it is. A seekable stream is scanned whole
    and rewound; another is read up to its first line beyond ASCII, which is handed back
    in front of the rest.

    Raises:
        InputProblem: the file is neither UTF-8 nor Windows-1252 (see the module).
    """
    if given is not None:
        return _refuse_bom(stream, given), Encoding(given)
    if stream.seekable():
        start = stream.tell()
        try:
            codec = _scan(iter(lambda: _block(stream), b""))
        finally:
            stream.seek(start)
        return stream, Encoding(codec, detected=True)
    head: list[bytes] = []
    size = 0
    while size < _BLOCK and (line := stream.readline()):
        head.append(line)
        size += len(line)
        if not line.isascii():
            break
    codec = _scan(iter(head))
    replay = io.BufferedReader(_Replay(b"".join(head), stream))
    return replay, Encoding(codec, detected=True)


def _refuse_bom(stream: IO[bytes], given: str) -> IO[bytes]:
    """*stream* from its start, or InputProblem: a UTF-8 BOM and a single-byte *given*.

    A BOM says the file is UTF-8: read as Windows-1252 it would send ``ï»¿nome`` for
    ``nome`` (the column not found, or a var by that name) and ``JoÃ£o`` for ``João``.
    """
    if given == UTF8:
        return stream
    if stream.seekable():
        start = stream.tell()
        head = stream.read(_BOM_SIZE)
        stream.seek(start)
    else:
        head = b""
        while len(head) < _BOM_SIZE and (more := stream.read(_BOM_SIZE - len(head))):
            head += more
        stream = io.BufferedReader(_Replay(head, stream))
    if head == codecs.BOM_UTF8:
        raise InputProblem(
            f"the file starts with a UTF-8 BOM, so it is UTF-8, not {encoding_name(given)}: "
            "give --encoding utf-8 (or leave --encoding out)"
        )
    return stream


def _block(stream: IO[bytes]) -> bytes:
    """About a MiB, ended at a line's end: no character is split between two blocks."""
    data = stream.read(_BLOCK)
    if data and not data.endswith(b"\n"):
        data += stream.readline()
    return data


def _scan(blocks: Iterator[bytes]) -> str:
    """The codec of the file whose bytes are *blocks*, or InputProblem (see the module)."""
    utf8_at: int | None = None  # the first line with a UTF-8 character beyond ASCII
    other_at: int | None = None  # the first line that is not UTF-8
    lines = 0
    first = True
    for block in blocks:
        if first:
            first = False
            if block.startswith(codecs.BOM_UTF8):
                return UTF8
            if block.startswith(_UTF16_32_BOMS):
                raise InputProblem(
                    'the file is UTF-16 or UTF-32 (Excel\'s "Unicode Text"), not a CSV '
                    "in UTF-8 or Windows-1252: save it as CSV UTF-8"
                )
        if b"\x00" in block:
            at = lines + block.count(b"\n", 0, block.index(b"\x00")) + 1
            raise InputProblem(
                f"line {at} holds a NUL byte: this is not a CSV text file (an .xlsx? UTF-16?): "
                "save it as CSV UTF-8"
            )
        if not block.isascii():
            bad = _first_not_utf8(block)
            if other_at is None and bad is not None:
                other_at = lines + block.count(b"\n", 0, bad) + 1
            # Decoding with "ignore" keeps only whole UTF-8 characters (at C speed; the
            # regex that says where the first is runs once, for the message).
            if utf8_at is None and (bad is None or not block.decode(UTF8, "ignore").isascii()):
                found = _UTF8_CHARACTER.search(block)
                utf8_at = lines + block.count(b"\n", 0, found.start() if found else 0) + 1
            if utf8_at is not None and other_at is not None:
                raise InputProblem(
                    f"the file mixes encodings: line {utf8_at} is UTF-8, line {other_at} is "
                    "not: give --encoding utf-8 (rows that are not become malformed rows) "
                    "or --encoding windows-1252"
                )
            if other_at is not None and any(byte in block for byte in _UNDEFINED_1252):
                at = min(i for byte in _UNDEFINED_1252 if (i := block.find(byte)) >= 0)
                line = lines + block.count(b"\n", 0, at) + 1
                raise InputProblem(
                    f"line {line} is neither UTF-8 nor Windows-1252 (a byte Windows-1252 "
                    "does not define): save the file as CSV UTF-8, or give --encoding"
                )
        lines += block.count(b"\n")
    return WINDOWS_1252 if other_at is not None else UTF8


def _first_not_utf8(block: bytes) -> int | None:
    """Where *block* first stops being UTF-8 (None: it is UTF-8 throughout)."""
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None


class _Replay(io.RawIOBase):
    """*head*, then the rest of *stream*: a pipe's first lines, read to find its encoding."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        read = getattr(self._stream, "read1", self._stream.read)
        data: bytes = read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

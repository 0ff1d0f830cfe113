"""The columns a result keeps, packed: no object per recipient until one is read.

A million-recipient ``send_*`` keeps every id, number and reason until the caller drops
the result. As Python strings in tuples they cost about 220 bytes a recipient; packed,
an id the service gives as a UUID is its 16 bytes (`Ids`), numbers share one string
with an array of where each ends (`Texts`), and reasons, which repeat, are each kept
once with a small code per recipient (`Shared`). An id of any other shape is kept as
text, exactly as given. Packing costs a few C-level passes over a chunk's columns when
its result is made; reading an item makes its string again.
"""

from __future__ import annotations

import binascii
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate

from ._columns import Complement, Joined, View

__all__ = [
    "Ids",
    "Shared",
    "Texts",
    "pack_ids",
    "pack_positions",
    "pack_sessions",
    "pack_shared",
    "pack_texts",
]

#: Where the dashes of a UUID's text are: 8-4-4-4-12 hex digits.
_DASHES = (8, 13, 18, 23)
_UUID_LENGTH = 36
#: What joins a column's strings: a NUL, which no number, id or reason should hold.
_SEP = "\x00"
_SEP_BYTE = b"\x00"
_STRIDE = _UUID_LENGTH + 1
#: The hex digits a lowercase UUID never holds (unhexlify takes both cases).
_UPPERCASE_HEX = (b"A", b"B", b"C", b"D", b"E", b"F")


def _packed_already(values: Sequence[object]) -> bool:
    """Whether *values* holds no object per item already: packed, joined, or a complement
    of a range."""
    return type(values) in _PACKED  # exact types: an isinstance of ABCs costs more


def pack_texts(values: Sequence[str]) -> Sequence[str]:
    """*values* as one `Texts` (a view or an empty column as it is)."""
    if not values or _packed_already(values):
        return values
    return Texts(values)


def pack_ids(values: Sequence[str]) -> Sequence[str]:
    """*values* as `Ids` if every one is a UUID in lowercase 8-4-4-4-12 form (what the
    service gives), which then reads back exactly; else as `Texts`."""
    if not values or _packed_already(values):
        return values
    raw = _uuid_bytes(values)
    return Texts(values) if raw is None else Ids(raw)


def pack_sessions(values: Sequence[str | None]) -> Sequence[str | None] | None:
    """Session ids as `pack_ids` packs them when every one is a string; None when none is
    (basic and single sends); a column that mixes them (rare) as a tuple."""
    if _packed_already(values):
        return values
    try:
        return pack_ids(values)  # type: ignore[arg-type]  # joining raises at a None
    except TypeError:
        values = tuple(values)
    return None if values.count(None) == len(values) else values


def pack_shared(values: Sequence[str]) -> Sequence[str]:
    """*values* as `Shared`: each distinct one kept once."""
    if not values or _packed_already(values):
        return values
    return Shared(values)


def pack_positions(values: Sequence[int]) -> Sequence[int]:
    """Input positions as a machine-integer array (a range or a view as it is)."""
    if not values or _packed_already(values):
        return values
    return array("q", values)


def _uuid_bytes(values: Sequence[str]) -> bytes | None:
    """The 16 bytes of each value, joined, if each is a lowercase dashed UUID; else None.

    Checked in C over the whole column, joined with NULs: a NUL after every 36
    characters and dashes at the four places; once both are taken out, 32 characters a
    value (so no other NUL or dash), none an uppercase letter, that read as hex digits.
    Raises TypeError if a value is not a string.
    """
    count = len(values)
    try:
        data = _SEP.join(values).encode("ascii")
    except UnicodeEncodeError:
        return None
    if len(data) != _STRIDE * count - 1:
        return None
    if data[_UUID_LENGTH::_STRIDE] != _SEP_BYTE * (count - 1):
        return None
    dashes = b"-" * count
    for at in _DASHES:
        if data[at::_STRIDE] != dashes:
            return None
    for letter in _UPPERCASE_HEX:  # a byte search each: far cheaper than a round trip
        if letter in data:
            return None
    digits = data.translate(None, b"-" + _SEP_BYTE)
    if len(digits) != 32 * count:
        return None
    try:
        return binascii.unhexlify(digits)
    except binascii.Error:
        return None


class Ids(View[str]):
    """UUIDs held as 16 bytes each, read as lowercase 8-4-4-4-12 text."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        super().__init__(len(raw) // 16)
        self._raw = raw

    def _item(self, index: int) -> str:
        h = self._raw[16 * index : 16 * index + 16].hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def __iter__(self) -> Iterator[str]:
        # All at once, in C: the hex digits in dash-separated groups of four, eight groups
        # an id; the dashes after its first, sixth and seventh groups are dropped, the one
        # after its last becomes a separator to split on.
        count = len(self)
        if not count:
            return iter(())
        text = bytearray(self._raw.hex("-", 2).encode("ascii"))
        dropped = b"\x01" * count
        for at in (4, 29, 34):
            text[at::40] = dropped
        text[39::40] = _SEP_BYTE * (count - 1)
        return iter(text.translate(None, b"\x01").decode("ascii").split(_SEP))


class Texts(View[str]):
    """Strings held as one string, joined with NULs (or, when a string holds a NUL,
    with nothing between them and the offset of each kept from the start)."""

    __slots__ = ("_gap", "_starts", "_text")

    def __init__(self, values: Sequence[str]) -> None:
        super().__init__(len(values))
        self._text = _SEP.join(values)
        self._gap = 1
        self._starts: array[int] | None = None  # made when an item is first indexed
        if self._text.count(_SEP) != len(values) - 1:
            self._text = "".join(values)
            self._gap = 0
            self._starts = self._offsets(values)

    def _offsets(self, values: Iterable[str]) -> array[int]:
        """Where each value starts in the text, and where the text ends."""
        gap = self._gap
        starts = accumulate((len(value) + gap for value in values), initial=0)
        return array("I" if len(self._text) < 2**32 - 1 else "q", starts)

    def _item(self, index: int) -> str:
        starts = self._starts
        if starts is None:
            starts = self._starts = self._offsets(self._text.split(_SEP))
        return self._text[starts[index] : starts[index + 1] - self._gap]

    def __iter__(self) -> Iterator[str]:
        if self._gap:
            return iter(self._text.split(_SEP))
        starts = self._starts
        assert starts is not None  # made in __init__ when there is no separator
        return map(self._text.__getitem__, map(slice, starts, starts[1:]))


class Shared(View[str]):
    """Strings that repeat, each distinct one held once, with a code per item."""

    __slots__ = ("_codes", "_distinct")

    def __init__(self, values: Sequence[str]) -> None:
        super().__init__(len(values))
        code: dict[str, int] = {}
        codes = [code.setdefault(value, len(code)) for value in values]
        self._distinct = tuple(code)
        self._codes = array("I", codes)

    def _item(self, index: int) -> str:
        return self._distinct[self._codes[index]]

    def __iter__(self) -> Iterator[str]:
        return map(self._distinct.__getitem__, self._codes)


#: The types `_packed_already` lets through as they are.
_PACKED: frozenset[type] = frozenset({Ids, Texts, Shared, Joined, Complement, range, array})

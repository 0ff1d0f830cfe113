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

from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain

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
_FIELDS = ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))


def _packed_already(values: Sequence[object]) -> bool:
    """Whether *values* holds no object per item already: packed, joined, or a complement
    of a range (a `Column` is not: it holds the decoded answer's entries)."""
    return isinstance(values, Ids | Texts | Shared | Joined | Complement | range | array)


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
    values = list(values)
    raw = _uuid_bytes(values)
    return Texts(values) if raw is None else Ids(raw)


def pack_sessions(values: Sequence[str | None]) -> Sequence[str | None] | None:
    """Session ids as `pack_ids` packs them when every one is a string; None when none is
    (basic and single sends); a column that mixes them (rare) as a tuple."""
    if _packed_already(values):
        return values
    values = tuple(values)
    if None not in values:
        return pack_ids(values)  # type: ignore[arg-type]  # no None in it
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


def _uuid_bytes(values: list[str]) -> bytes | None:
    """The 16 bytes of each value, joined, if each is a lowercase dashed UUID; else None.

    Checked in C over the whole column: every value 36 characters with dashes at the
    four places, 32 hex digits between them that read back as written.
    """
    if set(map(len, values)) != {_UUID_LENGTH}:
        return None
    joined = "".join(values)
    dashes = "-" * len(values)
    if any(joined[at::_UUID_LENGTH] != dashes for at in _DASHES):
        return None
    digits = joined.replace("-", "")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        return None
    if len(raw) != 16 * len(values) or raw.hex() != digits:
        return None  # uppercase or spaces: not read back as written
    return raw


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
        # All at once: the dashed text of every id laid out with strided copies in C.
        count = len(self)
        digits = self._raw.hex().encode("ascii")
        text = bytearray(b"-" * (_UUID_LENGTH * count))
        at = 0
        for start, end in _FIELDS:
            for offset in range(start, end):
                text[at::_UUID_LENGTH] = digits[offset::32]
                at += 1
            at += 1  # the dash after this field
        joined = text.decode("ascii")
        ends = range(_UUID_LENGTH, len(joined) + 1, _UUID_LENGTH)
        return map(joined.__getitem__, map(slice, range(0, len(joined), _UUID_LENGTH), ends))


class Texts(View[str]):
    """Strings held as one string and the offset where each ends."""

    __slots__ = ("_ends", "_text")

    def __init__(self, values: Sequence[str]) -> None:
        super().__init__(len(values))
        self._text = "".join(values)
        self._ends = array("I" if len(self._text) < 2**32 else "q", accumulate(map(len, values)))

    def _item(self, index: int) -> str:
        start = self._ends[index - 1] if index else 0
        return self._text[start : self._ends[index]]

    def __iter__(self) -> Iterator[str]:
        ends = self._ends
        return map(self._text.__getitem__, map(slice, chain((0,), ends), ends))


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

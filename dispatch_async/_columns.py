"""A result's columns (ids, numbers, input positions) as views that hold no object per item.

A chunk answered in the order sent has its accepted recipients at the chunk's positions
minus the few the service rejected (`Complement`); a merged result has its parts'
columns one after another (`Joined`). Each is read in place: indexing finds the item in
the parts, and an item is made only when it is read. The packed columns a result keeps
are in ``_packed``.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain
from typing import TypeVar, overload

__all__ = ["Complement", "Joined", "View"]

_T = TypeVar("_T")


class View(Sequence[_T]):
    """A read-only sequence that makes its items when read: equal to any sequence with
    the same items, shown as a list; a slice is a tuple of the items in it."""

    __slots__ = ("_length",)

    def __init__(self, length: int) -> None:
        self._length = length

    @abstractmethod
    def _item(self, index: int) -> _T:
        """The item at 0 <= *index* < len."""

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...
    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if isinstance(index, slice):
            return tuple(map(self._item, range(self._length)[index]))
        length = self._length
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._item(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class Complement(View[int]):
    """The items of *base* except those at *holes* (indices into *base*, ascending)."""

    __slots__ = ("_base", "_holes", "_shifted")

    def __init__(self, base: Sequence[int], holes: Sequence[int]) -> None:
        super().__init__(len(base) - len(holes))
        self._base = base
        self._holes = tuple(holes)
        # Item i is base[i + k], k the number of holes whose hole - (holes before it) <= i.
        self._shifted = tuple(hole - before for before, hole in enumerate(self._holes))

    def _item(self, index: int) -> int:
        return self._base[index + bisect_right(self._shifted, index)]

    def __iter__(self) -> Iterator[int]:
        base, at = self._base, 0
        runs: list[Sequence[int]] = []
        for hole in self._holes:
            runs.append(base[at:hole])
            at = hole + 1
        runs.append(base[at:])
        return chain.from_iterable(runs)


class Joined(View[_T]):
    """Several sequences, one after another."""

    __slots__ = ("_parts", "_starts")

    def __init__(self, parts: Sequence[Sequence[_T]]) -> None:
        starts = (0, *accumulate(map(len, parts)))
        super().__init__(starts[-1])
        self._parts = tuple(parts)
        self._starts = starts[:-1]

    def _item(self, index: int) -> _T:
        at = bisect_right(self._starts, index) - 1
        return self._parts[at][index - self._starts[at]]

    def __iter__(self) -> Iterator[_T]:
        return chain.from_iterable(self._parts)

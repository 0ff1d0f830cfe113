"""Input positions of a result's outcomes, built only when someone reads them.

A chunk answered in the order sent has its accepted recipients at the chunk's positions
minus the few the service rejected; a merged result has its parts' positions one after
another. Both are kept in that form, which costs nothing per recipient, and turned into
a tuple the first time one of them is indexed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import overload

__all__ = ["Complement", "Joined"]


class _Lazy(Sequence[int]):
    """A sequence of ints iterated from its parts, made a tuple on first index."""

    __slots__ = ("_items", "_length")

    def __init__(self, length: int) -> None:
        self._length = length
        self._items: tuple[int, ...] | None = None

    def _iterate(self) -> Iterator[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        return iter(self._items) if self._items is not None else self._iterate()

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if self._items is None:
            self._items = tuple(self._iterate())
        return self._items[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class Complement(_Lazy):
    """The items of *base* except those at *holes* (indices into *base*, ascending)."""

    __slots__ = ("_base", "_holes")

    def __init__(self, base: Sequence[int], holes: Sequence[int]) -> None:
        super().__init__(len(base) - len(holes))
        self._base = base
        self._holes = holes

    def _iterate(self) -> Iterator[int]:
        base, at = self._base, 0
        runs: list[Sequence[int]] = []
        for hole in self._holes:
            runs.append(base[at:hole])
            at = hole + 1
        runs.append(base[at:])
        return chain.from_iterable(runs)


class Joined(_Lazy):
    """Several sequences of positions, one after another."""

    __slots__ = ("_parts",)

    def __init__(self, parts: Sequence[Sequence[int]]) -> None:
        super().__init__(sum(map(len, parts)))
        self._parts = parts

    def _iterate(self) -> Iterator[int]:
        return chain.from_iterable(self._parts)

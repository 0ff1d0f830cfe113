"""A result's columns (ids, numbers, input positions), built only when someone reads them.

A chunk answered in the order sent has its accepted recipients at the chunk's positions
minus the few the service rejected, and its ids inside the decoded answer; a merged
result has its parts' columns one after another. Each is kept in that form, which costs
nothing per recipient, and becomes a tuple the first time it is indexed (a tuple of
strings or ints, which the garbage collector soon stops tracking).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, TypeVar, overload

__all__ = ["Column", "Complement", "Joined"]

_T = TypeVar("_T")


class _Lazy(Sequence[_T]):
    """A sequence iterated from its parts, made a tuple on first index."""

    __slots__ = ("_items", "_length")

    def __init__(self, length: int) -> None:
        self._length = length
        self._items: tuple[_T, ...] | None = None

    @abstractmethod
    def _iterate(self) -> Iterator[_T]:
        """The items, from the parts."""

    def _release(self) -> None:
        """Drop what the tuple now holds (the parts, the rows)."""

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[_T]:
        return iter(self._items) if self._items is not None else self._iterate()

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...
    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if self._items is None:
            self._items = tuple(self._iterate())
            self._release()
        return self._items[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class Complement(_Lazy[int]):
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


class Joined(_Lazy[_T]):
    """Several sequences, one after another."""

    __slots__ = ("_parts",)

    def __init__(self, parts: Sequence[Sequence[_T]]) -> None:
        super().__init__(sum(map(len, parts)))
        self._parts = parts

    def _iterate(self) -> Iterator[_T]:
        return chain.from_iterable(self._parts)

    def _release(self) -> None:
        self._parts = ()


class Column(_Lazy[_T]):
    """One field (``get``) of each of *rows*, e.g. the ids of a decoded answer."""

    __slots__ = ("_get", "_rows")

    def __init__(self, rows: Sequence[Any], get: Callable[[Any], _T]) -> None:
        super().__init__(len(rows))
        self._rows = rows
        self._get = get

    def _iterate(self) -> Iterator[_T]:
        return map(self._get, self._rows)

    def _release(self) -> None:
        self._rows = ()

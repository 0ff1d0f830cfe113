"""The values callers hand in and get back: recipients, fallbacks, and the accepted and
rejected recipients a result is made of (the result itself is in `_outcome`).

Results hold their accepted and rejected recipients in flat columns and build the
``ValidMessage``/``InvalidMessage`` objects only when they are looked at: a bulk job
accepts millions of recipients and most callers only count them or stream them out.
Every outcome knows its recipient's ``position`` in the caller's input and the caller's
``ref`` for it, which never goes on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, Generic, TypeVar, overload

import attrs

from ._columns import View
from ._packed import pack_ids, pack_positions, pack_sessions, pack_shared, pack_texts

__all__ = [
    "Fallback",
    "InvalidMessage",
    "InvalidMessages",
    "Recipient",
    "ValidMessage",
    "ValidMessages",
]


def _check_number(_: object, __: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str or not value:
        raise TypeError(f"a recipient number must be a non-empty string, not {value!r}")


def _check_vars(_: object, __: attrs.Attribute[Mapping[str, str]], value: object) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"vars must be a mapping of strings, not {type(value).__name__}")
    for key, val in value.items():
        if type(key) is not str or type(val) is not str:
            raise TypeError(f"vars must map strings to strings; {key!r}: {val!r} is not")


@attrs.frozen
class Recipient:
    """One phone number to send to, with the template variables for that number."""

    number: str = attrs.field(validator=_check_number)
    """The phone number to send to, such as ``+5511987654321``."""
    vars: Mapping[str, str] = attrs.field(factory=dict, validator=_check_vars, kw_only=True)
    """The template's variables for this number (name to text)."""
    ref: Any = attrs.field(default=None, kw_only=True)
    """Yours (a row key, a contact id): it never goes on the wire and comes back as
    the ``ref`` of this recipient's outcome."""


@attrs.frozen
class Fallback:
    """What to send on another channel when RCS cannot deliver (a phone without RCS)."""

    channel: str
    """The other channel: ``"sms"``."""
    content: str
    """The text to send there."""

    @classmethod
    def sms(cls, text: str) -> Fallback:
        """Fall back to an SMS saying *text*."""
        return cls("sms", text)


@attrs.frozen
class ValidMessage:
    """A recipient the service accepted."""

    id: str
    """The message's id, which the service's delivery callbacks call ``reference``."""
    number: str
    """The number as the caller gave it."""
    position: int
    """The recipient's index in the caller's input."""
    ref: Any = None
    """The `Recipient.ref` it was given with (None without one)."""
    session_id: str | None = None
    """The conversational session the service opened (webhook and template sends);
    None for basic and single, or when the answer has none."""


@attrs.frozen
class InvalidMessage:
    """A recipient the service (or local validation) rejected, and why."""

    number: str
    """The number as the caller gave it."""
    reason: str
    """Why: the service's words, or the SDK's for a local refusal (`DUPLICATE_REASON`)."""
    position: int
    """The recipient's index in the caller's input."""
    ref: Any = None
    """The `Recipient.ref` it was given with (None without one)."""


_T = TypeVar("_T")
_S = TypeVar("_S")
#: No recipient of the part had a ``ref``.
NO_REFS: Mapping[int, Any] = {}


class _Outcomes(Sequence[_T], Generic[_T]):
    """A read-only sequence of outcomes over parallel columns, each built on access.

    ``make(a, b, position, ref)`` builds one; *refs* maps input positions to the
    caller's refs (only those given). The columns are packed (``_packed``) by
    `valid_messages` and `invalid_messages`: a million-recipient result holds no object
    per recipient, so it is small and the garbage collector has nothing in it to scan.
    """

    __slots__ = ("_first", "_make", "_positions", "_refs", "_second", "_third")

    def __init__(
        self,
        make: Callable[..., _T],
        first: Sequence[str],
        second: Sequence[str],
        positions: Sequence[int],
        refs: Mapping[int, Any] = NO_REFS,
        third: Sequence[str | None] | None = None,
    ) -> None:
        self._make = make
        self._first = first
        self._second = second
        self._positions = positions
        self._refs = refs
        self._third = third  # an optional last field of each outcome (a session id)

    def __len__(self) -> int:
        return len(self._first)

    @property
    def positions(self) -> Sequence[int]:
        """Each outcome's index in the caller's input; ``positions[i]`` goes with item i."""
        return self._positions

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...
    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        third = self._third
        if isinstance(index, slice):
            return type(self)(
                self._make,
                self._first[index],
                self._second[index],
                self._positions[index],
                self._refs,
                None if third is None else third[index],
            )
        position = self._positions[index]
        ref = self._refs.get(position)
        if third is None:
            return self._make(self._first[index], self._second[index], position, ref)
        return self._make(self._first[index], self._second[index], position, ref, third[index])

    def __iter__(self) -> Iterator[_T]:
        positions = self._positions
        refs = map(self._refs.get, positions) if self._refs else repeat(None)
        if self._third is None:
            return map(self._make, self._first, self._second, positions, refs)
        return map(self._make, self._first, self._second, positions, refs, self._third)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(item) for item in self[:3])
        more = f", ... ({len(self) - 3} more)" if len(self) > 3 else ""
        return f"[{shown}{more}]"


class ValidMessages(_Outcomes[ValidMessage]):
    """``result.valid``: a sequence of ``ValidMessage``, and its columns.

    ``ids``, ``numbers`` and ``positions`` read a chunk's outcomes without building an
    object per recipient (a bulk job's records, say); ``ids[i]`` goes with ``numbers[i]``
    and ``positions[i]``.
    """

    __slots__ = ()

    @property
    def ids(self) -> Sequence[str]:
        """Each message's `ValidMessage.id`."""
        return self._first

    @property
    def numbers(self) -> Sequence[str]:
        """Each message's number, as the caller gave it."""
        return self._second

    @property
    def session_ids(self) -> Sequence[str | None]:
        """Each message's ``session_id`` (None where the answer gave none)."""
        third = self._third
        return third if third is not None else _Nones(len(self._first))


class InvalidMessages(_Outcomes[InvalidMessage]):
    """``result.invalid``: a sequence of ``InvalidMessage``, and its columns."""

    __slots__ = ()

    @property
    def numbers(self) -> Sequence[str]:
        """Each rejected number, as the caller gave it."""
        return self._first

    @property
    def reasons(self) -> Sequence[str]:
        """Each rejection's `InvalidMessage.reason`."""
        return self._second


def valid_messages(
    ids: Sequence[str],
    numbers: Sequence[str],
    positions: Sequence[int],
    refs: Mapping[int, Any] = NO_REFS,
    session_ids: Sequence[str | None] | None = None,
) -> ValidMessages:
    """Accepted recipients as a sequence, from parallel id, number and position columns
    (and session ids: None when no answer gave any)."""
    return ValidMessages(
        ValidMessage,
        pack_ids(ids),
        pack_texts(numbers),
        pack_positions(positions),
        refs,
        None if session_ids is None else pack_sessions(session_ids),
    )


def invalid_messages(
    numbers: Sequence[str],
    reasons: Sequence[str],
    positions: Sequence[int],
    refs: Mapping[int, Any] = NO_REFS,
) -> InvalidMessages:
    """Rejected recipients as a sequence, from parallel number, reason and position columns."""
    return InvalidMessages(
        InvalidMessage, pack_texts(numbers), pack_shared(reasons), pack_positions(positions), refs
    )


class _Nones(View[None]):
    """*length* Nones, holding nothing per item."""

    __slots__ = ()

    def _item(self, index: int) -> None:
        return None

    def __iter__(self) -> Iterator[None]:
        return repeat(None, len(self))

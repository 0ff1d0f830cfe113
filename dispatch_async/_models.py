"""The values callers hand in and get back: recipients, fallbacks and results.

Results hold their accepted and rejected recipients in flat lists and build the
``ValidMessage``/``InvalidMessage`` objects only when they are looked at: a bulk job
accepts millions of recipients and most callers only count them or stream them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

import attrs

from ._exceptions import DispatchError, FailedRecipientsError

__all__ = [
    "DispatchResult",
    "FailedRecipient",
    "Fallback",
    "InvalidMessage",
    "InvalidMessages",
    "Recipient",
    "ValidMessage",
    "ValidMessages",
    "merge_results",
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
    vars: Mapping[str, str] = attrs.field(factory=dict, validator=_check_vars, kw_only=True)


@attrs.frozen
class Fallback:
    """What to send on another channel when the main one fails (spec 2.3)."""

    channel: str
    content: str

    @classmethod
    def sms(cls, text: str) -> Fallback:
        """Fall back to an SMS saying *text*."""
        return cls("sms", text)


@attrs.frozen
class ValidMessage:
    """A recipient the service accepted; ``number`` is as the caller gave it."""

    id: str
    number: str


@attrs.frozen
class InvalidMessage:
    """A recipient the service (or local validation) rejected, and why."""

    number: str
    reason: str


@attrs.frozen
class FailedRecipient:
    """A recipient with no answer from the service.

    ``maybe_sent`` is False only when the service certainly did not act, so the
    recipient is safe to send again.
    """

    recipient: Recipient
    error: DispatchError
    maybe_sent: bool


_T = TypeVar("_T")


class _Pairs(Sequence[_T], Generic[_T]):
    """A read-only sequence of ``make(a, b)`` over two parallel sequences, built on access.

    A chunk's parts hold tuples: once the garbage collector has seen that a tuple holds
    only strings it stops tracking it, where a million-recipient job's lists of ids
    would be scanned again by every older-generation collection until the job ends.
    """

    __slots__ = ("_first", "_make", "_second")

    def __init__(self, make: type[_T], first: Sequence[str], second: Sequence[str]) -> None:
        self._make = make
        self._first = first
        self._second = second

    def __len__(self) -> int:
        return len(self._first)

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...
    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if isinstance(index, slice):
            return type(self)(self._make, self._first[index], self._second[index])
        return self._make(self._first[index], self._second[index])  # type: ignore[call-arg]

    def __iter__(self) -> Iterator[_T]:
        return map(self._make, self._first, self._second)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Pairs):
            # list() because a tuple never equals a list with the same items.
            return (list(self._first), list(self._second)) == (
                list(other._first),
                list(other._second),
            )
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(item) for item in self[:3])
        more = f", ... ({len(self) - 3} more)" if len(self) > 3 else ""
        return f"[{shown}{more}]"


class ValidMessages(_Pairs[ValidMessage]):
    """``result.valid``: a sequence of ``ValidMessage``, and its two columns.

    ``ids`` and ``numbers`` read a chunk's outcomes without building an object per
    recipient (a bulk job's records, say); ``ids[i]`` goes with ``numbers[i]``.
    """

    __slots__ = ()

    @property
    def ids(self) -> Sequence[str]:
        return self._first

    @property
    def numbers(self) -> Sequence[str]:
        return self._second


class InvalidMessages(_Pairs[InvalidMessage]):
    """``result.invalid``: a sequence of ``InvalidMessage``, and its two columns."""

    __slots__ = ()

    @property
    def numbers(self) -> Sequence[str]:
        return self._first

    @property
    def reasons(self) -> Sequence[str]:
        return self._second


def valid_messages(ids: Sequence[str], numbers: Sequence[str]) -> ValidMessages:
    """Accepted recipients as a sequence, from parallel id and number sequences."""
    return ValidMessages(ValidMessage, ids, numbers)


def invalid_messages(numbers: Sequence[str], reasons: Sequence[str]) -> InvalidMessages:
    """Rejected recipients as a sequence, from parallel number and reason sequences."""
    return InvalidMessages(InvalidMessage, numbers, reasons)


@attrs.frozen
class DispatchResult:
    """What happened to every recipient of a call, or of one chunk of it.

    Every input position in ``positions`` is in exactly one of ``valid``, ``invalid``
    and ``failed``. ``unexpected`` holds answer entries that matched no recipient sent.
    """

    positions: range
    valid: Sequence[ValidMessage] = attrs.field(factory=lambda: valid_messages([], []))
    invalid: Sequence[InvalidMessage] = attrs.field(factory=lambda: invalid_messages([], []))
    failed: Sequence[FailedRecipient] = attrs.field(factory=list)
    unexpected: Sequence[Mapping[str, Any]] = attrs.field(factory=list)
    requests: int = 0
    retries: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """How many recipients ended in each outcome."""
        maybe = sum(1 for f in self.failed if f.maybe_sent)
        return {
            "valid": len(self.valid),
            "invalid": len(self.invalid),
            "failed": len(self.failed),
            "maybe_sent": maybe,
            "not_sent": len(self.failed) - maybe,
        }

    @property
    def ok(self) -> bool:
        """True when no recipient failed (rejections are answers, not failures)."""
        return not self.failed

    def summary(self) -> str:
        """One line for a log: the outcome counts of this result."""
        c = self.counts
        return (
            f"{len(self.positions)} recipients: {c['valid']} sent, {c['invalid']} invalid, "
            f"{c['failed']} failed ({c['maybe_sent']} maybe sent, {c['not_sent']} not sent); "
            f"{self.requests} requests, {self.retries} retries"
        )

    def raise_for_failures(self) -> DispatchResult:
        """Raise ``FailedRecipientsError`` if any recipient failed; return self otherwise."""
        if self.failed:
            raise FailedRecipientsError(self)
        return self


def merge_results(
    parts: Iterable[DispatchResult], positions: range | None = None
) -> DispatchResult:
    """Join chunk results, in input order, into one: linear in the number of recipients."""
    ordered = sorted(parts, key=lambda p: p.positions.start)
    ids: list[str] = []
    valid_numbers: list[str] = []
    invalid_numbers: list[str] = []
    reasons: list[str] = []
    failed: list[FailedRecipient] = []
    unexpected: list[Mapping[str, Any]] = []
    requests = retries = 0
    for part in ordered:
        _extend_pairs(part.valid, ids, valid_numbers)
        _extend_pairs(part.invalid, invalid_numbers, reasons)
        failed.extend(part.failed)
        unexpected.extend(part.unexpected)
        requests += part.requests
        retries += part.retries
    if positions is None:
        end = max((p.positions.stop for p in ordered), default=0)
        positions = range(ordered[0].positions.start if ordered else 0, end)
    return DispatchResult(
        positions,
        # Tuples, for the garbage collector (see _Pairs); the copy is a memcpy.
        valid_messages(tuple(ids), tuple(valid_numbers)),
        invalid_messages(tuple(invalid_numbers), tuple(reasons)),
        failed,
        unexpected,
        requests,
        retries,
    )


def _extend_pairs(items: Sequence[Any], first: list[str], second: list[str]) -> None:
    if isinstance(items, _Pairs):
        first.extend(items._first)
        second.extend(items._second)
    else:  # a result built by hand, e.g. in a caller's test
        for item in items:
            a, b = attrs.astuple(item)
            first.append(a)
            second.append(b)

"""The values callers hand in and get back: recipients, fallbacks and results.

Results hold their accepted and rejected recipients in flat columns and build the
``ValidMessage``/``InvalidMessage`` objects only when they are looked at: a bulk job
accepts millions of recipients and most callers only count them or stream them out.
Every outcome knows its recipient's ``position`` in the caller's input and the caller's
``ref`` for it, which never goes on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, Generic, TypeVar, overload

import attrs

from ._columns import Joined
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


@attrs.frozen
class FailedRecipient:
    """A recipient with no answer from the service."""

    recipient: Recipient
    """The recipient, as a `Recipient`, ready to send again."""
    error: DispatchError
    """Why its request got no answer (a `DispatchError`)."""
    maybe_sent: bool
    """False only when the service certainly did not act: the recipient is safe to
    send again. True when it may have acted: sending again may send twice."""
    position: int
    """The recipient's index in the caller's input."""

    @property
    def ref(self) -> Any:
        """The caller's ``Recipient.ref`` for this recipient (None without one)."""
        return self.recipient.ref


_T = TypeVar("_T")
_S = TypeVar("_S")
#: No recipient of the part had a ``ref``.
NO_REFS: Mapping[int, Any] = {}


class _Outcomes(Sequence[_T], Generic[_T]):
    """A read-only sequence of outcomes over parallel columns, each built on access.

    ``make(a, b, position, ref)`` builds one; *refs* maps input positions to the
    caller's refs (only those given). A chunk's parts hold tuples: once the garbage
    collector has seen that a tuple holds only strings it stops tracking it, where a
    million-recipient job's lists of ids would be scanned again by every older-generation
    collection until the job ends.
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
    return ValidMessages(ValidMessage, ids, numbers, positions, refs, session_ids)


def invalid_messages(
    numbers: Sequence[str],
    reasons: Sequence[str],
    positions: Sequence[int],
    refs: Mapping[int, Any] = NO_REFS,
) -> InvalidMessages:
    """Rejected recipients as a sequence, from parallel number, reason and position columns."""
    return InvalidMessages(InvalidMessage, numbers, reasons, positions, refs)


@attrs.frozen
class DispatchResult:
    """What happened to every recipient of a call, or of one chunk of it.

    Every input position in ``positions`` is in exactly one of ``valid``, ``invalid``
    and ``failed``.
    """

    positions: range
    """The input positions this result accounts for (all of a ``send_*`` call's)."""
    valid: Sequence[ValidMessage] = attrs.field(factory=lambda: valid_messages((), (), ()))
    """The recipients the service accepted, in input order (a `ValidMessages`)."""
    invalid: Sequence[InvalidMessage] = attrs.field(factory=lambda: invalid_messages((), (), ()))
    """The recipients rejected, by the service or locally, in input order (an
    `InvalidMessages`)."""
    failed: Sequence[FailedRecipient] = attrs.field(factory=list)
    """The recipients with no answer, in input order; see `FailedRecipient.maybe_sent`."""
    unexpected: Sequence[Mapping[str, Any]] = attrs.field(factory=list)
    """Entries of the service's answers that matched no recipient sent."""
    requests: int = 0
    """Dispatch requests made, retries and re-sends after a refused token included."""
    retries: int = 0
    """Requests re-sent after a failure the retry policy allows."""
    split_to: int | None = None
    """None, unless the server refused a request as too large (HTTP 413, a proxy's
    ``client_max_body_size``): then the most recipients per request the call sent after
    that, a ``chunk_size`` its server takes."""

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
            f"{_counted(len(self.positions), 'recipient')}: {c['valid']} sent, "
            f"{c['invalid']} invalid, {c['failed']} failed ({c['maybe_sent']} maybe sent, "
            f"{c['not_sent']} not sent); {_counted(self.requests, 'request')}, "
            f"{_counted(self.retries, 'retry', 'retries')}"
            + ("" if self.split_to is None else f"; split to {self.split_to} per request")
        )

    def raise_for_failures(self) -> DispatchResult:
        """Raise ``FailedRecipientsError`` if any recipient failed; return self otherwise."""
        if self.failed:
            raise FailedRecipientsError(self)
        return self


def merge_results(parts: Iterable[DispatchResult]) -> DispatchResult:
    """Join chunk results, in input order, into one: linear in the number of recipients.

    The columns are joined lazily (see ``_columns``): merging costs nothing per
    recipient until someone reads them.
    """
    ordered = sorted(parts, key=lambda p: p.positions.start)
    valid = _Columns()
    invalid = _Columns()
    failed: list[FailedRecipient] = []
    unexpected: list[Mapping[str, Any]] = []
    requests = retries = 0
    split_to: int | None = None
    for part in ordered:
        valid.extend(part.valid)
        invalid.extend(part.invalid)
        failed.extend(part.failed)
        unexpected.extend(part.unexpected)
        requests += part.requests
        retries += part.retries
        if part.split_to is not None and (split_to is None or part.split_to < split_to):
            split_to = part.split_to  # the call's smallest: what its last chunks took
    end = max((p.positions.stop for p in ordered), default=0)
    return DispatchResult(
        range(ordered[0].positions.start if ordered else 0, end),
        valid_messages(*valid.columns(), valid.third()),
        invalid_messages(*invalid.columns()),
        failed,
        unexpected,
        requests,
        retries,
        split_to,
    )


class _Columns:
    """The columns of several parts' outcomes, joined lazily for ``merge_results``."""

    def __init__(self) -> None:
        self.first: list[Sequence[str]] = []
        self.second: list[Sequence[str]] = []
        self.positions: list[Sequence[int]] = []
        self.refs: list[Mapping[int, Any]] = []
        self.thirds: list[Sequence[str | None] | None] = []

    def extend(self, items: Sequence[Any]) -> None:
        # The parts are a call's chunk results, built by _matching: always _Outcomes.
        assert isinstance(items, _Outcomes), "a chunk result holds its outcomes as columns"
        if not items:
            return
        self.first.append(items._first)
        self.second.append(items._second)
        self.positions.append(items._positions)
        self.thirds.append(items._third)
        if items._refs and not any(r is items._refs for r in self.refs):
            self.refs.append(items._refs)

    def third(self) -> Sequence[str | None] | None:
        """The parts' last columns joined, None-filled where a part has none; None if none has."""
        if all(third is None for third in self.thirds):
            return None
        return _joined(
            [
                _Nones(len(first)) if third is None else third
                for first, third in zip(self.first, self.thirds, strict=True)
            ]
        )

    def columns(
        self,
    ) -> tuple[Sequence[str], Sequence[str], Sequence[int], Mapping[int, Any]]:
        refs: Mapping[int, Any] = NO_REFS
        if len(self.refs) == 1:
            refs = self.refs[0]  # a list's refs are one mapping shared by its chunks
        elif self.refs:
            refs = {p: r for mapping in self.refs for p, r in mapping.items()}
        return _joined(self.first), _joined(self.second), _joined(self.positions), refs


class _Nones(Sequence[None]):
    """*length* Nones, holding nothing per item."""

    __slots__ = ("_length",)

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> None: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[None]: ...
    def __getitem__(self, index: int | slice) -> Sequence[None] | None:
        if isinstance(index, slice):
            return _Nones(len(range(self._length)[index]))
        range(self._length)[index]  # raises IndexError as a tuple would
        return None

    def __iter__(self) -> Iterator[None]:
        return repeat(None, self._length)


def _joined(parts: list[Sequence[_S]]) -> Sequence[_S]:
    if not parts:
        return ()
    return parts[0] if len(parts) == 1 else Joined(parts)


def _counted(count: int, singular: str, plural: str | None = None) -> str:
    """ "1 request", "2 requests" (the command line has its own: it uses public names only)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"

"""What a call comes to: its result, and the root error, which can carry one.

A result's failed recipients each carry the error that failed them, and an error that
stops a job carries the partial result: one idea, so one module. It stands on the values
a result is made of (`_models`); the rest of the error tree (`_exceptions`, where the
whole tree is drawn) stands on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from ._columns import Joined
from ._models import (
    NO_REFS,
    InvalidMessage,
    Recipient,
    ValidMessage,
    _Nones,
    _Outcomes,
    invalid_messages,
    valid_messages,
)

__all__ = [
    "DispatchError",
    "DispatchResult",
    "FailedRecipient",
    "FailedRecipientsError",
    "merge_results",
]

_S = TypeVar("_S")


class DispatchError(Exception):
    """The root of every error dispatch-async raises."""

    maybe_sent: bool = False
    """Whether the service may have acted on the request that failed: what decides
    whether sending again is safe."""
    result: DispatchResult | None = None
    """The partial result of a ``send_*`` call this error stopped, accounting for every
    recipient read so far; None otherwise."""
    message: str
    """The error's text, without the class name."""

    def __init__(self, message: str, *, maybe_sent: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if maybe_sent is not None:
            self.maybe_sent = maybe_sent


class FailedRecipientsError(DispatchError):
    """``raise_for_failures()`` found recipients in ``failed``; ``result`` has them all."""

    def __init__(self, result: DispatchResult) -> None:
        failed = result.failed
        maybe = sum(1 for f in failed if f.maybe_sent)
        super().__init__(
            f"{len(failed)} recipient(s) failed ({maybe} may have been sent)",
            maybe_sent=maybe > 0,
        )
        self.result = result


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


def _joined(parts: list[Sequence[_S]]) -> Sequence[_S]:
    if not parts:
        return ()
    return parts[0] if len(parts) == 1 else Joined(parts)


def _counted(count: int, singular: str, plural: str | None = None) -> str:
    """ "1 request", "2 requests" (the command line has its own: it uses public names only)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"

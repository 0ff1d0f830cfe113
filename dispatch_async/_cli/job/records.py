"""The output records, one JSON line per input line, and the one place outcomes meet rows.

A record is ``{"line", "number", "outcome", ...}``: ``sent`` with the service's ``id``
(and ``sent_as``, the number put on the wire, when ``--prevalidate`` rewrote it;
``"confirmed_by": "callback"`` when ``callbacks reconcile`` made it from a ``maybe_sent`` one),
``invalid`` with its ``reason`` (and a ``detail`` for rows refused here), ``not_sent`` or
``maybe_sent`` with the ``error`` and its ``error_type`` (a ``maybe_sent`` one with
``sent_as`` too: its callbacks carry that number). Records are written from
templates, each string through orjson: a job writes one per recipient, and a dict per
record cost more than the whole request.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from operator import attrgetter

import orjson

import dispatch_async as da

from ..reading.input import MALFORMED, Row
from ..screen.outcomes import Failure

__all__ = [
    "CALLBACK",
    "SHOWN_MALFORMED",
    "failed_record",
    "invalid_record",
    "malformed_note",
    "malformed_record",
    "part_records",
    "sent_record",
]

#: The ``confirmed_by`` of a ``sent`` record a callback confirmed (``callbacks reconcile``).
CALLBACK = "callback"
#: How many malformed rows a run names on stderr before it only counts them.
SHOWN_MALFORMED = 10

_dumps = orjson.dumps
_SENT = b'{"line":%d,"number":%b,"outcome":"sent","id":%b}'
_SENT_AS = b'{"line":%d,"number":%b,"outcome":"sent","id":%b,"sent_as":%b}'
_INVALID = b'{"line":%d,"number":%b,"outcome":"invalid","reason":%b}'
_INVALID_DETAIL = b'{"line":%d,"number":%b,"outcome":"invalid","reason":%b,"detail":%b}'
_FAILED = b'{"line":%d,"number":%b,"outcome":"%b","error":%b,"error_type":%b}'


def sent_record(
    line: int,
    number: str,
    message_id: str,
    wire: Callable[[str], str] | None = None,
    *,
    confirmed_by: str | None = None,
) -> bytes:
    """The record of a recipient the service accepted.

    *wire* gives the number as sent (``--prevalidate``'s E.164): a record whose number
    was rewritten says ``"sent_as"``. A number already in E.164 is not parsed again.
    *confirmed_by*: what showed it was sent, when the answer did not (``CALLBACK``).
    """
    sent = _rewritten(number, wire)
    if sent is not None:
        record = _SENT_AS % (line, _dumps(number), _dumps(message_id), _dumps(sent))
    else:
        record = _SENT % (line, _dumps(number), _dumps(message_id))
    if confirmed_by is not None:
        record = record[:-1] + b',"confirmed_by":' + _dumps(confirmed_by) + b"}"
    return record


def _rewritten(number: str | None, wire: Callable[[str], str] | None) -> str | None:
    """The number as *wire* sent it when that differs from *number*, else None."""
    if wire is None or not number or (number[:1] == "+" and number[1:].isdigit()):
        return None
    sent = wire(number)
    return sent if sent != number else None


def invalid_record(line: int, number: str | None, reason: str, detail: str | None = None) -> bytes:
    """The record of a recipient rejected (by the service, or here with *detail*)."""
    if detail is None:
        return _INVALID % (line, _dumps(number), _dumps(reason))
    return _INVALID_DETAIL % (line, _dumps(number), _dumps(reason), _dumps(detail))


def malformed_record(row: Row) -> bytes:
    """The record of an input row that cannot be a recipient: ``invalid``, with why."""
    return invalid_record(row.line, row.number, MALFORMED, row.problem)


def malformed_note(row: Row) -> str:
    """What a person is told of a malformed row, on stderr."""
    return f"line {row.line}: {MALFORMED}: {row.problem}"


def failed_record(
    line: int,
    number: str | None,
    *,
    maybe_sent: bool,
    error: str,
    error_type: str,
    wire: Callable[[str], str] | None = None,
    since: str | None = None,
) -> bytes:
    """The record of a recipient with no answer: ``maybe_sent`` or ``not_sent``.

    *wire*: see ``sent_record``; a ``maybe_sent`` record says ``"sent_as"`` too, the
    number its callbacks would carry, and ``"since"``, when the run that may have sent
    it started (*since*, ISO 8601): callbacks from before it are not its.
    """
    outcome = b"maybe_sent" if maybe_sent else b"not_sent"
    record = _FAILED % (line, _dumps(number), outcome, _dumps(error), _dumps(error_type))
    if not maybe_sent:
        return record
    sent = _rewritten(number, wire)
    if sent is not None:
        record = record[:-1] + b',"sent_as":' + _dumps(sent) + b"}"
    if since is not None:
        record = record[:-1] + b',"since":' + _dumps(since) + b"}"
    return record


Explain = Callable[[da.DispatchError], tuple[str, str]]


def _as_is(error: da.DispatchError) -> tuple[str, str]:
    return str(error), type(error).__name__


def part_records(
    rows: Sequence[Row],
    part: da.DispatchResult,
    explain: Explain = _as_is,
    wire: Callable[[str], str] | None = None,
    failures: list[Failure] | None = None,
    since: str | None = None,
) -> tuple[list[bytes], Counter[str]]:
    """One record per row of *part* (its sendable rows, in input order), and the counts.

    The SDK names each outcome by the number as given; a number can stand on several
    rows (with other vars), so repeats are matched in input order. A row the part does
    not mention (the SDK accounts for every one: this is a bug guard) is ``maybe_sent``.
    *wire*: see ``sent_record``, *since*: ``failed_record``. *failures* gets each row
    the service failed on.
    """
    if not part.failed and wire is None:
        quick = _column_records(rows, part.valid, part.invalid)
        if quick is not None:
            return quick
    take = _Taker(rows)
    records: list[bytes] = []
    append = records.append
    counts: Counter[str] = Counter()
    for valid in part.valid:
        if (at := take(valid.number)) is not None:
            append(sent_record(rows[at].line, valid.number, valid.id, wire))
            counts["sent"] += 1
    for invalid in part.invalid:
        if (at := take(invalid.number)) is not None:
            append(_INVALID % (rows[at].line, _dumps(invalid.number), _dumps(invalid.reason)))
            counts["invalid"] += 1
    for failure in part.failed:
        number = failure.recipient.number
        if (at := take(number)) is not None:
            error, kind = explain(failure.error)
            maybe = failure.maybe_sent
            line = rows[at].line
            append(
                failed_record(
                    line,
                    number,
                    maybe_sent=maybe,
                    error=error,
                    error_type=kind,
                    wire=wire,
                    since=since,
                )
            )
            counts["maybe_sent" if maybe else "not_sent"] += 1
            if failures is not None:
                failures.append((line, maybe, error, kind))
    left = (
        [] if counts.total() == len(rows) else [r for at, r in enumerate(rows) if take.untaken(at)]
    )
    for row in left:
        append(
            failed_record(
                row.line,
                row.number,
                maybe_sent=True,
                error="the SDK gave no outcome for this row",
                error_type="Interrupted",
                wire=wire,
                since=since,
            )
        )
    counts["maybe_sent"] += len(left)
    return records, counts


def _column_records(
    rows: Sequence[Row], valid: object, invalid: object
) -> tuple[list[bytes], Counter[str]] | None:
    """The records of a part answered whole, its numbers each on one row; else None.

    Straight from the result's columns: no outcome object and no Python loop per row.
    """
    if not isinstance(valid, da.ValidMessages) or not isinstance(invalid, da.InvalidMessages):
        return None
    line_of = dict(zip(map(_NUMBER, rows), map(_LINE, rows), strict=True))
    if len(line_of) != len(rows) or len(valid) + len(invalid) != len(rows):
        return None
    try:
        sent_lines = list(map(line_of.pop, valid.numbers))
        invalid_lines = list(map(line_of.pop, invalid.numbers))
    except KeyError:
        return None
    numbers = map(_dumps, valid.numbers)
    ids = map(_dumps, valid.ids)
    records = list(map(_SENT.__mod__, zip(sent_lines, numbers, ids, strict=True)))
    numbers = map(_dumps, invalid.numbers)
    reasons = map(_dumps, invalid.reasons)
    records += map(_INVALID.__mod__, zip(invalid_lines, numbers, reasons, strict=True))
    return records, Counter(sent=len(sent_lines), invalid=len(invalid_lines))


_NUMBER = attrgetter("number")
_LINE = attrgetter("line")


class _Taker:
    """Hands out each row's index once, by number, in input order."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self._taken = bytearray(len(rows))
        numbers = [row.number for row in rows]
        index = dict(zip(numbers, range(len(rows)), strict=True))
        self._unique = index if len(index) == len(rows) else None
        self._queues: dict[str | None, deque[int]] = {}
        if self._unique is None:
            for at, number in enumerate(numbers):
                self._queues.setdefault(number, deque()).append(at)

    def __call__(self, number: str) -> int | None:
        if self._unique is not None:
            at = self._unique.pop(number, None)
        else:
            queue = self._queues.get(number)
            at = queue.popleft() if queue else None
        if at is not None:
            self._taken[at] = 1
        return at

    def untaken(self, at: int) -> bool:
        return not self._taken[at]

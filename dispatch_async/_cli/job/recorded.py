"""What a job's output said when a run started, line by line: what to skip or redo.

Built by ``JobFiles`` from the output and its journal (see ``journal``); read by the
``Source`` for every input row.
"""

from __future__ import annotations

import re
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs
import orjson

import dispatch_async as da

from ..reading.rows import MALFORMED
from ..screen.outcomes import OUTCOMES
from ..screen.problem import Problem

__all__ = ["Recorded", "fingerprint", "fingerprints", "new_record"]

#: A line's state: no record; a record that stays; maybe sent by a run that died; to do
#: again (not_sent, or maybe_sent with --resend-maybe-sent); a malformed row, read again.
_NONE, _DONE, _PENDING, _REDO, _MALFORMED = 0, 1, 2, 3, 4
_MARK_PENDING = bytes.maketrans(bytes([_NONE]), bytes([_PENDING]))
_PENDING_RUNS = re.compile(re.escape(bytes([_PENDING])) + b"+")
_NO_RECORD = re.compile(re.escape(bytes([_NONE])) + b"+")
_CHECKED = (_DONE, _PENDING)  # lines whose number is known: the input must still hold it
#: Reasons of rows never offered to the service: their numbers were not "seen" by dedupe.
_NOT_TRIED = (da.DUPLICATE_REASON, da.EXCLUDED_REASON)


def fingerprint(number: str | None) -> int:
    """What a record or the journal keeps of a line's number, to tell it changed (0: none).

    The CRC-32 of its UTF-8 (lone surrogates, from bytes that were not UTF-8, included):
    the same number gives the same value on every run and machine.
    """
    return 0 if number is None else zlib.crc32(number.encode("utf-8", "surrogatepass"))


def fingerprints(numbers: list[str]) -> array[int]:
    """``fingerprint`` of each of *numbers*, with one encode for all (every chunk pays it)."""
    encoded = "\n".join(numbers).encode("utf-8", "surrogatepass").split(b"\n")
    if len(encoded) != len(numbers):  # a number with a line break in it (a quoted cell)
        return array("I", map(fingerprint, numbers))
    return array("I", map(zlib.crc32, encoded))


@attrs.define
class Recorded:
    """What the output said, line by line, when the job started; empty for a new job.

    ``kept`` counts the records kept per outcome; their lines are skipped. ``redo``
    counts the records dropped to do their line again: ``not_sent``, ``malformed``
    (read again: a row fixed since is sent) and ``maybe_sent`` (``--resend-maybe-sent``).
    ``seen``
    holds the numbers those records sent or tried (for ``--dedupe`` across runs).
    ``crcs`` holds the fingerprint of the number each recorded or journaled line held
    (0: not known), which the input must still hold there. ``since`` holds when the run
    that may have sent a line left maybe sent started (the earliest, if several may
    have), where the journal or the record says.
    """

    resend_maybe_sent: bool = False
    status: bytearray = attrs.field(factory=bytearray)
    crcs: array[int] = attrs.field(factory=lambda: array("I"))
    kept: Counter[str] = attrs.field(factory=Counter)
    seen: set[str] | None = None
    #: No input line is above this (see ``line_bound``); a record beyond it is corrupt.
    max_line: int = 0
    #: The form ``seen`` holds (the one dedupe compares), applied to what is loaded back.
    canonical: Callable[[str], str] | None = None
    redo: Counter[str] = attrs.field(factory=Counter)
    since: dict[int, str] = attrs.field(factory=dict)
    duplicates: int = 0
    torn: bool = False

    def is_done(self, line: int) -> bool:
        """Whether *line* has a record that stays: skip it."""
        return line < len(self.status) and self.status[line] == _DONE

    def is_pending(self, line: int) -> bool:
        """Whether *line* was maybe sent by a run that died, and must not be sent again."""
        return (
            not self.resend_maybe_sent and line < len(self.status) and self.status[line] == _PENDING
        )

    def was_malformed(self, line: int) -> bool:
        """Whether *line* was a malformed row when an earlier run read it."""
        return line < len(self.status) and self.status[line] == _MALFORMED

    def holds(self, line: int, number: str | None) -> bool:
        """Whether *line* may hold *number*: the one its kept record names, or (a line a
        stopped run may have sent) the one the journal fingerprinted.

        A line to send (never sent, or again) may hold anything, and so may a line whose
        number is not known: a record without one (written by hand), a journal from
        before fingerprints.
        """
        if line >= len(self.status) or self.status[line] not in _CHECKED:
            return True
        stored = self.crcs[line]
        return stored == 0 or stored == fingerprint(number)

    @property
    def last_checked(self) -> int:
        """The last line that ``holds`` checks (0: none)."""
        return max(0, *(self.status.rfind(bytes([status])) for status in _CHECKED))

    @property
    def done_lines(self) -> int:
        """Lines whose record stays: skipped by this run."""
        return sum(self.kept.values())

    @property
    def recorded_lines(self) -> int:
        """Lines the earlier runs recorded: kept, and dropped to do again."""
        return self.done_lines + self.redo.total()

    @property
    def pending_lines(self) -> int:
        """Lines maybe sent by a run that died, with no record."""
        return self.status.count(_PENDING)

    def _grow(self, line: int) -> None:
        if line >= len(self.status):
            more = max(line + 1 - len(self.status), len(self.status))
            self.status.extend(bytes(more))
            self.crcs.extend(array("I", bytes(4 * more)))

    def _add(self, raw: bytes, where: str) -> bool:
        """Take in one output record; True if it is kept."""
        try:
            record = orjson.loads(raw)
            line = record["line"]
            outcome = record["outcome"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise Problem(
                f"{where} is not a dispatch-async record; fix or delete that line, then resume"
            ) from None
        if type(line) is not int or line < 1 or outcome not in OUTCOMES:
            raise Problem(f"{where} has no valid line and outcome; fix or delete it")
        if line > self.max_line:
            raise Problem(
                f"{where} names line {line:,}, but the input has at most {self.max_line:,} "
                "lines: it is not an output of this input; fix or delete it"
            )
        number = record.get("number")
        number = number if type(number) is str else None
        reason = record.get("reason")
        self._grow(line)
        if self.status[line] != _NONE:
            self.duplicates += 1
            return False
        if outcome == "not_sent":
            self.status[line] = _REDO
            self.redo["not_sent"] += 1
            return False
        if outcome == "invalid" and reason == MALFORMED:
            self.status[line] = _MALFORMED
            self.redo["malformed"] += 1
            return False
        self.crcs[line] = fingerprint(number)
        if outcome == "maybe_sent" and self.resend_maybe_sent:
            # Still "maybe sent" in the journal until a run reaches the line again.
            self.status[line] = _PENDING
            if type(since := record.get("since")) is str:
                self.since[line] = since
            self.redo["maybe_sent"] += 1
            return False
        self.status[line] = _DONE
        if (
            number is not None
            and self.seen is not None
            and not (outcome == "invalid" and reason in _NOT_TRIED)
        ):
            self.seen.add(self.canonical(number) if self.canonical else number)
        self.kept[outcome] += 1
        return True

    def _mark_pending(
        self, runs: Iterable[tuple[int, int, array[int] | None, str | None]], where: Path
    ) -> None:
        """Mark the journal's lines maybe sent, with the fingerprints it has for them and
        their run's start (a line already maybe sent keeps its earlier one)."""
        for first, last, crcs, since in runs:
            if not 1 <= first <= last <= self.max_line:
                raise Problem(
                    f"{where} has the range {first:,}-{last:,}, but the input has at most "
                    f"{self.max_line:,} lines: it is not a journal of this input; "
                    "fix or delete it"
                )
            self._grow(last)
            if since is not None:
                # Only lines with no record: usually none, of a long-finished chunk's.
                for found in _NO_RECORD.finditer(self.status, first, last + 1):
                    self.since.update(dict.fromkeys(range(found.start(), found.end()), since))
            self.status[first : last + 1] = self.status[first : last + 1].translate(_MARK_PENDING)
            if crcs is not None:
                self.crcs[first : last + 1] = crcs

    def pending_ranges(self) -> list[tuple[int, int, str | None]]:
        """Runs of lines that are maybe sent and have no record, with one run's start, as
        (first, last, since)."""
        ranges = []
        for found in _PENDING_RUNS.finditer(self.status):
            first = found.start()
            for line in range(first + 1, found.end() + 1):
                if line == found.end() or self.since.get(line) != self.since.get(first):
                    ranges.append((first, line - 1, self.since.get(first)))
                    first = line
        return ranges


def new_record(
    resend_maybe_sent: bool, dedupe: Callable[[str], str] | None, max_line: int
) -> Recorded:
    """What a job starts from before reading its output (all of a new job)."""
    if dedupe is None:
        return Recorded(resend_maybe_sent, max_line=max_line)
    return Recorded(resend_maybe_sent, seen=set(), canonical=dedupe, max_line=max_line)

"""Reading the input against what earlier runs recorded: what each row becomes.

A row is skipped (already recorded), settled at once (malformed, maybe sent by a run
that died, a duplicate of a number sent before) or handed on to be sent. The source
runs in a worker thread, so a slow stdin never stalls the event loop. The job's ``--exclude``
list is loaded here too (``load_exclude``): the reading wing reads it, the job says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

import dispatch_async as da

from ..reading.exclude import ExcludeList
from ..reading.input import InputProblem, Row, Rows, UnreadableInput, is_regular_file
from ..screen.problem import Problem
from .journal import Recorded
from .records import failed_record, invalid_record, malformed_record
from .spec import InputSpec, JobSpec

__all__ = ["Reading", "Source", "changed_line", "check_input", "load_exclude"]


@attrs.define
class Reading:
    """What one read gave: rows to send (at most a chunk) and lines settled at once.

    ``malformed`` are the rows found malformed by this run; ``again`` counts those an
    earlier run had recorded malformed already (recorded again, not told again).
    ``empty`` counts rows with every field empty: no record.
    """

    rows: list[Row] = attrs.field(factory=list)
    records: list[bytes] = attrs.field(factory=list)
    malformed: list[Row] = attrs.field(factory=list)
    again: int = 0
    empty: int = 0
    interrupted: int = 0
    duplicates: int = 0
    excluded: int = 0
    skipped: int = 0
    end: bool = False


class Source:
    """Reads rows and applies what earlier runs recorded; called from a worker thread.

    *exclude*: numbers never to send; their rows are settled ``invalid``, excluded.
    *wire*: the number as the job sends it (``sent_as``), which a ``maybe_sent`` record
    keeps for the callbacks.
    """

    def __init__(
        self,
        rows: Rows,
        recorded: Recorded,
        output: Path | None,
        exclude: ExcludeList | None = None,
        wire: Callable[[str], str] | None = None,
    ) -> None:
        self._input = rows
        self._wire = wire
        self._rows: Iterator[Row] = iter(rows)
        self._recorded = recorded
        self._output = output
        self._exclude = exclude
        self.last_line = 0

    def read(self, size: int) -> Reading:
        """Up to *size* rows to send; also stops after many settled lines, to stay small."""
        empty = self._input.empty
        batch = self._read(size)
        batch.empty = self._input.empty - empty
        if self._exclude is not None and batch.rows:
            _drop_excluded(batch, self._exclude)
        return batch

    def _read(self, size: int) -> Reading:
        batch = Reading()
        recorded = self._recorded
        if not recorded.status and recorded.seen is None:
            return self._read_fresh(size, batch)
        seen = recorded.seen
        key = recorded.canonical
        send = batch.rows
        settled = batch.records
        limit = max(size, 1000) * 4
        for row in self._rows:
            line = row.line
            self.last_line = line
            if not recorded.holds(line, row.number):
                raise changed_line(line, recorded, self._output)
            if recorded.is_done(line):
                batch.skipped += 1
            elif row.message is None:
                settled.append(malformed_record(row))
                if recorded.was_malformed(line):
                    batch.again += 1
                else:
                    batch.malformed.append(row)
            elif recorded.is_pending(line):
                settled.append(
                    failed_record(
                        line,
                        row.number,
                        maybe_sent=True,
                        error="a previous run was killed while this line may have been in "
                        "flight; --resend-maybe-sent sends it again",
                        error_type="Interrupted",
                        # What callbacks reconcile matches: the number as sent, and
                        # callbacks no older than the run that may have sent it.
                        wire=self._wire,
                        since=recorded.since.get(line),
                    )
                )
                batch.interrupted += 1
                if seen is not None and key is not None:
                    # Maybe sent: a later row with its number is a duplicate.
                    seen.add(key(row.message["number"]))
            elif seen is not None and key is not None and key(row.message["number"]) in seen:
                settled.append(invalid_record(line, row.number, da.DUPLICATE_REASON))
                batch.duplicates += 1
            else:
                send.append(row)
                if len(send) == size:
                    return batch
            if len(settled) >= limit or batch.skipped >= limit:
                return batch
        batch.end = True
        return batch

    def _read_fresh(self, size: int, batch: Reading) -> Reading:
        """``read`` for a job with nothing recorded yet: only malformed rows are settled."""
        send = batch.rows
        append = send.append
        settled = batch.records
        limit = max(size, 1000) * 4
        line = self.last_line
        for row in self._rows:
            line = row.line
            if row.message is not None:
                append(row)
                if len(send) == size:
                    break
            else:
                settled.append(malformed_record(row))
                batch.malformed.append(row)
                if len(settled) >= limit:
                    break
        else:
            batch.end = True
        self.last_line = line
        return batch


def _drop_excluded(batch: Reading, exclude: ExcludeList) -> None:
    """Settle the rows of *batch* whose number *exclude* holds: recorded, never sent."""
    numbers = [row.message["number"] for row in batch.rows]  # type: ignore[index]
    found = exclude.among(numbers)
    if not found:
        return
    kept = []
    for row, number in zip(batch.rows, numbers, strict=True):
        if number in found:
            batch.records.append(invalid_record(row.line, row.number, da.EXCLUDED_REASON))
            batch.excluded += 1
        else:
            kept.append(row)
    batch.rows = kept


def check_input(spec: InputSpec, recorded: Recorded, output: Path | None) -> None:
    """Refuse an input whose recorded or journaled lines no longer hold their numbers.

    Read once through before a resume sends anything: ``Source`` checks each row as it
    reads it too, but by then rows before the changed line may have been sent (a deleted
    row moves a row the service may have had onto a line to send again). Stdin or a pipe
    cannot be read twice: only ``Source`` checks them. A record the CSV reader cannot
    read ends the check: the run stops there as well.

    Raises:
        Problem: names the first line that changed.
    """
    last = recorded.last_checked
    if not last or not is_regular_file(spec.path):
        return
    rows = spec.open()
    try:
        for row in rows:
            if row.line > last:
                return
            if not recorded.holds(row.line, row.number):
                raise changed_line(row.line, recorded, output)
    except UnreadableInput:
        return
    finally:
        rows.close()


def changed_line(line: int, recorded: Recorded, output: Path | None) -> Problem:
    """The refusal of an input whose *line* is not what the job recorded or journaled."""
    what = (
        f"the recipient {output} recorded for it"
        if recorded.is_done(line)
        else "the recipient a run that was stopped may have sent from it"
    )
    return Problem(
        f"line {line} of the input is not {what}: the input changed since the job started. "
        "Resume with the input as it was (new rows go at its end, or into a new job)"
    )


async def load_exclude(spec: JobSpec) -> ExcludeList | None:
    """The job's ``--exclude`` list, read in a worker thread (None without one)."""
    if spec.exclude is None:
        return None
    column, region = spec.input.number_column, spec.settings.region
    try:
        return await asyncio.to_thread(ExcludeList, spec.exclude, column, region)
    except (InputProblem, da.DispatchError) as exc:  # DispatchError: without phonenumbers
        raise Problem(str(exc)) from None
    except OSError as exc:
        raise Problem(f"cannot read --exclude {spec.exclude}: {exc.strerror}") from None

"""``send --dry-run``: the input read and checked, the chunk plan printed, nothing sent.

The rows go through the same ``Source`` as a send (so a resume's skipped and settled
lines count the same) and then through the SDK's own dry run, ``dispatch_async.plan``,
which chunks and screens them exactly as the send would.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from typing import Any, TextIO

import attrs

import dispatch_async as da

from ..reading.input import InputProblem, Row, Rows, line_bound
from ..screen.problem import FAILED, OK, Problem
from ..screen.words import counted
from .journal import JobFiles, new_record
from .records import SHOWN_MALFORMED, malformed_note
from .source import Source, load_exclude
from .spec import JobSpec, dedupe_key

__all__ = ["run_plan"]

_SCREENS = {da.DUPLICATE_REASON: "--dedupe"}

#: How many chunks are listed first.
_SHOWN_CHUNKS = 5


@attrs.define
class _Count:
    rows: int = 0
    malformed: int = 0
    #: Malformed in an earlier run too: counted, not named again.
    again: int = 0
    interrupted: int = 0
    duplicates: int = 0
    excluded: int = 0
    skipped: int = 0


async def run_plan(spec: JobSpec, out: TextIO) -> int:
    """Read and check the input, print the chunk plan; send and write nothing."""
    rows = spec.input.open()
    exclude = None
    try:
        exclude = await load_exclude(spec)
        dedupe = dedupe_key(spec.settings)
        max_line = line_bound(spec.input.path)
        recorded = new_record(spec.resend_maybe_sent, dedupe, max_line)
        if spec.resume and spec.output is not None:
            try:
                recorded = JobFiles(spec.output, max_line=max_line).inspect(
                    resend_maybe_sent=spec.resend_maybe_sent, dedupe=dedupe
                )
            except OSError as exc:
                raise Problem(str(exc)) from None
        try:
            return await _plan(spec, rows, Source(rows, recorded, spec.output, exclude), out)
        except InputProblem as exc:
            raise Problem(str(exc), FAILED) from None
        except da.DispatchError as exc:
            raise Problem(str(exc)) from None
    finally:
        rows.close()
        if exclude is not None:
            exclude.close()


async def _plan(spec: JobSpec, rows: Rows, source: Source, out: TextIO) -> int:
    settings = spec.settings
    err = spec.display.err
    count = _Count()
    read: deque[Row] = deque()  # the row of each position read and not yet planned

    def messages() -> Iterator[dict[str, Any]]:
        while True:
            reading = source.read(settings.chunk_size)
            count.skipped += reading.skipped
            count.interrupted += reading.interrupted
            count.duplicates += reading.duplicates
            count.excluded += reading.excluded
            count.again += reading.again
            for row in reading.malformed:
                count.malformed += 1
                if count.malformed <= SHOWN_MALFORMED:
                    print(malformed_note(row), file=err)
            count.rows += len(reading.rows)
            for row in reading.rows:
                read.append(row)
                yield row.message  # type: ignore[misc]
            if reading.end:
                return

    chunks: list[tuple[int, int, int]] = []
    last: tuple[int, int, int] | None = None
    planned = 0
    refused: Counter[str] = Counter()
    example: Row | None = None  # the first row sent: not one the screening refuses
    first_refused: tuple[Row, str] | None = None
    async for chunk in da.plan(messages(), **settings.options()):
        planned_rows = [read.popleft() for _ in chunk.positions]
        span = [row.line for row in planned_rows]
        refused.update(invalid.reason for invalid in chunk.refused)
        if example is None or (first_refused is None and chunk.refused):
            example, first_refused = _examples(chunk, planned_rows, example, first_refused)
        planned += 1
        last = (len(chunk.numbers), span[0], span[-1])
        if len(chunks) < _SHOWN_CHUNKS:
            chunks.append(last)
    report = [f"{spec.display.title} --dry-run ({spec.target.describe()}): nothing is sent"]
    report.append(f"input: {spec.input.path}{_layout(rows)}")
    report += _table(_counts(spec, count, refused, rows.empty))
    given, most = spec.connection.rate, spec.connection.max_rate
    if given == "auto":
        rate = ", at a rate learned from the service's 429s"
        rate += f" (at most {most:g} requests/s)" if most else ""
    else:
        rate = f", at most {given:g} requests/s" if given else ""
    report.append(
        f"plan: {counted(planned, 'chunk')} of up to {counted(settings.chunk_size, 'recipient')}, "
        f"{settings.concurrency} in flight at a time{rate}"
    )
    for index, (size, first, end) in enumerate(chunks, 1):
        report.append(f"  chunk {index}: {counted(size, 'recipient')}, {_lines(first, end)}")
    if planned > len(chunks) and last is not None:
        if planned > len(chunks) + 1:
            report.append(f"  ... {counted(planned - len(chunks) - 1, 'more chunk')} ...")
        size, first, end = last
        report.append(f"  chunk {planned}: {counted(size, 'recipient')}, {_lines(first, end)}")
    report += _variables(rows, example)
    if first_refused is not None:
        row, reason = first_refused
        report.append(
            f"first refused, line {row.line:,}: number {_cut(row.number or '')}: {reason}"
        )
    print("\n".join(report), file=out)
    return OK


def _examples(
    chunk: da.PlannedChunk,
    rows: list[Row],
    example: Row | None,
    first_refused: tuple[Row, str] | None,
) -> tuple[Row | None, tuple[Row, str] | None]:
    """The first row sent and the first refused (with why), looking into one more chunk."""
    reasons = {invalid.position: invalid.reason for invalid in chunk.refused}
    for position, row in zip(chunk.positions, rows, strict=True):
        reason = reasons.get(position)
        if reason is None:
            example = example or row
        elif first_refused is None:
            first_refused = (row, reason)
    return example, first_refused


def _counts(
    spec: JobSpec, count: _Count, refused: Counter[str], empty: int
) -> list[tuple[str, int, str]]:
    """What becomes of every input row, one reason a line: (what, how many, why)."""
    table = [("to send", count.rows - refused.total(), "")]
    if count.malformed or count.again:
        malformed = count.malformed + count.again
        table.append(("refused: malformed input row", malformed, "recorded invalid"))
    for reason, number in sorted(refused.items(), key=lambda item: (-item[1], item[0])):
        screen = _SCREENS.get(reason, "--prevalidate")
        table.append((f"refused: {reason}", number, f"{screen}; recorded invalid"))
    if count.duplicates:
        table.append(("refused: sent by an earlier run", count.duplicates, "--dedupe"))
    if count.excluded:
        table.append(
            (f"refused: {da.EXCLUDED_REASON}", count.excluded, "--exclude; recorded invalid")
        )
    if spec.resume:
        table.append(("already recorded", count.skipped, f"in {spec.output}; skipped"))
    if count.interrupted:
        table.append(
            ("maybe sent by a killed run", count.interrupted, "recorded maybe_sent, not sent")
        )
    if empty:
        table.append(("empty rows", empty, "every field empty; no record"))
    return table


def _table(counts: list[tuple[str, int, str]]) -> list[str]:
    total = sum(number for _, number, _ in counts)
    rows = [(what, f"{number:,}", why) for what, number, why in counts]
    rows.append(("total", f"{total:,}", ""))
    left = max(len(what) for what, _, _ in rows)
    right = max(len(number) for _, number, _ in rows)
    return [
        f"  {what.ljust(left)}  {number.rjust(right)}" + (f"  ({why})" if why else "")
        for what, number, why in rows
    ]


def _lines(first: int, end: int) -> str:
    return f"line {first:,}" if first == end else f"lines {first:,}-{end:,}"


def _layout(rows: Rows) -> str:
    layout = rows.layout
    if layout is None:
        return f" ({rows.kind.upper()})"
    return (
        f" (CSV, {layout.encoding.describe()}, separator {layout.separator}, "
        f"{counted(len(layout.names), 'column')})"
    )


def _variables(rows: Rows, example: Row | None) -> list[str]:
    """The vars every recipient carries, and the first row sent as an example (never one
    the screening refuses: that one is told apart, with why).

    The example shows a number: this report is for the person who asked, on stdout,
    never logged.
    """
    if rows.variables is None:
        shown = ["vars: as each line gives them"]
    elif not rows.variables:
        shown = ["vars: none"]
    else:
        named = ", ".join(
            var if var == column else f"{var} (column {column!r})" for var, column in rows.variables
        )
        shown = [f"vars: {named}"]
    if example is not None and example.message is not None:
        cells = [f"number {_cut(example.message['number'])}"]
        cells += [f"{var} {_cut(value)}" for var, value in example.message["vars"].items()]
        shown.append(f"example, line {example.line:,}: {', '.join(cells)}")
    return shown


def _cut(value: str, most: int = 40) -> str:
    return repr(value if len(value) <= most else value[: most - 3] + "...")

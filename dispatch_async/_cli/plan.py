"""``send --dry-run``: the input read and checked, the chunk plan printed, nothing sent.

The rows go through the same ``Source`` as a send (so a resume's skipped and settled
lines count the same) and then through the SDK's own dry run, ``dispatch_async.plan``,
which chunks and screens them exactly as the send would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, TextIO

import attrs

import dispatch_async as da

from .input import InputProblem, line_bound
from .journal import JobFiles, new_record
from .records import SHOWN_MALFORMED, malformed_note
from .source import Source
from .spec import FAILED, OK, JobSpec, Problem, dedupe_key

__all__ = ["run_plan"]

#: How many chunks are listed first.
_SHOWN_CHUNKS = 5


@attrs.define
class _Count:
    rows: int = 0
    malformed: int = 0
    interrupted: int = 0
    duplicates: int = 0
    skipped: int = 0


async def run_plan(spec: JobSpec, out: TextIO) -> int:
    """Read and check the input, print the chunk plan; send and write nothing."""
    rows = spec.input.open()
    try:
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
            return await _plan(spec, Source(rows, recorded, spec.output), out)
        except InputProblem as exc:
            raise Problem(str(exc), FAILED) from None
        except da.DispatchError as exc:
            raise Problem(str(exc)) from None
    finally:
        rows.close()


async def _plan(spec: JobSpec, source: Source, out: TextIO) -> int:
    settings = spec.settings
    err = spec.display.err
    count = _Count()
    lines: deque[int] = deque()  # the input line of each position read and not yet planned

    def messages() -> Iterator[dict[str, Any]]:
        while True:
            reading = source.read(settings.chunk_size)
            count.skipped += reading.skipped
            count.interrupted += reading.interrupted
            count.duplicates += reading.duplicates
            for row in reading.malformed:
                count.malformed += 1
                if count.malformed <= SHOWN_MALFORMED:
                    print(malformed_note(row), file=err)
            count.rows += len(reading.rows)
            for row in reading.rows:
                lines.append(row.line)
                yield row.message  # type: ignore[misc]
            if reading.end:
                return

    chunks: list[tuple[int, int, int]] = []
    last: tuple[int, int, int] | None = None
    planned = refused = 0
    async for chunk in da.plan(messages(), **settings.options()):
        span = [lines.popleft() for _ in chunk.positions]
        refused += len(chunk.refused)
        planned += 1
        last = (len(span), span[0], span[-1])
        if len(chunks) < _SHOWN_CHUNKS:
            chunks.append(last)
    report = [f"{spec.display.title} --dry-run ({spec.target.describe()}): nothing is sent"]
    report.append(f"input: {spec.input.path}")
    report.append(f"  {count.rows:,} recipients to send")
    if count.malformed:
        report.append(f"  {count.malformed:,} malformed input rows (recorded invalid, never sent)")
    if count.duplicates:
        report.append(f"  {count.duplicates:,} numbers already sent by an earlier run (--dedupe)")
    if spec.resume:
        report.append(f"  {count.skipped:,} lines already recorded in {spec.output} (skipped)")
        if count.interrupted:
            report.append(
                f"  {count.interrupted:,} lines maybe sent by a killed run (recorded maybe_sent, "
                "not sent again without --resend-maybe-sent)"
            )
    if settings.dedupe or settings.prevalidate:
        report.append(f"  {refused:,} refused locally by --dedupe/--prevalidate")
    given = spec.connection.rate
    if given == "auto":
        rate = ", at a rate learned from the service's 429s"
    else:
        rate = f", at most {given:g} requests/s" if given else ""
    report.append(
        f"plan: {planned:,} chunks of up to {settings.chunk_size:,} recipients, "
        f"{settings.concurrency} in flight at a time{rate}"
    )
    for index, (size, first, end) in enumerate(chunks, 1):
        report.append(f"  chunk {index}: {size:,} recipients, lines {first:,}-{end:,}")
    if planned > len(chunks) and last is not None:
        if planned > len(chunks) + 1:
            report.append(f"  ... {planned - len(chunks) - 1:,} more chunks ...")
        size, first, end = last
        report.append(f"  chunk {planned}: {size:,} recipients, lines {first:,}-{end:,}")
    print("\n".join(report), file=out)
    return OK

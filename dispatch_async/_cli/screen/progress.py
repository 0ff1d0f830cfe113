"""What a person sees while a job runs and when it ends: progress, notes and the summary.

On a terminal the progress is a tqdm bar; in a log (stderr not a terminal), or on a
terminal that says it has no columns (a bare pty, some CI consoles: a bar there is
empty) it is a plain line every few seconds; with ``--quiet`` there is none. Either
shows the whole job's lines (empty rows included: the total counts them) and its sent /
invalid / failed so far. Notes (a malformed row, a cause of failure, "stopping") go
through the progress so they never break the bar.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TextIO

import attrs

from .outcomes import OUTCOMES
from .words import counted

__all__ = [
    "NoteHandler",
    "Progress",
    "Tally",
    "logging_to",
    "make_progress",
    "render_summary",
]


class Progress(Protocol):
    """Where the job reports lines accounted for, and prints notes."""

    def advance(self, lines: int) -> None:
        """*lines* more input lines have their outcome recorded."""

    def note(self, message: str) -> None:
        """Print a line for the user without breaking the progress display."""

    def close(self, *, complete: bool) -> None:
        """Leave the display in its final state: the whole input done when *complete*,
        else the lines done of the total (a job stopped early)."""


#: The whole job's counts so far, as the progress shows them.
Status = Callable[[], Counter[str]]


def make_progress(
    *,
    quiet: bool,
    total: int | None,
    initial: int,
    every: float,
    stream: TextIO,
    status: Status = Counter,
) -> Progress:
    """The progress display that suits *stream*: bar, plain lines, or nothing."""
    if quiet:
        return _Silent(stream)
    if stream.isatty() and _columns(stream) > 0:
        return _Bar(total, initial, stream, status)
    return _Plain(total, initial, every, stream, status)


def _status(counts: Counter[str]) -> str:
    """``"1,000 sent, 150 invalid, 50 failed"``."""
    failed = counts["not_sent"] + counts["maybe_sent"]
    return f"{counts['sent']:,} sent, {counts['invalid']:,} invalid, {failed:,} failed"


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 0


class _Silent:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def advance(self, lines: int) -> None:
        pass

    def note(self, message: str) -> None:
        print(message, file=self._stream, flush=True)

    def close(self, *, complete: bool) -> None:
        pass


class _Plain:
    """A line every *every* seconds: the display for logs and CI."""

    def __init__(
        self, total: int | None, initial: int, every: float, stream: TextIO, status: Status
    ) -> None:
        self._total = total
        self._status = status
        self._done = initial
        self._initial = initial
        self._every = every
        self._stream = stream
        self._started = time.monotonic()
        self._next = self._started + every

    def advance(self, lines: int) -> None:
        self._done += lines
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._every
            self.note(self._line(now))

    def _line(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = (self._done - self._initial) / elapsed
        text = f"progress: {self._done:,}"
        if self._total:
            text += f"/{self._total:,} lines ({100 * self._done / self._total:.0f}%)"
        else:
            text += " lines"
        text += f": {_status(self._status())}; {rate:,.0f}/s"
        if self._total and rate > 0 and self._done < self._total:
            text += f", ETA {_clock((self._total - self._done) / rate)}"
        return text

    def note(self, message: str) -> None:
        print(message, file=self._stream, flush=True)

    def close(self, *, complete: bool) -> None:
        pass


class _Bar:
    """A tqdm bar: recipients done, rate, and the ETA when the total is known."""

    def __init__(self, total: int | None, initial: int, stream: TextIO, status: Status) -> None:
        from tqdm import tqdm

        self._status = status
        self._tqdm: Any = tqdm
        self._bar: Any = tqdm(
            total=total,
            initial=initial,
            unit=" lines",
            unit_scale=True,
            dynamic_ncols=True,
            smoothing=0.1,
            mininterval=0.2,
            file=stream,
            desc="sending",
        )
        self._stream = stream

    def advance(self, lines: int) -> None:
        self._bar.set_postfix_str(_status(self._status()), refresh=False)
        self._bar.update(lines)

    def note(self, message: str) -> None:
        self._tqdm.write(message, file=self._stream)

    def close(self, *, complete: bool) -> None:
        bar = self._bar
        if complete and bar.total is not None and bar.n != bar.total:
            bar.total = bar.n  # the total counted lines; blank lines have no record
        bar.close()


class NoteHandler(logging.Handler):
    """Log records as notes, so ``--verbose`` output does not tear the progress bar."""

    def __init__(self, write: Callable[[str], None]) -> None:
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:  # pragma: no cover - logging must never break the job
            self.handleError(record)


@contextlib.contextmanager
def logging_to(progress: Progress, verbose: int) -> Iterator[None]:
    """Send the SDK's log through the progress display; -v for INFO, -vv for DEBUG."""
    logger = logging.getLogger("dispatch_async")
    handler = NoteHandler(progress.note)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    previous = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous[0])
        logger.propagate = previous[1]


@attrs.define
class Tally:
    """What one run did, for the summary and the exit code."""

    outcomes: Counter[str] = attrs.field(factory=Counter)
    malformed: int = 0
    #: Rows whose number is on the ``--exclude`` list: recorded invalid, never sent.
    excluded: int = 0
    #: Rows an earlier run recorded malformed that still are: recorded again, but the
    #: earlier run's (in the whole job's counts, not this run's).
    again: int = 0
    interrupted: int = 0
    skipped: int = 0
    #: Rows with every field empty (a spreadsheet's ``;;;`` lines): no record, no send.
    empty: int = 0
    requests: int = 0
    retries: int = 0
    unexpected: int = 0
    #: The fewest recipients per request the server took after refusing a body as too
    #: large (HTTP 413); None if it refused none.
    split_to: int | None = None
    #: Rows not sent because the server refused even a request of theirs alone (413).
    too_large: int = 0
    started: float = attrs.field(factory=time.monotonic)
    ended: float | None = None

    @property
    def accounted(self) -> int:
        """Input lines given an outcome by this run."""
        return sum(self.outcomes.values())

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started


def render_summary(
    title: str,
    tally: Tally,
    *,
    kept: Counter[str] | None,
    output: Path | None,
    stopped: bool = False,
) -> str:
    """The summary table: outcomes (this run, and the whole job on a resume), rates.

    *kept*: the earlier runs' records that stay, by outcome; None for a new job.
    """
    totals = None if kept is None else kept + tally.outcomes
    rows = [["outcome", "this run"] + (["whole job"] if totals is not None else [])]
    for outcome in OUTCOMES:
        row = [outcome, f"{tally.outcomes[outcome]:,}"]
        if totals is not None:
            row.append(f"{totals[outcome]:,}")
        rows.append(row)
    row = ["total", f"{tally.accounted:,}"]
    if totals is not None:
        row.append(f"{sum(totals.values()):,}")
    rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{title}: {'stopped after' if stopped else 'done in'} {tally.seconds:.2f} s"]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells))
    rate = tally.accounted / tally.seconds if tally.seconds > 0 else 0.0
    lines.append(
        f"  {counted(tally.requests, 'request')}, {counted(tally.retries, 'retry', 'retries')}, "
        f"{rate:,.0f} recipients/s"
    )
    # Down to one per request for rows too large alone, the size is no advice.
    if tally.split_to is not None and (tally.split_to > 1 or not tally.too_large):
        lines.append(
            "  the server refused requests as too large (HTTP 413): chunks went in parts of "
            f"{tally.split_to:,}; --chunk-size {tally.split_to} sends them so from the start"
        )
    if tally.malformed:
        lines.append(f"  invalid includes {counted(tally.malformed, 'malformed input row')}")
    if tally.excluded:
        lines.append(f"  invalid includes {counted(tally.excluded, 'excluded number')} (--exclude)")
    if tally.again:
        lines.append(
            f"  {tally.again:,} rows an earlier run recorded malformed still are "
            "(recorded again; counted in the whole job)"
        )
    if tally.interrupted:
        lines.append(
            f"  maybe_sent includes {counted(tally.interrupted, 'line')} in flight when an "
            "earlier run was killed"
        )
    if tally.skipped:
        lines.append(f"  skipped {counted(tally.skipped, 'line')} already recorded")
    if tally.empty:
        lines.append(
            f"  skipped {counted(tally.empty, 'empty row')} (every field empty; no record)"
        )
    if tally.unexpected:
        lines.append(
            f"  the service named {counted(tally.unexpected, 'number')} that were not sent"
        )
    if output is not None:
        lines.append(f"  results: {output}")
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

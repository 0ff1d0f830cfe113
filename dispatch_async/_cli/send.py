"""Running one ``send``: rows in, one record per input line out, nothing sent twice.

A ``Source`` (run in a worker thread, so a slow stdin never stalls the event loop)
reads rows and decides for each what the input and earlier runs say: skip it (already
recorded), record it at once (malformed, interrupted, duplicate), or send it. The rows
to send go to the SDK's ``stream_*``; its ``before_send`` hook journals each chunk's
lines (fsynced) just before the chunk's request leaves, and every part it yields is
matched back to input lines and appended to the output.

SIGINT/SIGTERM stop feeding: chunks in flight finish, rows read but not started are
recorded ``not_sent``. A second signal stops at once: the chunks whose requests had
started are ``maybe_sent``, the rest ``not_sent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import orjson

import dispatch_async as da

from .exclude import ExcludeList, load_exclude
from .input import Row, count_lines, line_bound
from .journal import JobFiles, Recorded
from .progress import NoteHandler, Progress, Tally, make_progress, render_summary
from .records import SHOWN_MALFORMED, failed_record, malformed_note, part_records
from .resume import as_read
from .source import Reading, Source, check_input
from .spec import FAILED, OK, JobSpec, Problem, dedupe_key, sent_as
from .words import counted

__all__ = ["run_send"]


class _Stopped(Exception):
    """Raised into the SDK by the feed: stop reading, finish what is in flight."""


# -- the job -----------------------------------------------------------------------


class SendJob:
    """One run: feeds the SDK, journals what is about to leave, records every outcome."""

    def __init__(self, spec: JobSpec, files: JobFiles) -> None:
        self._spec = spec
        self._files = files
        self._source: Source | None = None
        self._progress: Progress | None = None
        self.tally = Tally()
        self._fed: dict[int, Row] = {}  # by position: handed to the SDK, not yet recorded
        self._announced: dict[int, range] = {}  # chunks that may have left, by first position
        self._unfed: list[Row] = []
        self._stopping: str | None = None
        self._forced = False
        self._exhausted = False
        self._failure: Exception | None = None
        self._task: asyncio.Task[None] | None = None
        self._shown_malformed = 0
        self._wire = sent_as(spec.settings)

    def begin(self, source: Source, progress: Progress) -> None:
        """Attach the reading side; ``messages()`` is only iterated after this."""
        self._source = source
        self._progress = progress

    @property
    def progress(self) -> Progress:
        assert self._progress is not None, "begin() first"
        return self._progress

    # -- feeding -------------------------------------------------------------------

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """The recipients for the SDK, a chunk's worth read at a time off the event loop."""
        position = 0
        size = self._spec.settings.chunk_size
        fed = self._fed
        source = self._source
        assert source is not None, "begin() first"
        try:
            while not self._exhausted:
                if self._stopping:
                    raise _Stopped(self._stopping)
                batch = await asyncio.to_thread(source.read, size)
                self._settle(batch)
                self._exhausted = batch.end
                rows = batch.rows
                if self._stopping:  # a signal can only have come during the read
                    self._unfed = rows
                    raise _Stopped(self._stopping)
                fed.update(zip(range(position, position + len(rows)), rows, strict=True))
                position += len(rows)
                for row in rows:
                    yield row.message  # type: ignore[misc]
        except _Stopped:
            raise
        except Exception as exc:
            self._failure = exc
            raise

    async def before_send(self, positions: range) -> None:
        """The SDK is about to send these positions: journal their lines first (fsynced).

        The fsync runs in a thread: requests already in flight are answered meanwhile.
        """
        rows = list(map(self._fed.__getitem__, positions))
        await asyncio.to_thread(self._files.cover, rows)
        self._announced[positions.start] = positions

    def _settle(self, batch: Reading) -> None:
        tally = self.tally
        tally.skipped += batch.skipped
        if batch.records:
            self._files.append(batch.records)
            tally.outcomes["invalid"] += len(batch.malformed) + batch.duplicates + batch.excluded
            tally.excluded += batch.excluded
            tally.outcomes["maybe_sent"] += batch.interrupted
            tally.malformed += len(batch.malformed)
            tally.interrupted += batch.interrupted
            self.progress.advance(len(batch.records))
        for row in batch.malformed:
            self._shown_malformed += 1
            if self._spec.display.quiet or self._shown_malformed > SHOWN_MALFORMED:
                continue
            self.progress.note(malformed_note(row))
            if self._shown_malformed == SHOWN_MALFORMED:
                self.progress.note("(further malformed rows are only recorded in the output)")

    # -- recording -----------------------------------------------------------------

    def _record_part(self, part: da.DispatchResult) -> None:
        pop = self._fed.pop
        rows = [pop(position) for position in part.positions]
        self._announced.pop(part.positions.start, None)
        records, counts = part_records(rows, part, self._explain, self._wire)
        tally = self.tally
        tally.outcomes.update(counts)
        tally.requests += part.requests
        tally.retries += part.retries
        tally.unexpected += len(part.unexpected)
        self._files.append(records)
        self.progress.advance(len(records))

    def _explain(self, error: da.DispatchError) -> tuple[str, str]:
        cause = error.__cause__
        if isinstance(error, da.InputError) and isinstance(cause, _Stopped):
            return f"the job was {cause} before this was sent", "Interrupted"
        if isinstance(error, da.InputError) and cause is not None and cause is self._failure:
            return f"the job stopped before this was sent: {cause}", "Interrupted"
        return str(error), type(error).__name__

    def _unaccounted(self, rows: Iterable[Row], *, maybe_sent: bool) -> list[bytes]:
        why = (
            "the job was stopped while this was in flight"
            if maybe_sent
            else "the job stopped before this was sent"
        )
        records = [
            failed_record(
                r.line, r.number, maybe_sent=maybe_sent, error=why, error_type="Interrupted"
            )
            for r in rows
        ]
        self.tally.outcomes["maybe_sent" if maybe_sent else "not_sent"] += len(records)
        return records

    # -- running -------------------------------------------------------------------

    async def run(self, parts: AsyncIterator[da.DispatchResult]) -> da.DispatchError | None:
        """Consume the SDK's parts to the end (or a stop); the error that ended it, if any."""
        loop = asyncio.get_running_loop()
        handled = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._on_signal, signum)
                handled.append(signum)
        self._task = asyncio.ensure_future(self._consume(parts))
        ended: da.DispatchError | None = None
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._forced:
                raise
        except da.DispatchError as error:
            ended = error
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
        # Rows handed to the SDK and never reported (a forced stop): the chunks that were
        # announced may have left, the others certainly did not.
        started = [p for chunk in self._announced.values() for p in chunk if p in self._fed]
        maybe = [self._fed.pop(p) for p in started]
        records = self._unaccounted(maybe, maybe_sent=True)
        records += self._unaccounted(self._fed.values(), maybe_sent=False)
        records += self._unaccounted(self._unfed, maybe_sent=False)
        self._fed.clear()
        self._unfed = []
        self._files.append(records)
        self.progress.advance(len(records))
        self.tally.ended = time.monotonic()
        return ended

    async def _consume(self, parts: AsyncIterator[da.DispatchResult]) -> None:
        try:
            async for part in parts:
                self._record_part(part)
        finally:
            # A failed record (a write error) leaves the SDK's generator suspended; close it
            # here, in its own task, rather than at loop shutdown.
            aclose = getattr(parts, "aclose", None)
            if aclose is not None:
                await aclose()

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping is None:
            self._stopping = f"stopped by {name}"
            self.progress.note(
                f"{name}: stopping; requests in flight finish first (send it again to stop now)"
            )
        elif not self._forced and self._task is not None:
            self._forced = True
            self.progress.note(f"{name}: stopping now; requests in flight become maybe_sent")
            self._task.cancel()

    @property
    def complete(self) -> bool:
        """Whether every input line now has a record (so the journal can go)."""
        return (
            self._exhausted
            and self._stopping is None
            and not self._forced
            and self._failure is None
        )

    @property
    def stopped(self) -> str | None:
        return self._stopping

    @property
    def failure(self) -> Exception | None:
        return self._failure

    @property
    def last_line(self) -> int:
        """The last input line read."""
        return self._source.last_line if self._source is not None else 0


# -- the entry point ---------------------------------------------------------------


async def run_send(spec: JobSpec) -> int:
    """Run a send to the end and return the exit code (raises Problem for exit 2)."""
    display = spec.display
    if spec.output is None or str(spec.output) == "-":
        raise Problem("--output FILE is required: the results file, which --resume reads back")
    if not spec.connection.account:
        raise Problem("no account: set DISPATCH_ACCOUNT or pass --account")
    session = spec.connection.session(**spec.connection.rate_options())
    rows = spec.input.open()
    stored = None if spec.job_options is None else orjson.dumps(as_read(spec.job_options, rows))
    files = JobFiles(spec.output, max_line=line_bound(spec.input.path), options=stored)
    job = SendJob(spec, files)
    exclude: ExcludeList | None = None
    try:
        async with session:
            # Built first: it checks the endpoint's fields before any file is touched.
            try:
                parts = spec.target.stream(
                    session,
                    job.messages(),
                    before_send=job.before_send,
                    **spec.settings.options(),
                )
            except da.DispatchError as exc:
                raise Problem(str(exc)) from None
            exclude = await load_exclude(spec)
            recorded = files.start(
                resume=spec.resume,
                resend_maybe_sent=spec.resend_maybe_sent,
                dedupe=dedupe_key(spec.settings),
            )
            if spec.resume:
                await asyncio.to_thread(check_input, spec.input, recorded, spec.output)
            total = None
            if not display.quiet:
                total = await asyncio.to_thread(count_lines, spec.input.path)
                if total is not None and rows.kind == "csv" and spec.input.columns is None:
                    total -= 1  # the header
            progress = make_progress(
                quiet=display.quiet,
                total=total,
                initial=recorded.done_lines,
                every=display.progress_every,
                stream=display.err,
            )
            job.begin(Source(rows, recorded, spec.output, exclude), progress)
            if not display.quiet:
                progress.note(_intro(spec, recorded))
                if rows.layout is not None:
                    progress.note(f"input encoding: {rows.layout.encoding.describe()}")
                if exclude is not None:
                    progress.note(exclude.describe())
            with _logging_to(progress, display.verbose):
                # Only a run that returned can be complete: any exception (a write error, a
                # bug) leaves the journal, so --resume settles what may have been sent.
                ended_normally = False
                try:
                    ended = await job.run(parts)
                    ended_normally = True
                finally:
                    progress.close()
                    files.finish(complete=ended_normally and job.complete)
            job.tally.empty = rows.empty
            return _conclude(spec, job, recorded, ended)
    except OSError as exc:
        raise Problem(f"cannot write {spec.output}: {exc.strerror or exc}", FAILED) from None
    finally:
        rows.close()
        files.close()
        if exclude is not None:
            exclude.close()


def _intro(spec: JobSpec, recorded: Recorded) -> str:
    connection = spec.connection
    text = (
        f"{spec.display.title}: {spec.target.describe()} to {connection.base_url} "
        f"(account {connection.account}), from {spec.input.path}, results in {spec.output}"
    )
    if spec.resume:
        text += f"\nresuming: {counted(recorded.done_lines, 'line')} already recorded"
        if recorded.pending_lines:
            text += (
                "; lines a killed run may have sent are sent again (--resend-maybe-sent)"
                if spec.resend_maybe_sent
                else "; lines a killed run may have sent are recorded maybe_sent, not sent"
            )
        if recorded.torn:
            text += "; a torn last record was dropped"
    return text


def _conclude(
    spec: JobSpec, job: SendJob, recorded: Recorded, ended: da.DispatchError | None
) -> int:
    """Print the summary and what went wrong; the exit code (or Problem for 2)."""
    tally = job.tally
    err = spec.display.err
    kept = recorded.kept if spec.resume else None
    summary = render_summary(
        spec.display.title, tally, kept=kept, output=spec.output, stopped=bool(job.stopped)
    )
    print(summary, file=err)
    if isinstance(ended, da.AuthenticationError):
        raise Problem(str(ended))
    failure = job.failure
    if isinstance(failure, Problem):
        raise failure
    if failure is not None:
        raise Problem(f"the job stopped: {failure}", FAILED)
    if ended is not None and job.stopped is None:
        print(f"the job stopped: {ended}", file=err)
    if job.stopped or not job.complete:
        why = job.stopped or (
            "the deadline passed" if ended is None and spec.settings.deadline else "stopped"
        )
        print(
            f"{why} after input line {job.last_line:,}: run again with --resume to continue",
            file=err,
        )
    totals = recorded.kept + tally.outcomes
    not_sent, maybe_sent = totals["not_sent"], totals["maybe_sent"]
    if not_sent or maybe_sent:
        hint = "; --resume sends the not_sent ones again" if not_sent else ""
        print(
            f"failed: {not_sent:,} not_sent, {maybe_sent:,} maybe_sent "
            f'(see "outcome" in {spec.output}){hint}',
            file=err,
        )
        return FAILED
    return OK if job.complete and ended is None else FAILED


@contextlib.contextmanager
def _logging_to(progress: Progress, verbose: int) -> Iterator[None]:
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

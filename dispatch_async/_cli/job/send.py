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

A token is fetched before the input is read through or any file is created: a refused
secret or an unreachable service leaves nothing behind, so the same command works once
it is fixed. Failures are told by cause (``causes``), not as the SDK's event lines,
which ``-v`` shows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson

import dispatch_async as da

from ..reading.exclude import ExcludeList, load_exclude
from ..reading.input import Row, count_lines, line_bound
from ..screen.advice import LocalNumbers, export_command, too_many_invalid
from ..screen.causes import Causes, said
from ..screen.progress import Progress, Tally, logging_to, make_progress, render_summary
from .journal import JobFiles, Recorded
from .records import SHOWN_MALFORMED, Failure, failed_record, malformed_note, part_records
from .resume import as_read
from .source import Reading, Source, check_input
from .spec import FAILED, OK, JobSpec, Problem, dedupe_key, sent_as

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
        self.causes = Causes()
        self.local = LocalNumbers(spec.settings)
        #: The earlier runs' records that stay (a resume's), malformed rows still so included.
        self.kept: Counter[str] = Counter()
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
        # When this run started: its maybe_sent records say so, for callbacks reconcile.
        self._since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def begin(self, source: Source, progress: Progress, kept: Counter[str]) -> None:
        """Attach the reading side; ``messages()`` is only iterated after this."""
        self._source = source
        self._progress = progress
        self.kept = kept

    def counts(self) -> Counter[str]:
        """The whole job's outcomes so far: the earlier runs' and this one's."""
        return self.kept + self.tally.outcomes

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
        try:
            await asyncio.to_thread(self._files.cover, rows)
        except OSError as exc:
            # The SDK reports only that the hook failed: say which file, and why.
            where = self._files.journal
            self._failure = Problem(f"cannot write {where}: {exc.strerror or exc}", FAILED)
            raise
        self._announced[positions.start] = positions

    def _settle(self, batch: Reading) -> None:
        tally = self.tally
        tally.skipped += batch.skipped
        tally.empty += batch.empty
        if batch.records:
            self._files.append(batch.records)
            tally.outcomes["invalid"] += len(batch.malformed) + batch.duplicates + batch.excluded
            tally.excluded += batch.excluded
            tally.outcomes["maybe_sent"] += batch.interrupted
            tally.malformed += len(batch.malformed)
            tally.again += batch.again
            self.kept["invalid"] += batch.again
            tally.interrupted += batch.interrupted
        if batch.records or batch.empty:
            self.progress.advance(len(batch.records) + batch.empty)
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
        failures: list[Failure] = []
        records, counts = part_records(rows, part, self._explain, self._wire, failures, self._since)
        tally = self.tally
        tally.outcomes.update(counts)
        tally.requests += part.requests
        tally.retries += part.retries
        tally.unexpected += len(part.unexpected)
        self._files.append(records)
        if part.invalid:
            self.local.add(part.invalid)
        if failures:
            notes = self.causes.add(failures)
            if not self._spec.display.quiet:
                for note in notes:
                    self.progress.note(note)
        self.progress.advance(len(records))

    def _explain(self, error: da.DispatchError) -> tuple[str, str]:
        cause = error.__cause__
        if isinstance(error, da.InputError) and isinstance(cause, _Stopped):
            return f"the job was {cause} before this was sent", "Interrupted"
        if isinstance(error, da.InputError) and cause is not None and cause is self._failure:
            return f"the job stopped before this was sent: {cause}", "Interrupted"
        if isinstance(error, da.ClientStatusError) and error.body:
            return f"{error}: {said(error.body)}", type(error).__name__
        return str(error), type(error).__name__

    def _unaccounted(self, rows: Iterable[Row], *, maybe_sent: bool) -> list[bytes]:
        why = (
            "the job was stopped while this was in flight"
            if maybe_sent
            else "the job stopped before this was sent"
        )
        records = [
            failed_record(
                r.line,
                r.number,
                maybe_sent=maybe_sent,
                error=why,
                error_type="Interrupted",
                wire=self._wire,
                since=self._since,
            )
            for r in rows
        ]
        self.tally.outcomes["maybe_sent" if maybe_sent else "not_sent"] += len(records)
        return records

    # -- running -------------------------------------------------------------------

    async def run(self, parts: AsyncIterator[da.DispatchResult]) -> da.DispatchError | None:
        """Consume the SDK's parts to the end (or a stop); the error that ended it, if any."""
        self._task = asyncio.ensure_future(self._consume(parts))
        ended: da.DispatchError | None = None
        try:
            with da.on_stop_signals(self._on_signal):
                await self._task
        except asyncio.CancelledError:
            if not self._forced:
                raise
        except da.DispatchError as error:
            ended = error
        # Rows handed to the SDK and never reported (a forced stop): the chunks that were
        # announced may have left, the others certainly did not.
        started = [p for chunk in self._announced.values() for p in chunk if p in self._fed]
        maybe = [self._fed.pop(p) for p in started]
        records = self._unaccounted(maybe, maybe_sent=True)
        records += self._unaccounted(self._fed.values(), maybe_sent=False)
        records += self._unaccounted(self._unfed, maybe_sent=False)
        self._fed.clear()
        self._unfed = []
        if records:
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
            if aclose is not None:  # pragma: no branch - the SDK streams are async generators
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
    # The SDK's event lines only with -v: the terminal gets each cause of failure once.
    hooks = () if display.verbose <= 0 else None
    session = spec.connection.session(hooks=hooks, **spec.connection.rate_options())
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
            await _check_credentials(session)
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
                status=job.counts,
            )
            job.begin(
                Source(rows, recorded, spec.output, exclude), progress, Counter(recorded.kept)
            )
            if not display.quiet:
                progress.note(_intro(spec, recorded))
                if rows.layout is not None:
                    progress.note(f"input encoding: {rows.layout.encoding.describe()}")
                if exclude is not None:
                    progress.note(exclude.describe())
            with logging_to(progress, display.verbose):
                # Only a run that returned can be complete: any exception (a write error, a
                # bug) leaves the journal, so --resume settles what may have been sent.
                ended_normally = False
                try:
                    ended = await job.run(parts)
                    ended_normally = True
                finally:
                    progress.close()
                    files.finish(complete=ended_normally and job.complete)
            return _conclude(spec, job, ended)
    except OSError as exc:
        raise Problem(f"cannot write {spec.output}: {exc.strerror or exc}", FAILED) from None
    finally:
        rows.close()
        files.close()
        if exclude is not None:
            exclude.close()


async def _check_credentials(session: da.DispatchSession) -> None:
    """A token now, before the input is read or a file created (Problem if none)."""
    try:
        await session.check_credentials()
    except da.AuthenticationError as exc:  # a refused secret, or this caller (403)
        raise Problem(f"{exc}; nothing was sent or written") from None
    except da.DispatchError as exc:  # the token endpoint could not be reached
        raise Problem(f"{exc}; nothing was sent or written", FAILED) from None


def _intro(spec: JobSpec, recorded: Recorded) -> str:
    connection = spec.connection
    text = (
        f"{spec.display.title}: {spec.target.describe()} to {connection.base_url} "
        f"(account {connection.account}), from {spec.input.path}, results in {spec.output}"
    )
    if spec.resume:
        redo = recorded.redo
        text += (
            f"\nresuming: input lines recorded by earlier runs: {recorded.recorded_lines:,}; "
            f"kept and skipped: {recorded.done_lines:,}"
        )
        for what, count in (
            ("not_sent, sent again", redo["not_sent"]),
            ("malformed, read again (a fixed row is sent)", redo["malformed"]),
            ("maybe_sent, sent again (--resend-maybe-sent)", redo["maybe_sent"]),
        ):
            if count:
                text += f"; {what}: {count:,}"
        if recorded.pending_lines:
            text += (
                "; lines a killed run may have sent are sent again (--resend-maybe-sent)"
                if spec.resend_maybe_sent
                else "; lines a killed run may have sent are recorded maybe_sent, not sent"
            )
        if recorded.torn:
            text += "; a torn last record was dropped"
    return text


def _conclude(spec: JobSpec, job: SendJob, ended: da.DispatchError | None) -> int:
    """Print the summary and what went wrong; the exit code (or Problem for 2)."""
    tally = job.tally
    err = spec.display.err
    summary = render_summary(
        spec.display.title,
        tally,
        kept=job.kept if spec.resume else None,
        output=spec.output,
        stopped=bool(job.stopped),
    )
    print(summary, file=err)
    if job.causes:
        print("\n".join(job.causes.summary()), file=err)
    local = job.local.advice()
    if local is not None and spec.output is not None:
        print(local, file=err)
        again = export_command(spec.output, "invalid", spec.input.path)
        print(f"  to send the rows rejected: {again}, then send that file as a new job", file=err)
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
    totals = job.counts()
    code = OK if job.complete and ended is None else FAILED
    not_sent, maybe_sent = totals["not_sent"], totals["maybe_sent"]
    if not_sent or maybe_sent:
        hint = "; --resume sends the not_sent ones again" if not_sent else ""
        print(
            f"failed: {not_sent:,} not_sent, {maybe_sent:,} maybe_sent "
            f'(see "outcome" in {spec.output}){hint}',
            file=err,
        )
        code = FAILED
    if maybe_sent and spec.output is not None:
        print(
            "maybe_sent rows may have reached the service: check them before sending them "
            "again (they may arrive twice); "
            f"{export_command(spec.output, 'maybe_sent', spec.input.path)} writes them out "
            "as an input of their own",
            file=err,
        )
    too_many = too_many_invalid(totals, spec.max_invalid)
    if too_many is not None:
        print(too_many, file=err)
        code = FAILED
    return code

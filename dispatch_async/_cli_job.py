"""Running one ``send``: rows in, one record per input line out, nothing sent twice.

A ``Source`` (run in a worker thread, so a slow stdin never stalls the event loop)
reads rows and decides for each what the input and earlier runs say: skip it (already
recorded), record it at once (malformed, interrupted, duplicate), or send it. The
``Feed`` hands the rows to send to the SDK a chunk's worth at a time, covering each
batch in the journal (fsynced) before the SDK can see any of it. The consumer matches
every part the SDK yields back to input lines and appends the records (fsynced).

SIGINT/SIGTERM stop feeding: chunks in flight finish, chunks read but not started are
recorded ``not_sent``. A second signal stops at once and records what was in flight
as ``maybe_sent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import attrs

from ._batch import BatchOptions
from ._cli_input import (
    MALFORMED,
    Format,
    InputProblem,
    Row,
    Rows,
    count_lines,
    line_bound,
    open_rows,
)
from ._cli_journal import (
    JobFiles,
    JobFilesError,
    Recorded,
    failed_record,
    invalid_record,
    sent_record,
)
from ._cli_progress import NoteHandler, Progress, Tally, make_progress, render_summary
from ._exceptions import AuthenticationError, DispatchError, InputError
from ._models import DispatchResult, Fallback
from ._recipients import Chunk, Recipients
from ._retry import RetryPolicy
from ._screen import DUPLICATE, Screen
from ._session import DispatchSession

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "Batching",
    "Connection",
    "Display",
    "InputSpec",
    "JobSpec",
    "Problem",
    "Target",
    "run_plan",
    "run_send",
]

OK, FAILED, USAGE = 0, 1, 2

Endpoint = Literal["basic", "single", "template", "webhook"]

#: How many malformed rows are named on stderr before the rest are only counted.
_SHOWN_MALFORMED = 10
#: How many chunks ``--dry-run`` lists at the start of its plan.
_SHOWN_CHUNKS = 5
log = logging.getLogger("dispatch_async")


class Problem(Exception):
    """A reason to stop with one clear line on stderr and no traceback."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class _Stopped(Exception):
    """Raised into the SDK by the feed: stop reading, finish what is in flight."""


# -- what a job is -----------------------------------------------------------------


@attrs.frozen
class Target:
    """The endpoint to call and the fields of every request."""

    endpoint: Endpoint
    text: str | None = None
    template_id: str | None = None
    webhook: str | None = None
    campaign_name: str | None = None
    fallback_sms: str | None = None
    callback: str | None = None

    def describe(self) -> str:
        """What is sent, for the first line of the output: "template 'pix_reminder'"."""
        if self.endpoint == "webhook":
            return f"webhook {self.webhook}"
        if self.template_id:
            return f"template {self.template_id!r}"
        text = self.text or ""
        return f"text {text[:40] + '...' if len(text) > 40 else text!r}"

    def stream(
        self,
        session: DispatchSession,
        messages: Recipients,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """``session.stream_<endpoint>`` with this target's fields; raises InputError."""
        fallback = Fallback.sms(self.fallback_sms) if self.fallback_sms is not None else None
        match self.endpoint:
            case "template":
                return session.stream_template(
                    messages,
                    template_id=self.template_id or "",
                    campaign_name=self.campaign_name,
                    fallback=fallback,
                    callback=self.callback,
                    webhook=self.webhook,
                    account=account,
                    **options,
                )
            case "webhook":
                return session.stream_webhook(
                    messages,
                    webhook=self.webhook or "",
                    text=self.text,
                    template_id=self.template_id,
                    campaign_name=self.campaign_name,
                    fallback=fallback,
                    callback=self.callback,
                    account=account,
                    **options,
                )
            case "basic" | "single":
                send = session.stream_basic if self.endpoint == "basic" else session.stream_single
                return send(
                    messages,
                    text=self.text or "",
                    campaign_name=self.campaign_name,
                    fallback=fallback,
                    callback=self.callback,
                    account=account,
                    **options,
                )


@attrs.frozen
class Connection:
    """Where the service is and how to talk to it; the secret never shows in a repr."""

    base_url: str | None
    client_secret: str | None = attrs.field(repr=False)
    account: str | None
    timeout: float = 30.0
    attempts: int = 5
    max_retry_time: float = 120.0
    rate: float | None = None

    def session(self, **options: Any) -> DispatchSession:
        """A session on this connection; *options* go to DispatchSession as they are."""
        assert self.base_url is not None
        assert self.client_secret is not None
        return DispatchSession(
            self.base_url,
            client_secret=self.client_secret,
            account=self.account,
            timeout=self.timeout,
            retry=RetryPolicy(attempts=self.attempts, max_time=self.max_retry_time),
            **options,
        )


@attrs.frozen
class Batching:
    """The SDK's batcher settings."""

    chunk_size: int = 1000
    concurrency: int = 8
    dedupe: bool = False
    prevalidate: bool = False
    region: str | None = None
    deadline: float | None = None


@attrs.frozen
class InputSpec:
    """Which file to read, and how."""

    path: str
    format: Format = "auto"
    number_column: str = "number"
    columns: tuple[str, ...] | None = None


@attrs.frozen
class Display:
    """What the user sees."""

    title: str = "dispatch-async send"
    quiet: bool = False
    verbose: int = 0
    progress_every: float = 5.0
    stream: TextIO | None = None

    @property
    def err(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr


@attrs.frozen
class JobSpec:
    """Everything one ``send`` needs."""

    target: Target
    connection: Connection
    input: InputSpec
    output: Path | None
    batching: Batching = Batching()
    resume: bool = False
    resend_maybe_sent: bool = False
    display: Display = Display()


# -- reading: what each row becomes ------------------------------------------------


@attrs.define
class Batch:
    """What the source read: rows to send (at most a chunk) and lines settled at once."""

    rows: list[Row] = attrs.field(factory=list)
    records: list[bytes] = attrs.field(factory=list)
    malformed: list[Row] = attrs.field(factory=list)
    interrupted: int = 0
    duplicates: int = 0
    skipped: int = 0
    end: bool = False


class Source:
    """Reads rows and applies what earlier runs recorded; called from a worker thread."""

    def __init__(self, rows: Iterable[Row], recorded: Recorded, output: Path | None) -> None:
        self._rows: Iterator[Row] = iter(rows)
        self._recorded = recorded
        self._output = output
        self.last_line = 0

    def read(self, size: int) -> Batch:
        """Up to *size* rows to send; also stops after many settled lines, to stay small."""
        batch = Batch()
        recorded = self._recorded
        seen = recorded.seen
        key = recorded.canonical
        send = batch.rows
        settled = batch.records
        limit = max(size, 1000) * 4
        for row in self._rows:
            line = row.line
            self.last_line = line
            if recorded.is_done(line):
                if not recorded.matches(line, row.number):
                    raise Problem(
                        f"line {line} of the input is not the recipient {self._output} "
                        "recorded for it: resume with the same input file"
                    )
                batch.skipped += 1
            elif row.message is None:
                settled.append(invalid_record(line, row.number, MALFORMED, row.problem))
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
                    )
                )
                batch.interrupted += 1
                if seen is not None and key is not None:
                    # Maybe sent: a later row with its number is a duplicate.
                    seen.add(key(row.message["number"]))
            elif seen is not None and key is not None and key(row.message["number"]) in seen:
                settled.append(invalid_record(line, row.number, DUPLICATE))
                batch.duplicates += 1
            else:
                send.append(row)
                if len(send) == size:
                    return batch
            if len(settled) >= limit or batch.skipped >= limit:
                return batch
        batch.end = True
        return batch


# -- the job -----------------------------------------------------------------------


class SendJob:
    """One run: feeds the SDK, records every outcome, handles signals, sums up."""

    def __init__(self, spec: JobSpec, files: JobFiles) -> None:
        self._spec = spec
        self._files = files
        self._source: Source | None = None
        self._progress: Progress | None = None
        self.tally = Tally()
        self._in_flight: dict[int, Row] = {}
        self._unfed: list[Row] = []
        self._stopping: str | None = None
        self._forced = False
        self._exhausted = False
        self._failure: Exception | None = None
        self._task: asyncio.Task[None] | None = None
        self._shown_malformed = 0

    def begin(self, source: Source, progress: Progress) -> None:
        """Attach the reading side; ``messages()`` is only iterated after this."""
        self._source = source
        self._progress = progress
        self.tally = Tally()

    @property
    def progress(self) -> Progress:
        assert self._progress is not None, "begin() first"
        return self._progress

    # -- feeding -------------------------------------------------------------------

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """The recipients for the SDK; every batch is in the journal before it is seen."""
        position = 0
        size = self._spec.batching.chunk_size
        source = self._source
        assert source is not None, "begin() first"
        try:
            while not self._exhausted:
                if self._stopping:
                    raise _Stopped(self._stopping)
                batch = await asyncio.to_thread(source.read, size)
                self._settle(batch)
                self._exhausted = batch.end
                if not batch.rows:
                    continue
                self._files.cover(batch.rows[-1].line)
                for index, row in enumerate(batch.rows):
                    if self._stopping:
                        self._unfed = batch.rows[index:]
                        raise _Stopped(self._stopping)
                    self._in_flight[position] = row
                    position += 1
                    assert row.message is not None
                    yield row.message
        except _Stopped:
            raise
        except Exception as exc:
            self._failure = exc
            raise

    def _settle(self, batch: Batch) -> None:
        tally = self.tally
        tally.skipped += batch.skipped
        if batch.records:
            self._files.append(batch.records)
            tally.outcomes["invalid"] += len(batch.malformed) + batch.duplicates
            tally.outcomes["maybe_sent"] += batch.interrupted
            tally.malformed += len(batch.malformed)
            tally.interrupted += batch.interrupted
            self.progress.advance(len(batch.records))
        for row in batch.malformed:
            self._shown_malformed += 1
            if self._spec.display.quiet or self._shown_malformed > _SHOWN_MALFORMED:
                continue
            self.progress.note(f"line {row.line}: {MALFORMED}: {row.problem}")
            if self._shown_malformed == _SHOWN_MALFORMED:
                self.progress.note("(further malformed rows are only recorded in the output)")

    # -- recording -----------------------------------------------------------------

    def _record_part(self, part: DispatchResult) -> None:
        pop = self._in_flight.pop
        first: dict[str, Row] = {}
        repeats: dict[str, deque[Row]] = {}
        for position in part.positions:
            row = pop(position)
            number = row.number
            assert number is not None
            if number in first:
                repeats.setdefault(number, deque()).append(row)
            else:
                first[number] = row

        def take(number: str) -> Row | None:
            row = first.pop(number, None)
            if row is None and (queue := repeats.get(number)):
                row = queue.popleft()
            return row

        records: list[bytes] = []
        outcomes = self.tally.outcomes
        for valid in part.valid:
            if (sent := take(valid.number)) is not None:
                records.append(sent_record(sent.line, valid.number, valid.id))
                outcomes["sent"] += 1
        for invalid in part.invalid:
            if (refused := take(invalid.number)) is not None:
                records.append(invalid_record(refused.line, invalid.number, invalid.reason))
                outcomes["invalid"] += 1
        for failure in part.failed:
            number = failure.recipient.number
            if (failed := take(number)) is not None:
                error, kind = self._explain(failure.error)
                records.append(
                    failed_record(
                        failed.line,
                        number,
                        maybe_sent=failure.maybe_sent,
                        error=error,
                        error_type=kind,
                    )
                )
                outcomes["maybe_sent" if failure.maybe_sent else "not_sent"] += 1
        # The SDK accounts for every position; anything left is a bug, recorded safely.
        leftovers = list(first.values()) + [row for q in repeats.values() for row in q]
        records += self._unaccounted(leftovers, maybe_sent=True)
        self.tally.requests += part.requests
        self.tally.retries += part.retries
        self.tally.unexpected += len(part.unexpected)
        self._files.append(records)
        self._files.sync()
        self.progress.advance(len(records))

    def _explain(self, error: DispatchError) -> tuple[str, str]:
        cause = error.__cause__
        if isinstance(error, InputError) and isinstance(cause, _Stopped):
            return f"the job was {cause} before this was sent", "Interrupted"
        if isinstance(error, InputError) and cause is not None and cause is self._failure:
            return f"the job stopped before this was sent: {cause}", "Interrupted"
        return str(error), type(error).__name__

    def _unaccounted(self, rows: list[Row], *, maybe_sent: bool) -> list[bytes]:
        if not rows:
            return []
        why = (
            "the job was stopped while this was in flight"
            if maybe_sent
            else "the job stopped before this was sent"
        )
        outcome = "maybe_sent" if maybe_sent else "not_sent"
        self.tally.outcomes[outcome] += len(rows)
        return [
            failed_record(
                r.line, r.number, maybe_sent=maybe_sent, error=why, error_type="Interrupted"
            )
            for r in rows
        ]

    # -- running -------------------------------------------------------------------

    async def run(self, parts: AsyncIterator[DispatchResult]) -> DispatchError | None:
        """Consume the SDK's parts to the end (or a stop); the error that ended it, if any."""
        loop = asyncio.get_running_loop()
        handled = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._on_signal, signum)
                handled.append(signum)
        self._task = asyncio.ensure_future(self._consume(parts))
        ended: DispatchError | None = None
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._forced:
                raise
        except DispatchError as error:
            ended = error
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
        # Rows the SDK had read but not put in a chunk it reported, and rows never handed.
        leftovers = list(self._in_flight.values())
        self._in_flight.clear()
        records = self._unaccounted(leftovers, maybe_sent=self._forced)
        records += self._unaccounted(self._unfed, maybe_sent=False)
        self._unfed = []
        self._files.append(records)
        self.progress.advance(len(records))
        self.tally.ended = time.monotonic()
        return ended

    async def _consume(self, parts: AsyncIterator[DispatchResult]) -> None:
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


# -- entry points ------------------------------------------------------------------


async def run_send(spec: JobSpec) -> int:
    """Run a send to the end and return the exit code (raises Problem for exit 2)."""
    display = spec.display
    if spec.output is None or str(spec.output) == "-":
        raise Problem("--output FILE is required: the results file, which --resume reads back")
    session = _session(spec)
    rows = _open_input(spec.input)
    files = JobFiles(spec.output, max_line=line_bound(spec.input.path))
    job = SendJob(spec, files)
    try:
        async with session:
            # Built first: it checks the endpoint's fields before any file is touched.
            parts = _stream(session, spec, job.messages())
            try:
                recorded = files.start(
                    resume=spec.resume,
                    resend_maybe_sent=spec.resend_maybe_sent,
                    dedupe=_dedupe_key(spec),
                )
            except JobFilesError as exc:
                raise Problem(str(exc)) from None
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
            job.begin(Source(rows, recorded, spec.output), progress)
            if not display.quiet:
                progress.note(_intro(spec, recorded))
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
            return _conclude(spec, job, recorded, ended)
    except OSError as exc:
        raise Problem(f"cannot write {spec.output}: {exc.strerror or exc}", FAILED) from None
    finally:
        rows.close()
        files.close()


def run_plan(spec: JobSpec, out: TextIO) -> int:
    """``--dry-run``: read and check the input, print the chunk plan, send nothing."""
    rows = _open_input(spec.input)
    try:
        recorded = Recorded(
            seen=set() if spec.batching.dedupe else None, canonical=_dedupe_key(spec)
        )
        if spec.resume and spec.output is not None:
            try:
                recorded = JobFiles(spec.output, max_line=line_bound(spec.input.path)).inspect(
                    resend_maybe_sent=spec.resend_maybe_sent, dedupe=_dedupe_key(spec)
                )
            except (JobFilesError, OSError) as exc:
                raise Problem(str(exc)) from None
        try:
            return _plan(spec, Source(rows, recorded, spec.output), out)
        except InputProblem as exc:
            raise Problem(str(exc), FAILED) from None
    finally:
        rows.close()


def _plan(spec: JobSpec, source: Source, out: TextIO) -> int:
    batching = spec.batching
    err = spec.display.err
    screen = None
    if batching.dedupe or batching.prevalidate:
        try:
            screen = Screen(
                dedupe=batching.dedupe, prevalidate=batching.prevalidate, region=batching.region
            )
        except DispatchError as exc:
            raise Problem(str(exc)) from None
    chunks: list[tuple[int, int, int]] = []
    last_chunk: tuple[int, int, int] | None = None
    count = recipients = malformed = interrupted = duplicates = skipped = refused = 0
    position = 0
    while True:
        batch = source.read(batching.chunk_size)
        skipped += batch.skipped
        interrupted += batch.interrupted
        duplicates += batch.duplicates
        for row in batch.malformed:
            malformed += 1
            if malformed <= _SHOWN_MALFORMED:
                print(f"line {row.line}: {MALFORMED}: {row.problem}", file=err)
        if batch.rows:
            count += 1
            recipients += len(batch.rows)
            last_chunk = (len(batch.rows), batch.rows[0].line, batch.rows[-1].line)
            if len(chunks) < _SHOWN_CHUNKS:
                chunks.append(last_chunk)
            if screen is not None:
                messages = [row.message for row in batch.rows if row.message is not None]
                screened = screen.apply(Chunk(position, len(messages), messages))
                refused += len(screened.rejected)
            position += len(batch.rows)
        if batch.end:
            break
    lines = [f"{spec.display.title} --dry-run ({spec.target.describe()}): nothing is sent"]
    lines.append(f"input: {spec.input.path}")
    lines.append(f"  {recipients:,} recipients to send")
    if malformed:
        lines.append(f"  {malformed:,} malformed input rows (recorded invalid, never sent)")
    if duplicates:
        lines.append(f"  {duplicates:,} numbers already sent by an earlier run (--dedupe)")
    if spec.resume:
        lines.append(f"  {skipped:,} lines already recorded in {spec.output} (skipped)")
        if interrupted:
            lines.append(
                f"  {interrupted:,} lines maybe sent by a killed run (recorded maybe_sent, "
                "not sent again without --resend-maybe-sent)"
            )
    if screen is not None:
        lines.append(f"  {refused:,} refused locally by --dedupe/--prevalidate")
    rate = f", at most {spec.connection.rate:g} requests/s" if spec.connection.rate else ""
    lines.append(
        f"plan: {count:,} chunks of up to {batching.chunk_size:,} recipients, "
        f"{batching.concurrency} in flight at a time{rate}"
    )
    for index, (size, first, last) in enumerate(chunks, 1):
        lines.append(f"  chunk {index}: {size:,} recipients, lines {first:,}-{last:,}")
    if count > len(chunks) and last_chunk is not None:
        if count > len(chunks) + 1:
            lines.append(f"  ... {count - len(chunks) - 1:,} more chunks ...")
        size, first, last = last_chunk
        lines.append(f"  chunk {count}: {size:,} recipients, lines {first:,}-{last:,}")
    print("\n".join(lines), file=out)
    return OK


def _session(spec: JobSpec) -> DispatchSession:
    connection = spec.connection
    batching = spec.batching
    for value, what in (
        (connection.base_url, "no service URL: set DISPATCH_BASE_URL or pass --base-url"),
        (
            connection.client_secret,
            "no client secret: set DISPATCH_CLIENT_SECRET or pass --client-secret-file",
        ),
        (connection.account, "no account: set DISPATCH_ACCOUNT or pass --account"),
    ):
        if not value:
            raise Problem(what)
    try:
        return connection.session(
            requests_per_second=connection.rate,
            chunk_size=batching.chunk_size,
            max_concurrency=batching.concurrency,
            dedupe=batching.dedupe,
            prevalidate=batching.prevalidate,
            region=batching.region,
            deadline=batching.deadline,
        )
    except (DispatchError, ValueError, TypeError) as exc:
        raise Problem(str(exc)) from None


def _dedupe_key(spec: JobSpec) -> Callable[[str], str] | None:
    """The one form --dedupe compares numbers in, the SDK's (None without --dedupe)."""
    batching = spec.batching
    if not batching.dedupe:
        return None
    try:
        screen = Screen(dedupe=True, prevalidate=batching.prevalidate, region=batching.region)
    except DispatchError as exc:
        raise Problem(str(exc)) from None
    return screen.canonical


def _open_input(spec: InputSpec) -> Rows:
    try:
        rows = open_rows(
            spec.path, spec.format, number_column=spec.number_column, columns=spec.columns
        )
    except InputProblem as exc:
        raise Problem(f"{spec.path}: {exc}") from None
    except OSError as exc:
        raise Problem(f"cannot read {spec.path}: {exc.strerror}") from None
    if rows.kind == "jsonl" and (spec.columns is not None or spec.number_column != "number"):
        rows.close()
        raise Problem("--columns and --number-column apply to CSV input only")
    return rows


def _stream(
    session: DispatchSession, spec: JobSpec, messages: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[DispatchResult]:
    batching = spec.batching
    try:
        return spec.target.stream(
            session,
            messages,
            chunk_size=batching.chunk_size,
            max_concurrency=batching.concurrency,
            dedupe=batching.dedupe,
            prevalidate=batching.prevalidate,
            region=batching.region,
            deadline=batching.deadline,
        )
    except DispatchError as exc:
        raise Problem(str(exc)) from None


def _intro(spec: JobSpec, recorded: Recorded) -> str:
    connection = spec.connection
    text = (
        f"{spec.display.title}: {spec.target.describe()} to {connection.base_url} "
        f"(account {connection.account}), from {spec.input.path}, results in {spec.output}"
    )
    if spec.resume:
        text += f"\nresuming: {recorded.done_lines:,} lines already recorded"
        if recorded.pending_lines:
            text += (
                "; lines a killed run may have sent are sent again (--resend-maybe-sent)"
                if spec.resend_maybe_sent
                else "; lines a killed run may have sent are recorded maybe_sent, not sent"
            )
        if recorded.torn:
            text += "; a torn last record was dropped"
    return text


def _conclude(spec: JobSpec, job: SendJob, recorded: Recorded, ended: DispatchError | None) -> int:
    """Print the summary and what went wrong; the exit code (or Problem for 2)."""
    tally = job.tally
    err = spec.display.err
    kept = recorded.kept if spec.resume else None
    summary = render_summary(
        spec.display.title, tally, kept=kept, output=spec.output, stopped=bool(job.stopped)
    )
    print(summary, file=err)
    if isinstance(ended, AuthenticationError):
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
            "the deadline passed" if ended is None and spec.batching.deadline else "stopped"
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

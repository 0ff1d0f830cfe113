"""A send in flight: the job that feeds the SDK, journals what leaves, records what comes back.

The rows to send go to the SDK's ``stream_*``; its ``before_send`` hook journals each
chunk's lines (fsynced) just before the chunk's request leaves, and every part it yields
is matched back to input lines and appended to the output.

SIGINT/SIGTERM stop feeding: chunks in flight finish, rows read but not started are
recorded ``not_sent``. A second signal stops at once: the chunks whose requests had
started are ``maybe_sent``, the rest ``not_sent``. ``send`` sets a job up and tells how
it ended.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import dispatch_async as da

from ..reading.input import Row
from ..screen.advice import LocalNumbers
from ..screen.causes import Causes
from ..screen.flags import in_our_words
from ..screen.outcomes import Failure
from ..screen.problem import FAILED, Problem
from ..screen.progress import Progress, Tally
from .journal import JobFiles
from .records import SHOWN_MALFORMED, failed_record, malformed_note, part_records
from .source import Reading, Source
from .spec import JobSpec, sent_as

__all__ = ["SendJob"]


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
        self._since = files.since

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
        if part.split_to is not None:
            tally.split_to = min(part.split_to, tally.split_to or part.split_to)
        tally.too_large += sum(isinstance(f.error, da.RequestTooLargeError) for f in part.failed)
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
        # A status error's message carries the service's reason (a proxy's HTML page, as
        # a 413's body is, is no reason): the message alone, in the command line's words.
        return in_our_words(error), type(error).__name__

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

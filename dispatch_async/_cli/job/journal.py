"""The job's files: the output records, the write-ahead journal beside it, and resume.

``results.jsonl`` holds one JSON record per input line, appended as each chunk
completes (and fsynced when the run ends). ``results.jsonl.pending`` is the write-ahead
journal: when the SDK is about to send a chunk (its ``before_send`` hook), the input lines
of the chunk's rows are appended and fsynced, before the request leaves, each with a
fingerprint of its number, and when the run started. A line the journal covers that has
no record in the output may have been sent when the process died, so a resume records
it ``maybe_sent`` instead of sending it again; after a kill that is at most the chunks
whose requests had started.
Records lost to a power cut before their fsync are lines the journal covers: maybe_sent,
never sent twice. The fingerprints tell whether the input still holds, on those lines,
the numbers that may have been sent (an edited input would otherwise have its rows sent
twice, and new rows recorded ``maybe_sent``). The run's start becomes the ``since`` of
those ``maybe_sent`` records: ``callbacks reconcile`` takes no callback from before it.

The journal is text, one entry a line::

    dispatch-async journal 4 {"endpoint": "template", "input_path": ...}
                                 the header: the job's options, for --resume without flags
    1001-1500,1502-2000 AAEC... 2026-07-01T09:00:00+00:00
                                 lines 1001 to 1500 and 1502 to 2000 may have reached the
                                 service; then the CRC-32 of each line's number, in order
                                 (4 bytes little-endian each, base64; 0: not known); then
                                 when the run that sent them started
    reset                        a resume starts: forget every entry above...
    17-22 3q2+7w... 2026-07-...  ...except these lines, still unaccounted for
    end                          (a reset block without its end is a torn write: ignored)

A resume compacts the output first: it keeps one record per line (the first), drops the
records of lines to do again (``not_sent``, malformed rows, and ``maybe_sent`` with
``--resend-maybe-sent``) and a torn last line, and replaces the file atomically. The
journal's reset block is written before that replacement, so a crash in between loses
nothing. The journal is deleted when a job has accounted for its whole input, after its
options are kept beside the output (``results.jsonl.job``, see ``jobfile``).

Journals of earlier versions stay readable. ``dispatch-async journal 1`` stores no
options: it resumes with the job's flags given again. Version 1 and 2 entries are plain
ranges (``1001-2000``) without fingerprints: those lines are maybe sent, whatever the
input now holds there. Version 3 adds the fingerprints (an earlier version refuses it),
version 4 the run's start (an entry without one: the start is not known).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import operator
import os
import sys
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeAlias

import orjson

from ..reading.rows import Row
from ..screen.problem import DISK_ERRORS, FAILED, USAGE, Problem
from .jobfile import forget_options, keep_options, kept_options, sync_dir
from .recorded import Recorded, fingerprints, new_record

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, one job at a time
    fcntl = None  # type: ignore[assignment]

__all__ = ["JobFiles", "Recorded", "journal_path", "new_record", "stored_options"]

_MAGIC = b"dispatch-async journal "
_HEADER_V1 = _MAGIC + b"1"
_LINE, _NUMBER = operator.itemgetter(0), operator.itemgetter(1)  # of a Row
#: The versions whose header stores the job's options (3: entries carry fingerprints,
#: 4: and the run's start).
_WITH_OPTIONS = (_MAGIC + b"2 {", _MAGIC + b"3 {", _MAGIC + b"4 {")


class JobFiles:
    """The output file and its journal, for the duration of one run."""

    def __init__(self, output: Path, *, max_line: int, options: bytes | None = None) -> None:
        self.output = output
        self.max_line = max_line  # the input's bound: a line above it is corruption
        # The header of a journal this run starts: the job's options, JSON on one line.
        self._header = _HEADER_V1 if options is None else _MAGIC + b"4 " + options
        #: When this run started (ISO 8601): the ``since`` of what it may have sent.
        self.since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self._options = options  # kept beside the output once the journal goes (jobfile)
        real = Path(os.path.realpath(output))
        self.journal = journal_path(output)
        self._real = real
        self._scratch = Path(f"{real}.tmp")
        self._out: int | None = None
        self._journal: int | None = None
        self._held: int | None = None  # the output's inode, locked before it is rewritten

    # -- starting ------------------------------------------------------------------

    def inspect(self, *, resend_maybe_sent: bool, dedupe: Callable[[str], str] | None) -> Recorded:
        """What a resume would find, read only (for ``--dry-run``).

        *dedupe* is the canonical form of a number for ``--dedupe`` (None without it).
        """
        recorded = new_record(resend_maybe_sent, dedupe, self.max_line)
        if self.output.exists():
            self._scan(recorded, None)
        if self.journal.exists():
            recorded._mark_pending(
                _parse_journal(self.journal.read_bytes(), self.journal), self.journal
            )
        return recorded

    def start(
        self, *, resume: bool, resend_maybe_sent: bool, dedupe: Callable[[str], str] | None
    ) -> Recorded:
        """Lock the journal and get the output ready to append to; compact it on resume.

        Raises:
            Problem: the files exist without ``resume``, another run holds them, or
                they are not dispatch-async files.
        """
        if self.output.is_dir():
            raise Problem(f"--output {self.output} is a directory")
        if not self.output.absolute().parent.is_dir():
            raise Problem(f"the directory of --output {self.output} does not exist")
        if not resume:
            for path in (self.output, self.journal):
                if path.exists():
                    raise Problem(
                        f"{path} exists: add --resume to continue that job, "
                        "or choose another --output"
                    )
            forget_options(self.output)  # of a job whose results were deleted: not this one
        recorded = new_record(resend_maybe_sent, dedupe, self.max_line)
        ours = False  # a journal this run created and locked: removed again on failure
        try:
            existed = self.journal.exists()
            # Private: its header holds the job's options, the callback URL's token with them.
            self._journal = os.open(self.journal, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            self._lock(self._journal)
            # Refused after this (another run holds the output): leave no empty journal,
            # which would make the finished job look unfinished.
            ours = not existed
            # A hard link is a second path with its own journal: lock the output's inode too.
            if resume and self._real.exists():
                self._held = os.open(self._real, os.O_RDONLY)
                self._lock(self._held)
            previous = _read_all(self._journal)
            if previous.startswith(_MAGIC) and b"\n" not in previous:
                # A header torn by a kill: nothing can have been sent after it (every
                # range follows the header's fsync), so it is written again.
                os.ftruncate(self._journal, 0)
                previous = b""
            if not _is_header(previous.partition(b"\n")[0]):
                if previous:
                    raise Problem(f"{self.journal} is not a dispatch-async journal")
                self._write_journal(self._header + b"\n")
            elif not previous.endswith(b"\n"):
                # A torn last entry: cut it off, or the next entry would be glued to it.
                os.ftruncate(self._journal, previous.rindex(b"\n") + 1)
            if resume and self.output.exists():
                self._compact(recorded, previous)
            elif resume:
                recorded._mark_pending(_parse_journal(previous, self.journal), self.journal)
                self._reset_journal(recorded)
            if self._held is not None:
                # A second lock on the same inode from this process would conflict with it.
                os.close(self._held)
                self._held = None
            self._out = os.open(self._real, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._lock(self._out)
            sync_dir(self._real)
        except BaseException as exc:
            for path in (self._scratch, self.journal) if ours else (self._scratch,):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self.close()
            if isinstance(exc, OSError):
                where = exc.filename or self.output
                # A failing disk is a write error (exit 1), not a usage error.
                code = FAILED if exc.errno in DISK_ERRORS else USAGE
                raise Problem(f"cannot use {where}: {exc.strerror}", code) from exc
            raise
        return recorded

    def _lock(self, fd: int) -> None:
        if fcntl is None:  # pragma: no cover
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Problem(
                f"another dispatch-async run is using {self.output} (it or its journal "
                f"{self.journal} is locked)"
            ) from None

    def _scan(self, recorded: Recorded, sink: IO[bytes] | None) -> None:
        with open(self.output, "rb") as stream:
            for number, raw in enumerate(stream, 1):
                if not raw.endswith(b"\n"):
                    # The last line of a run killed mid-write: the journal covers its lines.
                    try:
                        orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        recorded.torn = True
                        return
                    raw += b"\n"
                if recorded._add(raw, f"{self.output} line {number}") and sink is not None:
                    sink.write(raw)

    def _compact(self, recorded: Recorded, journal: bytes) -> None:
        with open(self._scratch, "wb") as sink:
            self._scan(recorded, sink)
            recorded._mark_pending(_parse_journal(journal, self.journal), self.journal)
            # The journal first: until the output is replaced, the old one still agrees.
            self._reset_journal(recorded)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(self._scratch, self._real)
        sync_dir(self._real)

    def _reset_journal(self, recorded: Recorded) -> None:
        entries = [b"reset"]
        for first, last, since in recorded.pending_ranges():
            entries.append(_entry([(first, last)], recorded.crcs[first : last + 1], since))
        entries.append(b"end")
        self._write_journal(b"\n".join(entries) + b"\n")

    # -- running -------------------------------------------------------------------

    def cover(self, rows: Sequence[Row]) -> None:
        """Record durably that *rows* (in input order, each with a number) may reach the
        service."""
        crcs = fingerprints(list(map(_NUMBER, rows)))
        self._write_journal(_entry(_runs(rows), crcs, self.since) + b"\n")

    def append(self, records: list[bytes]) -> None:
        """Append records to the output; one write, so a crash tears at most the last."""
        if records and self._out is not None:
            _write_all(self._out, b"\n".join(records) + b"\n")

    def sync(self) -> None:
        """Make what was appended survive a power cut."""
        if self._out is not None:
            os.fsync(self._out)

    def finish(self, *, complete: bool) -> None:
        """Sync and close; a job that accounted for its whole input needs no journal."""
        self.sync()
        if complete:
            # The options first: until the journal is gone, it still holds them.
            if self._options is None:
                forget_options(self.output)
            else:
                keep_options(self.output, self._options)
            with contextlib.suppress(FileNotFoundError):
                self.journal.unlink()
            sync_dir(self._real)
        self.close()

    def close(self) -> None:
        """Close both files (releasing the lock). Safe to call twice."""
        for fd in (self._out, self._journal, self._held):
            if fd is not None:
                os.close(fd)
        self._out = self._journal = self._held = None

    def _write_journal(self, data: bytes) -> None:
        assert self._journal is not None
        _write_all(self._journal, data)
        os.fsync(self._journal)


def journal_path(output: Path) -> Path:
    """The journal of *output*: beside the file it is, through a symlink.

    Through a symlink, the journal and the rewrite belong to the file it points to: a
    second path then meets the same lock, and the symlink stays a symlink.
    """
    return Path(f"{os.path.realpath(output)}.pending")


def stored_options(output: Path) -> dict[str, object] | None:
    """The options the job writing *output* was started with: its journal's, or once the
    job has finished, those kept beside its results (``jobfile``).

    None for a journal from before options were stored, and for a header torn by a kill,
    or never written (nothing was sent under it: ``start`` writes it again).

    Raises:
        FileNotFoundError: *output* has no journal and no options kept (a job finished by
            an earlier dispatch-async, or never started).
        Problem: the journal is not a dispatch-async journal.
    """
    path = journal_path(output)
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return kept_options(output)
    with stream:
        header = stream.readline(1 << 20)
    if header.rstrip(b"\n") == _HEADER_V1 or (
        _MAGIC.startswith(header[: len(_MAGIC)]) and not header.endswith(b"\n")
    ):
        return None
    if not _is_header(header.rstrip(b"\n")) or not header.endswith(b"\n"):
        raise Problem(f"{path} is not a dispatch-async journal")
    try:
        options = orjson.loads(header[len(_MAGIC) + 2 :])
    except orjson.JSONDecodeError:
        options = None
    if type(options) is not dict:
        raise Problem(f"{path} has a header that is not a job's options; fix or delete it")
    return options


def _is_header(line: bytes) -> bool:
    return line == _HEADER_V1 or line.startswith(_WITH_OPTIONS)


#: Runs of journaled lines, each with the fingerprints of its lines (None: a version 1
#: or 2 entry, which has none) and its run's start (None: before version 4).
Runs: TypeAlias = "list[tuple[int, int, array[int] | None, str | None]]"


def _parse_journal(data: bytes, path: Path) -> Runs:
    entries = data.split(b"\n")[:-1]  # the piece after the last newline is torn or empty
    if not entries:
        return []
    if not _is_header(entries[0]):
        raise Problem(f"{path} is not a dispatch-async journal")
    current: Runs = []
    block: Runs | None = None
    for entry in entries[1:]:
        if entry == b"reset":
            block = []
        elif entry == b"end":
            if block is not None:
                current, block = block, None
        else:
            (current if block is None else block).extend(_parse_entry(entry, path))
    return current


def _entry(runs: Sequence[tuple[int, int]], crcs: array[int], since: str | None) -> bytes:
    """One journal entry: the runs of lines, their numbers' fingerprints in order, and
    when the run that sent them started (if known)."""
    if sys.byteorder != "little":  # pragma: no cover - the file is the same everywhere
        crcs = array("I", crcs)
        crcs.byteswap()
    spans = b",".join(b"%d-%d" % run for run in runs)
    entry = spans + b" " + base64.b64encode(crcs.tobytes())
    return entry if since is None else entry + b" " + since.encode("ascii")


def _runs(rows: Sequence[Row]) -> list[tuple[int, int]]:
    """The lines of *rows* (increasing) as runs of consecutive lines, (first, last)."""
    first, last = rows[0].line, rows[-1].line
    if last - first == len(rows) - 1:
        return [(first, last)]  # the usual chunk: no line in between is left out
    runs = []
    previous = first
    for line in map(_LINE, rows[1:]):
        if line != previous + 1:
            runs.append((first, previous))
            first = line
        previous = line
    runs.append((first, previous))
    return runs


def _parse_entry(entry: bytes, path: Path) -> Runs:
    spans, _, encoded = entry.partition(b" ")
    encoded, _, started = encoded.partition(b" ")
    runs = []
    try:
        for span in spans.split(b","):
            start, _, end = span.partition(b"-")
            runs.append((int(start), int(end)))
    except ValueError:
        raise Problem(f"{path} has an entry that is not a range: {entry[:80]!r}") from None
    if not encoded:  # version 1 or 2: a range, without fingerprints
        return [(first, last, None, None) for first, last in runs]
    crcs = array("I")
    try:
        crcs.frombytes(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        crcs = array("I")
    if len(crcs) != sum(last - first + 1 for first, last in runs) or any(
        first > last for first, last in runs
    ):
        raise Problem(
            f"{path} has an entry whose fingerprints do not match its lines: {entry[:80]!r}; "
            "fix or delete it"
        )
    if sys.byteorder != "little":  # pragma: no cover
        crcs.byteswap()
    since = _since(started, entry, path) if started else None
    parsed: Runs = []
    at = 0
    for first, last in runs:
        parsed.append((first, last, crcs[at : at + last - first + 1], since))
        at += last - first + 1
    return parsed


def _since(started: bytes, entry: bytes, path: Path) -> str:
    """An entry's run start, checked: an aware ISO 8601 time."""
    try:
        since = started.decode("ascii")
        if dt.datetime.fromisoformat(since).tzinfo is not None:
            return since
    except ValueError:
        pass
    raise Problem(
        f"{path} has an entry whose start is not a time: {entry[:80]!r}; fix or delete it"
    )


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    parts = []
    while chunk := os.read(fd, 1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

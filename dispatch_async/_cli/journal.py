"""The job's files: the output records, the write-ahead journal beside it, and resume.

``results.jsonl`` holds one JSON record per input line, appended as each chunk
completes (and fsynced when the run ends). ``results.jsonl.pending`` is the write-ahead
journal: when the SDK is about to send a chunk (its ``before_send`` hook), the range of
input lines the chunk spans is appended and fsynced, before the request leaves. A line
the journal covers that has no record in the output may have been sent when the process
died, so a resume records it ``maybe_sent`` instead of sending it again; after a kill that
is at most the chunks whose requests had started. Records lost to a power cut before
their fsync are lines the journal covers: maybe_sent, never sent twice.

The journal is text, one entry a line::

    dispatch-async journal 1     the header
    1001-2000                    lines 1001 to 2000 may have reached the service
    reset                        a resume starts: forget every entry above...
    17-22                        ...except these lines, still unaccounted for
    end                          (a reset block without its end is a torn write: ignored)

A resume compacts the output first: it keeps one record per line (the first), drops the
records of lines to do again (``not_sent``, malformed rows, and ``maybe_sent`` with
``--resend-maybe-sent``) and a torn last line, and replaces the file atomically. The
journal's reset block is written before that replacement, so a crash in between loses
nothing. The journal is deleted when a job has accounted for its whole input.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import attrs
import orjson

import dispatch_async as da

from .input import MALFORMED
from .records import OUTCOMES
from .spec import Problem

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, one job at a time
    fcntl = None  # type: ignore[assignment]

__all__ = ["JobFiles", "Recorded", "new_record"]

_HEADER = b"dispatch-async journal 1"
_NONE, _DONE, _PENDING, _REDO = 0, 1, 2, 3
_MARK_PENDING = bytes.maketrans(bytes([_NONE]), bytes([_PENDING]))
_PENDING_RUNS = re.compile(re.escape(bytes([_PENDING])) + b"+")


def _crc(number: str) -> int:
    return zlib.crc32(number.encode("utf-8", "surrogateescape"))


@attrs.define
class Recorded:
    """What the output said, line by line, when the job started; empty for a new job.

    ``kept`` counts the records kept per outcome; their lines are skipped. ``seen``
    holds the numbers those records sent or tried (for ``--dedupe`` across runs).
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
    redo: int = 0
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

    def matches(self, line: int, number: str | None) -> bool:
        """Whether the kept record of *line* is for *number* (the input did not change).

        A record without a number (written by hand) matches anything.
        """
        stored = self.crcs[line]
        return stored == 0 or (number is not None and stored == _crc(number))

    @property
    def done_lines(self) -> int:
        return sum(self.kept.values())

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
        if outcome == "not_sent" or (outcome == "invalid" and reason == MALFORMED):
            self.status[line] = _REDO
            self.redo += 1
            return False
        if outcome == "maybe_sent" and self.resend_maybe_sent:
            # Still "maybe sent" in the journal until a run reaches the line again.
            self.status[line] = _PENDING
            self.redo += 1
            return False
        self.status[line] = _DONE
        if number is not None:
            self.crcs[line] = _crc(number)
            if self.seen is not None and not (
                outcome == "invalid" and reason == da.DUPLICATE_REASON
            ):
                self.seen.add(self.canonical(number) if self.canonical else number)
        self.kept[outcome] += 1
        return True

    def _mark_pending(self, ranges: Iterable[tuple[int, int]], where: Path) -> None:
        for first, last in ranges:
            if not 1 <= first <= last <= self.max_line:
                raise Problem(
                    f"{where} has the range {first:,}-{last:,}, but the input has at most "
                    f"{self.max_line:,} lines: it is not a journal of this input; "
                    "fix or delete it"
                )
            self._grow(last)
            self.status[first : last + 1] = self.status[first : last + 1].translate(_MARK_PENDING)

    def pending_ranges(self) -> list[tuple[int, int]]:
        """Runs of lines that are maybe sent and have no record, as (first, last)."""
        return [(m.start(), m.end() - 1) for m in _PENDING_RUNS.finditer(self.status)]


class JobFiles:
    """The output file and its journal, for the duration of one run."""

    def __init__(self, output: Path, *, max_line: int) -> None:
        self.output = output
        self.max_line = max_line  # the input's bound: a line above it is corruption
        # Through a symlink, the journal and the rewrite belong to the file it points to:
        # a second path then meets the same lock, and the symlink stays a symlink.
        real = Path(os.path.realpath(output))
        self.journal = Path(f"{real}.pending")
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
        recorded = new_record(resend_maybe_sent, dedupe, self.max_line)
        ours = False  # a journal this run created and locked: removed again on failure
        try:
            self._journal = os.open(self.journal, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            self._lock(self._journal)
            ours = not resume
            # A hard link is a second path with its own journal: lock the output's inode too.
            if resume and self._real.exists():
                self._held = os.open(self._real, os.O_RDONLY)
                self._lock(self._held)
            previous = _read_all(self._journal)
            if not previous.startswith(_HEADER + b"\n"):
                if previous:
                    raise Problem(f"{self.journal} is not a dispatch-async journal")
                self._write_journal(_HEADER + b"\n")
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
            _sync_dir(self._real)
        except BaseException as exc:
            for path in (self._scratch, self.journal) if ours else (self._scratch,):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self.close()
            if isinstance(exc, OSError):
                where = exc.filename or self.output
                raise Problem(f"cannot use {where}: {exc.strerror}") from exc
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
        _sync_dir(self._real)

    def _reset_journal(self, recorded: Recorded) -> None:
        lines = [b"reset"]
        lines += [f"{first}-{last}".encode() for first, last in recorded.pending_ranges()]
        lines.append(b"end")
        self._write_journal(b"\n".join(lines) + b"\n")

    # -- running -------------------------------------------------------------------

    def cover(self, first: int, last: int) -> None:
        """Record durably that input lines *first* to *last* may reach the service."""
        self._write_journal(b"%d-%d\n" % (first, last))

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
            with contextlib.suppress(FileNotFoundError):
                self.journal.unlink()
            _sync_dir(self._real)
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


def new_record(
    resend_maybe_sent: bool, dedupe: Callable[[str], str] | None, max_line: int
) -> Recorded:
    """What a job starts from before reading its output (all of a new job)."""
    if dedupe is None:
        return Recorded(resend_maybe_sent, max_line=max_line)
    return Recorded(resend_maybe_sent, seen=set(), canonical=dedupe, max_line=max_line)


def _parse_journal(data: bytes, path: Path) -> list[tuple[int, int]]:
    entries = data.split(b"\n")[:-1]  # the piece after the last newline is torn or empty
    if not entries:
        return []
    if entries[0] != _HEADER:
        raise Problem(f"{path} is not a dispatch-async journal")
    current: list[tuple[int, int]] = []
    block: list[tuple[int, int]] | None = None
    for entry in entries[1:]:
        if entry == b"reset":
            block = []
        elif entry == b"end":
            if block is not None:
                current, block = block, None
        else:
            first, _, last = entry.partition(b"-")
            try:
                span = (int(first), int(last))
            except ValueError:
                raise Problem(f"{path} has an entry that is not a range: {entry!r}") from None
            (current if block is None else block).append(span)
    return current


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


def _sync_dir(path: Path) -> None:
    """Make a file's creation, rename or removal durable (POSIX; a no-op elsewhere)."""
    try:
        fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse
        pass
    finally:
        os.close(fd)

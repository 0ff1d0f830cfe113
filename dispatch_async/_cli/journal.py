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

    dispatch-async journal 2 {"endpoint": "template", "input_path": ...}
                                 the header: the job's options, for --resume without flags
    1001-2000                    lines 1001 to 2000 may have reached the service
    reset                        a resume starts: forget every entry above...
    17-22                        ...except these lines, still unaccounted for
    end                          (a reset block without its end is a torn write: ignored)

A resume compacts the output first: it keeps one record per line (the first), drops the
records of lines to do again (``not_sent``, malformed rows, and ``maybe_sent`` with
``--resend-maybe-sent``) and a torn last line, and replaces the file atomically. The
journal's reset block is written before that replacement, so a crash in between loses
nothing. The journal is deleted when a job has accounted for its whole input. A journal
from before the options were stored has the header ``dispatch-async journal 1``: it
resumes as before, with the job's flags given again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

import orjson

from .recorded import Recorded, new_record
from .spec import Problem

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, one job at a time
    fcntl = None  # type: ignore[assignment]

__all__ = ["JobFiles", "Recorded", "journal_path", "new_record", "stored_options"]

_MAGIC = b"dispatch-async journal "
_HEADER_V1 = _MAGIC + b"1"


class JobFiles:
    """The output file and its journal, for the duration of one run."""

    def __init__(self, output: Path, *, max_line: int, options: bytes | None = None) -> None:
        self.output = output
        self.max_line = max_line  # the input's bound: a line above it is corruption
        # The header of a journal this run starts: the job's options, JSON on one line.
        self._header = _HEADER_V1 if options is None else _MAGIC + b"2 " + options
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


def journal_path(output: Path) -> Path:
    """The journal of *output*: beside the file it is, through a symlink.

    Through a symlink, the journal and the rewrite belong to the file it points to: a
    second path then meets the same lock, and the symlink stays a symlink.
    """
    return Path(f"{os.path.realpath(output)}.pending")


def stored_options(output: Path) -> dict[str, object] | None:
    """The options the job writing *output* was started with, if its journal has them.

    None for a journal from before options were stored, and for a header torn by a kill
    (nothing was sent under it: ``start`` writes it again).

    Raises:
        FileNotFoundError: *output* has no journal (the job finished, or never started).
        Problem: the journal is not a dispatch-async journal.
    """
    path = journal_path(output)
    with open(path, "rb") as stream:
        header = stream.readline(1 << 20)
    if header.rstrip(b"\n") == _HEADER_V1 or (
        header.startswith(_MAGIC) and not header.endswith(b"\n")
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
    return line == _HEADER_V1 or line.startswith(_MAGIC + b"2 {")


def _parse_journal(data: bytes, path: Path) -> list[tuple[int, int]]:
    entries = data.split(b"\n")[:-1]  # the piece after the last newline is torn or empty
    if not entries:
        return []
    if not _is_header(entries[0]):
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

"""The job's options beside its results, where they outlive the journal.

The journal (``results.jsonl.pending``) stores in its header the options a job was
started with, and goes when the job has accounted for its whole input. Just before it
goes, the options are written to ``results.jsonl.job``: so the commands the summary
prints (``send --resume -o results.jsonl``, ``export results.jsonl``) work from the
results file alone once the job has finished. While a journal exists, its header is
the one read (a run stopped before its end has not written this file again).

Crash safety: the file is written whole to a scratch file, fsynced, renamed over the
old one and its directory synced, all before the journal is removed: at every moment
one of the two holds the options. It is private (0600): the callback URL's token is
among the options. Results files written before this file existed have none: their
commands take the job's flags again (``export -i``, ``send ENDPOINT ... --resume``).

The file is one line: the options as the journal's header holds them, and the input's
size and modification time when the job finished, so that ``export`` taking the input
from here refuses one changed since (its rows would no longer be the job's lines)::

    dispatch-async job 1 {"options": {"endpoint": "basic", ...}, "input": {"size": ...}}
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import orjson

from ..screen.problem import DISK_ERRORS, Problem

__all__ = [
    "forget_options",
    "input_changed",
    "job_path",
    "keep_options",
    "kept_options",
    "sync_dir",
]

_MAGIC = b"dispatch-async job 1 "


def job_path(output: Path) -> Path:
    """Where the options of the job writing *output* are kept (beside the file it is)."""
    return Path(f"{os.path.realpath(output)}.job")


def keep_options(output: Path, options: bytes) -> None:
    """Write *options* (the job's, JSON) for *output* atomically and durably."""
    parsed = orjson.loads(options)
    kept = orjson.dumps({"options": parsed, "input": _stamp(parsed.get("input_path"))})
    path = job_path(output)
    scratch = Path(f"{path}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = memoryview(_MAGIC + kept + b"\n")
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        scratch.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(scratch, path)
    sync_dir(path)


def forget_options(output: Path) -> None:
    """Remove options kept for an earlier job at *output* (a new job starts there)."""
    path = job_path(output)
    if os.path.lexists(path):  # looked at first: most jobs have none to remove
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def kept_options(output: Path) -> dict[str, object]:
    """The options kept for the finished job that wrote *output*.

    Without *output* there are none: its results deleted, a resume of the job would send
    every row again.

    Raises:
        FileNotFoundError: none are kept (a job still running, or from before this file),
            or *output* is gone.
        Problem: the file is not one of these.
    """
    if not os.path.exists(output):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(output))
    options = _read(output).get("options")
    if type(options) is not dict:
        raise Problem(f"{job_path(output)} does not hold a job's options; fix or delete it")
    return options


def input_changed(output: Path, input_path: str) -> bool:
    """Whether *input_path* is not as it was when the job writing *output* finished.

    False when nothing is known (no file kept, an input that was stdin): the rows are
    then taken as they are, as with ``export -i``.
    """
    try:
        kept = _read(output)
    except (FileNotFoundError, Problem):
        return False
    stamp = kept.get("input")
    return stamp is not None and stamp != _stamp(input_path)


def _read(output: Path) -> dict[str, object]:
    path = job_path(output)
    with open(path, "rb") as stream:
        line = stream.readline(1 << 20)
    kept = None
    if line.startswith(_MAGIC) and line.endswith(b"\n"):
        with contextlib.suppress(orjson.JSONDecodeError):
            kept = orjson.loads(line[len(_MAGIC) :])
    if type(kept) is not dict:
        raise Problem(f"{path} does not hold a job's options; fix or delete it")
    return kept


def _stamp(input_path: object) -> dict[str, int] | None:
    """The input's size and modification time (None: stdin, or it cannot be read)."""
    if not isinstance(input_path, str) or input_path == "-":
        return None
    try:
        found = os.stat(input_path)
    except OSError:
        return None
    return {"size": found.st_size, "mtime_ns": found.st_mtime_ns}


def sync_dir(path: Path) -> None:
    """Make a file's creation, rename or removal durable (POSIX; a no-op elsewhere).

    A directory that cannot be synced (Windows, some filesystems) is let be; a failing
    disk is not: the change may not last, and a journal that vanishes resends lines.
    """
    try:
        fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    except OSError as exc:  # pragma: no cover - Windows cannot open a directory; POSIX can
        if exc.errno in DISK_ERRORS:
            raise
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - some filesystems refuse (EINVAL); tmp does not
        if exc.errno in DISK_ERRORS:
            raise
    finally:
        os.close(fd)

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

The file is one line, as the journal's header is::

    dispatch-async job 1 {"endpoint": "basic", "input_path": ...}
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import orjson

from ..screen.problem import DISK_ERRORS, Problem

__all__ = ["forget_options", "job_path", "keep_options", "kept_options", "sync_dir"]

_MAGIC = b"dispatch-async job 1 "


def job_path(output: Path) -> Path:
    """Where the options of the job writing *output* are kept (beside the file it is)."""
    return Path(f"{os.path.realpath(output)}.job")


def keep_options(output: Path, options: bytes) -> None:
    """Write *options* (the job's, JSON) for *output* atomically and durably."""
    path = job_path(output)
    scratch = Path(f"{path}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = memoryview(_MAGIC + options + b"\n")
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
    with contextlib.suppress(FileNotFoundError):
        job_path(output).unlink()


def kept_options(output: Path) -> dict[str, object]:
    """The options kept for the finished job that wrote *output*.

    Raises:
        FileNotFoundError: none are kept (a job still running, or from before this file).
        Problem: the file is not one of these.
    """
    path = job_path(output)
    with open(path, "rb") as stream:
        line = stream.readline(1 << 20)
    options = None
    if line.startswith(_MAGIC) and line.endswith(b"\n"):
        with contextlib.suppress(orjson.JSONDecodeError):
            options = orjson.loads(line[len(_MAGIC) :])
    if type(options) is not dict:
        raise Problem(f"{path} does not hold a job's options; fix or delete it")
    return options


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

"""The job's side of the crash explorer: a fork server that runs ``dispatch-async`` with
its file-system calls on the job's directory counted, and one of them crashed or failed.

Started once (``python -m tests.crash_interpose``), it imports the command and then, for
each request on stdin (one JSON line), forks a child that patches the ``os``/``io``
calls the journal and the output use, runs the command, and reports how it ended (one
JSON line on stdout). Forking a warm interpreter makes a run cost a fraction of a cold
start, which is what lets the explorer try every point in minutes.

Only calls on the job's directory count (the journal, the output, the compaction's
scratch file, and the directory itself): the input sits elsewhere, and Python's own
imports never reach the patched functions. A point is one of ``open``, ``write``,
``fsync``, ``rename``, ``truncate``, ``unlink``, ``flock``; writes through a buffered
file (the compaction) count at each flush to the file descriptor.

What happens at the k-th point (``mode``):

``count``         nothing: every point is traced (``op path`` per line), to count them.
``kill-before``   SIGKILL before the call.
``kill-after``    SIGKILL just after it returns.
``power``         a power cut before the call: the directory is set to what was durable
                  (each file as of its last fsync, each name as of the directory's last
                  fsync; a file never fsynced is empty), then SIGKILL.
``enospc``/``eio`` the call fails with that errno (once; later calls succeed).
``short``         a write writes half its bytes and returns that count; the disk is then
                  full (every later write fails with ENOSPC). Only writes count: k is
                  the k-th write.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

OPS = ("open", "write", "fsync", "rename", "truncate", "unlink", "flock")
KILLS = ("kill-before", "kill-after", "power")
FAULTS = ("enospc", "eio", "short")


class Interposer:
    """The patched calls of one child: counts points under *jobdir*, acts at the k-th."""

    def __init__(self, jobdir: str, mode: str, k: int, trace: int) -> None:
        self.jobdir = os.path.realpath(jobdir)
        self.mode = mode
        self.k = k
        self.trace = trace  # an fd outside the job's directory
        self.seen = 0
        self.full = False  # after a short write: the disk is full
        self.fds: set[int] = set()
        self.lock = threading.Lock()
        self.real: dict[str, Callable[..., Any]] = {}
        # The durable state, for ``power``: names -> inode, inode -> content.
        self.names = self._listing()
        self.contents = {ino: self._read(name) for name, ino in self.names.items()}

    # -- the model of durability -------------------------------------------------------

    def _listing(self) -> dict[str, int]:
        return {
            entry.name: entry.inode()
            for entry in os.scandir(self.jobdir)
            if entry.is_file(follow_symlinks=False)
        }

    def _read(self, name: str) -> bytes:
        with open(os.path.join(self.jobdir, name), "rb") as stream:  # before install()
            return stream.read()

    def _synced(self, fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == self.jobdir:
            self.names = self._listing()
        else:
            with self.real["open"](f"/proc/self/fd/{fd}", "rb") as stream:
                self.contents[os.fstat(fd).st_ino] = stream.read()

    def _power_cut(self) -> None:
        unlink = self.real["unlink"]
        for entry in os.scandir(self.jobdir):
            if entry.is_file(follow_symlinks=False):
                unlink(entry.path)
        for name, ino in self.names.items():
            with self.real["open"](os.path.join(self.jobdir, name), "wb") as stream:
                stream.write(self.contents.get(ino, b""))

    # -- the points ----------------------------------------------------------------------

    def tracked(self, path: Any) -> bool:
        if isinstance(path, int):
            return path in self.fds
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return full == self.jobdir or os.path.dirname(full) == self.jobdir

    def point(self, op: str, where: Any, call: Callable[[], Any], *, write: bool = False) -> Any:
        """Count one point; crash, fail or pass it through."""
        if self.mode == "short" and not write:
            return call()
        with self.lock:  # the journal is written from worker threads
            self.seen += 1
            seen = self.seen
        name = os.readlink(f"/proc/self/fd/{where}") if isinstance(where, int) else where
        label = os.path.basename(os.fsdecode(name))
        if self.mode == "count" or seen == self.k:
            self.real["write"](self.trace, f"{seen} {op} {label}\n".encode())
        if self.full and write:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if seen != self.k or self.mode == "count":
            return call()
        if self.mode == "kill-before":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "power":
            self._power_cut()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode in ("enospc", "eio"):
            code = errno.ENOSPC if self.mode == "enospc" else errno.EIO
            raise OSError(code, os.strerror(code))
        if self.mode == "short":
            self.full = True
            return None  # the caller writes half
        result = call()
        os.kill(os.getpid(), signal.SIGKILL)  # kill-after
        return result

    # -- patching ------------------------------------------------------------------------

    def install(self) -> None:
        real = self.real
        real.update(
            open=builtins.open,
            os_open=os.open,
            write=os.write,
            fsync=os.fsync,
            replace=os.replace,
            rename=os.rename,
            ftruncate=os.ftruncate,
            unlink=os.unlink,
            flock=fcntl.flock,
            close=os.close,
        )
        me = self

        def os_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            if not me.tracked(path):
                return int(real["os_open"](path, flags, mode, **kw))
            fd = int(me.point("open", path, lambda: real["os_open"](path, flags, mode, **kw)))
            me.fds.add(fd)
            return fd

        def write(fd: int, data: Any) -> int:
            if fd not in me.fds:
                return int(real["write"](fd, data))
            view = memoryview(data)
            done = me.point("write", fd, lambda: real["write"](fd, view), write=True)
            if done is None:  # a short write: half of it
                done = real["write"](fd, view[: max(1, len(view) // 2)])
            return int(done)

        def fsync(fd: Any) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            if number not in me.fds:
                return real["fsync"](fd)  # type: ignore[no-any-return]
            me.point("fsync", number, lambda: real["fsync"](number))
            me._synced(number)
            return None

        def renamer(name: str) -> Callable[..., None]:
            def rename(src: Any, dst: Any, **kw: Any) -> None:
                if not (me.tracked(src) or me.tracked(dst)):
                    return real[name](src, dst, **kw)  # type: ignore[no-any-return]
                return me.point("rename", dst, lambda: real[name](src, dst, **kw))  # type: ignore[no-any-return]

            return rename

        def ftruncate(fd: int, length: int) -> None:
            if fd not in me.fds:
                return real["ftruncate"](fd, length)  # type: ignore[no-any-return]
            return me.point("truncate", fd, lambda: real["ftruncate"](fd, length))  # type: ignore[no-any-return]

        def unlink(path: Any, **kw: Any) -> None:
            if not me.tracked(path):
                return real["unlink"](path, **kw)  # type: ignore[no-any-return]
            return me.point("unlink", path, lambda: real["unlink"](path, **kw))  # type: ignore[no-any-return]

        def flock(fd: Any, operation: int) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            if number not in me.fds:
                return real["flock"](fd, operation)  # type: ignore[no-any-return]
            return me.point("flock", number, lambda: real["flock"](fd, operation))  # type: ignore[no-any-return]

        def close(fd: int) -> None:
            me.fds.discard(fd)
            return real["close"](fd)  # type: ignore[no-any-return]

        class TracedFile(io.FileIO):
            """A file opened with ``open()`` in the job's directory: writes are points."""

            def write(self, data: Any) -> int:
                return write(self.fileno(), data)

            def close(self) -> None:
                if not self.closed:
                    me.fds.discard(self.fileno())
                super().close()

        def traced_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
            if isinstance(file, int) or not me.tracked(file) or "b" not in mode:
                return real["open"](file, mode, *args, **kw)
            raw_mode = mode.replace("b", "")
            raw = me.point("open", file, lambda: TracedFile(file, raw_mode))
            me.fds.add(raw.fileno())
            if "r" in raw_mode and "+" not in raw_mode:
                return io.BufferedReader(raw)
            return io.BufferedWriter(raw)

        os.open = os_open
        os.write = write
        os.fsync = fsync
        os.replace = renamer("replace")
        os.rename = renamer("rename")
        os.ftruncate = ftruncate
        os.unlink = unlink
        os.close = close
        fcntl.flock = flock
        builtins.open = io.open = traced_open


def _child(request: dict[str, Any]) -> None:
    """In the forked child: set up stdio and the environment, patch, run, exit."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    trace = os.open(request["trace"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    Interposer(request["jobdir"], request["mode"], request["k"], trace).install()
    from dispatch_async._cli import main

    code = 0
    try:
        main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """Fork a child per request on stdin; answer each with how it ended."""
    import dispatch_async._cli.commands  # noqa: F401 - warm: every child starts imported

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(request)
            finally:
                os._exit(70)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            answer = {"signal": os.WTERMSIG(status)}
        else:
            answer = {"code": os.WEXITSTATUS(status)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()

"""A server binary (nginx, tinyproxy) run on 127.0.0.1 until a block ends, without pytest.

Shared by the tests (tests/network/_daemon.py, which turns a failed start into a test
failure) and the benchmarks (benchmarks/https.py).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

__all__ = ["START_TIMEOUT", "did_not_start", "free_port", "running"]

#: How long a server may take to listen, however loaded the machine.
START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def did_not_start(message: str) -> NoReturn:
    """The default report of a server that did not start."""
    raise RuntimeError(message)


@contextmanager
def running(
    command: Sequence[str], port: int, log: Path, *, fail: Callable[[str], NoReturn] = did_not_start
) -> Iterator[subprocess.Popen[bytes]]:
    """*command* running until the block ends, once it listens on *port*; its output in *log*.

    A server that exits or does not listen within `START_TIMEOUT` is reported by *fail*.
    """
    with log.open("wb") as output:
        process = subprocess.Popen(  # noqa: S603 - a fixed binary, arguments of the caller's
            list(command), stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                fail(f"{command[0]} did not start: {log.read_text(errors='replace')}")
            time.sleep(0.02)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a server that hangs on TERM
            process.kill()
            process.wait()

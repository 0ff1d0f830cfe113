"""A real server binary (nginx, tinyproxy) run by a test on 127.0.0.1, and stopped after."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fleet.conftest import free_port

__all__ = ["START_TIMEOUT", "binary", "free_port", "running"]

#: How long a server may take to listen, however loaded the machine.
START_TIMEOUT = 20.0


def binary(path: str, package: str) -> str:
    """The server at *path*; a skip with the reason when it is missing, a failure in CI."""
    found = shutil.which(path)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {path} (.ci/run installs the {package} package)")
        pytest.skip(f"{path} is missing (apt-get install -y {package})")
    return found


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def running(command: Sequence[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """*command* running until the block ends, once it listens on *port*; its output in *log*."""
    with log.open("wb") as output:
        process = subprocess.Popen(  # noqa: S603 - a fixed binary, arguments of the test's
            list(command), stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{command[0]} did not start: {log.read_text(errors='replace')}")
            time.sleep(0.02)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a server that hangs on TERM
            process.kill()
            process.wait()

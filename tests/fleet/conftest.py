"""A real redis-server on 127.0.0.1 for the fleet tests, started once per test session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answer_to_ping(port: int) -> bytes:
    """What the Redis on *port* answers a PING, b"" if none (a socket's own: redis-py
    would retry a LOADING answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64)
    except OSError:
        return b""


def _answers_ping(port: int) -> bool:
    return answer_to_ping(port).startswith(b"+PONG")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """The URL of a redis-server on 127.0.0.1 (no persistence).

    CI starts one and names it in DISPATCH_TEST_REDIS_URL; elsewhere a throwaway one is
    started here, and stopped at the end. In CI a missing Redis fails instead of skipping.
    """
    given = os.environ.get("DISPATCH_TEST_REDIS_URL")
    if given:
        yield given
        return
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide redis-server (see .ci/run)")
        pytest.skip("redis-server is not on PATH (apt-get install -y redis-server)")
    port = free_port()
    process = subprocess.Popen(  # noqa: S603 - redis-server from PATH, fixed arguments
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _answers_ping(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests never share a token or a limit."""
    return f"test-{uuid.uuid4().hex[:12]}:"

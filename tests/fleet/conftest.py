"""A real redis-server on 127.0.0.1 for the fleet tests, started once per test session,
and Redis users that may do less."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from tools.daemon import free_port
from tools.redis_topologies import (
    Cluster,
    MissingProgram,
    SentinelSet,
    TlsRedis,
    running_cluster,
    running_sentinels,
    running_tls_redis,
)
from tools.redis_topologies import (
    binary as program,
)


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
    with programs_required():
        binary = program("redis-server")
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


@contextlib.contextmanager
def programs_required() -> Iterator[None]:
    """Inside, a missing Redis program skips the test; in CI (``CI`` set) it fails it."""
    try:
        yield
    except MissingProgram as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide it (see .ci/run): {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 3-primary, 3-replica Redis Cluster on 127.0.0.1, for the whole test session."""
    with programs_required(), running_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """A primary, its replica and 3 sentinels on 127.0.0.1, for the whole test session."""
    with programs_required(), running_sentinels(tmp_path_factory.mktemp("sentinel")) as sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A TLS-only Redis on 127.0.0.1 whose certificate a private CA signed."""
    with programs_required(), running_tls_redis(tmp_path_factory.mktemp("tls")) as server:
        yield server


@pytest.fixture(params=["single", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> str:
    """The URL of a single Redis, then of one node of a Redis Cluster."""
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster").url  # type: ignore[no-any-return]
    return request.getfixturevalue("redis_server")  # type: ignore[no-any-return]


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests never share a token or a limit."""
    return f"test-{uuid.uuid4().hex[:12]}:"


@contextlib.asynccontextmanager
async def redis_user(redis_server: str, prefix: str, *rules: str) -> AsyncIterator[str]:
    """The URL of a Redis user (yielded) that may run only *rules* (ACL SETUSER words:
    ``+get``, ``-@all``...) on the keys under *prefix*; deleted at the end."""
    admin = redis.asyncio.Redis.from_url(redis_server)
    user = f"user-{prefix.rstrip(':')}"
    await admin.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">s3cret", f"~{prefix}*", *rules
    )
    try:
        yield redis_server.replace("redis://", f"redis://{user}:s3cret@")
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


def user_of(url: str) -> str:
    """The user name in a URL of `redis_user`."""
    return url.split("//", 1)[1].split(":", 1)[0]

"""The real parts between the SDK and the vendor, on 127.0.0.1: a Node ``http`` server
serving the vendor's endpoints (node_service.js), and a relay that adds latency."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

SCRIPT = Path(__file__).with_name("node_service.js")
#: A bound on a wait that only a hang reaches.
HANG = 30.0


@attrs.frozen
class NodeService:
    """A running node_service.js: its URL, and what it received."""

    url: str
    process: subprocess.Popen[bytes] = attrs.field(repr=False)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def seen(self, context: ssl.SSLContext | None = None) -> dict[str, Any]:
        """Connections accepted, token and dispatch requests, and each number's count.

        *context*: the TLS trust to ask an HTTPS service with.
        """
        connector = aiohttp.TCPConnector(force_close=True, ssl=context or True)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(f"{self.url}/_seen") as answer,
        ):
            seen: dict[str, Any] = await answer.json()
        seen["connections"] -= 1  # this question's own
        return seen

    def wait_for_line(self, expected: bytes) -> None:
        """Block (the event loop too, on purpose) until the service prints *expected*."""
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], HANG)
        assert ready, f"node_service.js did not print {expected!r}"
        assert stdout.readline().strip() == expected


def node_binary() -> str:
    """Node's path; a skip where it is missing, a failure in CI (.ci/run installs it)."""
    binary = shutil.which("node")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide node (see .ci/run: Debian's nodejs)")
        pytest.skip("node is not on PATH (apt-get install -y nodejs)")
    return binary


@contextlib.contextmanager
def node_service(*options: str) -> Iterator[NodeService]:
    """node_service.js with *options* on a free port of 127.0.0.1, stopped at the end."""
    process = subprocess.Popen(  # noqa: S603 - node from PATH, our script, fixed options
        [node_binary(), str(SCRIPT), *options], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], HANG)
        port = process.stdout.readline().strip() if ready else b""
        if not port.isdigit():
            pytest.fail("node_service.js did not start")
        yield NodeService(f"http://127.0.0.1:{int(port)}", process)
    finally:
        process.terminate()
        process.wait(timeout=HANG)
        if process.stdout is not None:
            process.stdout.close()


class LatencyRelay:
    """A TCP relay on 127.0.0.1 that delivers every byte, end and reset *delay* s late.

    Each way keeps its order; the server's FIN reaches the client *delay* late, as over
    a real network, so a request can be on its way while the server is closing.
    """

    def __init__(self, target_port: int, delay: float) -> None:
        self._target = target_port
        self._delay = delay
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> LatencyRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                end.transport.abort()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(queue, sink))
        try:
            while True:
                try:
                    chunk: bytes | None = await source.read(65536)
                except ConnectionError:
                    chunk = None  # a reset: passed on as one
                queue.put_nowait((loop.time() + self._delay, chunk))
                if not chunk:
                    break
            await deliver
        finally:
            deliver.cancel()

    @staticmethod
    async def _deliver(
        queue: asyncio.Queue[tuple[float, bytes | None]], sink: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(due - loop.time(), 0))
            if sink.transport.is_closing():
                return
            if chunk is None:
                sink.transport.abort()
                return
            if not chunk:
                sink.write_eof()
                return
            sink.write(chunk)

"""A real forward proxy (tinyproxy, Debian's) on 127.0.0.1, and what its log says passed."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import attrs
import pytest

from ._daemon import binary, free_port, running

PROXY_USER = "proxy-user"
PROXY_PASSWORD = "proxy-pass-7c1e"


@attrs.frozen
class Proxy:
    """A running tinyproxy: its URL (no credentials) and its log."""

    url: str
    port: int
    log: Path

    def connects(self) -> list[str]:
        """The ``host:port`` of every CONNECT the proxy was asked for, in order."""
        text = self.log.read_text(errors="replace")
        return re.findall(r"CONNECT (\S+) HTTP", text)

    def with_credentials(self, user: str = PROXY_USER, password: str = PROXY_PASSWORD) -> str:
        return self.url.replace("http://", f"http://{user}:{password}@")


@contextmanager
def tinyproxy(
    directory: Path, *, connect_ports: tuple[int, ...] = (), password: bool = False
) -> Iterator[Proxy]:
    """A tinyproxy on 127.0.0.1 that logs every request.

    *connect_ports*: the only ports it tunnels to (others get 403); *password*: it wants
    `PROXY_USER`/`PROXY_PASSWORD` (else 407).
    """
    path = binary("/usr/bin/tinyproxy", "tinyproxy")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "tinyproxy.log"
    log.touch()
    lines = [
        f"Port {port}",
        "Listen 127.0.0.1",
        "Timeout 30",
        "MaxClients 20",
        "Allow 127.0.0.1",
        f'LogFile "{log}"',
        "LogLevel Connect",
        "DisableViaHeader Yes",
        *(f"ConnectPort {allowed}" for allowed in connect_ports),
    ]
    if password:
        lines.append(f"BasicAuth {PROXY_USER} {PROXY_PASSWORD}")
    config = directory / "tinyproxy.conf"
    config.write_text("\n".join(lines) + "\n")
    with running([path, "-d", "-c", str(config)], port, directory / "tinyproxy.out"):
        yield Proxy(f"http://127.0.0.1:{port}", port, log)


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(name="clean_proxy_env")
def clean_proxy_env_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy in the environment but what the test sets."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture(name="proxy")
def proxy_fixture(tmp_path: Path) -> Iterator[Proxy]:
    """A tinyproxy that tunnels anywhere."""
    with tinyproxy(tmp_path / "tinyproxy") as running_proxy:
        yield running_proxy


@asynccontextmanager
async def refusing_proxy(status: int, reason: str) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A proxy in this process that answers every request *status*, as squid answers 407
    to a CONNECT without credentials: its URL, and the request heads it was sent."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(
                f'HTTP/1.1 {status} {reason}\r\nProxy-Authenticate: Basic realm="test"\r\n'
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", heads
    finally:
        server.close()
        await server.wait_closed()

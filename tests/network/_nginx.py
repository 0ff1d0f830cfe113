"""A real nginx (Debian's nginx-light) on 127.0.0.1, started and stopped by a test.

`start_nginx` writes a configuration into a directory of the test's own and runs nginx in
the foreground on a free port, with one ``server`` block the test gives (its directives
without ``listen``). A missing nginx skips the test, or fails it where CI is set (CI must
install it: see .ci/run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

__all__ = ["Nginx", "start_nginx"]

NGINX = "/usr/sbin/nginx"
_START_TIMEOUT = 10.0

_CONFIG = """\
daemon off;
worker_processes 1;
{user}
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    server {{
        listen 127.0.0.1:{port}{listen};
{server}
    }}
}}
"""


@attrs.frozen
class Nginx:
    """A running nginx: where it listens, and its error log."""

    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return (self.directory / "error.log").read_text(errors="replace")


def nginx_binary() -> str:
    """The nginx to run; skips the test if there is none (fails it where CI is set)."""
    binary = NGINX if os.access(NGINX, os.X_OK) else shutil.which("nginx")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide nginx (apt-get install nginx-light: see .ci/run)")
        pytest.skip("nginx is not installed (apt-get install -y nginx-light)")
    return binary


@contextlib.contextmanager
def start_nginx(directory: Path, server: str, *, listen: str = "") -> Iterator[Nginx]:
    """nginx on 127.0.0.1 with *server* (a server block's directives, no ``listen``).

    *listen* is added to the ``listen`` directive (``" ssl"``). Its files are kept in
    *directory*; it is stopped on exit.
    """
    binary = nginx_binary()
    directory.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    # As root, nginx's workers would run as nobody, who cannot write the test's directory.
    user = "user root;" if os.geteuid() == 0 else ""
    config = directory / "nginx.conf"
    config.write_text(
        _CONFIG.format(user=user, directory=directory, port=port, listen=listen, server=server)
    )
    process = subprocess.Popen(  # noqa: S603 - nginx, a configuration the test wrote
        [binary, "-p", str(directory), "-c", str(config), "-e", str(directory / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    nginx = Nginx(port, directory)
    try:
        _wait_for(process, port, nginx)
        yield nginx
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck nginx
            process.kill()
            process.wait()


def _wait_for(process: subprocess.Popen[bytes], port: int, nginx: Nginx) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"nginx did not start:\n{nginx.error_log()}")
        time.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

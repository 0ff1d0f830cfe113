"""A real nginx (Debian's nginx-light) on 127.0.0.1, without pytest.

`start_nginx` runs nginx in the foreground on a free port with one ``server`` block the
caller gives (its directives, without ``listen``); `nginx_tls` is one in front of the
simulator, terminating TLS with a certificate from a CA the caller made (trustme) and
serving it under a path prefix, as a company's reverse proxy may. Used by the tests
(tests/network/_nginx.py) and by the HTTPS benchmark (benchmarks/https.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import attrs
import trustme

from tools.daemon import did_not_start, free_port, running

__all__ = ["NGINX", "PREFIX", "Nginx", "nginx_tls", "start_nginx"]

#: Where Debian's nginx-light puts the binary.
NGINX = "/usr/sbin/nginx"

#: The prefix `nginx_tls` serves the simulator under.
PREFIX = "/rcs"

_CONFIG = """\
{user}
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {directory}/client_body;
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
    """A running nginx: where it listens, and what it logged."""

    port: int
    directory: Path
    base_url: str
    """The URL a session is given: ``http://127.0.0.1:PORT``, or `nginx_tls`'s https one."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return (self.directory / "error.log").read_text(errors="replace")

    def requests(self) -> list[str]:
        """The request lines nginx served (``POST /rcs/oauth/token``), in order."""
        lines = (self.directory / "access.log").read_text(errors="replace").splitlines()
        return [line.split('"')[1].rsplit(" ", 1)[0] for line in lines if '"' in line]


@contextmanager
def start_nginx(
    directory: Path,
    server: str,
    *,
    listen: str = "",
    scheme: str = "http",
    path: str = "",
    nginx: str = NGINX,
    fail: Callable[[str], NoReturn] = did_not_start,
) -> Iterator[Nginx]:
    """nginx (the binary *nginx*) on 127.0.0.1 with *server* (a server block's directives,
    no ``listen``).

    *listen* is added to the ``listen`` directive (``" ssl"``); *scheme* and *path* make
    its `Nginx.base_url`. Its files are kept in *directory*; it is stopped on exit. A
    start that fails is reported by *fail*.
    """
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # As root, nginx's workers would run as nobody, who cannot write the caller's directory.
    user = "user root root;" if os.geteuid() == 0 else ""
    config = directory / "nginx.conf"
    config.write_text(
        _CONFIG.format(user=user, directory=directory, port=port, listen=listen, server=server)
    )
    command = [nginx, "-p", str(directory), "-c", str(config), "-g", "daemon off;"]
    with running(command, port, directory / "nginx.out", fail=fail):
        yield Nginx(port, directory, f"{scheme}://127.0.0.1:{port}{path}")


@contextmanager
def nginx_tls(
    directory: Path,
    ca: trustme.CA,
    upstream: str,
    *,
    nginx: str = NGINX,
    fail: Callable[[str], NoReturn] = did_not_start,
) -> Iterator[Nginx]:
    """nginx speaking TLS with a certificate for 127.0.0.1 that *ca* issued, passing
    ``/rcs/...`` to *upstream* (the simulator's URL)."""
    directory.mkdir(parents=True, exist_ok=True)
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = directory / "chain.pem", directory / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(str(chain))
    for blob in certificate.cert_chain_pems[1:]:
        blob.write_to_path(str(chain), append=True)
    certificate.private_key_pem.write_to_path(str(key))
    server = f"""
        ssl_certificate {chain};
        ssl_certificate_key {key};
        location {PREFIX}/ {{
            proxy_pass {upstream.rstrip("/")}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
"""
    with start_nginx(
        directory, server, listen=" ssl", scheme="https", path=PREFIX, nginx=nginx, fail=fail
    ) as running_nginx:
        yield running_nginx

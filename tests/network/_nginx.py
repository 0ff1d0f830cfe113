"""A real nginx on 127.0.0.1 terminating TLS with a certificate from a CA the test made
(trustme), in front of the simulator, as a reverse proxy under a path prefix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
import trustme

from dispatch_async.testing import FakeDispatchServer

from ._daemon import binary, free_port, running

#: The prefix nginx serves the simulator under, as a company's reverse proxy may.
PREFIX = "/rcs"


@attrs.frozen
class Nginx:
    """A running nginx: the service's base URL through it (https, the prefix included)."""

    base_url: str
    port: int
    access_log: Path

    def requests(self) -> list[str]:
        """The request lines nginx served (``POST /rcs/oauth/token``), in order."""
        lines = self.access_log.read_text(errors="replace").splitlines()
        return [line.split('"')[1].rsplit(" ", 1)[0] for line in lines if '"' in line]


@contextmanager
def nginx_tls(directory: Path, ca: trustme.CA, upstream: str) -> Iterator[Nginx]:
    """nginx on 127.0.0.1 speaking TLS with a certificate for 127.0.0.1 that *ca* issued,
    passing ``/rcs/...`` to *upstream* (the simulator's URL)."""
    path = binary("/usr/sbin/nginx", "nginx-light")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = directory / "chain.pem", directory / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(str(chain))
    for blob in certificate.cert_chain_pems[1:]:
        blob.write_to_path(str(chain), append=True)
    certificate.private_key_pem.write_to_path(str(key))
    temp = "".join(
        f"{kind}_temp_path {directory / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root root;" if os.geteuid() == 0 else ""  # else workers cannot read temp
    access_log = directory / "access.log"
    config = directory / "nginx.conf"
    config.write_text(f"""
{user}
worker_processes 1;
pid {directory / "nginx.pid"};
error_log {directory / "error.log"} info;
events {{ worker_connections 64; }}
http {{
    access_log {access_log};
    {temp}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        location {PREFIX}/ {{
            proxy_pass {upstream.rstrip("/")}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
""")
    command = [path, "-p", str(directory), "-c", str(config), "-g", "daemon off;"]
    with running(command, port, directory / "nginx.out"):
        yield Nginx(f"https://127.0.0.1:{port}{PREFIX}", port, access_log)


@pytest.fixture(scope="session", name="ca")
def ca_fixture() -> trustme.CA:
    """A certificate authority of this test run's own: no system trusts it."""
    return trustme.CA()


@pytest.fixture(name="ca_file")
def ca_file_fixture(ca: trustme.CA, tmp_path: Path) -> Path:
    """The CA's certificate as a PEM file, as a company hands its CA out."""
    path = tmp_path / "company-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(name="nginx")
def nginx_fixture(server: FakeDispatchServer, ca: trustme.CA, tmp_path: Path) -> Iterator[Nginx]:
    """nginx with TLS from `ca`, serving the simulator under /rcs."""
    with nginx_tls(tmp_path / "nginx", ca, server.url) as running_nginx:
        yield running_nginx

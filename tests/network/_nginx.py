"""A real nginx (Debian's nginx-light) on 127.0.0.1, started and stopped by a test.

The launcher is tools/nginx.py's (the HTTPS benchmark uses it too): `start_nginx` runs
nginx with one ``server`` block the test gives, `nginx_tls` one terminating TLS in front
of the simulator under `PREFIX`. Here a missing nginx is a skip (a failure in CI) and a
failed start fails the test; the fixtures make the CA and the nginx a test uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import trustme

from dispatch_async.testing import FakeDispatchServer
from tools import nginx as _launcher
from tools.nginx import NGINX, PREFIX, Nginx

from ._daemon import binary

__all__ = ["PREFIX", "Nginx", "nginx_tls", "start_nginx"]


def start_nginx(
    directory: Path, server: str, *, listen: str = "", scheme: str = "http", path: str = ""
) -> AbstractContextManager[Nginx]:
    """tools.nginx.start_nginx, with the test's skip or failure."""
    return _launcher.start_nginx(
        directory,
        server,
        listen=listen,
        scheme=scheme,
        path=path,
        nginx=binary(NGINX, "nginx-light"),
        fail=pytest.fail,
    )


def nginx_tls(directory: Path, ca: trustme.CA, upstream: str) -> AbstractContextManager[Nginx]:
    """tools.nginx.nginx_tls, with the test's skip or failure."""
    return _launcher.nginx_tls(
        directory, ca, upstream, nginx=binary(NGINX, "nginx-light"), fail=pytest.fail
    )


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

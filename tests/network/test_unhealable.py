"""What will not heal fails at once, naming the host: a host name that does not resolve,
TLS spoken to a plain port, and a base URL the token endpoint is not under (a 404 says
the URL looks wrong, not that the secret was refused). Every recipient is accounted for,
``not_sent``. (Certificates and refusing proxies: test_tls.py, test_proxies.py.)"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeClock, FakeDispatchServer
from tests.conftest import SECRET, TEMPLATE, numbers

from ._nginx import Nginx, ca_file_fixture, ca_fixture, nginx_fixture

FIXTURES = (ca_fixture, ca_file_fixture, nginx_fixture)


def resolving_nothing(
    monkeypatch: pytest.MonkeyPatch, code: int, clock: FakeClock, attempts: int = 5
) -> da.DispatchSession:
    """A session to ``dispatch.invalid``, which fails to resolve with *code* as glibc
    fails, without asking a DNS server (nothing but 127.0.0.1 is reached in the tests)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(code, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return da.DispatchSession(
        "https://dispatch.invalid",
        client_secret=SECRET,
        account="acme",
        retry=da.RetryPolicy(attempts=attempts, clock=clock),
    )


class TestAHostNameThatDoesNotResolve:
    async def test_fails_at_once_naming_the_host_every_recipient_not_sent(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = FakeClock()
        async with resolving_nothing(monkeypatch, socket.EAI_NONAME, clock) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.send_template(numbers(3), **TEMPLATE)
        error = caught.value
        assert error.message == (
            "the host name dispatch.invalid does not resolve (Name or service not known): "
            "nothing was sent"
        )
        assert error.result is not None
        assert [f.maybe_sent for f in error.result.failed] == [False] * 3
        assert clock.sleeps == []

    async def test_a_temporary_failure_to_resolve_is_retried(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = FakeClock()
        async with resolving_nothing(monkeypatch, socket.EAI_AGAIN, clock, attempts=3) as session:
            with pytest.raises(da.TokenUnavailableError, match="could not connect to dispatch"):
                await session.check_credentials()
        assert len(clock.sleeps) == 2


class TestTLSToAPlainPort:
    async def test_fails_at_once_naming_host_and_port(self, server: FakeDispatchServer) -> None:
        clock = FakeClock()
        plain = server.url.replace("http://", "https://")
        async with da.DispatchSession(
            plain, client_secret=SECRET, account="acme", retry=da.RetryPolicy(clock=clock)
        ) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.send_template(numbers(2), **TEMPLATE)
        error = caught.value
        port = plain.rsplit(":", 1)[1]
        # OpenSSL's reason ("[SSL: WRONG_VERSION_NUMBER] wrong version number" here; its
        # wording varies by version), without aiohttp's text or OpenSSL's source line.
        assert re.fullmatch(
            rf"TLS with 127\.0\.0\.1:{port} failed: \[SSL: [A-Z_]+\] [a-z ]+; "
            r"nothing was sent \(is it an https port\?\)",
            error.message,
        ), error.message
        assert error.result is not None
        assert [f.maybe_sent for f in error.result.failed] == [False, False]
        assert clock.sleeps == []


class TestABaseURLTheTokenEndpointIsNotUnder:
    async def test_without_the_prefix_a_reverse_proxy_needs(
        self, nginx: Nginx, ca_file: Path
    ) -> None:
        root = nginx.base_url.removesuffix("/rcs")
        async with da.DispatchSession(
            root, client_secret=SECRET, account="acme", ssl=da.ssl_context(ca_file)
        ) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.send_template(numbers(2), **TEMPLATE)
        error = caught.value
        assert not isinstance(error, da.AuthenticationError)
        assert error.message == (
            f"the token endpoint {root}/oauth/token was not found (HTTP 404): the base URL "
            "looks wrong (it should be the service's root; behind a reverse proxy, with the "
            "prefix the proxy serves the service under, such as /rcs)"
        )
        assert error.result is not None
        assert [f.maybe_sent for f in error.result.failed] == [False, False]
        assert nginx.requests() == ["POST /oauth/token"]  # once: not retried

    async def test_ending_in_api_v3(self, server: FakeDispatchServer) -> None:
        async with da.DispatchSession(
            f"{server.url}/api/v3", client_secret=SECRET, account="acme"
        ) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.check_credentials()
        assert caught.value.message.endswith(
            "the base URL looks wrong (leave /api/v3 out of it: it is added to every "
            "request's path)"
        )
        assert SECRET not in str(caught.value)

"""Proxies: the environment's are honoured (NO_PROXY too), an explicit ``proxy=`` with
credentials works, ``trust_env=False`` opts out, and a proxy that is down or refuses is
named, never with its credentials. Through a real tinyproxy, whose log shows what passed,
to a real nginx (TLS from the test's CA) in front of the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

import dispatch_async as da
from dispatch_async.testing import FakeClock
from tests.conftest import SECRET, TEMPLATE, numbers
from tests.simulator_thread import simulator_in_thread

from ._daemon import free_port
from ._nginx import Nginx, ca_file_fixture, ca_fixture, nginx_fixture, nginx_tls
from ._proxy import (
    PROXY_PASSWORD,
    Proxy,
    clean_proxy_env_fixture,
    proxy_fixture,
    refusing_proxy,
    tinyproxy,
)

FIXTURES = (ca_fixture, ca_file_fixture, nginx_fixture, clean_proxy_env_fixture, proxy_fixture)

pytestmark = pytest.mark.usefixtures("clean_proxy_env")


def session_on(nginx: Nginx, ca_file: Path, **settings: object) -> da.DispatchSession:
    return da.DispatchSession(
        nginx.base_url,
        client_secret=SECRET,
        account="acme",
        ssl=da.ssl_context(ca_file),
        **settings,
    )


class TestTheEnvironmentsProxy:
    async def test_https_proxy_carries_every_request(
        self, nginx: Nginx, ca_file: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        async with session_on(nginx, ca_file) as session:
            result = await session.send_template(numbers(3), **TEMPLATE)
        assert len(result.valid) == 3
        assert set(proxy.connects()) == {f"127.0.0.1:{nginx.port}"}

    async def test_the_lower_case_variable_too(
        self, nginx: Nginx, ca_file: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("https_proxy", proxy.url)
        async with session_on(nginx, ca_file) as session:
            await session.check_credentials()
        assert proxy.connects() == [f"127.0.0.1:{nginx.port}"]

    async def test_no_proxy_naming_the_host_goes_direct(
        self, nginx: Nginx, ca_file: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "example.com,localhost")
        by_name = nginx.base_url.replace("127.0.0.1", "localhost")
        for base_url in (by_name, nginx.base_url):
            async with da.DispatchSession(
                base_url, client_secret=SECRET, ssl=da.ssl_context(ca_file)
            ) as session:
                await session.check_credentials()
        assert nginx.requests() == ["POST /rcs/oauth/token"] * 2
        assert proxy.connects() == [f"127.0.0.1:{nginx.port}"]  # not localhost's

    async def test_trust_env_false_ignores_it(
        self, nginx: Nginx, ca_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing there
        async with session_on(nginx, ca_file, trust_env=False) as session:
            await session.check_credentials()
        assert nginx.requests() == ["POST /rcs/oauth/token"]

    async def test_from_env_honours_it(
        self, nginx: Nginx, ca_file: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("DISPATCH_BASE_URL", nginx.base_url)
        monkeypatch.setenv("DISPATCH_CLIENT_SECRET", SECRET)
        async with da.DispatchSession.from_env(ssl=da.ssl_context(ca_file)) as session:
            await session.check_credentials()
        assert proxy.connects() == [f"127.0.0.1:{nginx.port}"]


class TestAnExplicitProxy:
    async def test_with_credentials_carries_the_requests(
        self, nginx: Nginx, ca_file: Path, tmp_path: Path
    ) -> None:
        with tinyproxy(tmp_path / "tinyproxy", password=True) as guarded:
            address = guarded.with_credentials()
            async with session_on(nginx, ca_file, proxy=address) as session:
                assert PROXY_PASSWORD not in repr(session)
                result = await session.send_template(numbers(2), **TEMPLATE)
            assert len(result.valid) == 2
            assert set(guarded.connects()) == {f"127.0.0.1:{nginx.port}"}

    def test_the_blocking_client_takes_it(
        self, ca: trustme.CA, ca_file: Path, tmp_path: Path
    ) -> None:
        with (
            simulator_in_thread() as simulator,
            nginx_tls(tmp_path / "nginx", ca, simulator.url) as proxied,
            tinyproxy(tmp_path / "tinyproxy") as forward,
            da.DispatchClient(
                proxied.base_url,
                client_secret=SECRET,
                account="acme",
                proxy=forward.url,
                ssl=da.ssl_context(ca_file),
            ) as client,
        ):
            result = client.send_template(numbers(2), **TEMPLATE)
            assert len(result.valid) == 2
            assert forward.connects() == [f"127.0.0.1:{proxied.port}"]

    def test_a_proxy_that_is_not_a_url_is_refused_without_quoting_it(self) -> None:
        with pytest.raises(da.ConfigurationError) as caught:
            da.DispatchSession(
                "https://api.example.com",
                client_secret=SECRET,
                proxy=f"ftp://user:{PROXY_PASSWORD}@proxy.example.com",
            )
        assert PROXY_PASSWORD not in str(caught.value)
        assert str(caught.value).startswith("proxy is not a proxy URL")


class TestAProxyThatRefuses:
    async def test_a_403_to_connect_is_not_sent_at_once_naming_the_proxy(
        self, nginx: Nginx, ca_file: Path, tmp_path: Path
    ) -> None:
        clock = FakeClock()
        with tinyproxy(tmp_path / "tinyproxy", connect_ports=(443,)) as strict:
            async with session_on(
                nginx, ca_file, proxy=strict.url, retry=da.RetryPolicy(clock=clock)
            ) as session:
                with pytest.raises(da.NetworkConfigurationError) as caught:
                    await session.send_template(numbers(4), **TEMPLATE)
            assert strict.connects() == [f"127.0.0.1:{nginx.port}"]  # asked once
        error = caught.value
        assert error.message == (
            f"the proxy 127.0.0.1:{strict.port} refused to connect to 127.0.0.1:{nginx.port} "
            "(HTTP 403: its rules do not allow this host): the request never reached the service"
        )
        assert (error.proxy, error.maybe_sent) == (f"127.0.0.1:{strict.port}", False)
        assert error.result is not None
        assert [f.maybe_sent for f in error.result.failed] == [False] * 4
        assert clock.sleeps == []
        assert nginx.requests() == []

    async def test_refused_credentials_are_not_sent_and_never_shown(
        self, nginx: Nginx, ca_file: Path, tmp_path: Path
    ) -> None:
        wrong = "wrong-password-9d2b"
        with tinyproxy(tmp_path / "tinyproxy", password=True) as guarded:
            address = guarded.with_credentials(password=wrong)
            async with session_on(nginx, ca_file, proxy=address) as session:
                with pytest.raises(da.NetworkConfigurationError) as caught:
                    await session.check_credentials()
        error = caught.value
        assert f"the proxy 127.0.0.1:{guarded.port} refused" in error.message
        # tinyproxy answers 401 (squid 407): either way, it wants other credentials.
        assert "it wants credentials, or refused the ones given in the proxy URL" in error.message
        assert error.__cause__ is None  # aiohttp's error holds the request's headers
        for shown in (str(error), repr(error), repr(error.__context__)):
            assert wrong not in shown

    async def test_a_407_says_it_wants_credentials_and_is_not_retried(self) -> None:
        clock = FakeClock()
        async with refusing_proxy(407, "Proxy Authentication Required") as (address, heads):
            session = da.DispatchSession(
                "https://api.example.com",
                client_secret=SECRET,
                proxy=address,
                retry=da.RetryPolicy(clock=clock),
            )
            async with session:
                with pytest.raises(da.NetworkConfigurationError) as caught:
                    await session.check_credentials()
        port = address.rsplit(":", 1)[1]
        assert caught.value.message == (
            f"the proxy 127.0.0.1:{port} refused to connect to api.example.com:443 (HTTP 407: "
            "it wants credentials, or refused the ones given in the proxy URL): the request "
            "never reached the service"
        )
        assert [head.split(b"\r\n")[0] for head in heads] == [
            b"CONNECT api.example.com:443 HTTP/1.1"
        ]
        assert clock.sleeps == []

    async def test_a_proxy_that_is_down_is_named(self, nginx: Nginx, ca_file: Path) -> None:
        port = free_port()
        one_try = da.RetryPolicy(attempts=1)
        async with session_on(
            nginx, ca_file, proxy=f"http://127.0.0.1:{port}", retry=one_try
        ) as session:
            with pytest.raises(da.TokenUnavailableError) as caught:
                await session.check_credentials()
        assert str(caught.value) == (
            f"could not get an access token: could not connect to the proxy 127.0.0.1:{port}: "
            "Connection refused"
        )
        assert caught.value.maybe_sent is False

    async def test_one_that_cannot_reach_the_service_is_retried_and_named(
        self, proxy: Proxy
    ) -> None:
        closed = free_port()
        clock = FakeClock()
        async with da.DispatchSession(
            f"https://127.0.0.1:{closed}",
            client_secret=SECRET,
            proxy=proxy.url,
            retry=da.RetryPolicy(attempts=2, clock=clock),
        ) as session:
            with pytest.raises(da.TokenUnavailableError) as caught:
                await session.check_credentials()
        assert str(caught.value) == (
            f"could not get an access token: the proxy 127.0.0.1:{proxy.port} could not "
            f"connect to 127.0.0.1:{closed} (HTTP 500): the request never reached the service"
        )
        assert caught.value.maybe_sent is False
        assert len(clock.sleeps) == 1  # the service may come back: retried
        assert proxy.connects() == [f"127.0.0.1:{closed}"] * 2

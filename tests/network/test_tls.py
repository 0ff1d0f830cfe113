"""Private CAs: a session trusts the CA it is given (``ssl=``, `ssl_context`, or
SSL_CERT_FILE/SSL_CERT_DIR set at any time), and a certificate it cannot trust stops it
at once, saying so and naming the host. nginx terminates TLS with a CA the test made."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
import trustme

import dispatch_async as da
from dispatch_async.testing import FakeClock
from tests.conftest import SECRET, TEMPLATE, numbers
from tests.simulator_thread import simulator_in_thread

from ._daemon import binary
from ._nginx import Nginx, ca_file_fixture, ca_fixture, nginx_fixture, nginx_tls

FIXTURES = (ca_fixture, ca_file_fixture, nginx_fixture)

pytestmark = pytest.mark.usefixtures("no_ssl_env")


@pytest.fixture
def no_ssl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system's CAs only, whatever this machine's environment names."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


def session_on(nginx: Nginx, **settings: object) -> da.DispatchSession:
    return da.DispatchSession(nginx.base_url, client_secret=SECRET, account="acme", **settings)


class TestTrustingAPrivateCA:
    async def test_a_session_given_ssl_context_with_the_ca_file_sends(
        self, nginx: Nginx, ca_file: Path
    ) -> None:
        async with session_on(nginx, ssl=da.ssl_context(ca_file)) as session:
            result = await session.send_template(numbers(3), **TEMPLATE)
        assert len(result.valid) == 3
        assert nginx.requests() == ["POST /rcs/oauth/token", "POST /rcs/api/v3/template"]

    def test_the_blocking_client_takes_ssl_too(
        self, ca: trustme.CA, ca_file: Path, tmp_path: Path
    ) -> None:
        context = da.ssl_context(ca_file)
        with (
            simulator_in_thread() as simulator,
            nginx_tls(tmp_path / "nginx", ca, simulator.url) as proxied,
            da.DispatchClient(
                proxied.base_url, client_secret=SECRET, account="acme", ssl=context
            ) as client,
        ):
            result = client.send_template(numbers(2), **TEMPLATE)
        assert len(result.valid) == 2

    def test_ssl_context_adds_the_ca_to_the_systems_own(self, ca_file: Path) -> None:
        system = ssl.create_default_context().cert_store_stats()["x509_ca"]
        assert da.ssl_context(ca_file).cert_store_stats()["x509_ca"] == system + 1

    def test_ssl_context_names_a_file_it_cannot_use(self, tmp_path: Path) -> None:
        missing = tmp_path / "missing.pem"
        with pytest.raises(da.ConfigurationError, match=f"CA file '{missing}' cannot be read"):
            da.ssl_context(missing)
        garbage = tmp_path / "garbage.pem"
        garbage.write_text("not a certificate\n")
        with pytest.raises(da.ConfigurationError, match="holds no PEM certificate"):
            da.ssl_context(garbage)


class TestTheEnvironmentsCAs:
    async def test_ssl_cert_file_set_after_aiohttp_was_imported_is_honoured(
        self, nginx: Nginx, ca_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        async with session_on(nginx) as session:
            await session.check_credentials()
        assert nginx.requests() == ["POST /rcs/oauth/token"]

    async def test_ssl_cert_dir_set_after_aiohttp_was_imported_is_honoured(
        self, nginx: Nginx, ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        directory = tmp_path / "certs"
        directory.mkdir()
        ca.cert_pem.write_to_path(str(directory / "company-ca.pem"))
        # openssl names each CA by its hash: what SSL_CERT_DIR's readers look for.
        openssl = binary("openssl", "openssl")
        subprocess.run([openssl, "rehash", str(directory)], check=True)  # noqa: S603, ASYNC221
        monkeypatch.setenv("SSL_CERT_DIR", str(directory))
        async with session_on(nginx) as session:
            await session.check_credentials()
        assert nginx.requests() == ["POST /rcs/oauth/token"]

    async def test_trust_env_false_ignores_them(
        self, nginx: Nginx, ca_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        async with session_on(nginx, trust_env=False) as session:
            with pytest.raises(da.NetworkConfigurationError, match="certificate"):
                await session.check_credentials()


class TestACertificateThatFails:
    async def test_is_raised_at_once_naming_the_host_not_as_token_unavailable(
        self, nginx: Nginx
    ) -> None:
        clock = FakeClock()
        async with session_on(nginx, retry=da.RetryPolicy(clock=clock)) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.check_credentials()
        error = caught.value
        assert not isinstance(error, da.TokenUnavailableError)
        assert error.message.startswith("the certificate of 127.0.0.1 failed verification")
        assert "unable to get local issuer certificate" in error.message
        assert (error.host, error.proxy, error.maybe_sent) == ("127.0.0.1", None, False)
        assert clock.sleeps == []  # not retried
        assert nginx.requests() == []

    async def test_stops_a_job_with_every_recipient_not_sent(self, nginx: Nginx) -> None:
        clock = FakeClock()
        async with session_on(nginx, retry=da.RetryPolicy(clock=clock), chunk_size=2) as session:
            with pytest.raises(da.NetworkConfigurationError) as caught:
                await session.send_template(numbers(5), **TEMPLATE)
        result = caught.value.result
        assert result is not None
        assert sorted(f.position for f in result.failed) == [0, 1, 2, 3, 4]
        assert not any(f.maybe_sent for f in result.failed)
        assert clock.sleeps == []

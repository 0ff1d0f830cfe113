"""The command line between the user and the service: proxies, private CAs, a base URL
set up wrong, a body too large. The real command against the simulator behind the real
parts of tests/network (nginx terminating TLS with a CA the test made, tinyproxy).

Here rather than in tests/network: what is tested is the command (its flags, variables,
lines and exit codes), run as in tests/cli/test_commands.py; the parts are only borrowed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_async.testing import FakeDispatchServer
from tests.cli_helpers import dispatch_async, outcomes, write_csv
from tests.conftest import numbers
from tests.network._daemon import free_port
from tests.network._nginx import (
    Nginx,
    ca_file_fixture,
    ca_fixture,
    nginx_fixture,
    start_nginx,
)
from tests.network._proxy import PROXY_PASSWORD, Proxy, proxy_fixture, tinyproxy

FIXTURES = (ca_fixture, ca_file_fixture, nginx_fixture, proxy_fixture)

#: Variables of this machine that would change the way to the service.
_NETWORK_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


@pytest.fixture(name="env")
def env_fixture(env: dict[str, str]) -> dict[str, str]:
    """A configured user with no proxy and no CA of this machine's."""
    return {name: value for name, value in env.items() if name.upper() not in _NETWORK_VARIABLES}


@pytest.fixture(name="behind_nginx")
def behind_nginx_fixture(env: dict[str, str], nginx: Nginx) -> dict[str, str]:
    """The user's service is behind nginx: https, under /rcs, a certificate of `ca`."""
    return env | {"DISPATCH_BASE_URL": nginx.base_url}


def send(*args: str | Path) -> tuple[str | Path, ...]:
    return ("send", "template", "--template-id", "pix_reminder", *args)


def error_line(stderr: str) -> str:
    """The one line a configuration error prints (and nothing else)."""
    [line] = stderr.strip().splitlines()
    assert line.startswith("Error: ")
    return line


class TestProxies:
    async def test_https_proxy_and_dispatch_ca_file_from_the_environment_are_used(
        self,
        behind_nginx: dict[str, str],
        nginx: Nginx,
        proxy: Proxy,
        ca_file: Path,
        contacts: Path,
        tmp_path: Path,
    ) -> None:
        behind_nginx |= {"HTTPS_PROXY": proxy.url, "DISPATCH_CA_FILE": str(ca_file)}
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send("-i", contacts, "-o", out), env=behind_nginx)
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=4, invalid=1)
        assert set(proxy.connects()) == {f"127.0.0.1:{nginx.port}"}

    async def test_the_proxy_flag_with_credentials_goes_through_and_never_shows_them(
        self, behind_nginx: dict[str, str], ca_file: Path, contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        with tinyproxy(tmp_path / "tinyproxy", password=True) as proxy:
            run = await dispatch_async(
                *send("--proxy", proxy.with_credentials(), "--ca-file", ca_file),
                "-i", contacts, "-o", out, "-vv", env=behind_nginx,
            )  # fmt: skip
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=4, invalid=1)
        assert set(proxy.connects()) == {behind_nginx["DISPATCH_BASE_URL"].split("/")[2]}
        assert PROXY_PASSWORD not in run.stderr + run.stdout + out.read_text()

    async def test_a_proxy_refusing_the_credentials_exits_2_naming_the_proxy_flag(
        self, behind_nginx: dict[str, str], ca_file: Path, contacts: Path, tmp_path: Path
    ) -> None:
        behind_nginx |= {"DISPATCH_CA_FILE": str(ca_file)}
        with tinyproxy(tmp_path / "tinyproxy", password=True) as proxy:
            wrong = proxy.with_credentials(password="wrong-9d2f")
            run = await dispatch_async(
                *send("--proxy", wrong, "-i", contacts, "-o", tmp_path / "r.jsonl"),
                env=behind_nginx,
            )
        assert run.code == 2, run.stderr
        line = error_line(run.stderr)
        assert f"the proxy 127.0.0.1:{proxy.port} refused to connect" in line
        assert "--proxy (DISPATCH_PROXY, else HTTPS_PROXY)" in line
        assert "wrong-9d2f" not in line
        assert not (tmp_path / "r.jsonl").exists()

    async def test_the_demo_goes_to_its_own_simulator_whatever_proxy_is_set(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: every try refused
        env |= {"HTTP_PROXY": nowhere, "HTTPS_PROXY": nowhere, "TMPDIR": str(tmp_path)}
        out = tmp_path / "demo.jsonl"
        run = await dispatch_async("demo", "--recipients", "20", "-q", "-o", out, env=env)
        assert run.code == 0, run.stderr
        assert outcomes(out)["not_sent"] == 0


class TestPrivateCAs:
    async def test_a_certificate_failing_verification_exits_2_naming_ca_file(
        self, behind_nginx: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            *send("-i", contacts, "-o", tmp_path / "r.jsonl"), env=behind_nginx
        )
        assert run.code == 2, run.stderr
        line = error_line(run.stderr)
        assert "the certificate of 127.0.0.1 failed verification" in line
        assert "(--ca-file (DISPATCH_CA_FILE) adds a private CA)" in line

    async def test_a_ca_file_holding_no_certificate_exits_2_naming_the_flag(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            *send("--ca-file", contacts, "-i", contacts, "-o", tmp_path / "r.jsonl"), env=env
        )
        assert run.code == 2, run.stderr
        assert error_line(run.stderr) == (
            f"Error: --ca-file (DISPATCH_CA_FILE): the CA file {str(contacts)!r} holds no "
            "PEM certificate"
        )


# -- behind a plain nginx: a base URL set up wrong, a body too large -----------------

#: The limit of `small_nginx`: a chunk of `big_csv` is over it, a row of it under.
BODY_LIMIT = 64 * 1024
PIX = "0" * 600


@pytest.fixture(name="small_nginx")
def small_nginx_fixture(server: FakeDispatchServer, tmp_path: Path) -> Iterator[Nginx]:
    """nginx in front of the simulator (plain http, no prefix) taking bodies up to
    `BODY_LIMIT`."""
    config = f"""
        client_max_body_size {BODY_LIMIT // 1024}k;
        location / {{
            proxy_pass {server.url};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    """
    with start_nginx(tmp_path / "small-nginx", config) as running:
        yield running


class TestABaseURLSetUpWrong:
    async def test_one_ending_in_api_v3_exits_2_naming_base_url(
        self, env: dict[str, str], small_nginx: Nginx, contacts: Path, tmp_path: Path
    ) -> None:
        env["DISPATCH_BASE_URL"] = f"{small_nginx.url}/api/v3"
        run = await dispatch_async(*send("-i", contacts, "-o", tmp_path / "r.jsonl"), env=env)
        assert run.code == 2, run.stderr
        line = error_line(run.stderr)
        assert "was not found (HTTP 404): --base-url (DISPATCH_BASE_URL) looks wrong" in line
        assert "leave /api/v3 out of it" in line
        assert "POST /api/v3/oauth/token" in small_nginx.requests()


def big_csv(path: Path, count: int, too_large: int | None = None) -> Path:
    """*count* rows of ~650 bytes each on the wire; row *too_large* over the limit alone."""
    rows = [f"{number},{PIX}" for number in numbers(count)]
    if too_large is not None:
        rows[too_large] = f"{numbers(count)[too_large]},{'x' * (BODY_LIMIT + 1000)}"
    return write_csv(path, "number,pixCode", rows)


class TestABodyTooLarge:
    async def test_the_summary_advises_the_chunk_size_that_went_through(
        self,
        env: dict[str, str],
        small_nginx: Nginx,
        server: FakeDispatchServer,
        tmp_path: Path,
    ) -> None:
        out = tmp_path / "r.jsonl"
        env["DISPATCH_BASE_URL"] = small_nginx.url
        run = await dispatch_async(
            *send("-i", big_csv(tmp_path / "big.csv", 300), "-o", out), env=env
        )
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=300)
        assert len(server.stats.received) == 300
        # 300 rows (~200 kB) refused, 150 (~100 kB) refused, 75 (~50 kB) taken.
        assert (
            "the server refused requests as too large (HTTP 413): chunks went in parts of 75; "
            "--chunk-size 75 sends them so from the start"
        ) in run.stderr
        assert "client intended to send too large body" in small_nginx.error_log()

    async def test_a_row_too_large_alone_is_said_so_without_nginxs_page_or_resume(
        self, env: dict[str, str], small_nginx: Nginx, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        env["DISPATCH_BASE_URL"] = small_nginx.url
        contacts = big_csv(tmp_path / "big.csv", 4, too_large=1)
        run = await dispatch_async(*send("-i", contacts, "-o", out), env=env)
        assert run.code == 1, run.stderr
        assert outcomes(out) == Counter(sent=3, not_sent=1)
        assert "html" not in run.stderr.lower()
        assert "--chunk-size" not in run.stderr  # one request per row is no advice
        assert "--resume" not in run.stderr.replace("--resume would be refused", "")
        assert (
            "1 row not sent as the server takes no request that large, even of one "
            "recipient (HTTP 413)"
        ) in run.stderr

"""Behind a real nginx with its default body limit (``client_max_body_size 1m``).

A thousand recipients with a few vars make a body of ~1.25 MB, which nginx refuses with
413 and its own HTML page, before the service sees it: the SDK sends the chunk again in
parts that nginx takes, each recipient once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer
from tests.conftest import TEMPLATE, numbers
from tests.network._nginx import Nginx, start_nginx

# On uvloop too: the SDK's transport in an app under uvicorn runs there (issue 35).
pytestmark = pytest.mark.both_loops

#: nginx's default, written out: the test does not depend on Debian's packaged config.
BODY_LIMIT = "client_max_body_size 1m;"


def proxy_to(port: int) -> str:
    return f"""
        {BODY_LIMIT}
        location / {{
            proxy_pass http://127.0.0.1:{port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    """


@pytest.fixture
async def service() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer() as server:
        yield server


@pytest.fixture
def nginx(tmp_path: Path, service: FakeDispatchServer) -> Iterator[Nginx]:
    with start_nginx(tmp_path / "nginx", proxy_to(service.port)) as running:
        yield running


def with_vars(count: int) -> list[da.Recipient]:
    """Recipients with a few vars, ~1.25 kB each on the wire."""
    vars_ = {"name": "Ana Maria da Silva " * 10, "pixCode": "0" * 600, "due": "x" * 400}
    return [da.Recipient(n, vars=vars_) for n in numbers(count)]


# aiohttp warns of any body over 1 MB (it advises a file-like object): such a body is
# what these tests are about.
@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
class TestBehindNginx:
    async def test_a_chunk_over_its_body_limit_goes_through_in_parts(
        self, service: FakeDispatchServer, nginx: Nginx
    ) -> None:
        async with da.DispatchSession(
            nginx.url, client_secret=service.client_secret, account="acme"
        ) as session:
            result = await session.send_template(with_vars(2000), **TEMPLATE)
        assert result.counts["valid"] == 2000
        assert not result.failed
        received = service.stats.received
        assert len(received) == 2000
        assert set(received.values()) == {1}
        assert result.split_to == 500
        assert "client intended to send too large body" in nginx.error_log()

    async def test_a_recipient_over_the_limit_alone_is_not_sent(
        self, service: FakeDispatchServer, nginx: Nginx
    ) -> None:
        given = with_vars(3)
        given[1] = da.Recipient(given[1].number, vars={"note": "x" * 1_100_000})
        async with da.DispatchSession(
            nginx.url, client_secret=service.client_secret, account="acme"
        ) as session:
            result = await session.send_template(given, **TEMPLATE)
        assert result.counts["valid"] == 2
        [failed] = result.failed
        assert failed.position == 1
        assert not failed.maybe_sent
        assert isinstance(failed.error, da.RequestTooLargeError)
        assert "<html>" not in str(failed.error)
        assert set(service.stats.received) == {given[0].number, given[2].number}

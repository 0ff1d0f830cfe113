"""The web-apps guide's FastAPI example, run: each outcome gets the answer its table gives."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET
from .typing import fastapi_app

EXAMPLE = Path(fastapi_app.__file__)
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "web-apps.md"
NUMBER = "+5511987654321"


@pytest.fixture
async def web(
    server: FakeDispatchServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("DISPATCH_BASE_URL", server.url)
    monkeypatch.setenv("DISPATCH_CLIENT_SECRET", SECRET)
    monkeypatch.setenv("DISPATCH_ACCOUNT", "acme")
    app = fastapi_app.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client


async def remind(web: httpx.AsyncClient, number: str = NUMBER) -> httpx.Response:
    return await web.post("/reminders", json={"number": number, "pix_code": "000201"})


async def test_a_sent_message_is_201_with_its_id(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    answer = await remind(web)
    assert answer.status_code == 201
    assert answer.json()["message_id"]
    assert server.stats.calls_by_path["template"] == 1


async def test_a_malformed_number_is_422_and_nothing_is_sent(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    answer = await remind(web, "")
    assert answer.status_code == 422
    assert "position 0" in answer.json()["detail"]
    assert server.stats.requests == 0


async def test_a_number_the_service_refuses_is_422(web: httpx.AsyncClient) -> None:
    answer = await remind(web, "+1")
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("not deliverable")


async def test_a_service_still_unavailable_after_the_retry_is_503_with_retry_after(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    server.script(Fault.status(503, retry_after="1"), Fault.status(503, retry_after="1"))
    answer = await remind(web)
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "1"
    assert server.stats.status_counts[503] == 2  # the view's one retry, then the answer


async def test_a_message_that_may_have_gone_is_502_and_not_retried(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    server.script(Fault.drop())
    answer = await remind(web)
    assert answer.status_code == 502
    assert "may have been sent" in answer.json()["detail"]
    assert server.stats.requests == 1


async def test_a_request_the_service_refuses_is_502(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    server.script(Fault.status(400))
    answer = await remind(web)
    assert answer.status_code == 502
    assert answer.json()["detail"] == "messaging refused the request"


async def test_refused_credentials_are_502(
    web: httpx.AsyncClient, server: FakeDispatchServer
) -> None:
    server.script_token(Fault.status(401))
    server.expire_tokens()  # the token checked at start-up is refused: a new one is asked for
    answer = await remind(web)
    assert answer.status_code == 502
    assert answer.json()["detail"] == "messaging is misconfigured"


async def test_refused_credentials_fail_the_start_up_before_any_request(
    server: FakeDispatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_BASE_URL", server.url)
    monkeypatch.setenv("DISPATCH_CLIENT_SECRET", "not-the-secret")
    app = fastapi_app.app
    with pytest.raises(da.AuthenticationError):
        async with app.router.lifespan_context(app):
            pass
    assert server.stats.token_calls == 1
    assert server.stats.requests == 0


def test_the_guide_shows_the_example_as_type_checked() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    assert EXAMPLE.read_text() in blocks

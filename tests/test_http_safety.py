"""Narrow HTTP behaviours, with aioresponses standing in for the network.

Redirects are errors, answers are capped, headers cannot be split, and no error ever
carries the secret or the token.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import pytest
from aioresponses import aioresponses

import dispatch_async as da
from dispatch_async import _transport

BASE = "https://api.example.test"
SECRET = "s3cr3t-CLIENT-value"
TOKEN = "tok-ACCESS-value-123"
TOKEN_URL = f"{BASE}/oauth/token"
TEMPLATE_URL = f"{BASE}/api/v3/template"


@pytest.fixture
def mocked() -> aioresponses:
    with aioresponses() as m:
        yield m


@pytest.fixture
async def session() -> AsyncIterator[da.DispatchSession]:
    async with da.DispatchSession(
        BASE, client_secret=SECRET, account="acme", retry=da.RetryPolicy(wait=False)
    ) as s:
        yield s


def give_token(mocked: aioresponses, token: str = TOKEN) -> None:
    mocked.post(
        TOKEN_URL, payload={"access_token": token, "expires_in": "3600", "token_type": "Bearer"}
    )


class TestRedirects:
    async def test_a_redirect_is_an_error_and_is_not_followed(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        give_token(mocked)
        mocked.post(TEMPLATE_URL, status=307, headers={"Location": "https://evil.test/x"})
        result = await session.send_template(["+5511987654321"], template_id="t")
        [failure] = result.failed
        assert isinstance(failure.error, da.RedirectError)
        assert failure.maybe_sent is False
        assert not any("evil.test" in str(key[1]) for key in mocked.requests)


class TestAnswerSize:
    async def test_an_oversized_answer_is_refused_and_may_have_been_sent(
        self, mocked: aioresponses, session: da.DispatchSession, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_transport, "MAX_ANSWER_BYTES", 1000)
        give_token(mocked)
        mocked.post(TEMPLATE_URL, body=b"x" * 5000)
        result = await session.send_template(["+5511987654321"], template_id="t")
        [failure] = result.failed
        assert isinstance(failure.error, da.ResponseTooLargeError)
        assert failure.maybe_sent is True


class TestHeaderInjection:
    async def test_a_token_with_a_line_break_is_refused(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        give_token(mocked, token="abc\r\nX-Evil: 1")
        with pytest.raises(da.AuthenticationError, match="control characters") as caught:
            await session.send_template(["+5511987654321"], template_id="t")
        assert caught.value.result is not None
        assert len(caught.value.result.failed) == 1

    def test_a_user_agent_with_a_line_break_is_refused(self) -> None:
        with pytest.raises(da.ConfigurationError):
            da.DispatchSession(BASE, client_secret=SECRET, user_agent="x\nHost: evil")


class TestSecretsNeverShow:
    async def test_an_error_body_echoing_the_credentials_is_redacted(
        self,
        mocked: aioresponses,
        session: da.DispatchSession,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.DEBUG)
        give_token(mocked)
        mocked.post(TEMPLATE_URL, status=400, body=f"bad request Bearer {TOKEN} {SECRET}")
        result = await session.send_template(["+5511987654321"], template_id="t")
        [failure] = result.failed
        error = failure.error
        assert isinstance(error, da.ClientStatusError)
        assert error.status == 400
        assert "bad request" in error.body
        shown = " ".join([repr(error), str(error), error.body, repr(result), caplog.text])
        assert TOKEN not in shown
        assert SECRET not in shown

    async def test_a_rejected_secret_is_not_in_the_error(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        mocked.post(TOKEN_URL, status=401, body=f"invalid_client {SECRET}")
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(["+5511987654321"], template_id="t")
        assert SECRET not in repr(caught.value)
        assert SECRET not in str(caught.value)
        chained = caught.value.__cause__
        while chained is not None:
            assert SECRET not in repr(chained)
            chained = chained.__cause__

    def test_the_session_repr_shows_neither_secret_nor_token(self) -> None:
        s = da.DispatchSession(BASE, client_secret=SECRET, account="acme")
        assert SECRET not in repr(s)
        assert re.search(r"DispatchSession unopened base_url='https://api.example.test'", repr(s))


class TestBaseUrl:
    @pytest.mark.parametrize(
        "url",
        [
            "http://api.example.com",
            "https://user:pass@api.example.com",
            "ftp://api.example.com",
            "api.example.com",
            "https://api.example.com/?x=1",
        ],
    )
    def test_an_unsafe_base_url_is_refused(self, url: str) -> None:
        with pytest.raises(da.ConfigurationError):
            da.DispatchSession(url, client_secret=SECRET)

    @pytest.mark.parametrize(
        "url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:80"]
    )
    def test_plain_http_is_allowed_to_loopback(self, url: str) -> None:
        assert da.DispatchSession(url, client_secret=SECRET).base_url.scheme == "http"

    def test_a_path_prefix_is_kept(self) -> None:
        s = da.DispatchSession("https://api.example.com/dispatch/", client_secret=SECRET)
        assert str(s.base_url) == "https://api.example.com/dispatch"

"""Narrow HTTP behaviours, with aioresponses standing in for the network.

Redirects are errors, answers are capped, headers cannot be split, and no error ever
carries the secret or the token.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable

import pytest
from aioresponses import aioresponses
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

import dispatch_async as da
from dispatch_async import _transport
from dispatch_async._redaction import redacted, url_secrets

# On uvloop too: the SDK's transport in an app under uvicorn runs there (issue 35).
pytestmark = pytest.mark.both_loops

BASE = "https://api.example.test"
SECRET = "s3cr3t-CLIENT-value"
TOKEN = "tok-ACCESS-value-123"
TOKEN_URL = f"{BASE}/oauth/token"
TEMPLATE_URL = f"{BASE}/api/v3/template"
#: Credentials with every character an encoder treats specially: "/", "+", a space, "=",
#: a quote, non-ASCII (two and four bytes in UTF-8).
AWKWARD_SECRET = 's3cr/et+CLIENT "valor" ção😀=='
AWKWARD_TOKEN = "tok/ACCESS+value=123/é"


def json_escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


def unicode_escaped(text: str) -> str:
    # json.dumps escapes only what it must: this escapes all but letters, digits and
    # "-._~" (astral characters as surrogate pairs), as the most eager encoders do.
    def escaped(char: str) -> str:
        if char.isascii() and (char.isalnum() or char in "-._~"):
            return char
        units = char.encode("utf-16-be")
        return "".join(f"\\u{units[i]:02X}{units[i + 1]:02X}" for i in range(0, len(units), 2))

    return "".join(map(escaped, text))


def lower_percent(text: str) -> str:
    return re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), urllib.parse.quote(text, safe=""))


def base64_of(blob: str, start: int, size: int) -> str:
    """The characters of base64 *blob* that encode only bytes start..start+size of it."""
    return blob[-(-8 * start // 6) : 8 * (start + size) // 6]


#: Every standard way a service may echo a credential back.
ENCODINGS: dict[str, Callable[[str], str]] = {
    "as is": lambda text: text,
    "JSON": json_escaped,
    "JSON, UTF-8 kept": lambda text: json.dumps(text, ensure_ascii=False)[1:-1],
    "JSON, slashes escaped (PHP)": lambda text: json_escaped(text).replace("/", "\\/"),
    "JSON, \\uXXXX escapes": unicode_escaped,
    "JSON, lower-case \\uXXXX escapes": lambda text: re.sub(
        r"\\u[0-9A-F]{4}", lambda m: m.group().lower(), unicode_escaped(text)
    ),
    "percent-encoded": lambda text: urllib.parse.quote(text, safe=""),
    "percent-encoded, slashes kept": urllib.parse.quote,
    "percent-encoded, lower case": lower_percent,
    "form-encoded (+ for space)": urllib.parse.quote_plus,
    "form-encoded, lower case": lambda text: lower_percent(text).replace("%20", "+"),
}


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

    async def test_an_answer_declaring_a_size_over_the_limit_is_refused_unread(
        self, mocked: aioresponses, session: da.DispatchSession, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_transport, "MAX_ANSWER_BYTES", 1000)
        give_token(mocked)
        mocked.post(TEMPLATE_URL, body=b"x" * 5000, headers={"Content-Length": "5000"})
        result = await session.send_template(["+5511987654321"], template_id="t")
        [failure] = result.failed
        assert isinstance(failure.error, da.ResponseTooLargeError)
        assert "the answer is 5000 bytes, over 1000" in str(failure.error)
        assert failure.maybe_sent is True


class TestHeaderInjection:
    async def test_a_token_with_a_line_break_is_refused(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        give_token(mocked, token="abc\r\nX-Evil: 1")
        with pytest.raises(da.AuthenticationError, match="control characters") as caught:
            await session.send_template(["+5511987654321"], template_id="t")
        assert str(caught.value) == "the access token has control characters; refusing it"
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

    @pytest.mark.parametrize("encoding", ENCODINGS)
    async def test_an_error_body_echoing_the_credentials_in_any_encoding_is_redacted(
        self, mocked: aioresponses, encoding: str
    ) -> None:
        encode = ENCODINGS[encoding]
        give_token(mocked, token=AWKWARD_TOKEN)
        echoed = (
            f"{encode(AWKWARD_TOKEN)}|{encode(AWKWARD_SECRET)}|{encode('Bearer ' + AWKWARD_TOKEN)}"
        )
        mocked.post(
            TEMPLATE_URL, status=400, body=f'{{"error": "bad request", "echo": "{echoed}"}}'
        )
        async with da.DispatchSession(BASE, client_secret=AWKWARD_SECRET, account="acme") as s:
            [failure] = (await s.send_template(["+5511987654321"], template_id="t")).failed
        error = failure.error
        assert isinstance(error, da.ClientStatusError)
        assert "bad request" in error.body
        for credential in (AWKWARD_TOKEN, AWKWARD_SECRET):
            assert encode(credential) not in error.body
        assert encode(AWKWARD_TOKEN)[:12] not in error.body

    @pytest.mark.parametrize("urlsafe", [False, True])
    @pytest.mark.parametrize("prefix", ["", "Authorization: ", "X-Authorization: "])
    async def test_the_authorization_value_echoed_in_base64_is_redacted(
        self, mocked: aioresponses, urlsafe: bool, prefix: str
    ) -> None:
        # Alone or inside a longer encoded text (any alignment), padded or not.
        encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
        blob = encode(f"{prefix}Bearer {AWKWARD_TOKEN}".encode()).decode()
        give_token(mocked, token=AWKWARD_TOKEN)
        mocked.post(TEMPLATE_URL, status=400, body=f"bad request, you sent {blob}")
        async with da.DispatchSession(BASE, client_secret=SECRET, account="acme") as s:
            [failure] = (await s.send_template(["+5511987654321"], template_id="t")).failed
        error = failure.error
        assert isinstance(error, da.ClientStatusError)
        assert "bad request" in error.body
        token = base64_of(blob, len(f"{prefix}Bearer ".encode()), len(AWKWARD_TOKEN.encode()))
        assert not any(token[i : i + 8] in error.body for i in range(len(token) - 7))

    async def test_a_credential_cut_short_at_the_end_of_the_excerpt_is_not_shown(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        # Redacting whole copies shortens the text: a copy cut short where the excerpt's
        # window ends must not slide into what is kept, wherever in a copy the window ends.
        give_token(mocked)
        shifts = range(len(TOKEN) + 1)
        for shift in shifts:
            mocked.post(TEMPLATE_URL, status=400, body="x" * shift + f"|{TOKEN}" * 200)
        for _ in shifts:
            [failure] = (await session.send_template(["+5511987654321"], template_id="t")).failed
            error = failure.error
            assert isinstance(error, da.ClientStatusError)
            assert "|***|***" in error.body
            assert not any(TOKEN[i : i + 4] in error.body for i in range(len(TOKEN) - 3))

    async def test_a_rejected_secret_is_not_in_the_error(
        self, mocked: aioresponses, session: da.DispatchSession
    ) -> None:
        mocked.post(TOKEN_URL, status=401, body=f"invalid_client {SECRET}")
        with pytest.raises(da.AuthenticationError) as caught:
            await session.send_template(["+5511987654321"], template_id="t")
        assert str(caught.value) == "the service rejected the client secret (HTTP 401)"
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


def token_calls(mocked: aioresponses) -> int:
    return sum(len(calls) for (_, url), calls in mocked.requests.items() if url == URL(TOKEN_URL))


class TestTokenEndpointAnswers:
    # A 404 says the base URL is wrong: tests/network/test_unhealable.py.
    @pytest.mark.parametrize("status", [300, 301, 405, 418, 499])
    async def test_a_redirect_or_a_client_error_is_a_refusal_and_not_retried(
        self, mocked: aioresponses, session: da.DispatchSession, status: int
    ) -> None:
        mocked.post(TOKEN_URL, status=status, body=f"client_secret={SECRET}")
        with pytest.raises(da.AuthenticationError) as caught:
            await session.check_credentials()
        assert str(caught.value) == (
            f"the token endpoint refused the request (HTTP {status}); "
            "check the client secret, base_url and token_request"
        )
        assert token_calls(mocked) == 1

    @pytest.mark.parametrize("status", [429, 500, 503, 599])
    async def test_a_429_or_a_5xx_is_retried_and_its_body_is_not_kept(
        self, mocked: aioresponses, status: int
    ) -> None:
        # The body may echo the form, and the form holds the secret.
        for _ in range(2):
            mocked.post(TOKEN_URL, status=status, body=f"you sent client_secret={SECRET}")
        policy = da.RetryPolicy(wait=False, attempts=2)
        async with da.DispatchSession(BASE, client_secret=SECRET, retry=policy) as session:
            with pytest.raises(da.TokenUnavailableError) as caught:
                await session.check_credentials()
        assert str(caught.value) == (
            f"could not get an access token: the service answered HTTP {status}"
        )
        cause = caught.value.__cause__
        assert isinstance(cause, da.StatusError)
        assert (cause.status, cause.body) == (status, "")
        assert token_calls(mocked) == 2


class TestBaseUrl:
    @pytest.mark.parametrize(
        "url",
        [
            "http://api.example.com",
            "https://user:pass@api.example.com",
            "ftp://api.example.com",
            "api.example.com",
            "https://api.example.com/?x=1",
            "http://[::1",  # not a URL at all
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


#: Secrets as the property tests draw them: "/", "+", spaces, quotes, backslashes,
#: non-ASCII (astral too), never the markers around them.
awkward_secrets = st.text(
    alphabet=st.one_of(
        st.sampled_from('/+ "\\=%&?#\t'),
        st.characters(codec="utf-8", exclude_characters="[]", exclude_categories=["Cs"]),
    ),
    min_size=8,
    max_size=40,
)


class TestRedactionProperties:
    @given(secret=awkward_secrets, encoding=st.sampled_from(sorted(ENCODINGS)))
    def test_no_encoding_of_a_secret_survives_and_the_text_around_it_does(
        self, secret: str, encoding: str
    ) -> None:
        encoded = ENCODINGS[encoding](secret)
        text = redacted(f"[start]{encoded}[end]", (secret,))
        assert encoded not in text
        assert text.startswith("[start]")
        assert text.endswith("[end]")

    @given(secret=awkward_secrets)
    def test_a_json_body_decoded_after_redaction_holds_no_secret(self, secret: str) -> None:
        for ensure_ascii in (True, False):
            body = json.dumps({"echo": secret}, ensure_ascii=ensure_ascii)
            for escaped in (body, body.replace("/", "\\/")):
                assert secret not in json.loads(redacted(escaped, (secret,)))["echo"]

    @given(secret=awkward_secrets)
    def test_a_form_decoded_after_redaction_holds_no_secret(self, secret: str) -> None:
        for form in (urllib.parse.quote_plus(secret), lower_percent(secret)):
            decoded = urllib.parse.unquote_plus(redacted(f"client_secret={form}", (secret,)))
            assert secret not in decoded

    @given(secret=awkward_secrets, shift=st.integers(0, 2))
    def test_base64_of_a_secret_at_any_offset_keeps_no_long_run_of_it(
        self, secret: str, shift: int
    ) -> None:
        data = secret.encode()
        blob = base64.b64encode(b"x" * shift + data + b"tail").decode()
        text = redacted(blob, (secret,))
        alone = base64_of(blob, shift, len(data))
        assert not any(alone[i : i + 8] in text for i in range(len(alone) - 7))


class TestUrlSecrets:
    @pytest.mark.parametrize(
        ("url", "keys"),
        [
            ("https://h.example/callbacks/" + "t" * 43, ("t" * 43,)),
            ("https://h.example/callbacks/" + "t" * 43 + "/", ("t" * 43,)),
            (
                "https://user:pa55word-long@h.example/cb?key=k3y-of-the-hook&v=1",
                ("pa55word-long", "k3y-of-the-hook"),
            ),
            ("https://h.example/cb", ()),  # nothing that long: no key to hide
            ("http://[::1/" + "t" * 20, ("http://[::1/" + "t" * 20,)),  # unreadable: all of it
            (None, ()),
        ],
    )
    def test_a_urls_keys_are_its_last_segment_password_and_query_values(
        self, url: str | None, keys: tuple[str, ...]
    ) -> None:
        assert url_secrets(url) == keys

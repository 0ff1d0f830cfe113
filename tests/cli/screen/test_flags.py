"""The SDK's messages as the command line shows them: its flags and variables, never the
SDK's parameter names. Each message here is the SDK's own, made as the SDK makes it."""

from __future__ import annotations

import re

import pytest
from yarl import URL

import dispatch_async as da
from dispatch_async._cli.screen.flags import in_our_words
from dispatch_async._endpoints import token_not_found
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.conftest import SECRET

#: An SDK parameter's name, as a word of a message.
SDK_NAMES = re.compile(r"\b(base_url|token_request|client_secret|trust_env|ssl=|proxy=)")


def refused_at_construction(**settings: object) -> da.ConfigurationError:
    base_url = settings.pop("base_url", "https://api.example.com")
    with pytest.raises(da.ConfigurationError) as raised:
        da.DispatchSession(base_url, client_secret=SECRET, **settings)  # type: ignore[arg-type]
    return raised.value


class TestSettingsMadeWrong:
    @pytest.mark.parametrize(
        ("settings", "expected"),
        [
            ({"base_url": "api.example.com"}, "--base-url (DISPATCH_BASE_URL) must be an"),
            (
                {"base_url": "https://user:pw@api.example.com"},
                "must not carry a user or password; put the secret in DISPATCH_CLIENT_SECRET "
                "or --client-secret-file",
            ),
            ({"proxy": "ftp://proxy:21"}, "--proxy (DISPATCH_PROXY) is not a proxy URL"),
        ],
    )
    def test_are_named_by_the_flag_and_variable(
        self, settings: dict[str, object], expected: str
    ) -> None:
        said = in_our_words(refused_at_construction(**settings))
        assert expected in said
        assert not SDK_NAMES.search(said), said


class TestErrorsThatWillNotHeal:
    def test_a_token_endpoint_not_found_names_base_url(self) -> None:
        said = in_our_words(token_not_found(URL("https://gw.example.com/oauth/token")))
        assert "--base-url (DISPATCH_BASE_URL) looks wrong" in said
        assert "the base URL" not in said

    async def test_a_refused_token_request_names_the_secrets_flags_not_token_request(
        self, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.status(400))
        async with da.DispatchSession(server.url, client_secret=SECRET) as session:
            with pytest.raises(da.AuthenticationError) as raised:
                await session.check_credentials()
        said = in_our_words(raised.value)
        assert said.endswith(
            "check the client secret (DISPATCH_CLIENT_SECRET or --client-secret-file) and "
            "--base-url (DISPATCH_BASE_URL)"
        )
        assert not SDK_NAMES.search(said), said

"""Each dispatch endpoint takes its own fields, checked before anything is sent (spec 4.2-4.6)."""

from __future__ import annotations

import inspect
import platform
from typing import Any

import aiohttp
import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, RecordedRequest

from .conftest import session_for

NUMBERS = ["+5511987654321", "+5511912345678"]
MESSAGES = [{"number": n, "vars": {}} for n in NUMBERS]
FALLBACK = [{"channel": "sms", "content": "Seu código Pix chegou"}]
OPTIONS: dict[str, Any] = {
    "campaign_name": "november",
    "callback": "https://hooks.example.com/cb",
    "fallback": [da.Fallback.sms("Seu código Pix chegou")],
}
# What OPTIONS look like on the wire (spec 2.1, 2.3).
OPTIONS_SENT = {
    "campaign_name": "november",
    "callback": "https://hooks.example.com/cb",
    "fallback": FALLBACK,
}
DISPATCH_ENDPOINTS = ("basic", "single", "template", "webhook")
USER_AGENT = (
    f"dispatch-async/{da.__version__} aiohttp/{aiohttp.__version__} "
    f"python/{platform.python_version()}"
)


def dispatches(server: FakeDispatchServer) -> list[RecordedRequest]:
    """The dispatch requests the simulator received, in order."""
    return [r for r in server.requests if r.endpoint in DISPATCH_ENDPOINTS]


def the_dispatch(server: FakeDispatchServer) -> RecordedRequest:
    """The one dispatch request received (fails if there were more or none)."""
    [request] = dispatches(server)
    return request


class TestWhatEachEndpointSends:
    """Each request says exactly what the caller asked: every field, nothing else."""

    async def test_template_sends_its_template_and_options(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(
            [NUMBERS[0], da.Recipient(NUMBERS[1], vars={"pixCode": "000201"})],
            template_id="pix_reminder",
            webhook="https://hooks.example.com/w",
            **OPTIONS,
        )
        assert [m.number for m in result.valid] == NUMBERS
        request = the_dispatch(server)
        assert (request.method, request.path) == ("POST", "/api/v3/template")
        assert request.json == {
            "account": "acme",
            "template_id": "pix_reminder",
            "webhook": "https://hooks.example.com/w",
            **OPTIONS_SENT,
            "messages": [
                {"number": NUMBERS[0], "vars": {}},
                {"number": NUMBERS[1], "vars": {"pixCode": "000201"}},
            ],
        }

    @pytest.mark.parametrize("method", ["send_basic", "send_single"])
    async def test_basic_and_single_send_the_text_as_content(
        self, server: FakeDispatchServer, session: da.DispatchSession, method: str
    ) -> None:
        result = await getattr(session, method)(NUMBERS, text="Olá, tudo bem?", **OPTIONS)
        assert len(result.valid) == 2
        request = the_dispatch(server)
        assert request.path == f"/api/v3/{method.removeprefix('send_')}"
        assert request.json == {
            "account": "acme",
            "content": {"text": {"message": "Olá, tudo bem?"}},
            **OPTIONS_SENT,
            "messages": MESSAGES,
        }

    async def test_webhook_sends_its_webhook_with_a_text_a_template_and_options(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_webhook(
            NUMBERS,
            webhook="https://hooks.example.com/w",
            text="Olá",
            template_id="pix_reminder",
            **OPTIONS,
        )
        assert len(result.valid) == 2
        request = the_dispatch(server)
        assert request.path == "/api/v3/webhook"
        assert request.json == {
            "account": "acme",
            "webhook": "https://hooks.example.com/w",
            "content": {"text": {"message": "Olá"}},
            "template_id": "pix_reminder",
            **OPTIONS_SENT,
            "messages": MESSAGES,
        }

    @pytest.mark.parametrize(
        ("method", "required", "sent"),
        [
            ("send_template", {"template_id": "otp_code"}, {"template_id": "otp_code"}),
            ("send_basic", {"text": "x"}, {"content": {"text": {"message": "x"}}}),
            ("send_single", {"text": "y"}, {"content": {"text": {"message": "y"}}}),
            (
                "send_webhook",
                {"webhook": "https://h.example/w"},
                {"webhook": "https://h.example/w"},
            ),
        ],
    )
    async def test_an_option_not_given_is_not_sent(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        method: str,
        required: dict[str, str],
        sent: dict[str, Any],
    ) -> None:
        await getattr(session, method)(NUMBERS, **required)
        assert the_dispatch(server).json == {"account": "acme", **sent, "messages": MESSAGES}

    async def test_every_fallback_is_sent_in_order(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        fallbacks = [da.Fallback.sms("primeiro"), da.Fallback("rcs", "segundo")]
        await session.send_basic(NUMBERS, text="x", fallback=fallbacks)
        assert the_dispatch(server).json["fallback"] == [
            {"channel": "sms", "content": "primeiro"},
            {"channel": "rcs", "content": "segundo"},
        ]

    @pytest.mark.parametrize(
        ("method", "fields"),
        [
            ("send_template", {"template_id": "t"}),
            ("send_basic", {"text": "x"}),
            ("send_single", {"text": "x"}),
            ("send_webhook", {"webhook": "https://h.example/w"}),
        ],
    )
    async def test_the_account_can_be_overridden_per_call(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        method: str,
        fields: dict[str, str],
    ) -> None:
        result = await getattr(session, method)(NUMBERS, account="other", **fields)
        await getattr(session, method)(NUMBERS, **fields)
        assert len(result.valid) == 2
        assert [r.json["account"] for r in dispatches(server)] == ["other", "acme"]

    async def test_the_sessions_account_is_sent_when_the_call_names_none(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, account="acme-rio") as session:
            await session.send_basic(NUMBERS, text="x")
        assert the_dispatch(server).json["account"] == "acme-rio"

    async def test_every_chunk_carries_the_same_fields_and_its_own_recipients(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        recipients = [f"+55119{i:08d}" for i in range(5)]
        await session.send_template(
            recipients, template_id="pix_reminder", chunk_size=2, max_concurrency=1, **OPTIONS
        )
        requests = dispatches(server)
        assert len(requests) == 3
        sent = [m["number"] for r in requests for m in r.json["messages"]]
        assert sent == recipients
        for request in requests:
            envelope = {k: v for k, v in request.json.items() if k != "messages"}
            assert envelope == {"account": "acme", "template_id": "pix_reminder", **OPTIONS_SENT}

    async def test_a_stream_sends_what_the_send_sends(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        parts = [
            part
            async for part in session.stream_webhook(
                NUMBERS, webhook="https://h.example/w", text="x", account="other", **OPTIONS
            )
        ]
        assert sum(len(p.valid) for p in parts) == 2
        assert the_dispatch(server).json == {
            "account": "other",
            "webhook": "https://h.example/w",
            "content": {"text": {"message": "x"}},
            **OPTIONS_SENT,
            "messages": MESSAGES,
        }

    async def test_a_view_sends_the_sessions_fields_in_its_own_chunks(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        view = session.with_options(chunk_size=1, retry=da.RetryPolicy(attempts=1))
        await view.send_basic(NUMBERS, text="x", callback="https://hooks.example.com/cb")
        requests = dispatches(server)
        assert [r.json["messages"] for r in requests] == [[m] for m in MESSAGES]
        for request in requests:
            assert request.json["account"] == "acme"
            assert request.json["content"] == {"text": {"message": "x"}}
            assert request.json["callback"] == "https://hooks.example.com/cb"

    async def test_ids_are_the_services_uuids(self, session: da.DispatchSession) -> None:
        import uuid

        result = await session.send_basic(NUMBERS, text="x")
        assert len(result.valid) == len(NUMBERS)
        for message in result.valid:
            assert str(uuid.UUID(message.id)) == message.id

    async def test_invalid_numbers_come_back_with_the_services_reason(
        self, session: da.DispatchSession
    ) -> None:
        result = await session.send_basic([NUMBERS[0], "12"], text="x")
        assert [(m.number, m.reason) for m in result.invalid] == [
            ("12", "number must be a valid phone number")
        ]

    async def test_templates_are_listed_as_the_service_sends_them(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        listing = await session.list_templates()
        assert listing == {"templates": server.templates}
        [request] = [r for r in server.requests if r.endpoint == "templates"]
        assert (request.method, request.path, request.size) == ("GET", "/api/v3/templates", 0)
        assert request.headers["Accept"] == "application/json"
        assert "Content-Type" not in request.headers


class TestHeaders:
    """Every call under /api/v3 carries the headers of spec section 5, and the token
    request those of 4.1."""

    async def test_a_dispatch_carries_the_bearer_token_jwt_json_and_the_user_agent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_basic(NUMBERS, text="x")
        headers = the_dispatch(server).headers
        assert headers["Authorization"] == "Bearer <redacted>"
        assert headers["X-Auth-Type"] == "JWT"
        assert headers["Content-Type"] == "application/json"
        assert headers["Accept"] == "application/json"
        assert headers["User-Agent"] == USER_AGENT
        # The token presented was the one issued: the simulator found nothing wrong with it.
        assert (server.stats.unknown_token_uses, server.stats.missing_token) == (0, 0)

    async def test_the_templates_listing_carries_the_token_and_jwt(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.list_templates()
        [request] = [r for r in server.requests if r.endpoint == "templates"]
        assert request.headers["Authorization"] == "Bearer <redacted>"
        assert request.headers["X-Auth-Type"] == "JWT"
        assert request.headers["User-Agent"] == USER_AGENT

    async def test_the_user_agent_can_be_set(self, server: FakeDispatchServer) -> None:
        async with session_for(server, user_agent="acme-billing/2.1") as session:
            await session.send_basic(NUMBERS, text="x")
        assert {r.headers["User-Agent"] for r in server.requests} == {"acme-billing/2.1"}

    async def test_the_token_request_is_a_client_credentials_form(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_basic(NUMBERS, text="x")
        token = server.requests[0]
        assert (token.method, token.path, token.endpoint) == ("POST", "/oauth/token", "token")
        # The secret is never recorded; that it was sent shows in the token being issued.
        assert token.form == {"grant_type": "client_credentials"}
        assert server.stats.tokens_issued == 1
        assert token.headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert token.headers["Accept"] == "application/x-www-form-urlencoded"
        assert token.headers["User-Agent"] == USER_AGENT
        assert "Authorization" not in token.headers


class TestRefusedBeforeSending:
    @pytest.mark.parametrize(
        ("method", "kwargs", "complaint"),
        [
            ("send_template", {"template_id": ""}, "template_id must be a non-empty string"),
            ("send_template", {"template_id": 5}, "template_id must be a non-empty string"),
            ("send_basic", {"text": ""}, "text must be a non-empty string"),
            ("send_single", {"text": None}, "requires text="),
            ("send_webhook", {"webhook": None, "text": "x"}, "requires webhook="),
            (
                "send_basic",
                {"text": "x", "fallback": ["sms"]},
                "fallback[0] must be a Fallback (e.g. Fallback.sms(text)), not str",
            ),
            (
                "send_basic",
                {"text": "x", "fallback": [da.Fallback.sms("ok"), da.Fallback.sms("")]},
                "fallback[1] needs a channel and non-empty content strings",
            ),
            (
                "send_basic",
                {"text": "x", "fallback": da.Fallback(None, "x")},  # type: ignore[arg-type]
                "fallback[0] needs a channel and non-empty content strings",
            ),
            (
                "send_basic",
                {"text": "x", "fallback": da.Fallback.sms("caf\udce9")},
                "fallback[0] has text that is not valid UTF-8",
            ),
            ("send_basic", {"text": "x", "campaign_name": 3}, "campaign_name must be"),
            ("send_basic", {"text": "x", "account": " "}, "account must be a non-empty string"),
            ("send_basic", {"text": "x", "callback": ""}, "callback must be a non-empty string"),
            (
                "send_basic",
                {"text": "caf\udce9"},
                "text has text that is not valid UTF-8 (a lone surrogate)",
            ),
            ("send_basic", {"text": "x", "chunk_size": 0}, "chunk_size must be a positive"),
            ("send_basic", {"text": "x", "deadline": -1}, "deadline must be a positive"),
        ],
    )
    async def test_a_missing_or_bad_field_is_refused(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        method: str,
        kwargs: dict[str, Any],
        complaint: str,
    ) -> None:
        with pytest.raises(da.InputError) as caught:
            await getattr(session, method)(NUMBERS, **kwargs)
        assert complaint in str(caught.value)
        assert isinstance(caught.value, ValueError)
        assert server.stats.requests == 0
        assert server.stats.token_calls == 0

    @pytest.mark.parametrize(
        ("method", "kwargs"),
        [
            ("send_template", {"template_id": "t", "text": "x"}),
            ("send_basic", {"text": "x", "webhook": "https://h"}),
            ("send_basic", {"text": "x", "template_id": "t"}),
            ("send_single", {"text": "x", "webhook": "https://h"}),
            ("send_single", {"text": "x", "template_id": "t"}),
        ],
    )
    async def test_a_field_the_endpoint_does_not_take_is_refused(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        method: str,
        kwargs: dict[str, Any],
    ) -> None:
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            await getattr(session, method)(NUMBERS, **kwargs)
        assert server.stats.requests == 0

    async def test_no_account_anywhere_is_refused(self, server: FakeDispatchServer) -> None:
        async with da.DispatchSession(server.url, client_secret="test-secret") as session:
            with pytest.raises(da.InputError) as caught:
                await session.send_basic(NUMBERS, text="x")
        assert str(caught.value) == "account is required: pass account= here or to the session"
        assert server.stats.token_calls == 0

    async def test_a_bad_recipient_anywhere_in_a_list_stops_the_call_before_sending(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        recipients: list[Any] = [f"+55119{i:08d}" for i in range(2500)]
        recipients[2400] = {"number": "+5511900000000", "vars": {"amount": 10}}
        with pytest.raises(da.InvalidRecipientError, match="position 2400") as caught:
            await session.send_template(recipients, template_id="t", chunk_size=1000)
        assert "vars['amount'] must be a string, not int" in str(caught.value)
        assert server.stats.requests == 0

    @pytest.mark.parametrize("recipients", ["+5511987654321", {"number": "+55"}, 5])
    async def test_a_single_recipient_instead_of_a_collection_is_refused(
        self, server: FakeDispatchServer, session: da.DispatchSession, recipients: Any
    ) -> None:
        with pytest.raises(da.InputError, match="recipients must be"):
            await session.send_basic(recipients, text="x")
        assert server.stats.requests == 0


class TestSendAndStreamTwins:
    @pytest.mark.parametrize("endpoint", ["template", "basic", "single", "webhook"])
    def test_send_takes_exactly_what_its_stream_takes(self, endpoint: str) -> None:
        send = inspect.signature(getattr(da.DispatchSession, f"send_{endpoint}"))
        stream = inspect.signature(getattr(da.DispatchSession, f"stream_{endpoint}"))
        assert send.parameters == stream.parameters
        assert send.return_annotation == "DispatchResult"
        assert stream.return_annotation == "AsyncGenerator[DispatchResult, None]"

    @pytest.mark.parametrize("endpoint", ["template", "basic", "single", "webhook"])
    def test_the_blocking_client_takes_what_the_session_takes(self, endpoint: str) -> None:
        for kind in ("send", "stream"):
            client = inspect.signature(getattr(da.DispatchClient, f"{kind}_{endpoint}"))
            session = inspect.signature(getattr(da.DispatchSession, f"{kind}_{endpoint}"))
            assert client.parameters == session.parameters

"""Each dispatch endpoint takes its own fields, checked before anything is sent (spec 4.2-4.6)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer

NUMBERS = ["+5511987654321", "+5511912345678"]


class TestWhatEachEndpointSends:
    async def test_template_sends_its_template_and_options(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_template(
            [NUMBERS[0], da.Recipient(NUMBERS[1], vars={"pixCode": "000201"})],
            template_id="pix_reminder",
            fallback=[da.Fallback.sms("Seu código Pix chegou")],
            campaign_name="november",
            callback="https://hooks.example.com/cb",
        )
        assert [m.number for m in result.valid] == NUMBERS
        assert server.stats.calls_by_path["template"] == 1

    @pytest.mark.parametrize("method", ["send_basic", "send_single"])
    async def test_basic_and_single_send_the_text_as_content(
        self, server: FakeDispatchServer, session: da.DispatchSession, method: str
    ) -> None:
        send = getattr(session, method)
        result = await send(NUMBERS, text="Olá", fallback=da.Fallback.sms("Olá"))
        assert len(result.valid) == 2
        assert server.stats.calls_by_path[method.removeprefix("send_")] == 1

    async def test_webhook_sends_with_its_webhook(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_webhook(
            NUMBERS, webhook="https://hooks.example.com/w", text="Olá"
        )
        assert len(result.valid) == 2
        assert server.stats.calls_by_path["webhook"] == 1

    async def test_the_account_can_be_overridden_per_call(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_basic(NUMBERS, text="x", account="other")
        assert len(result.valid) == 2

    async def test_ids_are_the_services_uuids(self, session: da.DispatchSession) -> None:
        import uuid

        result = await session.send_basic(NUMBERS, text="x")
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
        assert server.stats.last_headers["Accept"] == "application/json"


class TestRefusedBeforeSending:
    @pytest.mark.parametrize(
        ("method", "kwargs", "complaint"),
        [
            ("send_template", {"template_id": ""}, "template_id must be a non-empty string"),
            ("send_template", {"template_id": 5}, "template_id must be a non-empty string"),
            ("send_basic", {"text": ""}, "text must be a non-empty string"),
            ("send_single", {"text": None}, "requires text="),
            ("send_webhook", {"webhook": None, "text": "x"}, "requires webhook="),
            ("send_basic", {"text": "x", "fallback": ["sms"]}, "fallback[0] must be a Fallback"),
            ("send_basic", {"text": "x", "campaign_name": 3}, "campaign_name must be"),
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
            with pytest.raises(da.InputError, match="account is required"):
                await session.send_basic(NUMBERS, text="x")
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

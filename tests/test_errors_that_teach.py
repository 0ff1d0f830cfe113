"""Errors that teach: what the service said, the name meant, the setting refused up front."""

from __future__ import annotations

import pytest

import dispatch_async as da
from dispatch_async._redaction import service_reason
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET, TEMPLATE, numbers, session_for

CALLBACK = "https://hooks.example.com/dispatch/k3y-0f-th3-r3c31v3r"


class TestAStatusErrorSaysWhy:
    async def test_a_400_names_the_missing_template_variable(self) -> None:
        async with (
            FakeDispatchServer(
                client_secret=SECRET, templates={"pix_reminder": ["pixCode"]}
            ) as strict,
            session_for(strict) as session,
        ):
            result = await session.send_template(numbers(1), **TEMPLATE)
        error = result.failed[0].error
        assert str(error) == (
            "the service answered HTTP 400: messages[0].vars has no 'pixCode': "
            "template 'pix_reminder' needs 'pixCode'"
        )

    async def test_phone_numbers_in_the_reason_are_masked(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        given = numbers(1)
        server.script(Fault.status(400, body={"message": f"number {given[0]} is blocked"}))
        result = await session.send_basic(given, text="x")
        said = str(result.failed[0].error)
        assert said == f"the service answered HTTP 400: number ***{given[0][-2:]} is blocked"
        assert given[0][3:] not in said

    async def test_a_callback_key_the_service_echoes_is_blanked(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(Fault.status(400, body={"error": f"cannot reach {CALLBACK}"}))
        result = await session.send_basic(numbers(1), text="x", callback=CALLBACK)
        said = str(result.failed[0].error)
        assert (
            said
            == "the service answered HTTP 400: cannot reach https://hooks.example.com/dispatch/***"
        )

    async def test_a_body_that_is_not_json_is_shown_by_its_start_on_one_line_and_bounded(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(Fault.status(422, body="<p>\n  field   content is\ttoo long " + "x" * 5000))
        result = await session.send_basic(numbers(1), text="x")
        said = str(result.failed[0].error)
        assert said.startswith("the service answered HTTP 422: <p> field content is too long xxx")
        assert said.endswith("…")
        assert len(said) == len("the service answered HTTP 422: ") + 200

    async def test_a_5xx_stays_as_it_was(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(Fault.status(503, body={"message": "maintenance"}))
        once = session.with_options(retry=da.RetryPolicy(attempts=1))
        result = await once.send_basic(numbers(1), text="x")
        assert str(result.failed[0].error) == "the service answered HTTP 503"


class TestTheReasonTakenFromABody:
    def test_its_message_else_its_error_or_detail_else_the_start_of_the_body(self) -> None:
        assert service_reason(b'{"message": "template not found", "code": 7}', ()) == (
            "template not found"
        )
        assert service_reason(b'{"error": "x", "detail": "y"}', ()) == "x"
        assert service_reason(b'{"detail": "y"}', ()) == "y"
        assert service_reason(b'{"code": 7}', ()) == '{"code": 7}'
        assert (
            service_reason(b"<html>\n  Bad   Gateway\n</html>", ()) == "<html> Bad Gateway </html>"
        )
        assert service_reason(b"", ()) == ""

    def test_a_secret_in_a_body_that_is_not_json_is_blanked(self) -> None:
        secret = "s3cr3t-t0k3n-" * 4
        body = b"x" * 180 + secret.encode()
        reason = service_reason(body, (secret,))
        assert "s3cr3t" not in reason
        assert len(reason) <= 200


class TestAMistypedKeywordNamesTheMethodAndTheNameMeant:
    async def test_a_typo_in_a_batch_option(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        with pytest.raises(da.UnknownArgumentError) as caught:
            await session.send_basic(numbers(1), text="x", chunk_sise=5)  # type: ignore[call-arg]
        assert str(caught.value) == (
            "send_basic() got an unexpected keyword argument 'chunk_sise'; "
            "did you mean 'chunk_size'?"
        )
        assert isinstance(caught.value, TypeError)
        assert isinstance(caught.value, da.InputError)
        assert server.stats.requests == 0

    async def test_an_argument_of_another_endpoint_names_the_methods_that_take_it(
        self, session: da.DispatchSession
    ) -> None:
        with pytest.raises(TypeError) as caught:
            await session.send_template(numbers(1), **TEMPLATE, text="x")  # type: ignore[call-arg]
        assert str(caught.value) == (
            "send_template() got an unexpected keyword argument 'text' "
            "(send_basic, send_single and send_webhook take it)"
        )

    async def test_a_near_miss_of_the_methods_own_argument(
        self, session: da.DispatchSession
    ) -> None:
        with pytest.raises(
            TypeError, match=r"^stream_template\(\) .* did you mean 'campaign_name'\?$"
        ):
            session.stream_template(numbers(1), **TEMPLATE, campain_name="pix")  # type: ignore[call-arg]

    @pytest.mark.parametrize(
        ("make", "method"),
        [
            (
                lambda s: da.DispatchSession(s.url, client_secret=SECRET, dedup=True),
                "DispatchSession",
            ),
            (lambda s: session_for(s).with_options(dedup=True), "with_options"),
        ],
        ids=["session", "with_options"],
    )
    async def test_on_the_session_and_its_views(
        self, server: FakeDispatchServer, make: object, method: str
    ) -> None:
        with pytest.raises(da.UnknownArgumentError) as caught:
            make(server)  # type: ignore[operator]
        assert str(caught.value) == (
            f"{method}() got an unexpected keyword argument 'dedup'; did you mean 'dedupe'?"
        )

    async def test_in_a_plan(self) -> None:
        with pytest.raises(da.UnknownArgumentError, match=r"^plan\(\) .*did you mean 'region'\?$"):
            await anext(da.plan(numbers(1), regoin="BR"))  # type: ignore[call-arg]


class TestSettingsAreRefusedBeforeAnyRequest:
    @pytest.mark.parametrize(
        ("given", "problem"),
        [
            ("not a url", "has no http:// or https:// scheme"),
            ("hooks.example.com/dispatch/k3y-0f-th3-r3c31v3r", "has no http:// or https:// scheme"),
            ("ftp://hooks.example.com/k3y-0f-th3-r3c31v3r", "has no http:// or https:// scheme"),
            ("https:///k3y-0f-th3-r3c31v3r", "has no host"),
        ],
    )
    async def test_a_callback_that_is_not_a_url_is_named_but_not_shown(
        self, server: FakeDispatchServer, session: da.DispatchSession, given: str, problem: str
    ) -> None:
        with pytest.raises(da.InputError) as caught:
            await session.send_basic(numbers(1), text="x", callback=given)
        assert str(caught.value) == (
            f"callback must be an http or https URL with a host: the value given {problem}"
        )
        assert server.stats.requests == 0

    async def test_a_webhook_likewise(self, session: da.DispatchSession) -> None:
        with pytest.raises(da.InputError, match=r"^webhook must be an http or https URL"):
            session.stream_webhook(numbers(1), webhook="k3y-0f-th3-r3c31v3r", text="x")

    async def test_an_http_callback_to_any_host_is_taken(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_basic(numbers(1), text="x", callback="http://10.0.0.7:8080/cb")
        assert result.ok

    @pytest.mark.parametrize("region", ["XX", "br", "Brazil"])
    async def test_an_unknown_region_is_refused_naming_it(
        self, server: FakeDispatchServer, session: da.DispatchSession, region: str
    ) -> None:
        message = (
            'region must be a region code (ISO 3166 alpha-2, upper case) such as "BR", '
            f"or None, not str {region!r}"
        )
        with pytest.raises(da.ConfigurationError) as caught:
            await session.send_basic(numbers(1), text="x", prevalidate=True, region=region)
        assert str(caught.value) == message
        with pytest.raises(da.ConfigurationError, match=f"not str {region!r}$"):
            session_for(server, region=region)
        assert server.stats.requests == 0

    async def test_a_known_region_is_taken(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        result = await session.send_basic(
            ["(11) 98765-4321"], text="x", prevalidate=True, region="BR"
        )
        assert result.ok
        assert list(server.stats.received) == ["+5511987654321"]

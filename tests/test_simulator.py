"""The dispatch simulator, specified through plain HTTP (no SDK code involved)."""

from __future__ import annotations

import ast
import asyncio
import importlib
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

import dispatch_async.testing
from dispatch_async.testing import FakeDispatchServer, Fault, FaultKind, serve_forever
from dispatch_async.testing.__main__ import main

from .conftest import HANG
from .test_exported_members import isort_order

pytest_plugins = ["pytester"]

VALID = "+5511999990001"
OTHER = "+5511999990002"
THIRD = "+5511999990003"
TEXT = {"text": {"message": "Your PIX code is ready"}}
REQUIRED: dict[str, dict[str, Any]] = {
    "webhook": {"account": "acme", "webhook": "https://example.test/hook"},
    "template": {"account": "acme", "template_id": "pix_reminder"},
    "basic": {"account": "acme", "content": TEXT},
    "single": {"account": "acme", "content": TEXT},
}
OPTIONAL: dict[str, Any] = {
    "campaign_name": "march",
    "fallback": [{"channel": "sms", "content": "Your PIX code is ready"}],
    "callback": "https://example.test/callback",
}
ENDPOINTS = sorted(REQUIRED)
SHORT = aiohttp.ClientTimeout(total=0.2)
PROJECT_ROOT = Path(dispatch_async.testing.__file__).resolve().parents[2]


def body(endpoint: str = "basic", numbers: Sequence[str] = (VALID,), **extra: Any) -> Any:
    """A valid request for ``endpoint`` to ``numbers``, overridden by ``extra``."""
    messages = [{"number": n, "vars": {"pixCode": f"code-{n}"}} for n in numbers]
    return {**REQUIRED[endpoint], "messages": messages, **extra}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Auth-Type": "JWT"}


@pytest.fixture
async def server() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


@pytest.fixture
def token(server: FakeDispatchServer) -> str:
    return server.issue_token()


async def post(
    http: aiohttp.ClientSession,
    server: FakeDispatchServer,
    payload: Any,
    *,
    token: str | None,
    endpoint: str = "basic",
    headers: dict[str, str] | None = None,
    client_timeout: aiohttp.ClientTimeout | None = None,
) -> tuple[int, Any]:
    """POST ``payload`` as JSON; returns the status and the decoded JSON body."""
    sent = auth(token) if token is not None else {}
    sent |= headers or {}
    options: dict[str, Any] = {} if client_timeout is None else {"timeout": client_timeout}
    url = f"{server.url}/api/v3/{endpoint}"
    async with http.post(url, json=payload, headers=sent, **options) as response:
        return response.status, orjson.loads(await response.read())


async def get_token(
    http: aiohttp.ClientSession, server: FakeDispatchServer, **form: str
) -> tuple[int, Any]:
    fields = {"grant_type": "client_credentials", "client_secret": "test-secret"} | form
    async with http.post(f"{server.url}/oauth/token", data=fields) as response:
        return response.status, orjson.loads(await response.read())


# Lifecycle


class TestLifecycle:
    async def test_listens_on_loopback_on_a_free_port(self, server: FakeDispatchServer) -> None:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.port > 0

    async def test_has_no_url_before_it_starts(self) -> None:
        with pytest.raises(RuntimeError, match="not started"):
            _ = FakeDispatchServer().url

    async def test_close_is_idempotent_and_works_unstarted(
        self, http: aiohttp.ClientSession
    ) -> None:
        unstarted = FakeDispatchServer()
        await unstarted.close()
        async with FakeDispatchServer() as server:
            await server.close()
        await server.close()

        with pytest.raises(aiohttp.ClientConnectorError):
            await get_token(http, server)

    async def test_cannot_be_restarted(self, server: FakeDispatchServer) -> None:
        with pytest.raises(RuntimeError, match="open"):
            await server.start()
        await server.close()
        with pytest.raises(RuntimeError, match="closed"):
            await server.start()

    async def test_closes_promptly_and_leaves_no_task_behind_while_a_handler_hangs(
        self, http: aiohttp.ClientSession
    ) -> None:
        server = FakeDispatchServer()
        await server.start()
        token = server.issue_token()
        server.script(Fault.hang())
        request = asyncio.create_task(post(http, server, body(), token=token))
        await server.wait_until(lambda: server.stats.dispatch_calls == 1)

        async with asyncio.timeout(HANG):  # waiting for the hung handler is a hang
            await server.close()

        with pytest.raises(aiohttp.ServerDisconnectedError):
            await request
        assert asyncio.all_tasks() == {asyncio.current_task()}


# Token endpoint (spec 4.1, 2.6)


class TestTokenEndpoint:
    async def test_issues_a_bearer_token_for_client_credentials(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        status, answer = await get_token(http, server)

        assert status == 200
        assert answer["token_type"] == "Bearer"
        assert answer["expires_in"] == "3600"
        assert isinstance(answer["access_token"], str)
        assert answer["access_token"]
        assert server.stats.token_calls == 1
        assert server.stats.tokens_issued == 1

    async def test_issues_a_different_token_each_time(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        first = (await get_token(http, server))[1]["access_token"]
        second = (await get_token(http, server))[1]["access_token"]
        assert first != second

    async def test_expires_in_is_the_configured_lifetime_as_a_string(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        server.token_lifetime = 1.5
        assert (await get_token(http, server))[1]["expires_in"] == "1.5"

    @pytest.mark.parametrize("forced", [3600, "3600.0", "abc", 12.5])
    async def test_expires_in_can_be_forced_to_any_json_value(
        self, http: aiohttp.ClientSession, forced: object
    ) -> None:
        async with FakeDispatchServer(expires_in=forced) as server:
            assert (await get_token(http, server))[1]["expires_in"] == forced

    async def test_expires_in_none_omits_the_field(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(expires_in=None) as server:
            status, answer = await get_token(http, server)
        assert status == 200
        assert "expires_in" not in answer

    @pytest.mark.parametrize("grant_type", ["password", "", "CLIENT_CREDENTIALS"])
    async def test_refuses_other_grant_types(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, grant_type: str
    ) -> None:
        status, answer = await get_token(http, server, grant_type=grant_type)
        assert (status, answer) == (400, {"error": "unsupported_grant_type"})
        assert server.stats.tokens_issued == 0

    async def test_refuses_a_wrong_secret(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        status, answer = await get_token(http, server, client_secret="guess")
        assert (status, answer) == (401, {"error": "invalid_client"})

    async def test_accepts_the_configured_secret(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(client_secret="s3cret") as server:
            assert (await get_token(http, server, client_secret="s3cret"))[0] == 200
            assert (await get_token(http, server))[0] == 401


# Authentication on /api/v3 (spec 5)


class TestAuthentication:
    async def test_an_issued_token_is_accepted(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        issued = (await get_token(http, server))[1]["access_token"]
        assert (await post(http, server, body(), token=issued))[0] == 200

    @pytest.mark.parametrize(
        ("headers", "counter"),
        [
            ({}, "missing_token"),
            ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing_token"),
            ({"Authorization": "Bearer "}, "missing_token"),
            ({"Authorization": "Bearer never-issued"}, "unknown_token_uses"),
        ],
    )
    async def test_refuses_a_missing_or_unknown_token_without_acting(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        headers: dict[str, str],
        counter: str,
    ) -> None:
        status, answer = await post(http, server, body(), token=None, headers=headers)

        assert (status, answer) == (401, {"error": "invalid_token"})
        assert getattr(server.stats, counter) == 1
        assert server.stats.unauthorized == 1
        assert server.stats.dispatch_calls == 0
        assert not server.stats.received

    async def test_refuses_an_expired_token_and_counts_its_use(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        server.token_lifetime = 0
        expired = (await get_token(http, server))[1]["access_token"]

        status, answer = await post(http, server, body(), token=expired)

        assert (status, answer) == (401, {"error": "invalid_token"})
        assert server.stats.expired_token_uses == 1
        assert not server.stats.received

    async def test_expire_tokens_ends_every_token_issued_so_far(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.expire_tokens()
        fresh = server.issue_token()

        assert (await post(http, server, body(), token=token))[0] == 401
        assert (await post(http, server, body(), token=fresh))[0] == 200

    async def test_bearer_scheme_is_case_insensitive(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        headers = {"Authorization": f"bearer {token}"}
        assert (await post(http, server, body(), token=None, headers=headers))[0] == 200

    async def test_x_auth_type_other_than_jwt_is_refused(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        status, answer = await post(
            http, server, body(), token=token, headers={"X-Auth-Type": "OAuth"}
        )
        assert status == 400
        assert answer["error"] == "invalid_auth_type"
        assert server.stats.dispatch_calls == 0

    async def test_x_auth_type_may_be_left_out(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        assert (await post(http, server, body(), token=None, headers=headers))[0] == 200

    async def test_records_the_headers_that_matter(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        await post(http, server, body(), token=token, headers={"User-Agent": "sdk/1.0"})

        assert server.stats.user_agent == "sdk/1.0"
        assert server.stats.last_headers["X-Auth-Type"] == "JWT"
        assert server.stats.last_headers["Content-Type"] == "application/json"
        assert "Authorization" not in server.stats.last_headers


# Request validation (spec 4.2 to 4.5)


class TestRequestValidation:
    @pytest.mark.parametrize("endpoint", ENDPOINTS)
    async def test_accepts_each_endpoint_with_required_fields_only(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str, endpoint: str
    ) -> None:
        status, _ = await post(http, server, body(endpoint), token=token, endpoint=endpoint)
        assert status == 200
        assert server.stats.calls_by_path == Counter({endpoint: 1})

    @pytest.mark.parametrize("endpoint", ENDPOINTS)
    async def test_accepts_each_endpoint_with_its_optional_fields(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str, endpoint: str
    ) -> None:
        extra = dict(OPTIONAL)
        if endpoint == "webhook":
            extra |= {"content": TEXT, "template_id": "pix_reminder"}
        if endpoint == "template":
            extra |= {"webhook": "https://example.test/hook"}
        payload = body(endpoint, **extra)
        assert (await post(http, server, payload, token=token, endpoint=endpoint))[0] == 200

    @pytest.mark.parametrize(
        ("endpoint", "field"),
        [
            (endpoint, field)
            for endpoint in ENDPOINTS
            for field in [*REQUIRED[endpoint], "messages"]
        ],
    )
    async def test_refuses_a_missing_required_field_naming_it(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        token: str,
        endpoint: str,
        field: str,
    ) -> None:
        payload = body(endpoint)
        del payload[field]

        status, answer = await post(http, server, payload, token=token, endpoint=endpoint)

        assert status == 400
        assert (answer["error"], answer["field"]) == ("missing_field", field)
        assert not server.stats.received

    @pytest.mark.parametrize(
        ("endpoint", "field", "value"),
        [
            ("template", "content", TEXT),
            ("basic", "webhook", "https://example.test/hook"),
            ("basic", "template_id", "pix_reminder"),
            ("single", "webhook", "https://example.test/hook"),
            ("single", "template_id", "pix_reminder"),
            ("webhook", "priority", "high"),
        ],
    )
    async def test_refuses_a_field_outside_the_endpoint_table_naming_it(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        token: str,
        endpoint: str,
        field: str,
        value: object,
    ) -> None:
        payload = body(endpoint) | {field: value}

        status, answer = await post(http, server, payload, token=token, endpoint=endpoint)

        assert status == 400
        assert (answer["error"], answer["field"]) == ("unknown_field", field)
        assert server.stats.dispatch_calls == 0

    @pytest.mark.parametrize(
        ("change", "field"),
        [
            ({"account": 42}, "account"),
            ({"callback": None}, "callback"),
            ({"campaign_name": ["march"]}, "campaign_name"),
            ({"messages": []}, "messages"),
            ({"messages": {"number": VALID}}, "messages"),
            ({"messages": [VALID]}, "messages[0]"),
            ({"messages": [{"number": VALID}, {"number": 5511999990001}]}, "messages[1].number"),
            ({"messages": [{"vars": {}}]}, "messages[0].number"),
            ({"messages": [{"number": VALID, "vars": {"pixCode": 1}}]}, "messages[0].vars.pixCode"),
            ({"messages": [{"number": VALID, "vars": ["a"]}]}, "messages[0].vars"),
            ({"messages": [{"number": VALID, "name": "Ana"}]}, "messages[0].name"),
            ({"content": {"text": "hi"}}, "content.text"),
            ({"content": {"message": "hi"}}, "content"),
            ({"content": {"text": {"message": None}}}, "content.text.message"),
            ({"fallback": {"channel": "sms", "content": "hi"}}, "fallback"),
            ({"fallback": [{"channel": "sms"}]}, "fallback[0]"),
            ({"fallback": [{"channel": "sms", "content": 1}]}, "fallback[0].content"),
        ],
    )
    async def test_refuses_a_field_of_the_wrong_type_naming_it(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        token: str,
        change: dict[str, Any],
        field: str,
    ) -> None:
        status, answer = await post(http, server, body("basic") | change, token=token)

        assert status == 400
        assert answer["field"] == field
        assert server.stats.dispatch_calls == 0

    async def test_refuses_a_body_that_is_not_an_object(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        status, answer = await post(http, server, [body()], token=token)
        assert (status, answer["error"]) == (400, "invalid_body")

    async def test_refuses_malformed_json(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        headers = auth(token) | {"Content-Type": "application/json"}
        async with http.post(f"{server.url}/api/v3/basic", data=b"{", headers=headers) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"] == "invalid_json"

    async def test_refuses_a_body_that_is_not_declared_json(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        data = orjson.dumps(body())
        headers = auth(token) | {"Content-Type": "text/plain"}
        async with http.post(f"{server.url}/api/v3/basic", data=data, headers=headers) as resp:
            assert resp.status == 415
        assert server.stats.dispatch_calls == 0

    async def test_refuses_a_body_over_the_size_cap(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(max_body_bytes=1024) as server:
            payload = body(numbers=[f"+55119{i:08d}" for i in range(100)])
            headers = auth(server.issue_token())
            async with http.post(f"{server.url}/api/v3/basic", json=payload, headers=headers) as r:
                assert r.status == 413
            assert server.stats.dispatch_calls == 0


# Recipients and the dispatch response (spec 2.2, 2.5, 7)


class TestRecipients:
    async def test_splits_valid_and_invalid_recipients_keeping_input_order(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        numbers = [OTHER, "12", VALID, "not-a-number", THIRD]

        status, answer = await post(http, server, body(numbers=numbers), token=token)

        assert status == 200
        assert [m["number"] for m in answer["validMessages"]] == [OTHER, VALID, THIRD]
        assert answer["invalidMessages"] == [
            {"number": "12", "reason": "number must be a valid phone number"},
            {"number": "not-a-number", "reason": "number must be a valid phone number"},
        ]

    @pytest.mark.parametrize(
        ("number", "valid"),
        [
            ("+5511999990001", True),
            ("5511999990001", True),
            ("12345678", True),
            ("+123456789012345", True),
            ("1234567", False),
            ("1234567890123456", False),
            ("+0511999990001", False),
            ("05511999990001", False),
            ("+55 11 99999 0001", False),
            ("+55-11-99999-0001", False),
            ("++5511999990001", False),
            ("5511999990001\n", False),
            ("\u0665\u0665\u0661\u0661\u0669\u0669\u0669\u0669\u0669\u0660\u0660", False),
            ("", False),
        ],
    )
    async def test_a_valid_number_is_an_optional_plus_and_8_to_15_digits(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        token: str,
        number: str,
        valid: bool,
    ) -> None:
        _, answer = await post(http, server, body(numbers=[number]), token=token)
        assert [m["number"] for m in answer["validMessages"]] == ([number] if valid else [])
        assert [m["number"] for m in answer["invalidMessages"]] == ([] if valid else [number])

    @pytest.mark.parametrize("fast_ids", [False, True])
    async def test_each_accepted_recipient_gets_a_distinct_uuid(
        self, http: aiohttp.ClientSession, fast_ids: bool
    ) -> None:
        numbers = [f"+55119{i:08d}" for i in range(50)]
        async with FakeDispatchServer(fast_ids=fast_ids) as server:
            token = server.issue_token()
            first = (await post(http, server, body(numbers=numbers), token=token))[1]
            second = (await post(http, server, body(numbers=numbers), token=token))[1]

        ids = [m["id"] for m in first["validMessages"] + second["validMessages"]]
        assert len(set(ids)) == 100
        assert all(str(uuid.UUID(id_)) == id_ for id_ in ids)
        assert all(uuid.UUID(id_).version == 4 for id_ in ids)


# Templates listing (spec 4.6; the response shape is the simulator's own)


class TestTemplatesListing:
    async def test_lists_templates(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        headers = auth(token) | {"Accept": "application/json"}
        async with http.get(f"{server.url}/api/v3/templates", headers=headers) as resp:
            assert resp.status == 200
            answer = await resp.json()

        assert {"id": "pix_reminder", "name": "PIX payment reminder", "channel": "rcs"} in (
            answer["templates"]
        )
        assert server.stats.requests == 1
        assert server.stats.dispatch_calls == 0

    async def test_requires_a_token(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        async with http.get(f"{server.url}/api/v3/templates") as resp:
            assert resp.status == 401

    async def test_refuses_a_non_json_accept(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        headers = auth(token) | {"Accept": "text/html"}
        async with http.get(f"{server.url}/api/v3/templates", headers=headers) as resp:
            assert resp.status == 406


class TestKnownTemplates:
    """``templates={id: [var, ...]}``: the account's only templates, and the vars they need.

    The spec shows no answer for either mistake; a 400 for the call is the simulator's.
    """

    @pytest.fixture
    async def strict(self) -> AsyncIterator[FakeDispatchServer]:
        async with FakeDispatchServer(templates={"pix_reminder": ["pixCode"]}) as server:
            yield server

    async def test_a_template_it_has_with_its_vars_is_sent(
        self, http: aiohttp.ClientSession, strict: FakeDispatchServer
    ) -> None:
        status, answer = await post(
            http, strict, body("template"), token=strict.issue_token(), endpoint="template"
        )
        assert status == 200
        assert [m["number"] for m in answer["validMessages"]] == [VALID]

    async def test_an_unknown_template_is_refused_whole_and_nothing_is_acted_on(
        self, http: aiohttp.ClientSession, strict: FakeDispatchServer
    ) -> None:
        typo = body("template", numbers=[VALID, OTHER], template_id="pix_remindr")
        status, answer = await post(
            http, strict, typo, token=strict.issue_token(), endpoint="template"
        )
        assert status == 400
        assert answer["error"] == "unknown_template"
        assert answer["field"] == "template_id"
        assert "'pix_remindr' is not a template" in answer["message"]
        assert "'pix_reminder'" in answer["message"], "it names the templates there are"
        assert strict.stats.dispatch_calls == 0
        assert not strict.stats.received

    async def test_a_recipient_without_a_var_the_template_needs_refuses_the_call(
        self, http: aiohttp.ClientSession, strict: FakeDispatchServer
    ) -> None:
        payload = body("template", numbers=[VALID, OTHER])
        payload["messages"][1]["vars"] = {"Código Pix": "000201"}
        status, answer = await post(
            http, strict, payload, token=strict.issue_token(), endpoint="template"
        )
        assert status == 400
        assert answer["error"] == "missing_var"
        assert answer["field"] == "messages[1].vars.pixCode"
        assert strict.stats.dispatch_calls == 0

    async def test_a_webhook_naming_a_template_is_checked_the_same_way(
        self, http: aiohttp.ClientSession, strict: FakeDispatchServer
    ) -> None:
        status, answer = await post(
            http,
            strict,
            body("webhook", template_id="otp_code"),
            token=strict.issue_token(),
            endpoint="webhook",
        )
        assert (status, answer["error"]) == (400, "unknown_template")

    async def test_the_listing_is_derived_from_the_templates_given(
        self, http: aiohttp.ClientSession, strict: FakeDispatchServer
    ) -> None:
        headers = auth(strict.issue_token()) | {"Accept": "application/json"}
        async with http.get(f"{strict.url}/api/v3/templates", headers=headers) as resp:
            listing = await resp.json()
        assert listing == {
            "templates": [
                {
                    "id": "pix_reminder",
                    "name": "pix_reminder",
                    "channel": "rcs",
                    "vars": ["pixCode"],
                }
            ]
        }

    async def test_by_default_any_template_and_any_vars_are_accepted(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        payload = body("template", template_id="anything")
        payload["messages"][0]["vars"] = {}
        assert (await post(http, server, payload, token=token, endpoint="template"))[0] == 200

    def test_a_mapping_that_is_not_of_vars_is_refused(self) -> None:
        with pytest.raises(TypeError, match="template_id"):
            FakeDispatchServer(templates={"id": "pix_reminder"})  # type: ignore[dict-item]


# Stats


class TestStats:
    async def test_counts_every_number_acted_on_and_reports_duplicates(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        await post(http, server, body(numbers=[VALID, OTHER]), token=token)
        await post(http, server, body(numbers=[VALID, "12"]), token=token)

        stats = server.stats
        assert stats.received == Counter({VALID: 2, OTHER: 1, "12": 1})
        assert stats.duplicates == Counter({VALID: 2})
        assert stats.recipients_received == 4
        assert stats.dispatch_calls == 2

    async def test_counts_requests_and_statuses(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        await post(http, server, body(), token=token)
        await post(http, server, body(), token="stale")
        await get_token(http, server)

        assert server.stats.requests == 2
        assert server.stats.status_counts == Counter({200: 2, 401: 1})
        assert server.stats.unauthorized == 1

    async def test_max_concurrent_is_the_peak_of_overlapping_requests(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.hang(), Fault.hang())
        requests = [asyncio.create_task(post(http, server, body(), token=token)) for _ in "ab"]
        await server.wait_until(lambda: server.in_flight == 2)
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        await post(http, server, body(), token=token)

        assert server.stats.max_concurrent == 2

    async def test_reset_stats_zeroes_the_counters_in_place(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        stats = server.stats
        await post(http, server, body(), token=token)

        server.reset_stats()

        assert stats is server.stats
        assert stats.requests == 0
        assert not stats.received
        assert not stats.status_counts
        assert (await post(http, server, body(), token=token))[0] == 200
        assert stats.received == Counter({VALID: 1})


# Status faults


class TestStatusFaults:
    async def test_answers_the_status_with_retry_after_once(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(429, retry_after="0.2"))
        async with http.post(
            f"{server.url}/api/v3/basic", json=body(), headers=auth(token)
        ) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "0.2"
            assert await resp.json() == {"error": "Too Many Requests"}

        assert (await post(http, server, body(), token=token))[0] == 200
        assert server.stats.faults_injected == 1

    @pytest.mark.parametrize(
        ("code", "acted"),
        [(500, True), (502, True), (504, True), (503, False), (429, False), (400, False)],
    )
    async def test_only_500_502_and_504_act_before_failing(
        self,
        http: aiohttp.ClientSession,
        server: FakeDispatchServer,
        token: str,
        code: int,
        acted: bool,
    ) -> None:
        server.script(Fault.status(code))

        assert (await post(http, server, body(), token=token))[0] == code
        assert server.stats.received == (Counter({VALID: 1}) if acted else Counter())
        assert Fault.status(code).acted is acted

    async def test_sends_a_custom_body_and_any_retry_after_verbatim(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(503, retry_after="soon-ish", body="upstream down"))
        async with http.post(
            f"{server.url}/api/v3/basic", json=body(), headers=auth(token)
        ) as resp:
            assert (resp.status, await resp.text()) == (503, "upstream down")
            assert resp.headers["Retry-After"] == "soon-ish"

    async def test_can_be_told_it_acted(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(503, acted=True))
        await post(http, server, body(), token=token)
        assert server.stats.received == Counter({VALID: 1})

    @pytest.mark.parametrize("code", [200, 302, 600])
    def test_needs_an_error_status(self, code: int) -> None:
        with pytest.raises(ValueError, match="error status"):
            Fault.status(code)


# Connection faults


class TestConnectionFaults:
    async def test_drop_acts_then_closes_the_connection_without_answering(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.drop())

        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(http, server, body(), token=token)
        assert server.stats.received == Counter({VALID: 1})
        assert server.stats.dropped == 1

    async def test_drop_before_closes_the_connection_without_acting(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.drop_before())

        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(http, server, body(), token=token)
        assert not server.stats.received
        assert (await post(http, server, body(), token=token))[0] == 200

    async def test_hang_acts_and_never_answers(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.hang())

        with pytest.raises(TimeoutError):
            await post(http, server, body(), token=token, client_timeout=SHORT)
        assert server.stats.received == Counter({VALID: 1})
        # The client giving up ends the handler: the server is free again.
        await server.wait_until(lambda: server.in_flight == 0)

    async def test_delay_acts_then_answers_late(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.delay(0.05))
        request = asyncio.create_task(post(http, server, body(), token=token))
        await server.wait_until(lambda: server.stats.dispatch_calls == 1)

        assert not request.done()
        assert (await request)[0] == 200

    async def test_latency_delays_every_dispatch_answer(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(latency=0.05) as server:
            token = server.issue_token()
            started = time.monotonic()
            assert (await post(http, server, body(), token=token))[0] == 200
            # A local round trip takes about a millisecond; allow for timer granularity.
            assert time.monotonic() - started >= 0.04


# Response faults


class TestResponseFaults:
    async def test_omit_acts_on_all_but_leaves_the_last_recipients_out(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.omit(2))

        status, answer = await post(http, server, body(numbers=[VALID, "12", OTHER]), token=token)

        assert status == 200
        assert [m["number"] for m in answer["validMessages"]] == [VALID]
        assert answer["invalidMessages"] == []
        assert server.stats.received == Counter({VALID: 1, "12": 1, OTHER: 1})

    async def test_not_json_acts_and_answers_200_with_an_html_page(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.not_json())
        async with http.post(
            f"{server.url}/api/v3/basic", json=body(), headers=auth(token)
        ) as resp:
            assert (resp.status, resp.content_type) == (200, "text/html")
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(await resp.read())
        assert server.stats.received == Counter({VALID: 1})

    async def test_wrong_shape_acts_and_answers_items_without_ids(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.wrong_shape())

        status, answer = await post(http, server, body(), token=token)

        assert (status, answer["validMessages"]) == (200, [{"number": VALID}])
        assert server.stats.received == Counter({VALID: 1})

    async def test_wrong_shape_can_answer_any_json(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.wrong_shape(body={"validMessages": None}))
        assert await post(http, server, body(), token=token) == (200, {"validMessages": None})

    async def test_digits_only_strips_every_returned_number(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.digits_only())

        _, answer = await post(http, server, body(numbers=[VALID, "+55-11"]), token=token)

        assert [m["number"] for m in answer["validMessages"]] == [VALID.lstrip("+")]
        assert [m["number"] for m in answer["invalidMessages"]] == ["5511"]
        assert server.stats.received == Counter({VALID: 1, "+55-11": 1})

    async def test_revoke_token_refuses_without_acting_and_for_good(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.revoke_token())

        assert await post(http, server, body(), token=token) == (401, {"error": "invalid_token"})
        assert (await post(http, server, body(), token=token))[0] == 401
        assert not server.stats.received
        assert server.stats.revoked_token_uses == 1
        assert server.stats.unauthorized == 2


# Scheduling faults


class TestScheduling:
    async def test_scripted_faults_are_consumed_one_per_request_in_order(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(503), Fault.status(429))

        statuses = [(await post(http, server, body(), token=token))[0] for _ in range(3)]

        assert statuses == [503, 429, 200]
        assert server.pending_faults == 0

    @pytest.mark.parametrize("path", ["template", "/api/v3/template"])
    async def test_a_path_script_only_hits_that_endpoint(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str, path: str
    ) -> None:
        server.script(Fault.status(503), path=path)

        assert (await post(http, server, body("basic"), token=token))[0] == 200
        template = body("template")
        assert (await post(http, server, template, token=token, endpoint="template"))[0] == 503

    def test_a_path_script_needs_a_dispatch_endpoint(self) -> None:
        with pytest.raises(ValueError, match="not a dispatch endpoint"):
            FakeDispatchServer().script(Fault.drop(), path="templates")

    async def test_a_number_script_hits_the_requests_carrying_that_number(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script_for(OTHER, Fault.status(503), Fault.drop_before())

        assert (await post(http, server, body(numbers=[VALID]), token=token))[0] == 200
        assert (await post(http, server, body(numbers=[VALID, OTHER]), token=token))[0] == 503
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(http, server, body(numbers=[OTHER]), token=token)
        assert (await post(http, server, body(numbers=[OTHER]), token=token))[0] == 200

    async def test_a_number_script_goes_before_a_general_one(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(429))
        server.script_for(VALID, Fault.status(503))

        assert (await post(http, server, body(), token=token))[0] == 503
        assert (await post(http, server, body(), token=token))[0] == 429

    async def test_refused_requests_do_not_consume_faults(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(503))

        assert (await post(http, server, body(), token="stale"))[0] == 401
        assert (await post(http, server, {"account": "acme"}, token=token))[0] == 400
        assert server.pending_faults == 1
        assert (await post(http, server, body(), token=token))[0] == 503

    async def test_clear_faults_forgets_the_script(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer, token: str
    ) -> None:
        server.script(Fault.status(503))
        server.script_for(VALID, Fault.drop())
        server.script_token(Fault.hang())

        server.clear_faults()

        assert server.pending_faults == 0
        assert (await post(http, server, body(), token=token))[0] == 200

    async def test_random_faults_follow_the_rates_reproducibly_and_never_act(
        self, http: aiohttp.ClientSession
    ) -> None:
        async def statuses(seed: int) -> list[tuple[int, str | None]]:
            async with FakeDispatchServer(fault_rates={429: 0.5}, seed=seed) as server:
                token = server.issue_token()
                seen = []
                for _ in range(20):
                    async with http.post(
                        f"{server.url}/api/v3/basic", json=body(), headers=auth(token)
                    ) as resp:
                        seen.append((resp.status, resp.headers.get("Retry-After")))
                assert server.stats.dispatch_calls == seen.count((200, None))
                return seen

        first, again = await statuses(seed=7), await statuses(seed=7)

        assert first == again
        assert set(first) == {(200, None), (429, "0")}

    async def test_random_429_retry_after_is_configurable(
        self, http: aiohttp.ClientSession
    ) -> None:
        async with FakeDispatchServer(fault_rates={429: 1.0}, random_retry_after="2") as server:
            token = server.issue_token()
            async with http.post(
                f"{server.url}/api/v3/basic", json=body(), headers=auth(token)
            ) as resp:
                assert (resp.status, resp.headers["Retry-After"]) == (429, "2")

    @pytest.mark.parametrize("rates", [{200: 0.1}, {429: 1.5}, {429: 0.6, 503: 0.6}])
    def test_fault_rates_must_be_error_statuses_with_probabilities(
        self, rates: dict[int, float]
    ) -> None:
        with pytest.raises(ValueError, match="fault rate"):
            FakeDispatchServer(fault_rates=rates)


# Token endpoint faults


class TestTokenFaults:
    async def test_status_fault(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.status(503, retry_after="1"))

        async with http.post(f"{server.url}/oauth/token", data={}) as resp:
            assert (resp.status, resp.headers["Retry-After"]) == (503, "1")
        assert (await get_token(http, server))[0] == 200
        assert server.stats.token_calls == 2

    async def test_drop(self, http: aiohttp.ClientSession, server: FakeDispatchServer) -> None:
        server.script_token(Fault.drop())
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await get_token(http, server)

    async def test_hang(self, http: aiohttp.ClientSession, server: FakeDispatchServer) -> None:
        server.script_token(Fault.hang())
        with pytest.raises(TimeoutError):
            async with http.post(f"{server.url}/oauth/token", timeout=SHORT):
                pass

    async def test_delay_then_a_token(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.delay(0.01))
        assert (await get_token(http, server))[0] == 200

    async def test_wrong_shape_has_no_access_token(
        self, http: aiohttp.ClientSession, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.wrong_shape())
        status, answer = await get_token(http, server)
        assert (status, answer) == (200, {"expires_in": "3600", "token_type": "Bearer"})

    @pytest.mark.parametrize(
        "fault", [Fault.omit(1), Fault.digits_only(), Fault.revoke_token()], ids=repr
    )
    def test_refuses_faults_that_only_make_sense_for_dispatch(self, fault: Fault) -> None:
        with pytest.raises(ValueError, match="token endpoint"):
            FakeDispatchServer().script_token(fault)


# Faults as values


class TestFaultValues:
    def test_are_frozen_and_comparable(self) -> None:
        fault = Fault.status(503, retry_after="1")
        assert fault == Fault.status(503, retry_after="1")
        assert fault.kind is FaultKind.STATUS
        with pytest.raises(AttributeError):
            fault.acted = True  # type: ignore[misc]

    @pytest.mark.parametrize(
        ("fault", "acted"),
        [
            (Fault.delay(1), True),
            (Fault.hang(), True),
            (Fault.drop(), True),
            (Fault.drop_before(), False),
            (Fault.omit(1), True),
            (Fault.not_json(), True),
            (Fault.wrong_shape(), True),
            (Fault.digits_only(), True),
            (Fault.revoke_token(), False),
        ],
        ids=repr,
    )
    def test_say_whether_the_service_acted(self, fault: Fault, acted: bool) -> None:
        assert fault.acted is acted


# Waiting on the server


class TestWaitUntil:
    async def test_gives_up_after_the_timeout(self, server: FakeDispatchServer) -> None:
        with pytest.raises(TimeoutError):
            await server.wait_until(lambda: server.stats.requests > 0, timeout=0.01)


# Running standalone


class TestStandalone:
    async def test_serve_forever_announces_the_url_and_serves_until_stopped(
        self, http: aiohttp.ClientSession
    ) -> None:
        urls: list[str] = []
        announced, stop = asyncio.Event(), asyncio.Event()

        def ready(url: str) -> None:
            urls.append(url)
            announced.set()

        server = FakeDispatchServer()
        serving = asyncio.create_task(serve_forever(server, ready=ready, stop=stop))
        await announced.wait()

        assert urls == [server.url]
        assert (await get_token(http, server))[0] == 200
        stop.set()
        await serving
        with pytest.raises(RuntimeError, match="closed"):
            await server.start()

    async def test_module_prints_its_url_and_exits_cleanly_on_sigterm(
        self, http: aiohttp.ClientSession
    ) -> None:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatch_async.testing",
            "--port",
            "0",
            "--fault-rate",
            "503=1",
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(HANG):
                url = (await process.stdout.readline()).decode().strip()
            assert url.startswith("http://127.0.0.1:")
            token_form = {"grant_type": "client_credentials", "client_secret": "test-secret"}
            async with http.post(f"{url}/oauth/token", data=token_form) as resp:
                token = (await resp.json())["access_token"]
            async with http.post(f"{url}/api/v3/basic", json=body(), headers=auth(token)) as resp:
                assert resp.status == 503
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(HANG):
                await process.communicate()
        assert process.returncode == 0

    async def test_serve_template_makes_those_the_only_templates(
        self, http: aiohttp.ClientSession
    ) -> None:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dispatch_async.testing", "--port", "0",
            "--template", "pix_reminder:pixCode,name", "--template", "otp_code",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(5):
                url = (await process.stdout.readline()).decode().strip()
            token_form = {"grant_type": "client_credentials", "client_secret": "test-secret"}
            async with http.post(f"{url}/oauth/token", data=token_form) as resp:
                headers = auth((await resp.json())["access_token"])
            answers = []
            for template_id, given in (
                ("pix_reminder", {"pixCode": "1", "name": "Ana"}),
                ("pix_reminder", {"pixCode": "1"}),
                ("otp_code", {}),
                ("order_shipped", {}),
            ):
                payload = body("template", template_id=template_id)
                payload["messages"][0]["vars"] = given
                async with http.post(
                    f"{url}/api/v3/template", json=payload, headers=headers
                ) as resp:
                    answers.append((resp.status, (await resp.json()).get("error")))
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(5):
                await process.communicate()
        assert answers == [
            (200, None),
            (400, "missing_var"),
            (200, None),
            (400, "unknown_template"),
        ]

    def test_refuses_a_malformed_fault_rate(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_info:
            main(["--fault-rate", "429"])
        assert exit_info.value.code == 2
        assert "CODE=RATE" in capsys.readouterr().err


# The pytest plugin


class TestPytestPlugin:
    def test_dispatch_server_fixture_gives_a_started_server(
        self, pytester: pytest.Pytester
    ) -> None:
        pytester.makepyfile(
            """
            import aiohttp
            import pytest

            @pytest.mark.asyncio
            async def test_it(dispatch_server):
                async with aiohttp.ClientSession() as http:
                    async with http.post(dispatch_server.url + "/oauth/token") as resp:
                        assert resp.status == 400
                assert dispatch_server.stats.token_calls == 1
            """
        )
        result = pytester.runpytest_inprocess(
            # Whether or not the package is installed (entry point), load it exactly once.
            "-p",
            "no:dispatch_async",
            "-p",
            "dispatch_async.testing._pytest_plugin",
            "-p",
            "no:cacheprovider",
            # Irrelevant here, and importing it in-process costs most of this test's time.
            "-p",
            "no:hypothesispytest",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-W",
            "error",
        )
        result.assert_outcomes(passed=1)

    def test_loads_without_pytest_asyncio(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "pytest_asyncio", None)
        monkeypatch.delitem(sys.modules, "dispatch_async.testing._pytest_plugin", raising=False)

        plugin = importlib.import_module("dispatch_async.testing._pytest_plugin")

        assert not hasattr(plugin, "dispatch_server")


# The public line


class TestPublicSurface:
    def test_all_is_exactly_the_public_surface(self) -> None:
        exported = dispatch_async.testing.__all__
        assert exported == sorted(exported, key=isort_order)
        assert set(exported) == {
            "DEFAULT_RECORDED_BODY_BYTES",
            "DEFAULT_RECORDED_REQUESTS",
            "DEFAULT_TEMPLATES",
            "CallbackPlan",
            "CallbackSender",
            "CallbackStats",
            "FakeClock",
            "FakeDispatchServer",
            "Fault",
            "FaultKind",
            "RecordedRequest",
            "ServerStats",
            "argument_parser",
            "main",
            "serve_forever",
        }
        assert all(hasattr(dispatch_async.testing, name) for name in exported)

    def test_shares_no_code_with_the_client_sdk(self) -> None:
        package = Path(dispatch_async.testing.__file__).parent
        imported: set[str] = set()
        for module in package.glob("*.py"):
            if module.name == "_pytest_plugin.py":
                # The user's test support, not the simulator: it also serves the SDK's own
                # callback receiver (the callback_server fixture).
                continue
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, ast.ImportFrom):
                    assert node.level <= 1, f"{module.name} reaches above the simulator"
                    imported.add(node.module or "" if node.level == 0 else "<sibling>")
                elif isinstance(node, ast.Import):
                    imported.update(alias.name for alias in node.names)

        assert "aiohttp" in imported
        assert not {name for name in imported if name.partition(".")[0] == "dispatch_async"}

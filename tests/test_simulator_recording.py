"""The simulator keeps the requests it received, bounded and without credentials.

Specified through plain HTTP, so that what is recorded is what arrived, not what the SDK
meant to send.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

import dispatch_async.testing
from dispatch_async.testing import FakeDispatchServer, Fault, RecordedRequest

SECRET = "recorder-secret-never-kept"
NUMBER = "+5511999990001"
PROJECT_ROOT = Path(dispatch_async.testing.__file__).resolve().parents[2]


def basic(account: str = "acme", numbers: tuple[str, ...] = (NUMBER,)) -> dict[str, Any]:
    return {
        "account": account,
        "content": {"text": {"message": "Olá"}},
        "messages": [{"number": n, "vars": {"pixCode": "000201"}} for n in numbers],
    }


@pytest.fixture
async def server() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer(client_secret=SECRET) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def send(
    http: aiohttp.ClientSession,
    url: str,
    payload: object,
    *,
    token: str,
    endpoint: str = "basic",
) -> int:
    headers = {
        "Authorization": f"Bearer {token}",
        "X-Auth-Type": "JWT",
        "Content-Type": "application/json",
    }
    data = orjson.dumps(payload)  # exactly these bytes, so that sizes can be compared
    async with http.post(f"{url}/api/v3/{endpoint}", data=data, headers=headers) as answer:
        await answer.read()
        return answer.status


class TestWhatIsRecorded:
    async def test_each_request_with_its_method_path_endpoint_headers_and_body_in_order(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        token = server.issue_token()
        assert await send(http, server.url, basic("acme"), token=token) == 200
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        async with http.get(f"{server.url}/api/v3/templates", headers=headers) as answer:
            assert answer.status == 200

        first, second = server.requests
        assert (first.method, first.path, first.endpoint) == ("POST", "/api/v3/basic", "basic")
        assert first.json == basic("acme")
        assert first.size == len(orjson.dumps(basic("acme")))
        assert first.headers["x-auth-type"] == "JWT"  # names are case-insensitive
        assert first.headers["Content-Type"] == "application/json"
        assert (second.method, second.endpoint, second.json) == ("GET", "templates", None)
        assert second.headers["Accept"] == "application/json"

    async def test_refused_and_faulted_requests_are_recorded_as_they_arrived(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        server.script(Fault.drop_before())
        assert await send(http, server.url, basic("refused"), token="not-issued") == 401
        with pytest.raises(aiohttp.ClientError):
            await send(http, server.url, basic("dropped"), token=server.issue_token())

        assert [r.json["account"] for r in server.requests] == ["refused", "dropped"]
        assert server.stats.dispatch_calls == 0

    async def test_a_request_in_flight_is_already_recorded(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        server.script(Fault.hang())
        sending = asyncio.create_task(send(http, server.url, basic(), token=server.issue_token()))
        await server.wait_until(lambda: server.in_flight == 1)

        assert [r.endpoint for r in server.requests] == ["basic"]
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending

    async def test_the_simulators_own_paths_are_not_recorded(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        async with http.get(f"{server.url}/_stats") as answer:
            assert answer.status == 200
        async with http.put(f"{server.url}/_rate_limit", json={"rate": None}) as answer:
            assert answer.status == 200
        async with http.get(f"{server.url}/_requests") as answer:
            assert await answer.json() == []

        assert server.requests == []

    async def test_a_path_the_service_does_not_have_is_recorded_without_an_endpoint(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        async with http.post(f"{server.url}/api/v2/basic", json={}) as answer:
            assert answer.status == 404

        [recorded] = server.requests
        assert (recorded.path, recorded.endpoint) == ("/api/v2/basic", None)

    async def test_a_body_that_is_not_json_has_no_json(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        headers = {"Authorization": f"Bearer {server.issue_token()}"}
        url = f"{server.url}/api/v3/basic"
        async with http.post(url, data=b"{not json", headers=headers) as answer:
            assert answer.status == 415

        [recorded] = server.requests
        assert (recorded.body, recorded.json, recorded.form) == (b"{not json", None, None)

    async def test_clear_requests_forgets_them(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        await send(http, server.url, basic(), token=server.issue_token())
        assert len(server.requests) == 1
        server.clear_requests()
        assert server.requests == []


class TestCredentialsAreNeverKept:
    async def test_the_authorization_header_keeps_only_its_scheme(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        token = server.issue_token()
        await send(http, server.url, basic(), token=token)
        async with http.get(
            f"{server.url}/api/v3/templates", headers={"Authorization": "Basic dXNlcjpwYXNz"}
        ) as answer:
            assert answer.status == 401

        bearer, basic_auth = server.requests
        assert bearer.headers["Authorization"] == "Bearer <redacted>"
        assert basic_auth.headers["Authorization"] == "Basic <redacted>"
        assert token not in repr(server.requests)
        assert token not in str([r.as_json() for r in server.requests])

    async def test_a_token_form_is_kept_without_its_client_secret(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        form = {"grant_type": "client_credentials", "client_secret": SECRET, "scope": "x"}
        async with http.post(f"{server.url}/oauth/token", data=form) as answer:
            assert answer.status == 200

        [recorded] = server.requests
        assert recorded.endpoint == "token"
        assert recorded.form == {"grant_type": "client_credentials", "scope": "x"}
        assert recorded.body is not None
        assert SECRET.encode() not in recorded.body
        assert SECRET not in repr(recorded)
        assert SECRET not in str(recorded.as_json())

    async def test_a_json_token_body_is_kept_without_its_client_secret(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        fields = {"grant_type": "client_credentials", "client_secret": SECRET}
        async with http.post(f"{server.url}/oauth/token", json=fields) as answer:
            await answer.read()

        [recorded] = server.requests
        assert recorded.json == {"grant_type": "client_credentials"}
        assert recorded.body is not None
        assert SECRET.encode() not in recorded.body

    @pytest.mark.parametrize(
        ("content_type", "payload"),
        [
            ("text/plain", f"client_secret={SECRET}".encode()),
            ("application/json", f'["{SECRET}"]'.encode()),
            ("application/json", f"{SECRET} is not json".encode()),
            ("application/x-www-form-urlencoded", b"client_secret=\xff" + SECRET.encode()),
        ],
    )
    async def test_a_token_body_it_cannot_read_is_not_kept_at_all(
        self,
        server: FakeDispatchServer,
        http: aiohttp.ClientSession,
        content_type: str,
        payload: bytes,
    ) -> None:
        url = f"{server.url}/oauth/token"
        async with http.post(url, data=payload, headers={"Content-Type": content_type}) as answer:
            await answer.read()

        [recorded] = server.requests
        assert (recorded.body, recorded.size) == (None, len(payload))


class TestBounds:
    async def test_only_the_latest_requests_are_kept(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(recorded_requests=3) as server:
            token = server.issue_token()
            for account in ("a", "b", "c", "d", "e"):
                await send(http, server.url, basic(account), token=token)
            assert [r.json["account"] for r in server.requests] == ["c", "d", "e"]

    async def test_a_body_over_the_size_kept_is_recorded_by_its_size_only(
        self, http: aiohttp.ClientSession
    ) -> None:
        small, large = basic(numbers=(NUMBER,)), basic(numbers=(NUMBER,) * 20)
        limit = len(orjson.dumps(small))
        async with FakeDispatchServer(recorded_body_bytes=limit) as server:
            token = server.issue_token()
            await send(http, server.url, small, token=token)
            await send(http, server.url, large, token=token)
            kept, cut = server.requests

        assert kept.json == small
        assert (cut.body, cut.json, cut.size) == (None, None, len(orjson.dumps(large)))
        assert cut.endpoint == "basic"

    async def test_a_body_over_the_servers_limit_is_refused_and_recorded_without_it(
        self, http: aiohttp.ClientSession
    ) -> None:
        async with FakeDispatchServer(max_body_bytes=100) as server:
            status = await send(http, server.url, basic(numbers=(NUMBER,) * 5), token="t")
            [recorded] = server.requests
        assert status == 413
        assert (recorded.endpoint, recorded.body) == ("basic", None)
        assert recorded.headers["Authorization"] == "Bearer <redacted>"

    async def test_zero_keeps_nothing(self, http: aiohttp.ClientSession) -> None:
        async with FakeDispatchServer(recorded_requests=0) as server:
            assert await send(http, server.url, basic(), token=server.issue_token()) == 200
            assert server.requests == []

    async def test_by_default_the_latest_thousand_and_bodies_up_to_64_kib(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        padding = 64 * 1024 - len(orjson.dumps(basic("")))
        fits, too_large = basic("x" * padding), basic("x" * (padding + 1))
        token = server.issue_token()
        await send(http, server.url, fits, token=token)
        await send(http, server.url, too_large, token=token)
        assert [r.json for r in server.requests] == [fits, None]
        for _ in range(999):
            async with http.get(f"{server.url}/api/v3/templates") as answer:
                assert answer.status == 401
        assert len(server.requests) == 1000
        assert server.requests[0].json is None  # the first one is gone

    @pytest.mark.parametrize("setting", ["recorded_requests", "recorded_body_bytes"])
    def test_a_negative_bound_is_refused(self, setting: str) -> None:
        with pytest.raises(ValueError, match=">= 0"):
            FakeDispatchServer(**{setting: -1})


class TestFromAnotherProcess:
    async def test_get_requests_answers_them_as_json(
        self, server: FakeDispatchServer, http: aiohttp.ClientSession
    ) -> None:
        await send(http, server.url, basic("acme"), token=server.issue_token())

        async with http.get(f"{server.url}/_requests") as answer:
            [recorded] = await answer.json()

        assert recorded == server.requests[0].as_json()
        assert recorded["json"] == basic("acme")
        assert recorded["headers"]["Authorization"] == "Bearer <redacted>"
        assert (recorded["endpoint"], recorded["form"]) == ("basic", None)

    async def test_the_standalone_simulator_records_as_many_as_asked(
        self, http: aiohttp.ClientSession
    ) -> None:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dispatch_async.testing", "--port", "0",
            "--secret", SECRET, "--recorded-requests", "2",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(20):
                url = (await process.stdout.readline()).decode().strip()
            form = {"grant_type": "client_credentials", "client_secret": SECRET}
            async with http.post(f"{url}/oauth/token", data=form) as answer:
                token = (await answer.json())["access_token"]
            for account in ("a", "b"):
                assert await send(http, url, basic(account), token=token) == 200
            async with http.get(f"{url}/_requests") as answer:
                recorded = await answer.json()
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                await process.communicate()
        # Three requests, two kept: the token request, the oldest, was let go.
        assert [r["json"]["account"] for r in recorded] == ["a", "b"]
        assert SECRET not in str(recorded)


def test_a_recorded_request_is_frozen() -> None:
    recorded = RecordedRequest("GET", "/api/v3/templates", _headers(), 0, None)
    with pytest.raises(AttributeError):
        recorded.path = "/elsewhere"  # type: ignore[misc]


def _headers() -> Any:
    from multidict import CIMultiDict, CIMultiDictProxy

    return CIMultiDictProxy(CIMultiDict({"Accept": "application/json"}))

"""What the real service (Pointer RCS API v3) does that the spec leaves out, against the simulator.

Tokens whose lifetime is a duration or a placeholder, JWT expiry claims, a token endpoint
that reads JSON, the 403 of an IP allow-list, checking credentials up front, the RCS
basic text limit, and the ``session_id`` of accepted messages.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

import dispatch_async as da
from dispatch_async._auth import DEFAULT_LIFETIME
from dispatch_async._wire import AnswerColumns, decode_answer
from dispatch_async.instrumentation import Event, TokenObtained
from dispatch_async.testing import FakeClock, FakeDispatchServer, Fault

from .conftest import SECRET, numbers, session_for

NUMBER = "+5511987654321"
ROOT = Path(__file__).resolve().parents[1]
ELSEWHERE = "192.0.2.1"  # TEST-NET-1: never this machine


def lifetimes_heard() -> tuple[list[float], Callable[[Event], None]]:
    heard: list[float] = []

    def hook(event: Event) -> None:
        if isinstance(event, TokenObtained):
            heard.append(event.lifetime)

    return heard, hook


class TestTokenLifetime:
    async def test_the_documented_placeholder_lifetime_does_not_refuse_the_token(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        heard, hook = lifetimes_heard()
        async with (
            FakeDispatchServer(client_secret=SECRET, expires_in="<time>") as server,
            session_for(server, hooks=[hook]) as session,
        ):
            assert (await session.send_template([NUMBER], template_id="t")).ok
            server.expire_tokens()
            assert (await session.send_template([NUMBER], template_id="t")).ok
        assert heard == [DEFAULT_LIFETIME] * 2
        warnings = [r for r in caplog.records if "no readable lifetime" in r.getMessage()]
        assert len(warnings) == 1, "said once per session, not at every fetch"
        assert warnings[0].levelno == logging.WARNING
        assert warnings[0].getMessage() == (
            "the token answer gives no readable lifetime (expires_in '<time>', and the token "
            "has no usable exp claim); trusting it for 60s at a time"
        )

    @pytest.mark.parametrize(
        ("expires_in", "seconds"),
        [("1h", 3600.0), ("3600s", 3600.0), ("60m", 3600.0), ("1h30m", 5400.0), (900, 900.0)],
    )
    async def test_a_duration_string_is_read_as_the_lifetime(
        self, expires_in: object, seconds: float
    ) -> None:
        heard, hook = lifetimes_heard()
        async with (
            FakeDispatchServer(client_secret=SECRET, expires_in=expires_in) as server,
            session_for(server, hooks=[hook]) as session,
        ):
            await session.check_credentials()
        assert heard == [seconds]

    async def test_a_jwt_exp_claim_gives_the_lifetime_when_expires_in_is_unreadable(
        self,
    ) -> None:
        heard, hook = lifetimes_heard()
        async with (
            FakeDispatchServer(
                client_secret=SECRET, jwt_tokens=True, expires_in="<time>", token_lifetime=120
            ) as server,
            session_for(server, hooks=[hook]) as session,
        ):
            await session.check_credentials()
        assert len(heard) == 1
        assert 118.0 <= heard[0] <= 120.0

    @pytest.mark.parametrize(
        ("expires_in", "token_lifetime", "earliest"),
        [("3600", 30.0, 30.0), ("30", 3600.0, 30.0)],
        ids=["exp-earlier", "expires_in-earlier"],
    )
    async def test_when_expires_in_and_exp_disagree_the_earlier_expiry_wins(
        self, expires_in: str, token_lifetime: float, earliest: float
    ) -> None:
        heard, hook = lifetimes_heard()
        async with (
            FakeDispatchServer(
                client_secret=SECRET,
                jwt_tokens=True,
                expires_in=expires_in,
                token_lifetime=token_lifetime,
            ) as server,
            session_for(server, hooks=[hook]) as session,
        ):
            await session.check_credentials()
        assert len(heard) == 1
        assert earliest - 2.0 <= heard[0] <= earliest

    async def test_a_three_second_jwt_is_replaced_before_any_request_carries_it_expired(
        self,
    ) -> None:
        # Only the exp claim tells the lifetime: whole seconds, so 2 to 3 s are trusted.
        async with (
            FakeDispatchServer(
                client_secret=SECRET, jwt_tokens=True, expires_in="<time>", token_lifetime=3.0
            ) as server,
            session_for(server, max_concurrency=4, chunk_size=10) as session,
        ):
            loop = asyncio.get_running_loop()
            end = loop.time() + 7.0  # more than two lifetimes
            sent = 0
            while loop.time() < end:
                result = await session.send_template(numbers(20, sent), template_id="t")
                assert result.ok
                sent += 20
        assert server.stats.token_calls >= 3
        assert server.stats.expired_token_uses == 0
        assert server.stats.unauthorized == 0


class TestTokenRequestBody:
    async def test_the_form_body_is_sent_first_and_is_enough_for_the_spec_s_endpoint(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server) as session:
            await session.check_credentials()
        assert server.stats.token_calls == 1

    async def test_a_json_only_endpoint_gets_json_after_refusing_the_form_and_keeps_it(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="dispatch_async")
        async with (
            FakeDispatchServer(client_secret=SECRET, token_body="json") as server,
            session_for(server) as session,
        ):
            assert (await session.send_template([NUMBER], template_id="t")).ok
            assert server.stats.token_calls == 2  # the form, refused; then JSON
            server.expire_tokens()
            assert (await session.send_template([NUMBER], template_id="t")).ok
            assert server.stats.token_calls == 3  # JSON straight away
        assert server.stats.status_counts[400] == 1
        said = [r.getMessage() for r in caplog.records if "JSON" in r.getMessage()]
        assert said == ["the token endpoint refused a form body and read JSON; using JSON"]

    async def test_the_token_request_is_a_post_of_the_grant_in_the_form_then_in_json(
        self,
    ) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET, token_body="json") as server,
            session_for(server) as session,
        ):
            await session.check_credentials()
        form, json = [r for r in server.requests if r.endpoint == "token"]
        assert (form.method, form.path) == (json.method, json.path) == ("POST", "/oauth/token")
        assert form.headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert form.headers["Accept"] == "application/x-www-form-urlencoded"
        assert form.form == {"grant_type": "client_credentials"}  # the secret is not recorded
        assert json.headers["Content-Type"] == json.headers["Accept"] == "application/json"
        assert json.json == {"grant_type": "client_credentials"}
        # Nothing else goes out with the secret: no Authorization, no header of our own.
        for request in (form, json):
            assert {name.lower() for name in request.headers} <= {
                "host",
                "accept",
                "accept-encoding",
                "content-type",
                "content-length",
                "user-agent",
            }

    async def test_a_retry_after_from_the_token_endpoint_is_waited(
        self, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.status(503, retry_after="7"))
        clock = FakeClock()
        async with session_for(server, retry=da.RetryPolicy(clock=clock)) as session:
            await session.check_credentials()
        assert clock.sleeps == [7.0]
        assert server.stats.token_calls == 2

    async def test_an_endpoint_refusing_both_bodies_is_asked_with_the_form_first_again(
        self, server: FakeDispatchServer
    ) -> None:
        server.script_token(Fault.status(400), Fault.status(400))
        async with session_for(server) as session:
            with pytest.raises(da.AuthenticationError, match="HTTP 400"):
                await session.check_credentials()
            await session.check_credentials()
        bodies = [
            "form" if r.form is not None else "json" if r.json is not None else "other"
            for r in server.requests
            if r.endpoint == "token"
        ]
        assert bodies == ["form", "json", "form"]

    async def test_token_request_json_sends_json_only(self) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET, token_body="json") as server,
            session_for(server, token_request="json") as session,
        ):
            await session.check_credentials()
        assert server.stats.token_calls == 1

    async def test_token_request_form_never_tries_json(self) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET, token_body="json") as server,
            session_for(server, token_request="form") as session,
        ):
            with pytest.raises(da.AuthenticationError, match="HTTP 400"):
                await session.check_credentials()
        assert server.stats.token_calls == 1

    async def test_a_wrong_secret_is_one_token_call_and_never_retried_as_json(
        self, server: FakeDispatchServer
    ) -> None:
        async with da.DispatchSession(server.url, client_secret="wrong-secret-1234") as session:
            with pytest.raises(da.AuthenticationError, match="HTTP 401") as caught:
                await session.check_credentials()
        assert server.stats.token_calls == 1
        assert "wrong-secret-1234" not in f"{caught.value} {caught.value!r}"

    async def test_a_wrong_secret_to_a_json_endpoint_costs_the_form_once_then_one_call(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        secret = "wrong-secret/with+odd chars"
        async with (
            FakeDispatchServer(client_secret=SECRET, token_body="json") as server,
            da.DispatchSession(server.url, client_secret=secret) as session,
        ):
            for _ in range(2):
                with pytest.raises(da.AuthenticationError, match="HTTP 401") as caught:
                    await session.check_credentials()
                assert secret not in f"{caught.value} {caught.value!r}"
        assert server.stats.token_calls == 3  # form + JSON, then JSON alone
        assert secret not in caplog.text

    def test_an_unknown_token_request_is_refused_up_front(self) -> None:
        with pytest.raises(da.ConfigurationError, match="token_request"):
            da.DispatchSession(
                "http://127.0.0.1:9",
                client_secret=SECRET,
                token_request="xml",  # type: ignore[arg-type]
            )


class TestRefusedCaller:
    async def test_a_403_from_the_token_endpoint_names_the_allow_list_not_the_secret(
        self,
    ) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET, allowed_ips=[ELSEWHERE]) as server,
            session_for(server) as session,
        ):
            with pytest.raises(da.ForbiddenError) as caught:
                await session.check_credentials()
        error = caught.value
        assert isinstance(error, da.AuthenticationError)
        assert error.status == 403
        assert "HTTP 403" in str(error)
        assert "allow-list" in str(error)
        assert "secret" not in str(error)
        assert "127.0.0.1" not in str(error), "no raw answer bytes in messages"
        assert server.stats.token_calls == 1

    async def test_a_403_to_a_dispatch_stops_the_job_with_every_recipient_not_sent(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server, chunk_size=10, max_concurrency=2) as session:
            await session.check_credentials()
            server.allowed_ips = frozenset({ELSEWHERE})
            with pytest.raises(da.ForbiddenError, match="HTTP 403") as caught:
                await session.send_template(numbers(30), template_id="t")
        result = caught.value.result
        assert result is not None
        assert len(result.positions) == 30
        counts = result.counts
        assert counts["valid"] + counts["invalid"] + counts["failed"] == 30
        assert counts["maybe_sent"] == 0
        assert server.stats.recipients_received == 0
        assert server.stats.forbidden >= 1


class TestCheckCredentials:
    async def test_returns_once_a_token_is_held_and_the_first_send_needs_no_other(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server) as session:
            assert await session.check_credentials() is None
            assert server.stats.token_calls == 1
            await session.send_template([NUMBER], template_id="t")
        assert server.stats.token_calls == 1
        assert server.stats.dispatch_calls == 1

    async def test_a_wrong_secret_fails_before_anything_is_sent(
        self, server: FakeDispatchServer
    ) -> None:
        async with da.DispatchSession(server.url, client_secret="nope") as session:
            with pytest.raises(da.AuthenticationError):
                await session.check_credentials()
        assert server.stats.dispatch_calls == 0

    async def test_an_unreachable_service_is_token_unavailable(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        # The port is free again: nothing listens there.
        policy = da.RetryPolicy(wait=False, attempts=2)
        async with da.DispatchSession(
            f"http://127.0.0.1:{port}", client_secret=SECRET, retry=policy
        ) as session:
            with pytest.raises(da.TokenUnavailableError):
                await session.check_credentials()

    async def test_the_blocking_client_checks_too(self, server: FakeDispatchServer) -> None:
        def check() -> None:
            with da.DispatchClient(server.url, client_secret="nope") as client:
                client.check_credentials()

        with pytest.raises(da.AuthenticationError):
            await asyncio.to_thread(check)
        assert server.stats.token_calls == 1


class TestBasicText:
    LONG = "ç" * 81  # 162 UTF-8 bytes, 81 characters

    def test_a_text_over_160_utf8_bytes_is_warned_about(self) -> None:
        warning = da.basic_text_warning(self.LONG)
        assert warning is not None
        assert "162 UTF-8 bytes" in warning
        assert str(da.BASIC_TEXT_MAX_BYTES) in warning
        assert warning.endswith(" (use send_single for longer text)"), "it says what to do"

    def test_160_bytes_fit(self) -> None:
        assert da.basic_text_warning("é" * 80) is None

    async def test_plan_warns_but_does_not_refuse(self) -> None:
        with pytest.warns(UserWarning, match="RCS basic"):
            chunks = [c async for c in da.plan([NUMBER], basic_text=self.LONG)]
        assert [list(c.numbers) for c in chunks] == [[NUMBER]]

    async def test_send_basic_logs_the_warning_and_sends(
        self,
        session: da.DispatchSession,
        server: FakeDispatchServer,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        result = await session.send_basic([NUMBER], text=self.LONG)
        assert result.ok
        assert server.stats.dispatch_calls == 1
        assert any("RCS basic" in r.getMessage() for r in caplog.records)


class TestSessionIds:
    async def test_conversational_sends_carry_the_session_id_and_basic_has_none(
        self, session: da.DispatchSession
    ) -> None:
        template = await session.send_template(numbers(25), template_id="t", chunk_size=10)
        webhook = await session.send_webhook(numbers(3), webhook="https://example.test/h")
        basic = await session.send_basic(numbers(3), text="oi")
        for result in (template, webhook):
            assert all(isinstance(m.session_id, str) and m.session_id for m in result.valid)
            assert list(result.valid.session_ids) == [m.session_id for m in result.valid]
        assert len(template.valid) == 25
        assert [m.session_id for m in basic.valid] == [None] * 3

    async def test_a_service_that_sends_no_session_id_gives_none(self) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET, session_ids=False) as server,
            session_for(server) as session,
        ):
            result = await session.send_template(numbers(3), template_id="t")
        assert [m.session_id for m in result.valid] == [None] * 3

    @pytest.mark.parametrize("path", ["prevalidated", "careful"])
    async def test_every_matching_path_keeps_the_session_id(
        self, server: FakeDispatchServer, session: da.DispatchSession, path: str
    ) -> None:
        options: dict[str, object] = {}
        if path == "prevalidated":
            options = {"prevalidate": True, "region": "BR"}
        else:
            server.script(Fault.digits_only())
        result = await session.send_template(
            ["(11) 98765-4321" if path == "prevalidated" else NUMBER], template_id="t", **options
        )
        assert len(result.valid) == 1
        assert isinstance(result.valid[0].session_id, str)

    def test_answers_with_session_ids_are_decoded_on_the_fast_path(self) -> None:
        body = (
            b'{"validMessages": [{"id": "a", "number": "1", "session_id": null},'
            b' {"id": "b", "number": "2", "session_id": "s-2"}], "invalidMessages": []}'
        )
        decoded = decode_answer(body)
        assert isinstance(decoded, AnswerColumns)
        assert list(decoded.session_ids) == [None, "s-2"]


class TestTheStandaloneSimulator:
    async def test_speaks_like_the_real_service_when_asked(self) -> None:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "dispatch_async.testing", "--port", "0", "--secret", SECRET),
            *("--jwt-tokens", "--expires-in", "<time>", "--token-body", "json"),
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        heard, hook = lifetimes_heard()
        try:
            assert process.stdout is not None
            async with asyncio.timeout(10):
                url = (await process.stdout.readline()).decode().strip()
            async with da.DispatchSession(url, client_secret=SECRET, hooks=[hook]) as session:
                result = await session.send_template([NUMBER], template_id="t", account="acme")
            async with aiohttp.ClientSession() as http, http.get(f"{url}/_stats") as answer:
                stats = await answer.json()
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                await process.communicate()
        assert isinstance(result.valid[0].session_id, str)
        assert stats["token_calls"] == 2  # the form refused, then JSON
        assert len(heard) == 1
        assert 3598.0 <= heard[0] <= 3600.0  # from the JWT's exp: expires_in is "<time>"

    async def test_refuses_callers_outside_its_allow_list(self) -> None:
        form = {"grant_type": "client_credentials", "client_secret": SECRET}
        async with (
            FakeDispatchServer(client_secret=SECRET, allowed_ips=[ELSEWHERE]) as server,
            aiohttp.ClientSession() as http,
        ):
            async with http.post(f"{server.url}/oauth/token", data=form) as answer:
                assert answer.status == 403
                assert (await answer.json()) == {"message": "IP address is not allowed: 127.0.0.1"}
            async with http.post(f"{server.url}/api/v3/basic", json={}) as answer:
                assert answer.status == 403
        assert server.stats.forbidden == 2
        assert server.stats.tokens_issued == 0

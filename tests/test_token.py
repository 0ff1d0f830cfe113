"""The access token: one fetch for everyone, refreshed ahead of expiry, recovered after a 401."""

from __future__ import annotations

import asyncio
import logging
import pickle
import re

import pytest

import dispatch_async as da
from dispatch_async._auth import Secret
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET, session_for

NUMBER = "+5511987654321"


class TestSingleFlight:
    async def test_a_thousand_concurrent_sends_at_start_up_make_one_token_call(
        self, server: FakeDispatchServer
    ) -> None:
        async with session_for(server) as session:
            results = await asyncio.gather(
                *(session.send_template([NUMBER], template_id="t") for _ in range(1000))
            )
        assert all(len(r.valid) == 1 for r in results)
        assert server.stats.token_calls == 1
        assert server.stats.dispatch_calls == 1000

    async def test_the_token_is_sent_on_every_call_with_the_contract_headers(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_template([NUMBER], template_id="t")
        headers = server.stats.last_headers
        assert headers["X-Auth-Type"] == "JWT"
        assert headers["User-Agent"].startswith(f"dispatch-async/{da.__version__} ")
        assert server.stats.missing_token == 0
        assert server.stats.unknown_token_uses == 0


class TestRefreshAhead:
    async def test_refreshes_the_token_before_it_expires(self, server: FakeDispatchServer) -> None:
        server.token_lifetime = 1.0
        async with session_for(server) as session:
            await session.send_template([NUMBER], template_id="t")
            assert server.stats.token_calls == 1
            # The background task fetches the next token with nobody asking for one.
            await server.wait_until(lambda: server.stats.token_calls >= 2, timeout=2.0)
            await session.send_template([NUMBER], template_id="t")
        assert server.stats.expired_token_uses == 0

    async def test_no_request_uses_an_expired_token_over_several_lifetimes(
        self, server: FakeDispatchServer
    ) -> None:
        server.token_lifetime = 0.5
        async with session_for(server, max_concurrency=4, chunk_size=10) as session:
            loop = asyncio.get_running_loop()
            end = loop.time() + 2.5  # five lifetimes
            sent = 0
            while loop.time() < end:
                result = await session.send_template(
                    [f"+55119{i:08d}" for i in range(40)], template_id="t"
                )
                assert result.ok
                sent += 1
        assert sent > 5
        assert server.stats.expired_token_uses == 0
        assert server.stats.unauthorized == 0
        assert 4 <= server.stats.token_calls <= 8

    async def test_a_failing_refresh_keeps_the_old_token_in_use(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        server.token_lifetime = 6.0  # both failed rounds end before the 0.5 s of safety
        policy = da.RetryPolicy(wait=False, attempts=2)
        async with session_for(server, retry=policy) as session:
            await session.send_template([NUMBER], template_id="t")
            server.script_token(*[Fault.status(503)] * 20)
            # Two failed rounds of refresh (two attempts each); sends keep working.
            await server.wait_until(lambda: server.stats.token_calls >= 4, timeout=8.0)
            result = await session.send_template([NUMBER], template_id="t")
            assert result.ok
            assert "refreshing the access token failed" in caplog.text
            server.clear_faults()
        assert server.stats.expired_token_uses == 0

    async def test_the_refresh_task_survives_failures_and_is_gone_after_close(
        self, server: FakeDispatchServer
    ) -> None:
        server.token_lifetime = 1.0
        async with session_for(server) as session:
            await session.send_template([NUMBER], template_id="t")
            server.script_token(Fault.status(500), Fault.drop())
            await server.wait_until(lambda: server.stats.tokens_issued >= 2, timeout=5.0)
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert "dispatch-async token refresh" in names
        names = {t.get_name() for t in asyncio.all_tasks()}
        assert "dispatch-async token refresh" not in names


class TestUnauthorized:
    async def test_a_401_drops_the_token_refreshes_once_and_resends(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_template([NUMBER], template_id="t")
        server.script(Fault.revoke_token())
        result = await session.send_template(["+5511900000001"], template_id="t")
        assert result.ok
        assert len(result.valid) == 1
        assert result.requests == 2
        assert server.stats.token_calls == 2
        assert server.stats.received["+5511900000001"] == 1

    async def test_a_second_401_stops_the_job_with_nothing_sent(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        server.script(Fault.status(401), Fault.status(401))
        with pytest.raises(da.UnauthorizedError) as caught:
            await session.send_template([NUMBER], template_id="t")
        assert isinstance(caught.value, da.AuthenticationError)
        assert caught.value.result is not None
        [failure] = caught.value.result.failed
        assert failure.maybe_sent is False
        assert server.stats.received[NUMBER] == 0

    async def test_many_concurrent_401s_make_one_new_token(
        self, server: FakeDispatchServer, session: da.DispatchSession
    ) -> None:
        await session.send_template([NUMBER], template_id="t")
        server.expire_tokens()
        numbers = [f"+55119{i:08d}" for i in range(50)]
        result = await session.send_template(numbers, template_id="t", chunk_size=1)
        assert len(result.valid) == 50
        assert server.stats.token_calls == 2


class TestRejectedSecret:
    async def test_a_rejected_secret_raises_at_once_without_retries(
        self, server: FakeDispatchServer
    ) -> None:
        async with da.DispatchSession(server.url, client_secret="wrong", account="acme") as session:
            with pytest.raises(da.AuthenticationError, match="rejected the client secret"):
                await asyncio.gather(
                    *(session.send_template([NUMBER], template_id="t") for _ in range(100))
                )
        assert server.stats.token_calls == 1
        assert server.stats.dispatch_calls == 0

    async def test_a_token_endpoint_that_keeps_failing_is_retried_then_reported(
        self, server: FakeDispatchServer
    ) -> None:
        server.script_token(*[Fault.status(503)] * 3)
        policy = da.RetryPolicy(wait=False, attempts=3)
        async with session_for(server, retry=policy) as session:
            with pytest.raises(da.TokenUnavailableError, match="could not get an access token"):
                await session.send_template([NUMBER], template_id="t")
        assert server.stats.token_calls == 3

    @pytest.mark.parametrize("fault", ["429", "500", "drop"])
    async def test_a_token_request_refused_for_now_or_cut_is_retried(
        self, server: FakeDispatchServer, fault: str
    ) -> None:
        server.script_token(Fault.drop() if fault == "drop" else Fault.status(int(fault)))
        async with session_for(server) as session:
            await session.check_credentials()
        assert server.stats.token_calls == 2
        assert server.stats.tokens_issued == 1

    async def test_a_refused_token_is_logged_and_replaced(
        self,
        server: FakeDispatchServer,
        session: da.DispatchSession,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        await session.send_template([NUMBER], template_id="t")
        server.script(Fault.revoke_token())
        with caplog.at_level(logging.INFO, logger="dispatch_async"):
            assert (await session.send_template([NUMBER], template_id="t")).ok
        assert "the service refused the access token; fetching a new one" in [
            r.getMessage() for r in caplog.records
        ]
        assert server.stats.token_calls == 2


class TestSecrecy:
    async def test_the_keepers_repr_tells_the_time_left_and_never_the_token(
        self, server: FakeDispatchServer
    ) -> None:
        server.token_lifetime = 600
        async with session_for(server) as session:
            keeper = session._tokens
            assert repr(keeper) == "<TokenKeeper token=none>"
            await session.check_credentials()
            shown = re.fullmatch(r"<TokenKeeper token=expires in (\d+)s>", repr(keeper))
            assert shown is not None
            assert 0 < int(shown[1]) <= 600

    def test_the_secrets_holder_shows_stars_compares_by_value_and_cannot_be_pickled(
        self,
    ) -> None:
        secret = Secret("s3cr3t-value")
        assert repr(secret) == str(secret) == f"{secret}" == "Secret('********')"
        assert secret.reveal() == "s3cr3t-value"
        assert secret == Secret("s3cr3t-value")
        assert secret != Secret("other")
        assert secret != "s3cr3t-value"
        assert hash(secret) == hash(Secret("s3cr3t-value"))
        assert hash(secret) != hash(Secret("other"))
        assert len({secret, Secret("s3cr3t-value"), Secret("other")}) == 2
        with pytest.raises(TypeError) as caught:
            pickle.dumps(secret)
        assert str(caught.value) == "a Secret cannot be pickled"

    async def test_secret_and_token_never_reach_reprs_or_logs(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.token_lifetime = 1.0
        async with session_for(server) as session:
            await session.send_template([NUMBER, "bad"], template_id="t")
            server.script(
                Fault.revoke_token(), Fault.status(500), Fault.status(429, retry_after="0")
            )
            result = await session.send_template([NUMBER], template_id="t")
            await server.wait_until(lambda: server.stats.token_calls >= 3, timeout=3.0)
            tokens = list(server._tokens._deadlines)
            shown = "\n".join(
                [
                    repr(session),
                    repr(result),
                    str(result.failed),
                    caplog.text,
                    repr(session._tokens),
                ]
            )
        assert SECRET not in shown
        assert "Bearer" not in caplog.text
        assert len(tokens) >= 3
        for token in tokens:
            assert token not in shown


class TestTokenAnswerFromTheService:
    @pytest.mark.parametrize("value", ["3600", 3600, "3600.0"])
    async def test_expires_in_in_any_numeric_shape_is_accepted(
        self, server: FakeDispatchServer, value: object
    ) -> None:
        server.expires_in = value
        async with session_for(server) as session:
            assert (await session.send_template([NUMBER], template_id="t")).ok
            token = session._tokens._token
            assert token is not None
            assert token.lifetime == 3600.0

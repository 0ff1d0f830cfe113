"""The access token: one fetch for everyone, refreshed ahead of expiry, recovered after a 401."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async import _auth
from dispatch_async._auth import Secret, Token, TokenKeeper
from dispatch_async._token_store import StoredToken, TokenStoreUnavailable
from dispatch_async.testing import FakeClock, FakeDispatchServer, Fault

from .conftest import HANG, SECRET, session_for

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
        # Tokens of a second: a short-lived token is given up 15% of its life before it
        # expires, 150 ms here. With half-second ones (75 ms) a request that took its
        # token just before that point reached the server late under coverage on two
        # cores (2 of 720 in one CI run): the machine's delay, not a token kept too long.
        server.token_lifetime = 1.0
        async with session_for(server, max_concurrency=4, chunk_size=10) as session:
            loop = asyncio.get_running_loop()
            end = loop.time() + 5.0  # five lifetimes
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


# -- the keeper on its own: a fake clock, and the refresh task's waits ended by the test --

START = 1000.0


def planned(value: str, issued_at: float, *, refresh_in: float, expires_in: float) -> Token:
    """A token with a chosen refresh point and expiry (`Token.issued` draws the refresh point)."""
    return Token(
        value,
        issued_at,
        expires_in,
        refresh_at=issued_at + refresh_in,
        expires_at=issued_at + expires_in,
    )


class Fetches:
    """The keeper's *fetch*: each call gives the next outcome, a token or an error to raise.

    ``times`` holds the clock at each call; *takes* seconds pass on the clock during each.
    """

    def __init__(self, clock: FakeClock, *outcomes: Token | Exception, takes: float = 0.0) -> None:
        self.clock = clock
        self.outcomes = list(outcomes)
        self.takes = takes
        self.times: list[float] = []
        #: When set, a call waits for ``release`` (``started`` tells it has begun).
        self.held = False
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> Token:
        self.times.append(self.clock.now())
        self.clock.advance(self.takes)
        if self.held:
            self.started.set()
            await self.release.wait()
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class SteppedWaits:
    """Stands in for the refresh task's timed wait (`_auth._wait_or_timeout`) on a FakeClock.

    The task asks for a wait (``asked``); it ends when the test lets the time pass
    (``elapse``: the clock moves on) or when the task's event is set, as the real one does.
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._asked: asyncio.Queue[float] = asyncio.Queue()
        self._seconds = 0.0
        self._passed = asyncio.Event()

    async def __call__(self, event: asyncio.Event, seconds: float) -> bool:
        self._asked.put_nowait(seconds)
        self._seconds = seconds
        self._passed = passed = asyncio.Event()
        waits = [asyncio.ensure_future(e.wait()) for e in (event, passed)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return not passed.is_set()

    async def asked(self) -> float:
        """The seconds of the next wait the task asks for (waiting for it)."""
        async with asyncio.timeout(HANG):
            return await self._asked.get()

    def asked_now(self) -> float | None:
        """The seconds of a wait asked and not yet read, or None if none was."""
        return None if self._asked.empty() else self._asked.get_nowait()

    def elapse(self, seconds: float | None = None) -> None:
        """End the wait asked last: its seconds (or *seconds*) pass on the clock."""
        self.clock.advance(self._seconds if seconds is None else seconds)
        self._passed.set()


class Warnings(logging.Handler):
    """The package's warnings and errors, in order, as the code logs them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._queue: asyncio.Queue[logging.LogRecord] = asyncio.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        self._queue.put_nowait(record)

    async def next(self) -> logging.LogRecord:
        async with asyncio.timeout(HANG):
            return await self._queue.get()

    def none(self) -> bool:
        return self._queue.empty()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def waits(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> SteppedWaits:
    stepped = SteppedWaits(clock)
    monkeypatch.setattr(_auth, "_wait_or_timeout", stepped)
    return stepped


@pytest.fixture
def warnings() -> Iterator[Warnings]:
    handler = Warnings()
    logger = logging.getLogger("dispatch_async")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@contextlib.asynccontextmanager
async def keeper_for(fetch: Fetches, **options: Any) -> AsyncIterator[TokenKeeper]:
    keeper = TokenKeeper(fetch, clock=fetch.clock.now, **options)
    try:
        yield keeper
    finally:
        await keeper.close()


DOWN = da.TokenUnavailableError("could not get an access token: down")


def failed(left: float) -> str:
    return f"refreshing the access token failed ({DOWN}); the current one is kept, {left:.1f}s left"


class TestRefreshSchedule:
    async def test_the_refresh_waits_for_the_refresh_point_then_plans_on_the_new_token(
        self, clock: FakeClock, waits: SteppedWaits
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=200),
            planned("t2", START + 100, refresh_in=80, expires_in=200),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            waits.elapse()
            assert await waits.asked() == 80.0  # planned on t2, fetched at the refresh point
            assert fetch.times == [START, START + 100]
            assert await keeper.token() == "t2"

    async def test_a_token_due_for_refresh_already_is_refreshed_without_waiting(
        self, clock: FakeClock, waits: SteppedWaits
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=0, expires_in=200),
            planned("t2", START, refresh_in=50, expires_in=200),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 50.0  # no wait of 0 s asked before t2's
            assert fetch.times == [START, START]

    async def test_a_dropped_token_stops_the_plan_until_a_caller_fetches_the_next(
        self, clock: FakeClock, waits: SteppedWaits
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=200),
            planned("t2", START + 10, refresh_in=60, expires_in=200),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            clock.advance(10)
            keeper.invalidate("t1")  # the service refused it: the wait ends early
            assert await keeper.token() == "t2"
            assert await waits.asked() == 60.0
            assert fetch.times == [START, START + 10]

    async def test_a_failing_refresh_is_retried_after_waits_doubling_from_half_a_second_to_30(
        self, clock: FakeClock, waits: SteppedWaits, warnings: Warnings
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=200),
            planned("t2", START + 100, refresh_in=100, expires_in=200),
            *[DOWN] * 9,
            planned("t3", START + 300, refresh_in=100, expires_in=200),
            DOWN,
            DOWN,
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            waits.elapse()
            assert await waits.asked() == 100.0  # t2 came: planned on it, no failure counted
            left = 100.0
            for wait in [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]:
                waits.elapse()
                record = await warnings.next()
                assert record.getMessage() == failed(left)
                assert waits.asked_now() == wait
                left -= wait
            assert await keeper.token() == "t2", "the current token is kept meanwhile"
            # t2 expires during the last wait: a caller fetches t3, which ends that wait.
            clock.advance(8.5)
            assert await keeper.token() == "t3"
            assert await waits.asked() == 100.0  # planned on t3: the failures are forgotten
            waits.elapse()
            assert (await warnings.next()).getMessage() == failed(100.0)
            assert waits.asked_now() == 0.5
            waits.elapse()
            assert (await warnings.next()).getMessage() == failed(99.5)
            assert waits.asked_now() == 1.0

    async def test_failures_stop_at_expiry_until_a_caller_fetches_a_new_token(
        self, clock: FakeClock, waits: SteppedWaits, warnings: Warnings
    ) -> None:
        # The fifth failure comes exactly at t1's expiry (100 + 0.5 + 1 + 2 + 4 = 107.5).
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=107.5),
            *[DOWN] * 5,
            planned("t2", START + 107.5, refresh_in=40, expires_in=100),
            DOWN,
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            for wait in [0.5, 1.0, 2.0, 4.0]:
                waits.elapse()
                await warnings.next()
                assert waits.asked_now() == wait
            waits.elapse()
            assert (await warnings.next()).getMessage() == failed(0.0)
            assert waits.asked_now() is None, "no retry once the token has expired"
            assert len(fetch.times) == 6
            assert await keeper.token() == "t2"  # the caller fetches: the task plans again
            assert await waits.asked() == 40.0
            waits.elapse()
            assert (await warnings.next()).getMessage() == failed(60.0)
            assert waits.asked_now() == 0.5

    async def test_a_refresh_failing_after_its_token_was_refused_waits_for_a_caller(
        self, clock: FakeClock, waits: SteppedWaits, warnings: Warnings
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=200),
            DOWN,
            planned("t2", START + 100, refresh_in=30, expires_in=200),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            fetch.held = True
            waits.elapse()
            async with asyncio.timeout(HANG):
                await fetch.started.wait()
            keeper.invalidate("t1")  # a 401 while the refresh is under way
            fetch.held = False
            fetch.release.set()
            assert (await warnings.next()).getMessage() == failed(0.0)  # no token: none left
            assert waits.asked_now() is None
            assert await keeper.token() == "t2"
            assert await waits.asked() == 30.0

    async def test_an_unexpected_error_in_the_refresh_is_logged_and_retried_like_a_failure(
        self, clock: FakeClock, waits: SteppedWaits, warnings: Warnings
    ) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=100, expires_in=200),
            RuntimeError("a bug"),
            RuntimeError("a bug"),
            RuntimeError("a bug"),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 100.0
            for wait in [0.5, 1.0, 2.0]:
                waits.elapse()
                record = await warnings.next()
                assert record.levelno == logging.ERROR
                assert record.getMessage() == "unexpected error while refreshing the access token"
                assert record.exc_info is not None
                assert isinstance(record.exc_info[1], RuntimeError)
                assert waits.asked_now() == wait


class TestKeeper:
    async def test_a_token_is_not_used_from_its_expiry_on(self, clock: FakeClock) -> None:
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=50, expires_in=60),
            planned("t2", START + 60, refresh_in=50, expires_in=60),
        )
        async with keeper_for(fetch) as keeper:
            assert await keeper.token() == "t1"
            clock.advance(59.5)
            assert await keeper.token() == "t1"
            clock.advance(0.5)
            assert await keeper.token() == "t2"
        assert fetch.times == [START, START + 60]

    async def test_on_token_hears_each_token_kept_and_how_long_its_fetch_took(
        self, clock: FakeClock
    ) -> None:
        heard: list[tuple[str, float]] = []
        fetch = Fetches(clock, planned("t1", START, refresh_in=50, expires_in=60), takes=2.5)
        async with keeper_for(
            fetch, on_token=lambda token, seconds: heard.append((token.value, seconds))
        ) as keeper:
            assert await keeper.token() == "t1"
        assert heard == [("t1", 2.5)]

    async def test_close_ends_the_refresh_task_and_a_fetch_in_flight_and_can_be_repeated(
        self, clock: FakeClock
    ) -> None:
        started = asyncio.Event()

        async def fetch_for_ever() -> Token:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("never reached")

        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        previous = loop.get_exception_handler()
        loop.set_exception_handler(lambda loop, context: errors.append(context))
        try:
            keeper = TokenKeeper(fetch_for_ever, clock=clock.now)
            keeper.start()
            caller = asyncio.create_task(keeper.token())
            async with asyncio.timeout(HANG):
                await started.wait()
            tasks = {task.get_name(): task for task in asyncio.all_tasks()}
            ours = [tasks["dispatch-async token refresh"], tasks["dispatch-async token fetch"]]
            await keeper.close()
            assert all(task.cancelled() for task in ours), "cancelled and awaited by close"
            await keeper.close()
            with pytest.raises(asyncio.CancelledError):
                await caller
        finally:
            loop.set_exception_handler(previous)
        assert errors == [], "nothing left for asyncio to complain about"


class TestTimedWait:
    async def test_is_true_when_the_event_is_set_and_false_when_the_time_is_up(self) -> None:
        event = asyncio.Event()
        async with asyncio.timeout(HANG):
            assert await _auth._wait_or_timeout(event, 0.01) is False
            event.set()
            assert await _auth._wait_or_timeout(event, HANG) is True


# -- a token shared through a store (tests/fleet has the same against Redis) -------------

WALL = 1_800_000_000.0  # the wall clock, when the keeper's clock shows START
UNREACHABLE = TokenStoreUnavailable("ConnectionError: connection refused")


class MemoryStore:
    """A `TokenStore` in memory, on the keeper's FakeClock: what other processes shared.

    Each read takes *read_time* seconds; ``shared_at_read`` puts a token in the store on
    the n-th read (another process saved it); ``held_elsewhere`` refuses the lock (another
    process is fetching); ``calls`` tells what was asked of the store, and when.
    """

    def __init__(self, clock: FakeClock, *, read_time: float = 0.0) -> None:
        self.clock = clock
        self.read_time = read_time
        self.stored: StoredToken | None = None
        self.ttl: float | None = None
        self.shared_at_read: dict[int, StoredToken] = {}
        self.held_elsewhere = False
        self.unreachable = False
        self.refuses_saves = False
        self.calls: list[tuple[str, float]] = []
        self.lock_waits: list[float] = []

    async def load(self) -> StoredToken | None:
        self._reach("load")
        self.clock.advance(self.read_time)
        reads = sum(name == "load" for name, _ in self.calls)
        self.stored = self.shared_at_read.get(reads, self.stored)
        return self.stored

    async def save(self, token: StoredToken, ttl: float) -> None:
        if self.refuses_saves:
            raise UNREACHABLE
        self._reach("save")
        self.stored, self.ttl = token, ttl

    def lock(self, wait: float) -> contextlib.AbstractAsyncContextManager[bool]:
        return self._locked(wait)

    @contextlib.asynccontextmanager
    async def _locked(self, wait: float) -> AsyncIterator[bool]:
        self._reach("lock")
        self.lock_waits.append(wait)
        yield not self.held_elsewhere

    async def aclose(self) -> None:
        pass

    def _reach(self, call: str) -> None:
        if self.unreachable:
            raise UNREACHABLE
        self.calls.append((call, self.clock.now()))


@contextlib.asynccontextmanager
async def sharing_keeper(fetch: Fetches, store: MemoryStore) -> AsyncIterator[TokenKeeper]:
    clock = fetch.clock
    async with keeper_for(fetch, store=store, wall_clock=lambda: clock.now() - START + WALL) as k:
        yield k


class TestSharedStore:
    async def test_a_fresh_shared_token_is_used_without_the_lock_or_a_fetch(
        self, clock: FakeClock
    ) -> None:
        heard: list[Token] = []
        store = MemoryStore(clock)
        store.stored = StoredToken("shared", WALL - 20, 600.0)  # issued 20 s ago
        fetch = Fetches(clock)
        async with keeper_for(
            fetch,
            store=store,
            wall_clock=lambda: clock.now() - START + WALL,
            on_token=lambda token, seconds: heard.append(token),
        ) as keeper:
            assert await keeper.token() == "shared"
        assert store.calls == [("load", START)]
        assert fetch.times == []
        [token] = heard
        assert token.lifetime == 600.0
        assert token.issued_at == START - 20
        assert token.expires_at == START - 20 + 600 - 10  # 10 s of safety at most
        assert START - 20 + 0.75 * 600 <= token.refresh_at <= START - 20 + 0.8 * 600

    async def test_a_token_shared_while_the_lock_was_taken_is_used_not_fetched_again(
        self, clock: FakeClock
    ) -> None:
        store = MemoryStore(clock)
        store.shared_at_read[2] = StoredToken("shared", WALL, 600.0)
        fetch = Fetches(clock)
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "shared"
        assert store.calls == [("load", START), ("lock", START), ("load", START)]
        assert fetch.times == []

    async def test_a_token_is_fetched_under_the_lock_and_shared_for_as_long_as_it_is_used(
        self, clock: FakeClock
    ) -> None:
        store = MemoryStore(clock)
        fetch = Fetches(clock, planned("t1", START, refresh_in=80, expires_in=95), takes=2.0)
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
        assert store.calls == [
            ("load", START),
            ("lock", START),
            ("load", START),
            ("save", START + 2),
        ]
        assert store.lock_waits == [1.0]
        assert store.stored == StoredToken("t1", WALL, 95.0)  # issued when the fetch began
        assert store.ttl == 93.0

    @pytest.mark.parametrize(("left", "shared"), [(0.0, False), (0.5, True)])
    async def test_a_token_is_shared_only_while_it_has_time_left(
        self, clock: FakeClock, left: float, shared: bool
    ) -> None:
        store = MemoryStore(clock)
        fetch = Fetches(clock, planned("t1", START, refresh_in=5, expires_in=10), takes=10 - left)
        async with sharing_keeper(fetch, store) as keeper:
            await keeper.token()
        assert (store.stored is not None) is shared
        assert store.ttl == (left if shared else None)

    async def test_a_store_that_cannot_save_leaves_the_token_in_use_here(
        self, clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = MemoryStore(clock)
        store.refuses_saves = True
        fetch = Fetches(clock, planned("t1", START, refresh_in=80, expires_in=95))
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
            assert await keeper.token() == "t1"
        assert fetch.times == [START]
        assert [r.getMessage() for r in caplog.records] == [
            f"could not share the new access token ({UNREACHABLE}); using it locally"
        ]

    async def test_an_unreachable_store_means_a_token_fetched_here(
        self, clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = MemoryStore(clock)
        store.unreachable = True
        fetch = Fetches(clock, planned("t1", START, refresh_in=80, expires_in=95))
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
        assert fetch.times == [START]
        assert [r.getMessage() for r in caplog.records] == [
            f"the token store is unreachable ({UNREACHABLE}); fetching a token locally"
        ]

    async def test_a_refresh_while_the_store_is_unreachable_keeps_the_token_and_tries_again(
        self, clock: FakeClock, waits: SteppedWaits, warnings: Warnings
    ) -> None:
        # A Redis restart at the refresh point: a token fetched now would not be shared, so
        # every process of the fleet would fetch its own. The one in hand still works.
        store = MemoryStore(clock)
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=50, expires_in=95),
            planned("t2", START + 51.5, refresh_in=50, expires_in=95),
        )
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 50.0
            store.unreachable = True
            for wait in [0.5, 1.0]:
                waits.elapse()
                assert (await warnings.next()).getMessage() == (
                    "refreshing the access token failed (the token store is unreachable "
                    f"({UNREACHABLE})); the current one is kept, "
                    f"{95 - clock.now() + START:.1f}s left"
                )
                assert waits.asked_now() == wait
            assert await keeper.token() == "t1"
            assert fetch.times == [START], "no token fetched while the store was away"
            store.unreachable = False
            waits.elapse()
            assert await waits.asked() == 50.0
        assert fetch.times == [START, START + 51.5]
        assert store.stored == StoredToken("t2", WALL + 51.5, 95.0)
        assert warnings.none()

    async def test_a_token_that_expires_while_the_store_is_unreachable_is_fetched_here(
        self, clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = MemoryStore(clock)
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=50, expires_in=95),
            planned("t2", START + 95, refresh_in=50, expires_in=95),
        )
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
            store.unreachable = True
            clock.advance(95)
            assert await keeper.token() == "t2"
        assert fetch.times == [START, START + 95]
        assert [r.getMessage() for r in caplog.records] == [
            f"the token store is unreachable ({UNREACHABLE}); fetching a token locally"
        ]

    async def test_while_another_process_holds_the_lock_the_store_is_read_until_its_token_comes(
        self, clock: FakeClock
    ) -> None:
        # Between two tries of the lock (each waiting 1 s for it), the store is read again
        # for 1 s; each read takes 0.5 s here. The token appears at the fifth read.
        store = MemoryStore(clock, read_time=0.5)
        store.held_elsewhere = True
        store.shared_at_read[5] = StoredToken("theirs", WALL, 600.0)
        fetch = Fetches(clock)
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "theirs"
        assert store.calls == [
            ("load", START),
            ("lock", START + 0.5),
            ("load", START + 0.5),
            ("load", START + 1.0),
            ("load", START + 1.5),
            ("lock", START + 2.0),
            ("load", START + 2.0),
        ]
        assert fetch.times == []

    async def test_after_30_seconds_without_a_shared_token_it_fetches_its_own(
        self, clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = MemoryStore(clock, read_time=2.0)
        store.held_elsewhere = True
        fetch = Fetches(clock, planned("t1", START + 30, refresh_in=80, expires_in=95))
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
        assert fetch.times == [START + 30]
        assert [r.getMessage() for r in caplog.records] == [
            "no shared access token appeared within 30s; fetching one locally"
        ]
        assert store.stored is None, "a token fetched without the lock is not shared"

    async def test_a_shared_token_due_for_refresh_is_not_adopted_but_fetched_anew(
        self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_auth, "REFRESH_JITTER", 0.0)  # refresh at 80% of the lifetime
        store = MemoryStore(clock)
        store.stored = StoredToken("shared", WALL - 80, 100.0)  # due for refresh just now
        fetch = Fetches(clock, planned("t1", START, refresh_in=80, expires_in=95))
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
        assert fetch.times == [START]
        assert store.stored == StoredToken("t1", WALL, 95.0)

    async def test_its_own_shared_token_is_replaced_at_its_refresh_point(
        self, clock: FakeClock, waits: SteppedWaits
    ) -> None:
        store = MemoryStore(clock)
        fetch = Fetches(
            clock,
            planned("t1", START, refresh_in=50, expires_in=95),
            planned("t2", START + 50, refresh_in=50, expires_in=95),
        )
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 50.0
            waits.elapse()
            assert await waits.asked() == 50.0
            assert fetch.times == [START, START + 50]
            assert store.stored is not None
            assert store.stored.value == "t2"

    async def test_a_refresh_woken_just_before_the_refresh_point_waits_the_rest(
        self, clock: FakeClock, waits: SteppedWaits
    ) -> None:
        # A timer may fire within the clock's resolution before its time.
        store = MemoryStore(clock)
        fetch = Fetches(clock, planned("t1", START, refresh_in=50, expires_in=95))
        async with sharing_keeper(fetch, store) as keeper:
            assert await keeper.token() == "t1"
            keeper.start()
            assert await waits.asked() == 50.0
            waits.elapse(49.75)
            assert await waits.asked() == 0.25
            assert fetch.times == [START]

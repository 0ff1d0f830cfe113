"""requests_per_second="auto": learning the rate the service accepts (AIMD), per process."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

import dispatch_async as da
from dispatch_async import _throttle
from dispatch_async._adaptive import Aimd, RateState
from dispatch_async._throttle import LocalRate, Pace, Slot, Throttle, steady_limiter
from dispatch_async.instrumentation import Event, RateChanged
from dispatch_async.testing import FakeClock, FakeDispatchServer
from tests.cli_helpers import dispatch_async, records, write_csv
from tests.conftest import SECRET, numbers


def grown(aimd: Aimd, state: RateState, seconds: float) -> RateState:
    """*state* after a request that waited for the rate succeeded, *seconds* after it changed."""
    return aimd.succeeded(state, state.version, state.changed_at + seconds, held=True)


class TestTheAlgorithm:
    """The pure transitions, on a clock the test moves by hand."""

    def test_doubles_per_interval_until_the_first_429(self) -> None:
        aimd = Aimd(initial=10, interval=1.0)
        state = aimd.start(now=100.0)
        state = grown(aimd, state, 1.0)
        assert state.rate == 20
        assert grown(aimd, state, 1.0).rate == 40

    def test_does_not_rise_twice_within_an_interval(self) -> None:
        aimd = Aimd(initial=10, interval=1.0)
        state = grown(aimd, aimd.start(now=0.0), 1.0)
        assert grown(aimd, state, 0.5) is state

    def test_does_not_rise_when_the_rate_held_nothing_back(self) -> None:
        aimd = Aimd(initial=10)
        state = aimd.start(now=0.0)
        assert aimd.succeeded(state, state.version, 5.0, held=False) is state

    def test_a_429_cuts_the_rate_by_the_factor(self) -> None:
        aimd = Aimd(initial=50, factor=0.8)
        state = aimd.start(now=0.0)
        cut = aimd.limited(state, state.version, 0.1)
        assert cut.rate == pytest.approx(40)
        assert cut.reason == "decrease"
        assert cut.version == state.version + 1

    def test_after_a_429_it_rises_by_a_constant_step(self) -> None:
        aimd = Aimd(initial=50, factor=0.8, step_share=0.04)
        state = aimd.start(now=0.0)
        state = aimd.limited(state, state.version, 0.0)  # 40/s, steps of 2/s
        rates = []
        for _ in range(3):
            state = grown(aimd, state, 1.0)
            rates.append(state.rate)
        assert rates == pytest.approx([42, 44, 46])

    def test_429s_to_requests_sent_at_an_older_rate_cut_only_once(self) -> None:
        aimd = Aimd(initial=50)
        state = aimd.start(now=0.0)
        sent_under = state.version
        once = aimd.limited(state, sent_under, 0.1)
        assert aimd.limited(once, sent_under, 0.2) is once
        # A request sent under the cut rate and still refused cuts again.
        assert aimd.limited(once, once.version, 0.3).rate < once.rate

    def test_never_rises_above_the_maximum(self) -> None:
        aimd = Aimd(max_requests_per_second=15, initial=10)
        state = grown(aimd, aimd.start(now=0.0), 1.0)
        assert state.rate == 15
        assert grown(aimd, state, 1.0) is state

    def test_starts_at_the_maximum_when_it_is_lower(self) -> None:
        assert Aimd(max_requests_per_second=2).start(now=0.0).rate == 2

    def test_never_falls_below_the_minimum(self) -> None:
        aimd = Aimd(initial=0.2, minimum=0.1)
        state = aimd.start(now=0.0)
        for _ in range(10):
            state = aimd.limited(state, state.version, 0.0)
        assert state.rate == 0.1

    @pytest.mark.parametrize(("read", "used"), [(1000.0, 15.0), (0.001, 0.1), (12.0, 12.0)])
    def test_a_rate_read_from_elsewhere_is_used_within_the_bounds(
        self, read: float, used: float
    ) -> None:
        aimd = Aimd(max_requests_per_second=15)
        state = RateState(read, 4, 0.0, 1.0, "increase")
        assert aimd.within(state) == RateState(used, 4, 0.0, 1.0, "increase")

    def test_a_change_dated_by_a_clock_an_hour_ahead_does_not_stop_the_rise(self) -> None:
        aimd = Aimd(interval=1.0)
        ahead = RateState(40.0, 7, 3600.0, 2.0, "increase")
        assert aimd.succeeded(ahead, 7, 0.0, held=True).rate == 42.0
        # Within an interval either way, it is the same clock: no second rise.
        assert aimd.succeeded(ahead, 7, 3599.5, held=True) is ahead

    @pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "5"])
    def test_refuses_a_maximum_that_is_not_a_positive_number(self, bad: object) -> None:
        with pytest.raises(da.ConfigurationError, match="max_requests_per_second"):
            Aimd(max_requests_per_second=bad)  # type: ignore[arg-type]

    def test_a_state_survives_its_encoding(self) -> None:
        aimd = Aimd(initial=50)
        state = aimd.limited(aimd.start(now=1234.5), 1, 1235.25)
        assert RateState.decode(state.encode()) == state
        assert RateState.decode(aimd.start(now=1.0).encode()) == aimd.start(now=1.0)

    @pytest.mark.parametrize("text", ["", "garbage", "1 2 3 4", "-5 1 0 - start", "5 1 0 - odd"])
    def test_a_value_it_did_not_write_decodes_to_nothing(self, text: str) -> None:
        assert RateState.decode(text) is None


class TestThisProcessLearning:
    """`LocalRate`: the algorithm fed by the statuses of this process's requests."""

    async def test_only_a_200_or_a_429_moves_the_rate(self) -> None:
        now = [100.0]
        rate = LocalRate(Aimd(initial=10, interval=1.0), clock=lambda: now[0])
        start = rate.state
        now[0] = 102.0
        for status in (500, 503, 401, 400):
            await rate.answered(Slot(start.version, held=True), status)
        assert rate.state is start
        await rate.answered(Slot(start.version, held=True), 200)
        assert rate.state.rate == 20
        await rate.answered(Slot(rate.state.version, held=True), 429)
        assert rate.state.rate == pytest.approx(16)

    async def test_after_a_429_the_rate_rises_again_only_an_interval_later(self) -> None:
        now = [100.0]
        rate = LocalRate(Aimd(initial=10, interval=1.0), clock=lambda: now[0])
        await rate.answered(Slot(rate.state.version, held=True), 429)
        cut = rate.state
        now[0] = 100.5
        await rate.answered(Slot(cut.version, held=True), 200)
        assert rate.state is cut, "within the interval of the cut"
        now[0] = 101.5
        await rate.answered(Slot(cut.version, held=True), 200)
        assert rate.state.rate == pytest.approx(8.4), "8/s, up by its step: 4% of the 10/s cut"


class _Learner:
    """A learned rate the test sets by hand (`Learner`)."""

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.state: RateState | None = None
        self.holds: list[float] = []

    async def take(self) -> Slot:
        return Slot(0 if self.state is None else self.state.version, held=False)

    async def answered(self, slot: Slot, status: int) -> None:
        pass

    async def hold(self, seconds: float) -> None:
        self.holds.append(seconds)


class _Fleet:
    """A shared limiter whose ``learner`` is *learner* (as `RedisRateLimiter` has one)."""

    def __init__(self, learner: _Learner) -> None:
        self.learner = learner

    async def acquire(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class TestWhatTheThrottleTells:
    @pytest.mark.parametrize(("shared", "whose"), [(False, "the"), (True, "the fleet's")])
    async def test_each_change_of_the_learned_rate_once_in_the_log_and_to_on_change(
        self, caplog: pytest.LogCaptureFixture, shared: bool, whose: str
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="dispatch_async")
        heard: list[tuple[RateState, RateState | None, bool]] = []
        learner = _Learner(shared)
        throttle = Throttle(shared=_Fleet(learner), on_change=lambda *change: heard.append(change))
        clock = FakeClock()
        aimd = Aimd(initial=10, interval=1.0)

        slot = await throttle.wait(clock)  # no rate yet: nothing to tell
        start = learner.state = aimd.start(now=0.0)
        slot = await throttle.wait(clock)
        await throttle.answered(slot, 200)  # the same state: told once
        learner.state = RateState(start.rate, start.version, 0.5)  # same version, anew
        await throttle.answered(slot, 200)
        up = learner.state = grown(aimd, start, 1.0)
        await throttle.answered(slot, 200)
        down = learner.state = aimd.limited(up, up.version, 1.5)
        await throttle.answered(slot, 429)

        told = [(r.levelno, r.getMessage()) for r in caplog.records if "request rate" in r.msg]
        assert told == [
            (logging.DEBUG, f"{whose} learned request rate is 10/s (was unknown): first rate"),
            (
                logging.DEBUG,
                f"{whose} learned request rate is 20/s (was 10/s): requests went through",
            ),
            (logging.INFO, f"{whose} learned request rate is 16/s (was 20/s): a 429"),
        ]
        assert heard == [(start, None, shared), (up, start, shared), (down, up, shared)]


class _Time:
    """`time` and `asyncio` for `Pace`: sleeps are noted and move the time on at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class TestThePace:
    async def test_one_request_every_one_over_the_rate_read_afresh(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fake = _Time()
        monkeypatch.setattr(_throttle, "time", fake)
        monkeypatch.setattr(_throttle, "asyncio", fake)
        rate = [4.0]
        pace = Pace(lambda: rate[0])
        assert await pace.wait() is False
        assert await pace.wait() is True
        fake.now += 1.0  # idle for a second: the next one goes at once
        assert await pace.wait() is False
        rate[0] = 2.0
        assert await pace.wait() is True
        assert fake.sleeps == [0.25, 0.5]

    def test_a_fixed_rate_lets_one_request_through_every_one_over_the_rate(self) -> None:
        limiter = steady_limiter(8)
        assert (limiter.max_rate, limiter.time_period) == (1, 0.125)

    def test_a_fixed_rate_without_aiolimiter_says_what_to_install(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "aiolimiter", None)
        with pytest.raises(da.ConfigurationError) as caught:
            steady_limiter(8)
        assert str(caught.value) == (
            'a request rate needs aiolimiter: pip install "dispatch-async[rate]"'
        )


class TestRetryAfter:
    async def test_is_waited_exactly_and_the_lowered_learned_rate_still_spaces_requests(
        self,
    ) -> None:
        clock = FakeClock()
        throttle = Throttle("auto")
        slot = await throttle.wait(clock)
        assert slot is not None
        await throttle.answered(slot, 429)
        assert throttle.rate == Aimd().initial * Aimd().factor
        await throttle.pause(0.3, clock)
        after = await throttle.wait(clock)
        assert clock.sleeps == [0.3], "the Retry-After, exactly, on the policy's clock"
        assert after is not None
        assert after.held, "then the learned rate's gap, on top of the pause"

    async def test_a_fleet_that_learns_together_is_held_for_the_seconds_asked(self) -> None:
        clock = FakeClock()
        learner = _Learner(shared=True)
        throttle = Throttle(shared=_Fleet(learner))
        await throttle.pause(0.3, clock)
        await throttle.wait(clock)
        assert learner.holds == [0.3], "the fleet's other processes hold too"
        assert clock.sleeps == [0.3], "and this process waits it out itself"


class TestTheSetting:
    async def test_a_session_shows_its_learned_rate_from_the_start(self) -> None:
        events: list[Event] = []
        async with FakeDispatchServer(client_secret=SECRET) as server:
            session = da.DispatchSession(
                server.url,
                client_secret=SECRET,
                account="acme",
                requests_per_second="auto",
                hooks=[events.append],
            )
            assert session.requests_per_second == Aimd().initial  # where learning starts
            async with session:
                await session.send_basic(numbers(3), text="hi", chunk_size=1)
                learned = session.requests_per_second
        changes = [e for e in events if isinstance(e, RateChanged)]
        assert changes, "the learner told its rate"
        assert learned == changes[-1].requests_per_second, "the rate it learned last"
        assert server.stats.rate_limited == 0
        assert learned >= Aimd().initial, "without a 429 the rate never goes down"

    def test_a_fixed_rate_is_shown_as_set(self) -> None:
        session = da.DispatchSession("http://127.0.0.1:1", client_secret="s", requests_per_second=7)
        assert session.requests_per_second == 7
        assert (
            da.DispatchSession("http://127.0.0.1:1", client_secret="s").requests_per_second is None
        )

    @pytest.mark.parametrize(
        "settings",
        [
            {"requests_per_second": "fast"},
            {"requests_per_second": 0},
            {"requests_per_second": 10, "max_requests_per_second": 20},
            {"requests_per_second": "auto", "max_requests_per_second": -1},
        ],
    )
    def test_a_bad_setting_is_refused_before_anything_is_sent(
        self, settings: dict[str, object]
    ) -> None:
        with pytest.raises(da.ConfigurationError, match="requests_per_second"):
            da.DispatchSession("http://127.0.0.1:1", client_secret="s", **settings)  # type: ignore[arg-type]

    def test_auto_with_a_shared_limiter_is_refused(self) -> None:
        limiter = da.RedisRateLimiter("redis://127.0.0.1:1/0", requests_per_second=10)
        with pytest.raises(da.ConfigurationError) as caught:
            da.DispatchSession(
                "http://127.0.0.1:1",
                client_secret="s",
                requests_per_second="auto",
                rate_limiter=limiter,
            )
        assert str(caught.value) == (
            'requests_per_second="auto" learns for this process alone: to learn for a fleet,'
            " give it to the RedisRateLimiter instead"
        )

    def test_a_maximum_without_auto_is_refused_saying_what_it_bounds(self) -> None:
        with pytest.raises(da.ConfigurationError) as caught:
            da.DispatchSession(
                "http://127.0.0.1:1",
                client_secret="s",
                requests_per_second=10,
                max_requests_per_second=20,
            )
        assert str(caught.value) == 'max_requests_per_second bounds requests_per_second="auto"'

    def test_a_maximum_below_where_learning_starts_is_where_it_starts(self) -> None:
        session = da.DispatchSession(
            "http://127.0.0.1:1",
            client_secret="s",
            requests_per_second="auto",
            max_requests_per_second=4,
        )
        assert session.requests_per_second == 4


class TestAgainstARateLimitedSimulator:
    async def test_learns_a_rate_near_the_limit_and_loses_no_recipient(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="dispatch_async")
        events: list[Event] = []
        async with (
            FakeDispatchServer(rate_limit=40, client_secret=SECRET) as server,
            da.DispatchSession(
                server.url,
                client_secret=SECRET,
                account="acme",
                requests_per_second="auto",
                retry=da.RetryPolicy(attempts=100),
                hooks=[events.append],
            ) as session,
        ):
            result = await session.send_basic(
                numbers(400), text="hi", chunk_size=1, max_concurrency=8
            )
            learned = session.requests_per_second
        assert result.ok
        assert len(result.valid) == 400
        assert server.stats.recipients_received == 400
        assert not server.stats.duplicates
        assert server.stats.rate_limited > 0  # it did meet the limit
        changes = [e for e in events if isinstance(e, RateChanged)]
        cuts = [e for e in changes if e.reason == "decrease"]
        # The first 429 came once the rate had gone past the limit (a 429 is only met
        # over it): the learner did probe up to the limit.
        assert cuts[0].previous is not None
        assert cuts[0].previous >= 40
        # Near the limit: one cut below it at most, and never twice it (at twice the
        # limit, the burst is spent in a second and the next 429 cuts the rate).
        assert learned is not None
        assert 40 * Aimd().factor <= learned <= 40 * 2
        assert changes[0].reason == "start"
        assert changes[0].previous is None
        assert {"increase", "decrease"} <= {e.reason for e in changes}
        assert not any(e.shared for e in changes)
        assert "learned request rate is" in caplog.text

    async def test_never_learns_more_than_the_maximum(self) -> None:
        async with (
            FakeDispatchServer(client_secret=SECRET) as server,
            da.DispatchSession(
                server.url,
                client_secret=SECRET,
                account="acme",
                requests_per_second="auto",
                max_requests_per_second=12,
            ) as session,
        ):
            await session.send_basic(numbers(40), text="hi", chunk_size=1, max_concurrency=8)
            assert session.requests_per_second == 12


class TestTheCommandLine:
    """``--rate auto``: the same learning, through the SDK's public API."""

    async def test_sends_every_row_once_learning_the_rate(self, tmp_path: Path) -> None:
        async with FakeDispatchServer(rate_limit=30, client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(60))
            output = tmp_path / "out.jsonl"
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "-o", output,
                "--rate", "auto", "--attempts", "50", "--chunk-size", "1", "-q", "-vv",
                env=cli_env(server),
            )  # fmt: skip
            assert run.code == 0, run.stderr
            assert server.stats.recipients_received == 60
            assert not server.stats.duplicates
        assert sorted(r["number"] for r in records(output)) == numbers(60)
        assert "the learned request rate is 10/s (was unknown): first rate" in run.stderr

    async def test_the_plan_says_the_rate_is_learned(self, tmp_path: Path) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(3))
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "--dry-run", "--rate", "AUTO",
                env=cli_env(server),
            )  # fmt: skip
        assert run.code == 0, run.stderr
        assert "at a rate learned from the service's 429s" in run.stdout + run.stderr

    async def test_max_rate_bounds_the_learned_rate(self, tmp_path: Path) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(6))
            output = tmp_path / "out.jsonl"
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "-o", output, "--rate", "auto",
                "--max-rate", "4", "--chunk-size", "1", "-q", "-vv", env=cli_env(server),
            )  # fmt: skip
            assert run.code == 0, run.stderr
            assert server.stats.recipients_received == 6
        assert "the learned request rate is 4/s (was unknown): first rate" in run.stderr
        assert "the learned request rate is 8/s" not in run.stderr

    async def test_the_plan_says_how_high_the_rate_may_go(self, tmp_path: Path) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(3))
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "--dry-run", "--rate", "auto",
                "--max-rate", "2.5", env=cli_env(server),
            )  # fmt: skip
        assert run.code == 0, run.stderr
        assert "learned from the service's 429s (at most 2.5 requests/s)" in run.stdout

    @pytest.mark.parametrize(
        ("flags", "message"),
        [
            (["--rate", "5", "--max-rate", "4"], "--max-rate bounds a learned rate"),
            (["--max-rate", "4"], "--max-rate bounds a learned rate"),
            (["--rate", "auto", "--max-rate", "0"], "'0' is not a positive number"),
            (["--rate", "auto", "--max-rate", "inf"], "'inf' is not a positive number"),
        ],
    )
    async def test_a_max_rate_without_auto_or_not_a_rate_is_refused(
        self, tmp_path: Path, flags: list[str], message: str
    ) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(3))
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "out.jsonl",
                *flags, env=cli_env(server),
            )  # fmt: skip
            assert server.stats.dispatch_calls == 0
        assert run.code == 2
        assert message in run.stderr

    @pytest.mark.parametrize("rate", ["fast", "0", "-3", "nan"])
    async def test_a_rate_that_is_neither_a_number_nor_auto_is_refused(
        self, tmp_path: Path, rate: str
    ) -> None:
        async with FakeDispatchServer(client_secret=SECRET) as server:
            contacts = write_csv(tmp_path / "in.csv", "number", numbers(3))
            run = await dispatch_async(
                "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "out.jsonl",
                "--rate", rate, env=cli_env(server),
            )  # fmt: skip
            assert server.stats.dispatch_calls == 0
        assert run.code != 0
        assert "neither a positive number nor 'auto'" in run.stderr


def cli_env(server: FakeDispatchServer) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    return clean | {
        "DISPATCH_BASE_URL": server.url,
        "DISPATCH_CLIENT_SECRET": SECRET,
        "DISPATCH_ACCOUNT": "acme",
    }

"""How long a retry waits, pinned on a fake clock: backoff, jitter, caps, Retry-After.

Through the public policy (`RetryPolicy.wait_before`, `pause_for`) and through real
requests to the simulator, with `FakeClock` taking the waits: nothing here sleeps.
"""

from __future__ import annotations

import email.utils
import logging
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import attrs
import pytest

import dispatch_async as da
from dispatch_async.instrumentation import Event, Paused, RetryScheduled
from dispatch_async.testing import FakeClock, FakeDispatchServer, Fault

from .conftest import numbers, session_for

SAMPLES = 400  # enough that a bound no sample comes near fails with odds below 1e-40
# The mean of SAMPLES uniform waits has a standard error of 2.9% of the expected mean:
# 25% is 8.7 of those (odds 5e-18 per check; 10%, 3.5 of them, failed one CI run in a
# few hundred checks), and still far from a wait that is fixed (100%) or zero (-100%).
MEAN_TOLERANCE = 0.25


def busy(error_class: type[da.StatusError] = da.ServiceUnavailableError) -> da.StatusError:
    """A 503 (or *error_class*) that asked for no particular wait."""
    return error_class("the service answered HTTP 503", status=503)


def asked(seconds: float) -> da.StatusError:
    """A 503 whose Retry-After asked for *seconds*."""
    error = busy()
    error.retry_after = seconds  # type: ignore[attr-defined]
    return error


def http_date(moment: datetime) -> str:
    return email.utils.format_datetime(moment.astimezone(UTC), usegmt=True)


def check_full_jitter(waits: Sequence[float], ceiling: float) -> None:
    """*waits* look uniform over [0, ceiling]: within it, and spread all over it."""
    assert len(waits) == SAMPLES
    assert all(0 <= w <= ceiling for w in waits), (min(waits), max(waits), ceiling)
    assert min(waits) < ceiling / 4
    assert max(waits) > ceiling * 3 / 4
    assert statistics.fmean(waits) == pytest.approx(ceiling / 2, rel=MEAN_TOLERANCE)


class TestBackoffOnThePolicy:
    @pytest.mark.parametrize("retry", [1, 2, 3, 4, 5, 6])
    def test_the_nth_retry_waits_up_to_first_wait_doubled_n_minus_1_times(self, retry: int) -> None:
        policy = da.RetryPolicy(first_wait=0.5, max_wait=1000)
        check_full_jitter(
            [policy.wait_before(retry, busy()) for _ in range(SAMPLES)], 0.5 * 2 ** (retry - 1)
        )

    def test_max_wait_caps_the_growth(self) -> None:
        policy = da.RetryPolicy(first_wait=1.0, max_wait=3.0)
        check_full_jitter([policy.wait_before(2) for _ in range(SAMPLES)], 2.0)
        check_full_jitter([policy.wait_before(3) for _ in range(SAMPLES)], 3.0)
        check_full_jitter([policy.wait_before(50) for _ in range(SAMPLES)], 3.0)

    def test_the_defaults_start_at_half_a_second_and_stop_at_thirty(self) -> None:
        policy = da.RetryPolicy()
        check_full_jitter([policy.wait_before(1) for _ in range(SAMPLES)], 0.5)
        check_full_jitter([policy.wait_before(10) for _ in range(SAMPLES)], 30.0)

    @pytest.mark.parametrize("retry", [1024, 1100, 10**6])
    def test_however_many_retries_the_wait_stays_within_max_wait(self, retry: int) -> None:
        policy = da.RetryPolicy(first_wait=0.5, max_wait=2.0)
        assert all(0 <= policy.wait_before(retry) <= 2.0 for _ in range(50))

    def test_without_waits_every_wait_is_zero_even_one_the_service_asked_for(self) -> None:
        policy = da.RetryPolicy(first_wait=5, max_wait=5, wait=False)
        assert {policy.wait_before(retry, asked(30)) for retry in range(1, 5)} == {0.0}
        assert {policy.wait_before(retry, busy()) for retry in range(1, 5)} == {0.0}
        assert da.RetryPolicy().without_waits().wait_before(3) == 0.0

    def test_a_first_wait_of_zero_never_waits(self) -> None:
        policy = da.RetryPolicy(first_wait=0, max_wait=30)
        assert {policy.wait_before(retry) for retry in range(1, 20)} == {0.0}


class TestRetryAfterOnThePolicy:
    @pytest.mark.parametrize("seconds", [0.0, 0.25, 7.0, 119.0])
    def test_the_wait_asked_for_is_waited_exactly(self, seconds: float) -> None:
        policy = da.RetryPolicy()
        assert policy.pause_for(asked(seconds)) == seconds
        assert {policy.wait_before(retry, asked(seconds)) for retry in (1, 4)} == {seconds}

    def test_it_is_capped_at_max_retry_after(self) -> None:
        assert da.RetryPolicy().wait_before(1, asked(3600)) == 120.0
        policy = da.RetryPolicy(max_retry_after=5.0)
        assert policy.pause_for(asked(3600)) == 5.0
        assert policy.wait_before(1, asked(3600)) == 5.0
        assert policy.wait_before(1, asked(4.5)) == 4.5

    def test_it_takes_the_place_of_the_backoff_whatever_the_retry(self) -> None:
        policy = da.RetryPolicy(first_wait=100, max_wait=100)
        assert policy.wait_before(6, asked(0.5)) == 0.5

    @pytest.mark.parametrize(
        "error",
        [busy(), busy(da.RateLimitedError), da.ConnectError("refused")],
    )
    def test_an_error_that_asked_for_nothing_gets_the_backoff(
        self, error: da.DispatchError
    ) -> None:
        policy = da.RetryPolicy(first_wait=0.5)
        assert policy.pause_for(error) is None
        check_full_jitter([policy.wait_before(1, error) for _ in range(SAMPLES)], 0.5)


# -- through real requests ----------------------------------------------------------


def waits_of(events: list[Event]) -> list[float]:
    return [e.wait for e in events if isinstance(e, RetryScheduled)]


def pauses_of(events: list[Event]) -> list[float]:
    return [e.seconds for e in events if isinstance(e, Paused)]


async def send_through(
    server: FakeDispatchServer,
    policy: da.RetryPolicy,
    *faults: Fault,
    count: int = 1,
) -> tuple[da.DispatchResult, list[Event]]:
    """Send to *count* numbers, one request each in turn, each answered *faults* first."""
    events: list[Event] = []
    recipients = numbers(count)
    for number in recipients:
        server.script_for(number, *faults)
    async with session_for(server, retry=policy, hooks=[events.append]) as session:
        result = await session.send_basic(recipients, text="x", chunk_size=1, max_concurrency=1)
    assert server.pending_faults == 0
    return result, events


class TestBackoffOfARealRequest:
    async def test_grows_with_each_retry_within_its_jittered_bounds(
        self, server: FakeDispatchServer
    ) -> None:
        clock = FakeClock()
        policy = da.RetryPolicy(attempts=4, first_wait=0.5, max_wait=30, clock=clock)
        result, events = await send_through(server, policy, *[Fault.status(503)] * 3, count=40)

        assert len(result.valid) == 40
        assert result.retries == 120
        assert clock.sleeps == waits_of(events), "the wait reported is the wait taken"
        per_request = [clock.sleeps[i : i + 3] for i in range(0, 120, 3)]
        for ceiling, waits in zip((0.5, 1.0, 2.0), zip(*per_request, strict=True), strict=True):
            assert all(0 <= w <= ceiling for w in waits), (ceiling, waits)
            assert max(waits) > ceiling / 2  # beyond the retry before it: it grew
        assert pauses_of(events) == []

    async def test_an_error_not_to_retry_after_one_to_retry_ends_the_retries(
        self, server: FakeDispatchServer
    ) -> None:
        # A 503 is retried; the 500 that answers the retry may have been acted on: no more.
        policy = da.RetryPolicy(attempts=5, clock=FakeClock())
        result, _ = await send_through(server, policy, Fault.status(503), Fault.status(500))

        assert [r.endpoint for r in server.requests] == ["token", "basic", "basic"]
        [failure] = result.failed
        assert type(failure.error) is da.ServerStatusError
        assert failure.error.status == 500

    async def test_max_wait_caps_it(self, server: FakeDispatchServer) -> None:
        clock = FakeClock()
        policy = da.RetryPolicy(attempts=7, first_wait=1, max_wait=1.5, clock=clock)
        result, _ = await send_through(server, policy, *[Fault.status(503)] * 6, count=10)

        assert result.ok
        per_request = [clock.sleeps[i : i + 6] for i in range(0, 60, 6)]
        assert all(max(waits) <= 1.5 for waits in per_request)
        assert max(w for waits in per_request for w in waits[1:]) > 1.0, "past first_wait"

    async def test_max_time_stops_the_retries(self, server: FakeDispatchServer) -> None:
        clock = FakeClock()
        events: list[Event] = []

        def each_attempt_takes_four_seconds(event: Event) -> None:
            events.append(event)
            if isinstance(event, RetryScheduled):
                clock.advance(4)

        policy = da.RetryPolicy(attempts=100, max_time=10, first_wait=0, clock=clock)
        server.script(*[Fault.status(503)] * 100)
        async with session_for(server, retry=policy, hooks=[each_attempt_takes_four_seconds]) as s:
            result = await s.send_basic(numbers(1), text="x")

        # Failures at 0, 4 and 8 s are retried; the one at 12 s is past max_time.
        assert server.stats.requests == 4
        assert isinstance(result.failed[0].error, da.ServiceUnavailableError)
        assert waits_of(events) == [0.0, 0.0, 0.0]

    async def test_a_failure_at_exactly_max_time_is_not_retried(
        self, server: FakeDispatchServer
    ) -> None:
        clock = FakeClock()

        def each_attempt_takes_five_seconds(event: Event) -> None:
            if isinstance(event, RetryScheduled):
                clock.advance(5)

        policy = da.RetryPolicy(attempts=100, max_time=10, first_wait=0, clock=clock)
        server.script(*[Fault.status(503)] * 100)
        async with session_for(server, retry=policy, hooks=[each_attempt_takes_five_seconds]) as s:
            await s.send_basic(numbers(1), text="x")

        # Failures at 0 and 5 s are retried; the one at 10 s has used all of max_time.
        assert server.stats.requests == 3

    async def test_max_time_bounds_every_wait(self, server: FakeDispatchServer) -> None:
        clock = FakeClock()
        policy = da.RetryPolicy(attempts=2, max_time=10, first_wait=100, max_wait=100, clock=clock)
        result, _ = await send_through(server, policy, Fault.status(503), count=20)

        assert result.ok
        assert all(0 <= w <= 10 for w in clock.sleeps)
        assert 10 in clock.sleeps, "a backoff of up to 100 s, cut to the 10 s left"

    async def test_the_time_left_is_max_time_less_the_time_since_the_first_failure(
        self, server: FakeDispatchServer
    ) -> None:
        clock = FakeClock(start=100)
        events: list[Event] = []

        def each_attempt_takes_four_seconds(event: Event) -> None:
            events.append(event)
            if isinstance(event, RetryScheduled):
                clock.advance(4)

        policy = da.RetryPolicy(attempts=100, max_time=10, clock=clock)
        server.script(*[Fault.status(503, retry_after="5")] * 3)
        async with session_for(server, retry=policy, hooks=[each_attempt_takes_four_seconds]) as s:
            result = await s.send_basic(numbers(1), text="x")

        # Failures at 100 s and 109 s: the 5 s asked for, then the 1 s left of the 10 s;
        # the failure at 114 s is past max_time.
        assert waits_of(events) == [5.0, 1.0]
        assert server.stats.requests == 3
        assert isinstance(result.failed[0].error, da.ServiceUnavailableError)

    async def test_each_retry_is_logged_with_its_error_attempt_and_wait(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        policy = da.RetryPolicy(attempts=3, clock=FakeClock())
        server.script(Fault.status(503, retry_after="2"), Fault.status(429, retry_after="0.5"))
        with caplog.at_level(logging.INFO, logger="dispatch_async"):
            result, _ = await send_through(server, policy)
        assert result.ok
        retries = [r.getMessage() for r in caplog.records if r.msg.startswith("retrying")]
        assert len(retries) == 2
        assert retries[0].startswith("retrying after ")
        assert retries[0].endswith(" (attempt 1, waiting 2.00s)")
        assert "503" in retries[0]
        assert retries[1].endswith(" (attempt 2, waiting 0.50s)")
        assert "429" in retries[1]

    async def test_each_retry_is_told_to_the_hooks_with_the_error_that_caused_it(
        self, server: FakeDispatchServer
    ) -> None:
        policy = da.RetryPolicy(attempts=3, clock=FakeClock())
        server.script(Fault.status(503, retry_after="2"), Fault.status(429, retry_after="0.5"))
        result, events = await send_through(server, policy)
        assert result.ok
        told = [(e.attempt, e.error, e.wait) for e in events if isinstance(e, RetryScheduled)]
        assert [(attempt, wait) for attempt, _, wait in told] == [(1, 2.0), (2, 0.5)]
        assert "503" in told[0][1]
        assert "429" in told[1][1]

    async def test_a_thousand_retries_do_not_overflow_the_backoff(
        self, server: FakeDispatchServer
    ) -> None:
        policy = da.RetryPolicy(attempts=1100, max_time=3600, first_wait=0, max_wait=0)
        server.script(*[Fault.status(503)] * 1050)
        async with session_for(server, retry=policy) as session:
            result = await session.send_basic(numbers(1), text="x")
        assert result.ok
        assert result.retries == 1050


async def one_retry_after(
    server: FakeDispatchServer, retry_after: str, policy: da.RetryPolicy, *, status: int = 503
) -> tuple[list[float], list[float]]:
    """One request answered *status* with *retry_after*, then 200: what was slept on the
    policy's clock (a fresh `FakeClock`), and the session's pauses."""
    clock = FakeClock()
    policy = attrs.evolve(policy, clock=clock)
    result, events = await send_through(
        server, policy, Fault.status(status, retry_after=retry_after)
    )
    assert result.ok
    assert result.retries == 1
    assert clock.sleeps == waits_of(events), "the wait reported is the wait taken"
    return clock.sleeps, pauses_of(events)


class TestRetryAfterOfARealRequest:
    async def test_is_waited_exactly_by_the_request_and_pauses_the_session(
        self, server: FakeDispatchServer
    ) -> None:
        slept, paused = await one_retry_after(server, "7", da.RetryPolicy(first_wait=0.5))
        assert slept == [7.0]  # once: the session's pause has passed by then
        assert paused == [7.0]

    async def test_a_429_with_decimals_is_waited_exactly(self, server: FakeDispatchServer) -> None:
        slept, paused = await one_retry_after(server, "0.25", da.RetryPolicy(), status=429)
        assert slept == paused == [0.25]

    @pytest.mark.parametrize(
        ("retry_after", "policy", "waited"),
        [
            ("3600", da.RetryPolicy(), 120.0),
            ("3600", da.RetryPolicy(max_retry_after=5), 5.0),
            ("121", da.RetryPolicy(max_time=1000), 120.0),
            ("9" * 400, da.RetryPolicy(), 120.0),  # too many digits for a float: inf
            (http_date(datetime.now(UTC) + timedelta(days=3)), da.RetryPolicy(), 120.0),
        ],
    )
    async def test_is_capped_at_max_retry_after(
        self, server: FakeDispatchServer, retry_after: str, policy: da.RetryPolicy, waited: float
    ) -> None:
        slept, paused = await one_retry_after(server, retry_after, policy)
        assert slept == paused == [waited]

    async def test_a_date_ahead_is_waited_until(self, server: FakeDispatchServer) -> None:
        when = http_date(datetime.now(UTC) + timedelta(seconds=60))
        [waited], _ = await one_retry_after(server, when, da.RetryPolicy())
        assert 58 < waited <= 60  # the date has whole seconds; a moment has passed

    async def test_a_date_ahead_without_a_zone_is_taken_as_utc(
        self, server: FakeDispatchServer
    ) -> None:
        ahead = datetime.now(UTC) + timedelta(seconds=60)
        when = ahead.strftime("%a, %d %b %Y %H:%M:%S -0000")  # -0000: "zone unknown"
        [waited], _ = await one_retry_after(server, when, da.RetryPolicy())
        assert 58 < waited <= 60

    @pytest.mark.parametrize(
        "retry_after",
        [http_date(datetime.now(UTC) - timedelta(hours=1)), "Wed, 21 Oct 2015 07:28:00 GMT", "0"],
    )
    async def test_a_date_past_or_zero_retries_at_once(
        self, server: FakeDispatchServer, retry_after: str
    ) -> None:
        policy = da.RetryPolicy(first_wait=10, max_wait=10)
        slept, paused = await one_retry_after(server, retry_after, policy)
        assert slept == [0.0]  # not the backoff, which would be anything up to 10 s
        assert paused == []

    @pytest.mark.parametrize(
        "retry_after",
        [
            "-5",
            "-0.5",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "Infinity",
            "1e3",
            "+5",
            "1_000",
            "٣",  # an Arabic-Indic digit three
            "0x10",
            "5 seconds",
            "soon",
            "",
            "Mon, 32 Jan 2099 00:00:00 GMT",
            "Mon, 01 Jan 10000 00:00:00 GMT",
        ],
    )
    async def test_anything_else_falls_back_to_the_backoff(
        self, server: FakeDispatchServer, retry_after: str
    ) -> None:
        policy = da.RetryPolicy(first_wait=0.5, max_retry_after=100)
        [waited], paused = await one_retry_after(server, retry_after, policy)
        assert 0 <= waited <= 0.5
        assert paused == []

    @pytest.mark.parametrize(
        "retry_after",
        [
            "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",
            "Mon, 01 Jan 9999999999 00:00:00 GMT",
            "Mon, 01 Jan 2025 00:00:00 +99999999999999999999",
            "Mon, 01 Jan 2025 99999999999999999999:00:00 GMT",
        ],
    )
    async def test_a_date_too_large_to_compute_falls_back_to_the_backoff(
        self, server: FakeDispatchServer, retry_after: str
    ) -> None:
        # No fake clock: a zero backoff, so that this runs on any version of the policy.
        policy = da.RetryPolicy(attempts=2, first_wait=0, max_wait=0)
        server.script(Fault.status(503, retry_after=retry_after))
        async with session_for(server, retry=policy) as session:
            result = await session.send_basic(numbers(1), text="x")
        assert result.ok
        assert result.retries == 1

    @pytest.mark.parametrize(
        ("retry_after", "parsed"),
        [
            ("7", 7.0),
            (" 0.25 ", 0.25),
            ("garbage", None),
            ("-5", None),
            ("nan", None),
            ("1e3", None),
            ("+5", None),
            ("1_000", None),
            ("٣", None),
        ],
    )
    async def test_the_error_of_a_refused_request_carries_the_wait_it_asked_for(
        self, server: FakeDispatchServer, retry_after: str, parsed: float | None
    ) -> None:
        policy = da.RetryPolicy(attempts=1)
        server.script(Fault.status(503, retry_after=retry_after))
        async with session_for(server, retry=policy) as session:
            result = await session.send_basic(numbers(1), text="x")
        [failed] = result.failed
        assert isinstance(failed.error, da.ServiceUnavailableError)
        assert failed.error.retry_after == parsed


class TestFakeClock:
    async def test_sleeps_take_no_time_and_move_it_on(self) -> None:
        clock = FakeClock(start=5)
        await clock.sleep(120)
        await clock.sleep(-1)
        clock.advance(0.5)
        assert clock.now() == 125.5
        assert clock.sleeps == [120, -1]

    def test_never_goes_back(self) -> None:
        with pytest.raises(ValueError, match="never goes back"):
            FakeClock().advance(-1)

    def test_is_no_part_of_the_policys_equality(self) -> None:
        assert da.RetryPolicy(clock=FakeClock()) == da.RetryPolicy()
        assert "clock" not in repr(da.RetryPolicy(clock=FakeClock()))

    async def test_shows_its_time_and_sleeps_as_the_real_clock_shows_its_name(self) -> None:
        clock = FakeClock(start=5)
        await clock.sleep(1.5)
        assert repr(clock) == "<FakeClock now=6.5 sleeps=1>"
        assert repr(da.MONOTONIC) == "MONOTONIC"

"""A blocking client with a Redis token store and rate limit, used before a fork and after."""

from __future__ import annotations

import textwrap

import pytest

from ..conftest import SECRET
from ..simulator_thread import simulator_in_thread
from ..test_blocking import run_forking


def test_a_forked_child_opens_its_own_redis_connections_and_the_parent_goes_on(
    redis_server: str, prefix: str
) -> None:
    # Run as a script: the child leaves through the interpreter's own shutdown.
    script = textwrap.dedent(
        f"""
        import logging, os, sys
        import dispatch_async as da
        logging.basicConfig(level=logging.WARNING)
        client = da.DispatchClient(
            {{url!r}}, client_secret={SECRET!r}, account="acme",
            token_store=da.RedisTokenStore({redis_server!r}, key_prefix={prefix!r}),
            rate_limiter=da.RedisRateLimiter(
                {redis_server!r}, requests_per_second=500, key_prefix={prefix!r}
            ),
        )
        assert client.send_basic(["+5511987654321"], text="parent").ok
        if os.fork() == 0:
            for n in range(3):
                assert client.send_basic([f"+551198765430{{n}}"], text="child").ok
            sys.exit(0)
        _, status = os.wait()
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert client.send_basic(["+5511987654322"], text="parent again").ok
        print("parent ok")
        """
    )
    with simulator_in_thread() as simulator:
        done = run_forking(script.replace("{url!r}", repr(simulator.url)))
        assert done.returncode == 0, done.stderr
        assert done.stdout == "parent ok\n"
        assert done.stderr == "", done.stderr  # no warning: no unreachable store, no leak
        assert simulator.server.stats.token_calls == 1  # the child adopted the shared token
        assert simulator.server.stats.dispatch_calls == 5


@pytest.mark.parametrize("rate", ["auto", "500"])
def test_a_child_forked_while_the_parent_holds_the_rate_turn_is_not_stuck_on_it(
    rate: str, redis_server: str, prefix: str
) -> None:
    # A parent's request reserving its slot holds the limiter's turn (a lock) while it
    # waits; a fork at that moment copies the lock held, by a task the child does not have.
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        import dispatch_async as da
        limiter = da.RedisRateLimiter(
            {redis_server!r}, requests_per_second={rate if rate == "500" else '"auto"'},
            key_prefix={prefix!r},
        )
        client = da.DispatchClient({{url!r}}, client_secret={SECRET!r}, account="acme",
                                   rate_limiter=limiter)
        assert client.send_basic(["+5511987654321"], text="parent").ok
        holder = limiter.learner if limiter.learner is not None else limiter
        assert asyncio.run(holder._turn.acquire())  # as a task of the parent would
        if os.fork() == 0:
            signal.alarm(20)  # a stuck child must not outlive the test
            assert client.send_basic(["+5511987654300"], text="child").ok
            sys.exit(0)
        _, status = os.wait()
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("child ok")
        """
    )
    with simulator_in_thread() as simulator:
        done = run_forking(script.replace("{url!r}", repr(simulator.url)))
        assert done.returncode == 0, done.stderr
        assert done.stdout == "child ok\n"
        assert done.stderr == "", done.stderr
        assert simulator.server.stats.dispatch_calls == 2


pytestmark = pytest.mark.filterwarnings("error")

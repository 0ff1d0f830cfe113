"""The blocking client: the session's calls from synchronous code, threads and forked children."""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import dispatch_async as da
from dispatch_async.testing import Fault

from .conftest import SECRET, numbers
from .simulator_thread import ThreadedSimulator, simulator_in_thread

# Python 3.12+ warns on any fork of a process with threads; these forks are the point.
FORK_WARNING = "ignore:This process:DeprecationWarning"


def run_forking(script: str) -> subprocess.CompletedProcess[str]:
    """Run *script*, which forks, in a fresh interpreter that shows every other warning."""
    return subprocess.run(  # noqa: S603 - our interpreter, our script
        [sys.executable, "-W", "default", "-W", FORK_WARNING, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def simulator() -> Iterator[ThreadedSimulator]:
    with simulator_in_thread() as running:
        yield running


@pytest.fixture
def client(simulator: ThreadedSimulator) -> Iterator[da.DispatchClient]:
    with da.DispatchClient(
        simulator.url, client_secret=SECRET, account="acme", retry=da.RetryPolicy(wait=False)
    ) as c:
        yield c


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dispatch-async"]


def interrupt_once_in_flight(simulator: ThreadedSimulator) -> None:
    """Send the main thread a real SIGINT, as Ctrl-C does, once a request is in flight.

    It interrupts the blocking wait itself.
    """
    simulator.portal.call(
        lambda: simulator.server.wait_until(lambda: bool(simulator.server.in_flight))
    )
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


class TestCalls:
    def test_send_returns_the_sessions_result(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        result = client.send_template(numbers(3), template_id="pix_reminder")
        assert isinstance(result, da.DispatchResult)
        assert [m.number for m in result.valid] == numbers(3)
        assert simulator.server.stats.calls_by_path["template"] == 1

    def test_every_endpoint_and_the_templates_listing(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        assert client.send_basic(numbers(1), text="x").ok
        assert client.send_single(numbers(1, 1), text="x").ok
        assert client.send_webhook(numbers(1, 2), webhook="https://hooks.example.com").ok
        assert "templates" in client.list_templates()
        assert dict(simulator.server.stats.calls_by_path) == {
            "basic": 1,
            "single": 1,
            "webhook": 1,
        }

    def test_a_bad_recipient_is_refused_before_anything_is_sent(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        with pytest.raises(da.InputError):
            client.send_basic([object()], text="x")  # type: ignore[list-item]
        assert simulator.server.stats.requests == 0

    def test_sixteen_threads_share_one_token(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        def send(i: int) -> bool:
            return client.send_basic(numbers(1, i), text="x").ok

        with ThreadPoolExecutor(16) as pool:
            sent = list(pool.map(send, range(16 * 100)))
        assert sent == [True] * 1600
        assert simulator.server.stats.token_calls == 1
        assert simulator.server.stats.dispatch_calls == 1600
        assert len(loop_threads()) == 1


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as Python sets it up in a terminal.

    A process started in the background (``cmd &``, as CI may start the suite) ignores
    SIGINT, and Python then leaves it ignored: the SIGINT these tests send was lost, and
    the call ran to its timeout, unless an earlier test had run a command in process whose
    asyncio signal handling turned Ctrl-C on (the "SIGINT lost in whole-suite runs" of
    2026-11-25; the commands now leave it as they found it).
    """
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, found)


@pytest.mark.usefixtures("ctrl_c_raises")
class TestInterruptions:
    def test_ctrl_c_cancels_the_call_on_the_loop_and_the_client_goes_on(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        assert client.send_basic(numbers(1), text="x").ok
        simulator.script(Fault.hang())
        helper = threading.Thread(target=interrupt_once_in_flight, args=(simulator,))
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            client.send_basic(numbers(1, 1), text="hangs")
        helper.join()
        # The request was cancelled on the loop, not left running.
        simulator.portal.call(
            lambda: simulator.server.wait_until(lambda: not (simulator.server.in_flight))
        )
        assert client.send_basic(numbers(1, 2), text="x").ok

    def test_ctrl_c_during_a_streams_read_raises_keyboard_interrupt_and_closes_the_stream(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        simulator.script(Fault.hang())
        stream = client.stream_basic(numbers(30), text="x", chunk_size=10, max_concurrency=1)
        helper = threading.Thread(target=interrupt_once_in_flight, args=(simulator,))
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            next(stream)
        helper.join()
        simulator.portal.call(
            lambda: simulator.server.wait_until(lambda: not (simulator.server.in_flight))
        )
        assert list(stream) == []  # closed, nothing more read or sent
        assert simulator.server.stats.dispatch_calls == 1
        assert client.send_basic(numbers(1, 40), text="x").ok

    def test_a_callback_on_the_clients_loop_cannot_wait_for_it(
        self, client: da.DispatchClient
    ) -> None:
        async def before_send(positions: range) -> None:
            client.list_templates()  # would wait for the loop it is running on

        with pytest.raises(da.CallbackError) as caught:
            client.send_basic(numbers(1), text="x", before_send=before_send)
        assert isinstance(caught.value.__cause__, da.EventLoopError)


class TestCalledInsideARunningEventLoop:
    async def test_a_call_is_refused_before_it_stalls_the_loop(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        with pytest.raises(da.EventLoopError, match="use DispatchSession and await"):
            client.send_basic(numbers(1), text="x")
        with pytest.raises(da.EventLoopError, match=r"asyncio\.to_thread"):
            client.stream_basic(numbers(1), text="x")
        assert simulator.server.stats.dispatch_calls == 0

    async def test_from_a_worker_thread_of_that_loop_it_works(
        self, client: da.DispatchClient
    ) -> None:
        result = await asyncio.to_thread(client.send_basic, numbers(2), text="x")
        assert len(result.valid) == 2


class TestStreams:
    def test_a_stream_is_a_plain_iterator_of_parts(self, client: da.DispatchClient) -> None:
        parts = list(client.stream_basic(numbers(25), text="x", chunk_size=10))
        assert sorted(p.positions.start for p in parts) == [0, 10, 20]
        assert sum(len(p.valid) for p in parts) == 25

    def test_a_stream_reads_no_further_ahead_than_the_session(
        self, client: da.DispatchClient
    ) -> None:
        read = itertools.count()

        def recipients() -> Iterator[str]:
            for n in range(100_000):
                next(read)
                yield f"+55119{n:08d}"

        stream = client.stream_basic(recipients(), text="x", chunk_size=10, max_concurrency=2)
        taken = [next(stream) for _ in range(3)]
        stream.close()
        consumed = next(read)
        # In flight, queued and being read: at most 2 + 2 + 1 chunks past those taken.
        assert len(taken) == 3
        assert consumed <= (3 + 5) * 10 + 1
        assert next(read) == consumed + 1  # nothing read after the close

    def test_a_bad_argument_fails_when_the_stream_is_made(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        with pytest.raises(da.ConfigurationError, match="chunk_size"):
            client.stream_basic(numbers(2), text="x", chunk_size=0)
        assert simulator.server.stats.requests == 0


class TestOptions:
    def test_a_view_without_retries_fails_at_once_where_the_client_retries(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        no_retries = client.with_options(retry=da.RetryPolicy(attempts=1))
        simulator.script(Fault.status(503))
        [failure] = no_retries.send_basic(numbers(1), text="x").failed
        assert isinstance(failure.error, da.ServiceUnavailableError)
        simulator.script(Fault.status(503))
        assert client.send_basic(numbers(1, 1), text="x").ok
        assert simulator.server.stats.status_counts[503] == 2
        assert simulator.server.stats.token_calls == 1

    def test_closing_a_view_leaves_the_client_open(self, client: da.DispatchClient) -> None:
        view = client.with_options(timeout=5.0)
        with view:
            assert view.send_basic(numbers(1), text="x").ok
        assert "view" in repr(view)
        assert client.send_basic(numbers(1, 1), text="x").ok

    def test_a_bad_option_is_refused_at_once(self, client: da.DispatchClient) -> None:
        with pytest.raises(da.ConfigurationError, match="timeout"):
            client.with_options(timeout=-1)

    def test_a_view_without_options_is_still_a_view_its_close_does_nothing(
        self, client: da.DispatchClient
    ) -> None:
        # with_options(timeout=None) means "keep the client's": as from a config with no overrides.
        view = client.with_options(timeout=None, retry=None)
        with view:
            assert view.send_basic(numbers(1), text="x").ok
        assert "view" in repr(view)
        assert client.send_basic(numbers(1, 1), text="x").ok


class TestLifecycle:
    def test_the_loop_starts_on_first_use_and_stops_on_close(
        self, simulator: ThreadedSimulator
    ) -> None:
        client = da.DispatchClient(simulator.url, client_secret=SECRET, account="acme")
        assert loop_threads() == []
        client.send_basic(numbers(1), text="x")
        assert len(loop_threads()) == 1
        client.close()
        client.close()
        assert loop_threads() == []
        with pytest.raises(da.SessionClosedError):
            client.send_basic(numbers(1), text="x")

    def test_a_call_waiting_to_retry_when_another_thread_closes_says_the_client_closed(
        self, simulator: ThreadedSimulator
    ) -> None:
        waiting = threading.Event()

        def hook(event: object) -> None:
            if isinstance(event, da.instrumentation.RetryScheduled):
                waiting.set()  # the retry's sleep starts right after, on the same loop turn

        client = da.DispatchClient(
            simulator.url, client_secret=SECRET, account="acme", hooks=[hook]
        )
        simulator.script(Fault.status(503, retry_after="30"))
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.send_basic, numbers(1), text="x")
            assert waiting.wait(10)
            client.close()
            with pytest.raises(da.SessionClosedError) as caught:
                call.result(10)
        assert caught.value.result is not None
        [failure] = caught.value.result.failed
        assert failure.maybe_sent is False  # a 503: the service did not act

    def test_a_listing_waiting_for_its_turn_when_another_thread_closes_ends_at_once(
        self, simulator: ThreadedSimulator
    ) -> None:
        # One request every 100 s: the second listing waits for its turn on the loop.
        client = da.DispatchClient(simulator.url, client_secret=SECRET, requests_per_second=0.01)
        assert "templates" in client.list_templates()
        started = threading.Event()

        def listing() -> object:
            started.set()
            return client.list_templates()

        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(listing)
            assert started.wait(10)
            client.close()  # returns at once: it does not wait for the turn
            with pytest.raises(da.SessionClosedError):
                call.result(10)
        assert simulator.server.stats.requests == 1  # the first listing only

    def test_a_call_cut_short_by_close_in_another_thread_accounts_for_every_recipient(
        self, simulator: ThreadedSimulator
    ) -> None:
        # Eight chunks of ten hang in the service (it received them); twelve wait their turn.
        server = simulator.server
        simulator.script(*[Fault.hang()] * 8)
        client = da.DispatchClient(simulator.url, client_secret=SECRET, account="acme")
        given = numbers(200)
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.send_template, given, template_id="t", chunk_size=10)
            simulator.portal.call(
                lambda: server.wait_until(lambda: server.stats.recipients_received == 80)
            )
            client.close()
            with pytest.raises(da.SessionClosedError) as caught:
                call.result(10)
        result = caught.value.result
        assert result is not None
        assert not result.valid
        assert sorted(f.position for f in result.failed) == list(range(200))
        maybe_sent = {f.recipient.number for f in result.failed if f.maybe_sent}
        assert maybe_sent == set(server.stats.received)
        assert len(maybe_sent) == 80

    def test_closing_with_a_stream_half_read_closes_it_quietly(
        self, simulator: ThreadedSimulator, caplog: pytest.LogCaptureFixture
    ) -> None:
        client = da.DispatchClient(simulator.url, client_secret=SECRET, account="acme")
        stream = client.stream_basic(numbers(30), text="x", chunk_size=10)
        next(stream)
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            client.close()
        # The loop's own shutdown closed each nested generator at once ("already running").
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
        with pytest.raises(da.SessionClosedError):
            next(stream)

    def test_bad_arguments_fail_at_construction_without_a_thread(self) -> None:
        with pytest.raises(da.ConfigurationError, match="timeout"):
            da.DispatchClient("http://127.0.0.1:1", client_secret=SECRET, timeout=0)
        with pytest.raises(da.ConfigurationError, match="base_url"):
            da.DispatchClient("ftp://example.com", client_secret=SECRET)
        assert loop_threads() == []

    def test_from_env_and_a_repr_without_the_secret(
        self, simulator: ThreadedSimulator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("DISPATCH_BASE_URL", simulator.url)
        monkeypatch.setenv("DISPATCH_CLIENT_SECRET", SECRET)
        monkeypatch.setenv("DISPATCH_ACCOUNT", "acme")
        with da.DispatchClient.from_env(chunk_size=5) as client:
            assert client.send_basic(numbers(1), text="x").ok
            assert "acme" in repr(client)
            assert SECRET not in repr(client)

    def test_takes_every_argument_of_the_session_but_http_session(self) -> None:
        session = dict(inspect.signature(da.DispatchSession.__init__).parameters)
        del session["http_session"]
        client = dict(inspect.signature(da.DispatchClient.__init__).parameters)
        assert client.keys() == session.keys()
        for name, parameter in session.items():
            assert client[name].default == parameter.default, name
            assert client[name].annotation == parameter.annotation, name

    def test_the_secret_is_in_no_repr_of_anything_the_client_holds(
        self, client: da.DispatchClient
    ) -> None:
        # A traceback printer that shows locals (Sentry, rich) reprs what the client holds.
        assert client.send_basic(numbers(1), text="x").ok
        seen: set[int] = set()
        pending: list[object] = [client]
        while pending:
            item = pending.pop()
            if id(item) in seen or isinstance(item, type):
                continue
            seen.add(id(item))
            assert SECRET not in repr(item), type(item)
            if isinstance(item, dict):
                pending += list(item.values())
            elif isinstance(item, list | tuple | set | frozenset):
                pending += list(item)
            pending += list(getattr(item, "__dict__", {}).values())
            if isinstance(item, functools.partial):
                pending += [*item.args, *item.keywords.values()]

    def test_without_anyio_the_error_says_what_to_install(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "anyio.from_thread", None)
        with pytest.raises(da.ConfigurationError, match=r"dispatch-async\[sync\]"):
            da.DispatchClient("http://127.0.0.1:1", client_secret=SECRET)

    def test_closes_at_interpreter_exit_without_warnings(
        self, simulator: ThreadedSimulator
    ) -> None:
        # Registered before the client's own exit handler, so it runs after it.
        script = textwrap.dedent(
            f"""
            import atexit, threading
            atexit.register(lambda: print("threads left:", [
                t.name for t in threading.enumerate() if t.name == "dispatch-async"]))
            import dispatch_async as da
            client = da.DispatchClient({simulator.url!r}, client_secret={SECRET!r}, account="a")
            print("ok:", client.send_basic(["+5511987654321"], text="x").ok)
            """
        )
        done = subprocess.run(  # noqa: S603 - our interpreter, our script
            [sys.executable, "-W", "default", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:2] == ["ok: True", "threads left: []"]
        assert done.stderr == ""


@pytest.mark.filterwarnings(FORK_WARNING)
class TestFork:
    def test_a_child_forked_after_use_sends_on_its_own_and_the_parent_still_works(
        self, client: da.DispatchClient, simulator: ThreadedSimulator
    ) -> None:
        assert client.send_basic(numbers(1), text="parent").ok
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, and leave without running pytest's teardown
            try:
                ok = client.send_basic(numbers(1, 1), text="child").ok
                os.write(write_end, b"sent" if ok else b"failed")
            finally:
                os._exit(0)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as child_said:
            assert child_said.read() == b"sent"
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.send_basic(numbers(1, 2), text="parent again").ok
        # The child fetched its own token: it did not use the parent's token task.
        assert simulator.server.stats.token_calls == 2
        assert simulator.server.stats.dispatch_calls == 3

    def test_the_parent_still_works_after_a_child_exits_normally(
        self, simulator: ThreadedSimulator
    ) -> None:
        # A child that runs the interpreter's shutdown must not close what it inherited
        # (an epoll set and sockets it shares with the parent).
        script = textwrap.dedent(
            f"""
            import os, sys
            import dispatch_async as da
            client = da.DispatchClient({simulator.url!r}, client_secret={SECRET!r}, account="a")
            assert client.send_basic(["+5511987654321"], text="parent").ok
            if os.fork() == 0:
                assert client.send_basic(["+5511987654322"], text="child").ok
                sys.exit(0)
            _, status = os.wait()
            assert os.waitstatus_to_exitcode(status) == 0
            for n in range(3, 6):
                assert client.send_basic([f"+551198765432{{n}}"], text="again").ok
            print("parent ok")
            """
        )
        done = run_forking(script)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "parent ok\n"
        assert "Warning" not in done.stderr, done.stderr

    def test_a_stream_begun_before_the_fork_is_refused_in_the_child(
        self, client: da.DispatchClient
    ) -> None:
        stream = client.stream_basic(numbers(30), text="x", chunk_size=10)
        next(stream)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                next(stream)
                os.write(write_end, b"continued")
            except da.EventLoopError:
                os.write(write_end, b"refused")
            finally:
                os._exit(0)
        os.close(write_end)
        os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as child_said:
            assert child_said.read() == b"refused"
        assert len(list(stream)) == 2  # the parent's stream goes on

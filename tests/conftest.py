"""Shared fixtures: a real simulator on 127.0.0.1 and a session talking to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aioresponses.core
import hypothesis
import pytest
from aiohttp import ClientResponse

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer
from tests.cli_helpers import write_csv

SECRET = "test-secret"
#: A bound on a wait that only a hang reaches, however loaded the machine: tests check
#: what happened (an outcome), and use this, never a sub-second stopwatch, to fail a hang.
HANG = 30.0

# Hypothesis' per-example deadline (200 ms) times the machine, not the code: under coverage,
# mutation testing or a loaded host an example takes longer, and fails for nothing.
hypothesis.settings.register_profile("dispatch", deadline=None)
# Under mutation testing (mutmut sets MUTANT_UNDER_TEST in every process it runs tests in)
# each mutant reruns the properties: a few fixed examples find a broken function as well,
# and shrinking (the bulk of a failing property's time) tells mutmut nothing it uses.
hypothesis.settings.register_profile(
    "mutation",
    deadline=None,
    max_examples=10,
    derandomize=True,
    database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    # mutmut runs a test more than once in a process (to learn what it reaches, then
    # clean), each time on a new instance of its class; and a loaded machine is slow.
    suppress_health_check=[
        hypothesis.HealthCheck.differing_executors,
        hypothesis.HealthCheck.too_slow,
    ],
)
hypothesis.settings.load_profile("mutation" if "MUTANT_UNDER_TEST" in os.environ else "dispatch")

#: Under mutation testing, the test files that speak for each core module. mutmut runs a
#: mutant against every test that reaches the mutated function, and on the way to a
#: request most tests reach most functions: a surviving mutant cost the whole selection.
#: A mutant runs only the tests of its module's files among those (all of them if none).
MUTATION_TEST_FILES = {
    "_endpoints": {
        "test_endpoints",
        "test_simulator_recording",
        "test_before_send",
        "test_real_service",
    },
    "_wire": {
        "test_outcomes",
        "test_token_answer",
        "test_endpoints",
        "test_hostile_service",
        "test_real_service",
    },
    "_matching": {"test_outcomes", "test_properties", "test_positions", "test_hostile_service"},
    "_recipients": {
        "test_recipients",
        "test_positions",
        "test_properties",
        "test_batcher",
        "test_job_control",
    },
    "_batch": {"test_batcher", "test_plan", "test_job_control", "test_positions", "test_options"},
    "_retry": {"test_retry_timing", "test_outcomes", "test_token", "test_hostile_service"},
    "_auth": {
        "test_token",
        "test_token_answer",
        "test_real_service",
        "test_http_safety",
        "test_shared_token",
    },
    "_screen": {
        "test_exclude",
        "test_batcher",
        "test_plan",
        "test_before_send",
        "test_positions",
        "test_hostile_service",
    },
    "_throttle": {"test_adaptive_rate", "test_batcher", "test_options", "test_simulator_limits"},
}


def _signal_handling() -> tuple[object, object, int]:
    """What Ctrl-C and SIGTERM do in this process, and where a signal wakes a loop."""
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), wakeup_fd


@pytest.fixture(autouse=True)
def _signal_handling_left_as_found() -> Iterator[None]:
    """A test leaves the process's signal handling as it found it.

    A handler left behind (asyncio's no-op for a loop that is gone, say) would swallow a
    later test's real SIGINT: the blocking client's Ctrl-C tests would wait out their call.
    """
    before = _signal_handling()
    yield
    after = _signal_handling()
    assert after == before, f"signal handling (SIGINT, SIGTERM, wakeup fd): {before} -> {after}"


def _under_a_mutant() -> str | None:
    """The module of the mutant mutmut runs the tests against (``_retry``), if any."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")  # "dispatch_async._retry.x_f__mutmut_3"
    return mutant.split(".")[1] if "__mutmut_" in mutant else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    module = _under_a_mutant()
    if module is None:
        return
    files = MUTATION_TEST_FILES.get(module, set())
    kept = [item for item in items if item.path.stem in files]
    if kept and len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop has no Windows build
    uvloop = None


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test on asyncio's loop; those marked ``both_loops`` on uvloop's too.

    The receivers and the SDK's transport run under uvicorn on uvloop as often as not:
    their modules are marked (``pytestmark``), and each of their tests runs twice.
    """
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None and item.get_closest_marker("both_loops") is not None:
        loops["uvloop"] = uvloop.new_event_loop
    return loops


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """Under a mutant, a test that runs past HANG fails (killed), even one the mutant sent
    into an endless loop on the event loop's thread, where no asyncio timeout can reach:
    mutmut's own limit comes from every test of the function, minutes for a hang."""
    if _under_a_mutant() is None:
        return (yield)

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"ran past {HANG:.0f}s under a mutant")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(int(HANG))
    try:
        return (yield)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


TEMPLATE = {"template_id": "pix_reminder"}


def numbers(count: int, start: int = 0) -> list[str]:
    """Distinct numbers both the simulator and phonenumbers accept (Sao Paulo mobiles)."""
    return [f"+55119{i:08d}" for i in range(start, start + count)]


def spreadsheet_numbers(count: int) -> list[str]:
    """Distinct local Brazilian numbers as a spreadsheet holds them; every tenth is "123"."""
    return [
        "123" if i % 10 == 9 else f"(11) 9{i // 10_000:04d}-{i % 10_000:04d}" for i in range(count)
    ]


@contextlib.asynccontextmanager
async def loop_turns() -> AsyncIterator[list[int]]:
    """How often the event loop let another task run, so far: ``[count]``.

    A task that counts and yields at once; it runs again whenever the loop gets a turn,
    so a stretch of code that never yields leaves the count where it was.
    """
    count = [0]

    async def turn() -> None:
        while True:
            count[0] += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(turn())
    await asyncio.sleep(0)
    try:
        yield count
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def stalling(given: list[str]) -> AsyncIterator[str]:
    """*given*, then nothing more and no end either: a source with nothing for now."""
    for number in given:
        yield number
    await asyncio.Event().wait()
    yield "never"


def session_for(server: FakeDispatchServer, **settings: Any) -> da.DispatchSession:
    """A session on *server* that never waits between retries, with *settings* on top."""
    settings.setdefault("retry", da.RetryPolicy(wait=False))
    settings.setdefault("account", "acme")
    return da.DispatchSession(server.url, client_secret=server.client_secret, **settings)


class _SentWriter:
    output_size = 0


class _CompatibleResponse(ClientResponse):
    # aiohttp 3.14 made ClientResponse's stream_writer required and aioresponses 0.7.9
    # does not pass it yet (pnuckowski/aioresponses#289): give it a finished writer.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stream_writer", _SentWriter())
        super().__init__(*args, **kwargs)


aioresponses.core.ClientResponse = _CompatibleResponse  # type: ignore[misc]


@pytest.fixture
async def server() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer(client_secret=SECRET) as fake:
        yield fake


@pytest.fixture
def no_waits() -> da.RetryPolicy:
    return da.RetryPolicy(wait=False)


@pytest.fixture
async def session(
    server: FakeDispatchServer, no_waits: da.RetryPolicy
) -> AsyncIterator[da.DispatchSession]:
    async with da.DispatchSession(
        server.url, client_secret=SECRET, account="acme", retry=no_waits
    ) as s:
        yield s


# -- the command line (tests/cli_helpers.py runs it) ---------------------------------


@pytest.fixture
def env(server: FakeDispatchServer) -> dict[str, str]:
    """The environment of a configured user: DISPATCH_* pointing at the simulator."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    return clean | {
        "DISPATCH_BASE_URL": server.url,
        "DISPATCH_CLIENT_SECRET": SECRET,
        "DISPATCH_ACCOUNT": "acme",
    }


@pytest.fixture
def contacts(tmp_path: Path) -> Path:
    """A small CSV: a number column and two vars, one invalid number."""
    rows = [f"{n},Ana,PIX{i}" for i, n in enumerate(numbers(4))] + ["12345,Bia,PIX9"]
    return write_csv(tmp_path / "contacts.csv", "number,name,pixCode", rows)

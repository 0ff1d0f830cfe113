"""``dispatch-async callbacks serve``: the receiver as a real process on 127.0.0.1, fed by
real HTTP posts (by hand, and by the simulator after a real send)."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from dispatch_async.callbacks import DeliveryStatus, DeliveryTracker
from dispatch_async.testing import CallbackPlan, FakeDispatchServer

from .conftest import SECRET, numbers, session_for
from .receiver_process import COMMAND, receiver_process

EVENT = {
    "reference": "m-1",
    "campaign_name": "july",
    "direction": "inbound",
    "user_id": "5511987654321",
    "channel": "RCS",
    "type": "READ",
}


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(client: aiohttp.ClientSession, url: str, event: object = EVENT) -> int:
    async with client.post(url, data=orjson.dumps(event)) as answer:
        return answer.status


async def stored(store: Path, reference: str) -> DeliveryStatus | None:
    async with DeliveryTracker(store) as tracker:
        state = await tracker.message(reference)
    return None if state is None else state.status


class TestServe:
    async def test_stores_what_it_acknowledges_and_stops_cleanly_on_sigterm(
        self, tmp_path: Path, client: aiohttp.ClientSession
    ) -> None:
        store = tmp_path / "deliveries.sqlite3"
        async with receiver_process(store) as receiver:
            assert await post(client, receiver.url) == 200
            assert await post(client, f"{receiver.base}/not-the-token-at-all") == 404
            assert await post(client, receiver.url, ["not", "an", "event"]) == 400
            receiver.process.send_signal(signal.SIGTERM)
            assert await receiver.process.wait() == 0
        assert await stored(store, "m-1") is DeliveryStatus.READ

    async def test_makes_a_private_token_once_and_keeps_it(
        self, tmp_path: Path, client: aiohttp.ClientSession
    ) -> None:
        store = tmp_path / "deliveries.sqlite3"
        async with receiver_process(store) as first:
            pass
        token_file = tmp_path / "deliveries.sqlite3.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        async with receiver_process(store) as second:
            assert second.token == first.token
            assert len(second.token) >= 43
            assert await post(client, second.url) == 200

    async def test_takes_the_token_from_the_environment(
        self, tmp_path: Path, client: aiohttp.ClientSession
    ) -> None:
        token = "a-token-the-operator-chose-0123456789"
        store = tmp_path / "deliveries.sqlite3"
        async with receiver_process(store, env={"DISPATCH_CALLBACK_TOKEN": token}) as receiver:
            assert receiver.url.endswith(f"/{token}")
            assert await post(client, receiver.url) == 200
        assert not (tmp_path / "deliveries.sqlite3.token").exists()

    async def test_never_prints_the_token_nor_a_number(
        self, tmp_path: Path, client: aiohttp.ClientSession
    ) -> None:
        store = tmp_path / "deliveries.sqlite3"
        async with receiver_process(store, "-v") as receiver:
            await post(client, receiver.url)
            await post(client, f"{receiver.base}/{receiver.token[:-1]}")
            await post(client, receiver.url, {"user_id": "5511987654321"})
            receiver.process.send_signal(signal.SIGTERM)
            out, err = await receiver.process.communicate()
        text = (out + err).decode()
        assert "refused a callback" in text  # it does log, at -v
        assert receiver.token not in text
        assert "5511987654321" not in text

    async def test_refuses_callers_off_its_allow_list(
        self, tmp_path: Path, client: aiohttp.ClientSession
    ) -> None:
        store = tmp_path / "deliveries.sqlite3"
        async with receiver_process(store, "--allow-ip", "10.0.0.0/8") as receiver:
            assert await post(client, receiver.url) == 403
        assert await stored(store, "m-1") is None


class TestWithTheSimulator:
    async def test_a_send_with_callbacks_ends_tracked(self, tmp_path: Path) -> None:
        store = tmp_path / "deliveries.sqlite3"
        plan = CallbackPlan(read=1.0, duplicates=0.3, reorder=0.5, seed=5)
        async with (
            receiver_process(store) as receiver,
            FakeDispatchServer(client_secret=SECRET, callbacks=plan) as server,
        ):
            async with session_for(server) as session:
                result = await session.send_basic(
                    numbers(30), text="oi", campaign_name="july", callback=receiver.url
                )
            assert server.callbacks is not None
            await server.callbacks.settled()
            assert server.callbacks.stats.given_up == 0
        async with DeliveryTracker(store) as tracker:
            assert await tracker.counts("july") == {DeliveryStatus.READ: 30}
            for id_ in result.valid.ids:
                assert len(await tracker.events(id_)) == 3


class TestUsage:
    async def test_needs_a_store(self, tmp_path: Path) -> None:
        done = await asyncio.create_subprocess_exec(
            *COMMAND, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
        )
        _, err = await done.communicate()
        assert done.returncode == 2
        assert b"--store FILE or --redis URL" in err

    async def test_a_file_that_is_not_sqlite_is_refused(self, tmp_path: Path) -> None:
        store = tmp_path / "deliveries.sqlite3"
        await asyncio.to_thread(store.write_bytes, b"this is not a database" * 200)
        done = await asyncio.create_subprocess_exec(
            *COMMAND,
            "--store",
            str(store),
            "--port",
            "0",
            stderr=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            env=dict(os.environ),
        )
        _, err = await done.communicate()
        assert done.returncode == 2
        assert b"not a usable SQLite database" in err
        assert b"Traceback" not in err


def test_the_command_is_listed() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "dispatch_async._cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "callbacks" in done.stdout

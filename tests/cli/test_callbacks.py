"""``dispatch-async callbacks serve``: the receiver as a real process on 127.0.0.1, fed by
real HTTP posts (by hand, and by the simulator after a real send)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from dispatch_async._cli.callbacks import ServeConfig, _token
from dispatch_async._cli.commands import cli as main
from dispatch_async._cli.job.reconcile import _locked, _rewrite, reconcile
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.callbacks import DeliveryStatus, DeliveryTracker, parse_event
from dispatch_async.testing import CallbackPlan, FakeDispatchServer, Fault
from tests.cli_helpers import dispatch_async, killed_with_a_request_in_flight
from tests.conftest import SECRET, numbers, session_for
from tests.receiver_process import COMMAND, receiver_process

MAYBE_SENT_RECORD = (
    '{"line":2,"number":"+5511987654321","outcome":"maybe_sent","error":"500",'
    '"error_type":"ServerError"}\n'
)
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


class TestSecretsStayPrivate:
    def test_the_journal_holding_the_callback_url_is_private(self, tmp_path: Path) -> None:
        from dispatch_async._cli.job.journal import JobFiles

        files = JobFiles(tmp_path / "results.jsonl", max_line=10, options=b'{"callback":"x"}')
        files.start(resume=False, resend_maybe_sent=False, dedupe=None)
        try:
            assert stat.S_IMODE(files.journal.stat().st_mode) == 0o600
        finally:
            files.close()


class TestEmptyToken:
    """An empty token would make the server run with a random one nobody knows."""

    async def serve(self, tmp_path: Path, *args: str, env: dict[str, str]) -> str:
        """Its output once it exited 2 (bounded: the old server served on, unreachable)."""
        base = {k: v for k, v in os.environ.items() if k != "DISPATCH_CALLBACK_TOKEN"}
        store = str(tmp_path / "deliveries.sqlite3")
        process = await asyncio.create_subprocess_exec(
            *COMMAND,
            "--store",
            store,
            "--port",
            "0",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**base, **env},
        )
        try:
            async with asyncio.timeout(20):
                out, err = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.communicate()
            raise AssertionError("it served with a token nobody knows") from None
        text = (out + err).decode()
        assert process.returncode == 2, text
        assert "Traceback" not in text
        return text

    async def test_an_empty_token_file_is_refused_naming_it(self, tmp_path: Path) -> None:
        token_file = tmp_path / "deliveries.sqlite3.token"
        await asyncio.to_thread(token_file.write_text, "\n")
        out = await self.serve(tmp_path, env={})
        assert f"the token file {token_file} is empty" in out

    async def test_a_blank_token_variable_is_refused_naming_it(self, tmp_path: Path) -> None:
        out = await self.serve(tmp_path, env={"DISPATCH_CALLBACK_TOKEN": "  "})
        assert "$DISPATCH_CALLBACK_TOKEN is empty" in out

    async def test_a_made_token_file_is_whole_and_leaves_no_scratch(self, tmp_path: Path) -> None:
        async with receiver_process(tmp_path / "deliveries.sqlite3") as receiver:
            pass
        assert len(receiver.token) >= 43
        names = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.iterdir()))
        assert not [n for n in names if n.endswith(".tmp")]


@pytest.mark.parametrize("command", ["serve", "reconcile"])
def test_the_key_prefix_comes_from_where_every_command_takes_it(command: str) -> None:
    from click.testing import CliRunner

    from dispatch_async._cli.commands import cli as main

    done = CliRunner().invoke(main, ["callbacks", command, "--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    assert "[DISPATCH_KEY_PREFIX]" in done.output


def test_the_command_is_listed() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "dispatch_async._cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "callbacks" in done.stdout


class TestReconcile:
    """A job whose chunk the service acted on before answering 500: its maybe_sent
    records, and the callbacks the simulator posted meanwhile to `callbacks serve`."""

    async def job(
        self, tmp_path: Path, plan: CallbackPlan, *, url_in_env: bool = False, local: bool = False
    ) -> tuple[Path, Path, FakeDispatchServer]:
        """*local*: the input has the numbers without +55, sent with --prevalidate."""
        store = tmp_path / "deliveries.sqlite3"
        results = tmp_path / "results.jsonl"
        written = [n[3:] if local else n for n in numbers(6)]
        rows = "number\n" + "".join(f"{n}\n" for n in written)
        await asyncio.to_thread((tmp_path / "in.csv").write_text, rows)
        async with (
            receiver_process(store) as receiver,
            FakeDispatchServer(client_secret=SECRET, callbacks=plan) as server,
        ):
            server.script_for(numbers(6)[3], Fault.status(500))  # the second chunk of 3
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")},
                "DISPATCH_BASE_URL": server.url,
                "DISPATCH_CLIENT_SECRET": SECRET,
                "DISPATCH_ACCOUNT": "acme",
            }
            callback = ("--callback", receiver.url)
            if local:
                callback += ("--prevalidate", "--region", "BR")
            if url_in_env:
                env["DISPATCH_CALLBACK_URL"], callback = receiver.url, ()
            await cli(
                "send",
                "basic",
                "--text",
                "oi",
                "-i",
                tmp_path / "in.csv",
                "-o",
                results,
                "--chunk-size",
                "3",
                "--campaign-name",
                "job-1",
                *callback,
                "-q",
                env=env,
                expect=1,
            )
            assert server.callbacks is not None
            await server.callbacks.settled()
        return results, store, server

    async def test_confirmed_records_become_sent_with_the_callbacks_reference(
        self, tmp_path: Path
    ) -> None:
        results, store, _ = await self.job(tmp_path, CallbackPlan(read=0.0, seed=2))
        before = records_by_line(results)
        assert [before[line]["outcome"] for line in range(2, 8)] == ["sent"] * 3 + [
            "maybe_sent"
        ] * 3
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=0,
        )
        assert "3 confirmed sent by callbacks, 0 still maybe_sent" in out
        after = records_by_line(results)
        assert all(after[line]["outcome"] == "sent" for line in range(2, 8))
        for line in (2, 3, 4):
            assert after[line] == before[line]  # untouched
        async with DeliveryTracker(store) as tracker:
            for line in (5, 6, 7):
                state = await tracker.message(after[line]["id"])
                assert state is not None
                assert state.number == after[line]["number"].lstrip("+")
        assert not await asyncio.to_thread(lambda: list(tmp_path.glob("*.reconcile")))
        again = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=0,
        )
        assert "0 maybe_sent" in again
        assert records_by_line(results) == after
        exported = await cli(
            "export",
            results,
            "-i",
            tmp_path / "in.csv",
            "--outcome",
            "maybe_sent",
            expect=0,
        )
        assert not any(n in exported for n in numbers(6))

    async def test_the_callback_url_can_come_from_the_environment_not_argv(
        self, tmp_path: Path
    ) -> None:
        _, store, _ = await self.job(tmp_path, CallbackPlan(read=0.0, seed=2), url_in_env=True)
        async with DeliveryTracker(store) as tracker:
            assert sum((await tracker.counts("job-1")).values()) == 6

    async def test_confirms_local_numbers_sent_in_e164_by_prevalidate(self, tmp_path: Path) -> None:
        results, store, _ = await self.job(tmp_path, CallbackPlan(read=0.0, seed=2), local=True)
        before = records_by_line(results)
        assert [before[line].get("sent_as") for line in (5, 6, 7)] == numbers(6)[3:]
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=0,
        )
        assert "3 confirmed sent by callbacks, 0 still maybe_sent" in out
        after = records_by_line(results)
        for line, number in zip((5, 6, 7), numbers(6)[3:], strict=True):
            assert after[line]["outcome"] == "sent"
            assert (after[line]["number"], after[line]["sent_as"]) == (number[3:], number)

    async def test_without_callbacks_records_stay_maybe_sent(self, tmp_path: Path) -> None:
        results, store, _ = await self.job(tmp_path, CallbackPlan(drop=1.0))
        before = await asyncio.to_thread(results.read_bytes)
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=1,
        )
        assert "0 confirmed sent by callbacks, 3 still maybe_sent" in out
        assert await asyncio.to_thread(results.read_bytes) == before
        exported = await cli(
            "export",
            results,
            "-i",
            tmp_path / "in.csv",
            "--outcome",
            "maybe_sent",
            expect=0,
        )
        assert [n for n in numbers(6) if n in exported] == numbers(6)[3:]

    async def test_another_campaigns_callbacks_confirm_nothing(self, tmp_path: Path) -> None:
        results, store, _ = await self.job(tmp_path, CallbackPlan(seed=2))
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "another-job",
            expect=1,
        )
        assert "3 still maybe_sent" in out

    async def test_callbacks_from_before_the_run_confirm_nothing(self, tmp_path: Path) -> None:
        results, _, _ = await self.job(tmp_path, CallbackPlan(read=0.0, seed=2))
        assert all("since" in records_by_line(results)[line] for line in (5, 6, 7))
        old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
        record = (
            '{"line":2,"number":"+5511987654321","outcome":"maybe_sent","error":"500",'
            '"error_type":"ServerError","since":"2026-01-01T00:00:00+00:00"}\n'
        )
        await asyncio.to_thread(old.write_text, record)
        await asyncio.to_thread(new.write_text, record)
        events = tmp_path / "events.sqlite3"
        async with DeliveryTracker(events) as tracker:
            body = {**EVENT, "campaign_name": "pix", "direction": "outbound", "type": "basic"}
            await tracker.record(
                parse_event(
                    orjson.dumps(
                        {**body, "reference": "OLD-1", "timestamp": "2025-01-01T09:00:00Z"}
                    )
                )
            )
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            old,
            "--store",
            events,
            "--campaign-name",
            "pix",
            expect=1,
        )
        assert "0 confirmed" in out
        async with DeliveryTracker(events) as tracker:
            await tracker.record(
                parse_event(
                    orjson.dumps(
                        {**body, "reference": "NEW-1", "timestamp": "2026-01-01T00:00:01Z"}
                    )
                )
            )
        await cli(
            "callbacks",
            "reconcile",
            "-o",
            new,
            "--store",
            events,
            "--campaign-name",
            "pix",
            expect=0,
        )
        assert records_by_line(new)[2]["id"] == "NEW-1"

    async def test_a_store_that_does_not_exist_is_refused_not_made(self, tmp_path: Path) -> None:
        results = tmp_path / "results.jsonl"
        await asyncio.to_thread(results.write_text, MAYBE_SENT_RECORD)
        store = tmp_path / "delivreies.sqlite3"
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=2,
        )
        assert f"--store {store} does not exist" in out
        assert not await asyncio.to_thread(store.exists)

    async def test_warns_when_the_store_has_nothing_of_the_campaign(self, tmp_path: Path) -> None:
        results, store, _ = await self.job(tmp_path, CallbackPlan(seed=2))
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-l",
            expect=1,
        )
        assert "no message of campaign 'job-l'" in out

    async def test_a_resume_refused_while_it_runs_leaves_no_journal_behind(
        self, tmp_path: Path
    ) -> None:
        from dispatch_async._cli.job.reconcile import _locked

        results, store, _ = await self.job(tmp_path, CallbackPlan(read=0.0, seed=2))
        async with FakeDispatchServer(client_secret=SECRET) as server:
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")},
                "DISPATCH_BASE_URL": server.url,
                "DISPATCH_CLIENT_SECRET": SECRET,
                "DISPATCH_ACCOUNT": "acme",
            }
            with _locked(results):  # what reconcile holds while it runs
                out = await cli(
                    "send",
                    "basic",
                    "--text",
                    "oi",
                    "-i",
                    tmp_path / "in.csv",
                    "-o",
                    results,
                    "--resume",
                    "-q",
                    env=env,
                    expect=2,
                )
        assert "another dispatch-async run" in out
        assert not await asyncio.to_thread((tmp_path / "results.jsonl.pending").exists)
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            store,
            "--campaign-name",
            "job-1",
            expect=0,
        )
        assert "3 confirmed" in out

    async def test_an_unfinished_job_is_refused(self, tmp_path: Path) -> None:
        results = tmp_path / "results.jsonl"
        await asyncio.to_thread(results.write_text, "")
        await asyncio.to_thread((tmp_path / "results.jsonl.pending").write_text, "x\n")
        async with DeliveryTracker(tmp_path / "d.sqlite3"):
            pass
        out = await cli(
            "callbacks",
            "reconcile",
            "-o",
            results,
            "--store",
            tmp_path / "d.sqlite3",
            "--campaign-name",
            "job-1",
            expect=2,
        )
        assert "still has a journal" in out


class TestReconcileAcrossRuns:
    """One number ``maybe_sent`` on line 2 (run 1, stopped) and on line 3 (a resume,
    stopped again), and the callbacks stored for it: a results file and a store written
    here, read by the real command."""

    RUN_1, RUN_2 = "2026-01-01T09:00:00+00:00", "2026-01-01T10:00:00+00:00"

    async def reconcile(
        self, tmp_path: Path, callbacks: dict[str, str], *, expect: int
    ) -> tuple[str, dict[int, dict[str, Any]]]:
        """*callbacks*: reference -> time of its message's first event."""
        results, store = tmp_path / "results.jsonl", tmp_path / "events.sqlite3"
        lines = [
            {"line": line, "number": "+5511987654321", "outcome": "maybe_sent", "error": "x",
             "error_type": "Interrupted", "since": since}
            for line, since in ((2, self.RUN_1), (3, self.RUN_2))
        ]  # fmt: skip
        await asyncio.to_thread(
            results.write_bytes, b"".join(orjson.dumps(r) + b"\n" for r in lines)
        )
        async with DeliveryTracker(store) as tracker:
            for reference, at in callbacks.items():
                body = {**EVENT, "reference": reference, "campaign_name": "pix",
                        "direction": "outbound", "type": "basic", "timestamp": at}  # fmt: skip
                await tracker.record(parse_event(orjson.dumps(body)))
        out = await cli(
            "callbacks", "reconcile", "-o", results, "--store", store, "--campaign-name", "pix",
            expect=expect,
        )  # fmt: skip
        return out, records_by_line(results)

    async def test_a_callback_either_run_could_have_caused_confirms_neither_line(
        self, tmp_path: Path
    ) -> None:
        # Marking line 2 sent would lose it, and export would give line 3 to send twice.
        out, after = await self.reconcile(tmp_path, {"r-1": "2026-01-01T10:00:30Z"}, expect=1)
        assert "0 confirmed sent by callbacks, 2 still maybe_sent" in out
        assert [after[line]["outcome"] for line in (2, 3)] == ["maybe_sent", "maybe_sent"]

    async def test_a_callback_after_each_runs_start_confirms_each_line_marked_as_such(
        self, tmp_path: Path
    ) -> None:
        callbacks = {"late": "2026-01-01T10:00:30Z", "early": "2026-01-01T09:00:30Z"}
        out, after = await self.reconcile(tmp_path, callbacks, expect=0)
        assert "2 confirmed sent by callbacks, 0 still maybe_sent" in out
        assert [after[line] for line in (2, 3)] == [
            {"line": line, "number": "+5511987654321", "outcome": "sent", "id": id_,
             "confirmed_by": "callback"}
            for line, id_ in ((2, "early"), (3, "late"))
        ]  # fmt: skip
        exported = await cli(
            "export", tmp_path / "results.jsonl", "-i", await self.input(tmp_path),
            "--outcome", "sent", expect=0,
        )  # fmt: skip
        assert exported.count("+5511987654321") == 2

    async def input(self, tmp_path: Path) -> Path:
        """The job's input: the number on lines 2 and 3."""
        source = tmp_path / "in.csv"
        await asyncio.to_thread(source.write_text, "number\n+5511987654321\n+5511987654321\n")
        return source


class TestReconcileAfterAKill:
    async def test_lines_a_killed_run_left_in_flight_are_confirmed_by_their_callbacks(
        self, tmp_path: Path
    ) -> None:
        """A --prevalidate job of local numbers killed (SIGKILL) with a chunk in flight
        that the service acted on: the resume records it maybe_sent as the kill left it
        (the number as sent, the killed run's start), and reconcile confirms it."""
        store, results = tmp_path / "deliveries.sqlite3", tmp_path / "results.jsonl"
        source = tmp_path / "in.csv"
        await asyncio.to_thread(
            source.write_text, "number\n" + "".join(f"{n[3:]}\n" for n in numbers(9))
        )
        # Each answer takes 0.5 s: answered at once, the last chunks were sent before the
        # first one's records were seen and requests held, and the run ended unkilled.
        plan = CallbackPlan(read=0.0)
        async with (
            receiver_process(store) as receiver,
            FakeDispatchServer(client_secret=SECRET, callbacks=plan, latency=0.5) as server,
        ):
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")},
                "DISPATCH_BASE_URL": server.url,
                "DISPATCH_CLIENT_SECRET": SECRET,
                "DISPATCH_ACCOUNT": "acme",
            }
            started = dt.datetime.now(dt.UTC).replace(microsecond=0)
            await killed_with_a_request_in_flight(
                server, env,
                "send", "basic", "--text", "oi", "-i", source, "-o", results, "-q",
                "--chunk-size", "3", "--concurrency", "1", "--campaign-name", "job-1",
                "--callback", receiver.url, "--prevalidate", "--region", "BR",
                records=3,
            )  # fmt: skip
            killed = dt.datetime.now(dt.UTC)
            resumed = await dispatch_async("send", "--resume", "-o", results, "-q", env=env)
            assert resumed.code == 1, resumed.stderr  # 1: some lines are maybe_sent
            assert server.callbacks is not None
            await server.callbacks.settled()
        maybe = [r for r in records_by_line(results).values() if r["outcome"] == "maybe_sent"]
        assert len(maybe) == 3, "the chunk in flight"
        for record in maybe:
            assert record["sent_as"] == "+55" + record["number"]
            assert started <= dt.datetime.fromisoformat(record["since"]) <= killed
        out = await cli(
            "callbacks", "reconcile", "-o", results, "--store", store, "--campaign-name", "job-1",
            expect=0,
        )  # fmt: skip
        assert "3 confirmed sent by callbacks, 0 still maybe_sent" in out


async def cli(*args: str | Path, env: dict[str, str] | None = None, expect: int) -> str:
    """Run the command; its stdout and stderr, once it exited with *expect*."""
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_async._cli",
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or dict(os.environ),
    )
    out, err = await done.communicate()
    text = (out + err).decode()
    assert done.returncode == expect, text
    return text


def records_by_line(path: Path) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for raw in path.read_bytes().splitlines():
        record = orjson.loads(raw)
        found.setdefault(record["line"], record)
    return found


class TestCallbacksUsageInProcess:
    """In-process (click's runner): what the callbacks commands refuse, and the token file."""

    def invoke(self, *args: str) -> tuple[int, str]:
        done = CliRunner().invoke(main, ["callbacks", *args], env={"DISPATCH_CALLBACK_TOKEN": None})
        return done.exit_code, done.output.splitlines()[-1]

    def test_serve_on_redis_needs_a_token_and_reconcile_one_store(self, tmp_path: Path) -> None:
        assert self.invoke("serve", "--redis", "redis://127.0.0.1:9/0") == (
            2, "Error: with --redis, give --token-file FILE or $DISPATCH_CALLBACK_TOKEN",
        )  # fmt: skip
        store = tmp_path / "d.sqlite3"
        assert self.invoke(
            "reconcile", "-o", str(tmp_path / "r.jsonl"), "--store", str(store),
            "--redis", "redis://127.0.0.1:9/0", "--campaign-name", "c",
        ) == (2, "Error: give --store FILE or --redis URL (one of them)")  # fmt: skip

    def test_reconcile_against_a_redis_it_cannot_reach_exits_2_naming_it(
        self, tmp_path: Path
    ) -> None:
        results = tmp_path / "r.jsonl"
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        results.write_text('{"line":2,"number":"+5511900000001","outcome":"maybe_sent"}\n')
        code, last = self.invoke(
            "reconcile", "-o", str(results), "--redis", f"redis://127.0.0.1:{port}/0",
            "--campaign-name", "c",
        )  # fmt: skip
        assert code == 2
        assert last.startswith("Error: ")

    def test_a_token_file_given_wins_over_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        token_file = tmp_path / "token"
        token_file.write_text("from-the-file\n")
        monkeypatch.setenv("DISPATCH_CALLBACK_TOKEN", "from-the-environment")
        config = ServeConfig(
            store=None, redis="redis://127.0.0.1:9/0", key_prefix="p", host="127.0.0.1",
            port=0, path="cb", token_file=token_file, allowed_ips=(), max_body_bytes=1024,
            verbose=0,
        )  # fmt: skip
        assert _token(config) == "from-the-file"


class TestReconcileReadsOnlyResults:
    """In-process: what reconcile refuses to read, and which records it counts."""

    async def refusal(self, tmp_path: Path, results: Path) -> str:
        async with DeliveryTracker(tmp_path / "d.sqlite3") as tracker:
            with pytest.raises(Problem) as refused:
                await reconcile(results, tracker, "c")
        return refused.value.message

    async def test_a_file_that_is_not_whole_records_is_refused_by_line(
        self, tmp_path: Path
    ) -> None:
        results = tmp_path / "r.jsonl"
        first = b'{"line":2,"number":"+5511900000001","outcome":"sent","id":"a"}\n'
        cases = {
            first + b"{not json\n": f"{results} line 2 is not a dispatch-async record",
            first + b'{"line":3}\n': f"{results} line 2 is not a dispatch-async record",
            first + b'["line", 3]\n': f"{results} line 2 is not a whole dispatch-async record",
            first + first[:-1]: f"{results} line 2 is not a whole dispatch-async record",
        }
        for content, message in cases.items():
            await asyncio.to_thread(results.write_bytes, content)
            assert await self.refusal(tmp_path, results) == message
        assert await self.refusal(tmp_path, tmp_path) == f"{tmp_path} is not a results file"

    async def test_a_file_another_run_holds_is_refused(self, tmp_path: Path) -> None:
        results = tmp_path / "r.jsonl"
        await asyncio.to_thread(results.write_bytes, b"")
        with _locked(results):
            message = await self.refusal(tmp_path, results)
        assert message == f"another dispatch-async run is using {results}"

    async def test_only_the_first_record_of_a_line_and_only_maybe_sent_ones_count(
        self, tmp_path: Path
    ) -> None:
        results = tmp_path / "r.jsonl"
        lines = [
            {"line": 2, "number": "+5511900000001", "outcome": "maybe_sent", "since": "soon"},
            {"line": 2, "number": "+5511900000001", "outcome": "maybe_sent"},
            {"line": 3, "number": "+5511900000002", "outcome": "not_sent"},
            {"line": 4, "number": "", "outcome": "maybe_sent"},
            {"line": 5, "number": "+5511900000003", "outcome": "maybe_sent",
             "since": "2026-11-27T16:00:00"},  # no zone: not a moment to compare with
        ]  # fmt: skip
        content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        await asyncio.to_thread(results.write_bytes, content)
        async with DeliveryTracker(tmp_path / "d.sqlite3") as tracker:
            done = await reconcile(results, tracker, "c")
        assert (done.maybe_sent, done.confirmed, done.left) == (2, 0, 2)
        assert await asyncio.to_thread(results.read_bytes) == content, "nothing confirmed"

    def test_a_rewrite_that_fails_leaves_the_results_as_they_were_and_no_scratch_file(
        self, tmp_path: Path
    ) -> None:
        results = tmp_path / "r.jsonl"
        content = b'{"line":2,"outcome":"maybe_sent"}\nnot a record\n'
        results.write_bytes(content)
        with pytest.raises(orjson.JSONDecodeError):
            _rewrite(results, {2: b'{"line":2,"outcome":"sent"}\n'})
        assert results.read_bytes() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]

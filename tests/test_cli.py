"""The ``dispatch-async`` command, run as a real process against the simulator on 127.0.0.1.

The simulator runs in the test's event loop, so its counters can be read directly; the
command runs as a subprocess, exactly as a user runs it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import signal
import struct
import sys
import termios
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from dispatch_async import DispatchSession, RateLimitedError, RetryPolicy
from dispatch_async.testing import FakeDispatchServer, Fault, argument_parser

SECRET = "cli-test-secret-never-printed"
COMMAND = (sys.executable, "-m", "dispatch_async._cli")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# -- helpers -----------------------------------------------------------------------


@attrs.frozen
class Run:
    code: int
    stdout: str
    stderr: str


async def dispatch_async(
    *args: str | Path,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    kill_after: float = 30.0,
) -> Run:
    """Run the command to its end; kill it if it is still running after *kill_after* s."""
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        *map(str, args),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
    )
    try:
        async with asyncio.timeout(kill_after):
            out, err = await process.communicate(stdin)
    except TimeoutError:
        process.kill()
        await process.communicate()
        raise
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


def numbers(count: int, start: int = 0) -> list[str]:
    return [f"+55119{i:08d}" for i in range(start, start + count)]


def write_csv(path: Path, header: str, lines: Iterable[str]) -> Path:
    path.write_text(header + "\n" + "".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_jsonl(path: Path, items: Iterable[object]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def by_line(path: Path) -> dict[int, dict[str, Any]]:
    """The output's records by input line, checking that no line has two."""
    found = records(path)
    lines = Counter(record["line"] for record in found)
    assert max(lines.values(), default=1) == 1, "a line was recorded twice"
    return {record["line"]: record for record in found}


def outcomes(path: Path) -> Counter[str]:
    return Counter(record["outcome"] for record in records(path))


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def has_journal(output: Path) -> bool:
    return Path(f"{output}.pending").exists()


async def wait_for_records(path: Path, count: int, process: asyncio.subprocess.Process) -> None:
    """Poll the output until it has *count* records (bounded: fail rather than hang)."""
    async with asyncio.timeout(20):
        while line_count(path) < count:
            assert process.returncode is None, "the job ended before it could be stopped"
            await asyncio.sleep(0.01)


# -- fixtures ----------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer(client_secret=SECRET) as fake:
        yield fake


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


# -- input -------------------------------------------------------------------------


class TestInput:
    async def test_sends_every_csv_row_and_records_it_by_line(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "template", "--template-id", "pix_reminder", "-i", contacts, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert sorted(found) == [2, 3, 4, 5, 6]
        assert [found[line]["number"] for line in (2, 3, 4, 5)] == numbers(4)
        assert server.stats.received == Counter([*numbers(4), "12345"])
        assert server.stats.calls_by_path == Counter({"template": 1})

    async def test_reads_jsonl(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_jsonl(
            tmp_path / "contacts.jsonl",
            [{"number": n, "vars": {"name": "Ana"}} for n in numbers(3)] + [{"number": "+5511"}],
        )
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "Olá", "-i", source, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        assert sorted(by_line(out)) == [1, 2, 3, 4]
        assert server.stats.received == Counter([*numbers(3), "+5511"])

    async def test_reads_stdin_when_the_input_is_a_dash(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        lines = "".join(json.dumps({"number": n}) + "\n" for n in numbers(3))
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "single", "--text", "hi", "-i", "-", "-o", out, env=env, stdin=lines.encode()
        )
        assert run.code == 0, run.stderr
        assert {r["line"]: r["outcome"] for r in records(out)} == {1: "sent", 2: "sent", 3: "sent"}
        assert server.stats.calls_by_path == Counter({"single": 1})

    async def test_reads_csv_from_stdin_too(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        text = "number,name\n" + "".join(f"{n},Ana\n" for n in numbers(2))
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", "-", "-o", out, env=env, stdin=text.encode()
        )
        assert run.code == 0, run.stderr
        assert sorted(by_line(out)) == [2, 3]

    async def test_the_number_column_and_headerless_columns_are_configurable(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        named = write_csv(tmp_path / "named.csv", "name,phone", [f"Ana,{n}" for n in numbers(2)])
        bare = write_csv(tmp_path / "bare.csv", f"{numbers(1, 2)[0]},Bia", [])
        first = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", named, "-o", tmp_path / "a.jsonl",
            "--number-column", "phone", env=env,
        )  # fmt: skip
        second = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", bare, "-o", tmp_path / "b.jsonl",
            "--columns", "number,name", env=env,
        )  # fmt: skip
        assert (first.code, second.code) == (0, 0), first.stderr + second.stderr
        assert sorted(by_line(tmp_path / "b.jsonl")) == [1]
        assert server.stats.received == Counter(numbers(3))

    async def test_malformed_rows_are_recorded_invalid_by_line_and_never_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        good = numbers(3)
        source = tmp_path / "contacts.jsonl"
        source.write_text(
            "\n".join(
                [
                    json.dumps({"number": good[0], "vars": {"name": "Ana"}}),
                    "{not json",
                    json.dumps({"vars": {"name": "no number"}}),
                    json.dumps({"number": good[1], "vars": {"age": 30}}),
                    "",
                    json.dumps({"number": good[2]}),
                    json.dumps(["+5511999999999"]),
                ]
            )
            + "\n",
            encoding="utf-8",
        )
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert sorted(found) == [1, 2, 3, 4, 6, 7]
        for line in (2, 3, 4, 7):
            assert found[line]["outcome"] == "invalid"
            assert found[line]["reason"] == "malformed input row"
            assert f"line {line}: malformed input row" in run.stderr
        assert found[4]["detail"] == "vars['age'] must be a string, not a number"
        assert server.stats.received == Counter([good[0], good[2]])

    async def test_a_csv_row_with_the_wrong_number_of_fields_is_malformed(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        good = numbers(2)
        source = write_csv(
            tmp_path / "c.csv",
            "number,name",
            [f"{good[0]},Ana", "+5511900000009,Bia,extra", f"{good[1]},Caio"],
        )
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        assert by_line(out)[3]["detail"] == "expected 2 fields, found 3"
        assert server.stats.received == Counter(good)


# -- output, summary, progress -----------------------------------------------------


class TestOutput:
    async def test_one_record_per_input_line_with_its_outcome(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "results.jsonl"
        run = await dispatch_async(
            "send", "template", "--template-id", "pix_reminder", "-i", contacts, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert set(found[2]) == {"line", "number", "outcome", "id"}
        assert found[2]["outcome"] == "sent"
        assert UUID.fullmatch(found[2]["id"])
        assert found[6] == {
            "line": 6,
            "number": "12345",
            "outcome": "invalid",
            "reason": "number must be a valid phone number",
        }
        assert not has_journal(out), "a finished job leaves no journal"

    async def test_the_summary_on_stderr_counts_outcomes_requests_and_rate(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "template", "--template-id", "pix_reminder", "-i", contacts,
            "-o", tmp_path / "r.jsonl", "--chunk-size", "2", env=env,
        )  # fmt: skip
        assert run.code == 0
        assert re.search(r"sent\s+4\n", run.stderr)
        assert re.search(r"invalid\s+1\n", run.stderr)
        assert re.search(r"not_sent\s+0\n", run.stderr)
        assert re.search(r"maybe_sent\s+0\n", run.stderr)
        assert re.search(r"done in [\d.]+ s\n", run.stderr)
        assert re.search(r"3 requests, 0 retries, [\d,]+ recipients/s", run.stderr)
        assert run.stdout == ""

    async def test_a_count_of_one_is_in_the_singular(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", [*numbers(1), "x,y", ","])
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "r.jsonl", env=env
        )
        assert run.code == 0, run.stderr
        assert re.search(r"\n  1 request, 0 retries, [\d,]+ recipients/s\n", run.stderr)
        assert "invalid includes 1 malformed input row\n" in run.stderr
        assert "skipped 1 empty row (" in run.stderr
        server.script(Fault.status(429, retry_after="0"))
        again = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "s.jsonl", env=env
        )
        assert re.search(r"\n  2 requests, 1 retry, [\d,]+ recipients/s\n", again.stderr)

    async def test_plain_progress_lines_when_stderr_is_not_a_terminal(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "template", "--template-id", "t", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--chunk-size", "1", "--concurrency", "1", "--progress-every", "0", env=env,
        )  # fmt: skip
        assert run.code == 0
        assert "progress: 5/5 lines (100%)" in run.stderr

    async def test_quiet_shows_no_progress(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "template", "--template-id", "t", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--chunk-size", "1", "--progress-every", "0", "--quiet", env=env,
        )  # fmt: skip
        assert run.code == 0
        assert "progress:" not in run.stderr
        assert "done in" in run.stderr

    async def test_a_progress_bar_on_a_terminal(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        # A terminal of 0 columns (a bare pty) gets plain lines: see the next test.
        code, shown = await on_a_terminal(
            "send", "template", "--template-id", "t", "-i", contacts, "-o", tmp_path / "r.jsonl",
            env=env, columns=120,
        )  # fmt: skip
        assert code == 0
        assert "sending: 100%" in shown
        assert "5.00/5.00" in shown

    async def test_a_terminal_without_columns_gets_plain_progress_lines(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        code, shown = await on_a_terminal(
            "send", "template", "--template-id", "t", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--chunk-size", "1", "--concurrency", "1", "--progress-every", "0",
            env=env, columns=0,
        )  # fmt: skip
        assert code == 0
        assert "progress: 5/5 lines (100%)" in shown


async def on_a_terminal(*args: str | Path, env: dict[str, str], columns: int) -> tuple[int, str]:
    """Run the command with stderr on a terminal *columns* wide; its code and what it showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(
        follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0)
    )
    try:
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=follower, env=env,
        )  # fmt: skip
        os.close(follower)
        follower = -1
        async with asyncio.timeout(30):
            code = await process.wait()
        return code, _drain(leader)
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)


def _drain(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


# -- exit codes and errors ---------------------------------------------------------


class TestExitCodes:
    async def test_exit_1_when_recipients_fail_and_the_summary_names_the_outcome(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(6))
        # One chunk the service acted on before failing, one it refused outright.
        server.script(Fault.status(500), Fault.status(503))
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", out,
            "--chunk-size", "2", "--concurrency", "1", "--attempts", "1", env=env,
        )  # fmt: skip
        assert run.code == 1, run.stderr
        assert outcomes(out) == Counter(sent=2, maybe_sent=2, not_sent=2)
        assert "failed: 2 not_sent, 2 maybe_sent" in run.stderr
        maybe = [r for r in records(out) if r["outcome"] == "maybe_sent"]
        assert maybe[0]["error_type"] == "ServerStatusError"

    @pytest.mark.parametrize(
        ("args", "unset", "message"),
        [
            ((), "DISPATCH_CLIENT_SECRET", "no client secret: set DISPATCH_CLIENT_SECRET"),
            ((), "DISPATCH_ACCOUNT", "no account: set DISPATCH_ACCOUNT or pass --account"),
            (("--base-url", "http://example.com"), None, "plain http is allowed only"),
            (("--number-column", "phone"), None, "the CSV has no 'phone' column"),
            (("--chunk-size", "0"), None, "Invalid value for '--chunk-size'"),
            (("--resend-maybe-sent",), None, "--resend-maybe-sent goes with --resume"),
        ],
    )
    async def test_exit_2_with_a_clear_message_for_configuration_errors(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        contacts: Path,
        tmp_path: Path,
        args: tuple[str, ...],
        unset: str | None,
        message: str,
    ) -> None:
        if unset is not None:
            env = {k: v for k, v in env.items() if k != unset}
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", out, *args, env=env
        )
        assert run.code == 2
        assert message in run.stderr
        assert "Traceback" not in run.stderr
        assert run.stderr.strip().splitlines()[-1].startswith("Error: ")
        assert not out.exists()
        assert server.stats.token_calls == 0

    async def test_exit_2_when_the_output_exists_and_resume_was_not_asked(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        out.write_text("keep me\n")
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", out, env=env
        )
        assert run.code == 2
        assert run.stderr.strip() == (
            f"Error: {out} exists: add --resume to continue that job, or choose another --output"
        )
        assert out.read_text() == "keep me\n"

    async def test_exit_2_when_the_service_rejects_the_secret(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", out,
            env=env | {"DISPATCH_CLIENT_SECRET": "wrong"},
        )  # fmt: skip
        assert run.code == 2
        assert run.stderr.strip().splitlines()[-1] == (
            "Error: the service rejected the client secret (HTTP 401)"
        )
        assert outcomes(out) == Counter(not_sent=5)

    async def test_deadline_stops_the_job_and_records_every_line_read(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(40))
        out = tmp_path / "r.jsonl"
        server.latency = 0.5
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", out,
            "--chunk-size", "5", "--concurrency", "2", "--deadline", "0.2", env=env,
        )  # fmt: skip
        assert run.code == 1
        assert "the deadline passed after input line" in run.stderr
        found = by_line(out)
        assert 0 < len(found) < 40
        assert sorted(found) == list(range(2, len(found) + 2)), "every line read is recorded"
        assert outcomes(out)["maybe_sent"] == 10, "the two requests in flight"
        assert has_journal(out), "the job is not finished: --resume goes on"

    async def test_secrets_are_never_printed_even_with_verbose(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        server.script(Fault.status(429, retry_after="0"), Fault.status(503, retry_after="0"))
        secret_file = tmp_path / "secret"
        secret_file.write_text(SECRET + "\n")
        no_secret_env = {k: v for k, v in env.items() if k != "DISPATCH_CLIENT_SECRET"}
        ok = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "a.jsonl",
            "--client-secret-file", secret_file, "-vv", env=no_secret_env,
        )  # fmt: skip
        rejected = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "b.jsonl", "-vv",
            env=env | {"DISPATCH_CLIENT_SECRET": "another-secret-never-printed"},
        )  # fmt: skip
        assert (ok.code, rejected.code) == (0, 2)
        assert "retrying after the service answered HTTP 429" in ok.stderr
        for run in (ok, rejected):
            assert SECRET not in run.stdout + run.stderr
            assert "another-secret-never-printed" not in run.stdout + run.stderr
        for out in (tmp_path / "a.jsonl", tmp_path / "b.jsonl"):
            assert SECRET not in out.read_text()


# -- dry run -----------------------------------------------------------------------


class TestDryRun:
    async def test_prints_the_chunk_plan_and_sends_and_writes_nothing(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(
            tmp_path / "c.csv", "number,name", [f"{n},Ana" for n in numbers(5)] + ["oops"]
        )
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "template", "--template-id", "t", "-i", source, "-o", out,
            "--dry-run", "--chunk-size", "2", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        assert re.search(r"\n  to send +5\n", run.stdout)
        assert re.search(r"\n  refused: malformed input row +1  \(recorded invalid\)", run.stdout)
        assert "plan: 3 chunks of up to 2 recipients, 8 in flight at a time" in run.stdout
        assert "chunk 1: 2 recipients, lines 2-3" in run.stdout
        assert "chunk 3: 1 recipient, line 6\n" in run.stdout
        assert "line 7: malformed input row: expected 2 fields, found 1" in run.stderr
        assert line_count(out) == 0
        assert not has_journal(out)
        assert (server.stats.token_calls, server.stats.requests) == (0, 0)

    async def test_needs_no_credentials(self, contacts: Path) -> None:
        bare = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "--dry-run", env=bare
        )
        assert run.code == 0, run.stderr
        assert "plan: 1 chunk of up to 1,000 recipients" in run.stdout


# -- resume ------------------------------------------------------------------------


class TestResume:
    async def test_sends_only_unrecorded_lines_and_resends_not_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(6))
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(503))  # refused: the service did not act
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "2")
        first = await dispatch_async(*args, "--concurrency", "1", "--attempts", "1", env=env)
        assert first.code == 1
        assert outcomes(out) == Counter(sent=4, not_sent=2)

        second = await dispatch_async(*args, "--resume", env=env)
        assert second.code == 0, second.stderr
        assert "skipped 4 lines already recorded" in second.stderr
        assert sorted(by_line(out)) == list(range(2, 8))
        assert outcomes(out) == Counter(sent=6)
        assert server.stats.received == Counter(numbers(6))

    async def test_keeps_maybe_sent_unless_resend_maybe_sent_is_given(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(4))
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(500))  # acted on, then failed: maybe sent
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "2")
        assert (await dispatch_async(*args, "--concurrency", "1", env=env)).code == 1
        maybe = {r["number"] for r in records(out) if r["outcome"] == "maybe_sent"}
        assert len(maybe) == 2

        kept = await dispatch_async(*args, "--resume", env=env)
        assert kept.code == 1
        assert "failed: 0 not_sent, 2 maybe_sent" in kept.stderr
        assert server.stats.dispatch_calls == 2

        resent = await dispatch_async(*args, "--resume", "--resend-maybe-sent", env=env)
        assert resent.code == 0, resent.stderr
        assert outcomes(out) == Counter(sent=4)
        assert sorted(by_line(out)) == [2, 3, 4, 5]
        assert server.stats.duplicates == Counter(dict.fromkeys(maybe, 2))

    async def test_refuses_an_input_that_is_not_the_one_recorded(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        first = write_csv(tmp_path / "a.csv", "number", numbers(2))
        other = write_csv(tmp_path / "b.csv", "number", numbers(2, start=10))
        assert (
            await dispatch_async("send", "basic", "--text", "x", "-i", first, "-o", out, env=env)
        ).code == 0
        run = await dispatch_async(
            "send", "basic", "--text", "x", "-i", other, "-o", out, "--resume", env=env
        )
        assert run.code == 2
        assert "line 2 of the input is not the recipient" in run.stderr

    async def test_a_fixed_malformed_row_is_sent_on_resume(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        good = numbers(2)
        source = write_csv(tmp_path / "c.csv", "number,name", [f"{good[0]},Ana", f"{good[1]}"])
        out = tmp_path / "r.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out)
        assert (await dispatch_async(*args, env=env)).code == 0
        write_csv(source, "number,name", [f"{good[0]},Ana", f"{good[1]},Bia"])
        assert (await dispatch_async(*args, "--resume", env=env)).code == 0
        assert outcomes(out) == Counter(sent=2)
        assert server.stats.received == Counter(good)

    async def test_dedupe_holds_across_resumes(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        first, second = numbers(2)
        source = write_csv(tmp_path / "c.csv", "number", [first, second])
        out = tmp_path / "r.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--dedupe")
        assert (await dispatch_async(*args, env=env)).code == 0
        write_csv(source, "number", [first, second, first])  # the list grew meanwhile
        resumed = await dispatch_async(*args, "--resume", env=env)
        assert resumed.code == 0, resumed.stderr
        assert by_line(out)[4] == {
            "line": 4,
            "number": first,
            "outcome": "invalid",
            "reason": "duplicate",
        }
        assert server.stats.received == Counter([first, second])

    async def test_sigint_finishes_in_flight_chunks_then_resume_completes(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(2000))
        out = tmp_path / "r.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "20")
        server.latency = 0.02
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args), "--concurrency", "2",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        await wait_for_records(out, 100, process)
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            _, err = await process.communicate()
        assert process.returncode == 1
        assert "stopped by SIGINT after input line" in err.decode()
        assert "dispatch-async send basic: stopped after" in err.decode()
        stopped = outcomes(out)
        assert "maybe_sent" not in stopped, "chunks in flight finish"
        assert 0 < stopped["sent"] < 2000
        by_line(out)

        server.latency = 0
        resumed = await dispatch_async(*args, "--resume", env=env)
        assert resumed.code == 0, resumed.stderr
        assert sorted(by_line(out)) == list(range(2, 2002))
        assert not server.stats.duplicates

    async def test_a_second_run_on_the_same_output_is_refused_while_the_first_runs(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(200))
        out = tmp_path / "r.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "10")
        server.latency = 0.05
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args), "--concurrency", "1",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            await wait_for_records(out, 10, process)
            # The first run holds its next request until the server closes: it is still
            # running (and holding the output) however slowly the second one starts.
            server.latency = 3600
            second = await dispatch_async(*args, "--resume", env=env)
        finally:
            process.kill()
            await process.wait()
        assert second.code == 2
        assert f"another dispatch-async run is using {out}" in second.stderr

    async def test_a_job_killed_mid_way_resumes_with_every_line_once_and_nothing_sent_twice(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        total = 50_000
        source = write_csv(tmp_path / "c.csv", "number,name", [f"{n},Ana" for n in numbers(total)])
        out = tmp_path / "r.jsonl"
        args = ("send", "template", "--template-id", "t", "-i", source, "-o", out, "--quiet")
        server.latency = 0.02  # requests are in flight when the kill lands
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args), "--chunk-size", "500", "--concurrency", "4",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        await wait_for_records(out, 2000, process)
        # Hold the next requests, so that some are certainly in flight when the kill lands.
        server.latency = 3600
        await server.wait_until(lambda: server.in_flight > 0, timeout=60)
        process.kill()
        await process.wait()
        assert process.returncode == -signal.SIGKILL
        assert line_count(out) < total, "killed mid-way, not after the end"

        server.latency = 0
        resumed = await dispatch_async(*args, env=env, kill_after=60)
        assert resumed.code == 2, "the output exists: resuming needs --resume"
        resumed = await dispatch_async(*args, "--resume", env=env, kill_after=60)
        assert resumed.code == 1, resumed.stderr  # the lines in flight stay maybe_sent

        found = by_line(out)
        assert sorted(found) == list(range(2, total + 2))
        assert {found[line + 2]["number"] for line in range(total)} == set(numbers(total))
        sent = {r["number"] for r in found.values() if r["outcome"] == "sent"}
        maybe = {r["number"] for r in found.values() if r["outcome"] == "maybe_sent"}
        assert len(sent) + len(maybe) == total
        assert maybe, "the kill left chunks in flight, recorded maybe_sent"
        assert all(r["error_type"] == "Interrupted" for r in found.values() if r["number"] in maybe)
        received = server.stats.received
        assert not server.stats.duplicates, "no number was received twice"
        assert sent <= set(received)
        assert set(received) <= sent | maybe
        assert not has_journal(out)

    async def test_after_a_kill_maybe_sent_is_at_most_the_chunks_whose_requests_started(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        total, chunk, concurrency = 40_000, 500, 4
        source = write_csv(tmp_path / "c.csv", "number,name", [f"{n},Ana" for n in numbers(total)])
        out = tmp_path / "r.jsonl"
        args = ("send", "template", "--template-id", "t", "-i", source, "-o", out, "--quiet")
        # Slow answers: the SDK reads chunks ahead of the requests it has started.
        server.latency = 0.3
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args), "--chunk-size", str(chunk),
            "--concurrency", str(concurrency),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        await wait_for_records(out, 3 * chunk, process)
        process.kill()
        await process.wait()
        received_before = set(server.stats.received)

        server.latency = 0
        resumed = await dispatch_async(*args, "--resume", env=env, kill_after=60)
        assert resumed.code == 1, resumed.stderr
        found = by_line(out)
        assert sorted(found) == list(range(2, total + 2))
        maybe = {r["number"] for r in found.values() if r["outcome"] == "maybe_sent"}
        assert 0 < len(maybe) <= concurrency * chunk
        # Each maybe_sent row was in a request that had started: most reached the service.
        assert len(maybe - received_before) <= concurrency * chunk
        assert not server.stats.duplicates


# -- demo and serve ----------------------------------------------------------------


class TestDemo:
    @pytest.mark.parametrize("recipients", [100_000, 2_000, 500, 1])
    async def test_sends_every_synthetic_recipient_and_exits_0(
        self, tmp_path: Path, recipients: int
    ) -> None:
        bare = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        out = tmp_path / "demo.jsonl"
        # The demo's contacts go to a new temporary directory: keep it in tmp_path.
        run = await dispatch_async(
            "demo", "-o", out, "--recipients", str(recipients),
            env=bare | {"TMPDIR": str(tmp_path)}, kill_after=60,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        assert "dispatch-async demo: done in" in run.stderr
        assert re.search(rf"total\s+{recipients:,}\n", run.stderr)
        assert re.search(r"not_sent\s+0\n", run.stderr)
        retries = re.search(r"([\d,]+) retries", run.stderr)
        assert retries is not None
        assert int(retries.group(1).replace(",", "")) > 0, "the scripted faults were retried"
        found = outcomes(out)
        assert found["sent"] + found["invalid"] == recipients
        assert found["invalid"] < max(recipients // 10, 1)


class TestServe:
    async def test_runs_the_simulator_with_the_given_flags_until_sigterm(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *COMMAND, "serve", "--port", "0", "--secret", "serve-secret",
            "--token-lifetime", "42", "--fault-rate", "429=1.0",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(20):
                url = (await process.stdout.readline()).decode().strip()
            assert url.startswith("http://127.0.0.1:")
            async with aiohttp.ClientSession() as http:
                answer = await http.post(
                    f"{url}/oauth/token",
                    data={"grant_type": "client_credentials", "client_secret": "serve-secret"},
                )
                assert (await answer.json())["expires_in"] == "42"
            async with DispatchSession(
                url, client_secret="serve-secret", account="a", retry=RetryPolicy(attempts=1)
            ) as session:
                result = await session.send_basic(["+5511999990000"], text="hi")
            assert isinstance(result.failed[0].error, RateLimitedError)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                await process.communicate()
        assert process.returncode == 0

    async def test_ctrl_c_prints_what_it_saw_and_get_stats_shows_it_meanwhile(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *COMMAND, "serve", "--port", "0", "--secret", "serve-secret",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(20):
                url = (await process.stdout.readline()).decode().strip()
            async with DispatchSession(url, client_secret="serve-secret", account="a") as session:
                await session.send_basic(numbers(3), text="hi")
            async with aiohttp.ClientSession() as http, http.get(f"{url}/_stats") as answer:
                stats = await answer.json()
            assert (stats["dispatch_calls"], stats["recipients_received"]) == (1, 3)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
            async with asyncio.timeout(20):
                _, err = await process.communicate()
        assert process.returncode == 0
        assert "simulator stopped: 1 token request, 1 /api/v3 request, 1 dispatch" in err.decode()
        assert "3 recipients received (0 more than once)" in err.decode()

    async def test_help_is_click_styled_names_every_option_and_documents_stats(self) -> None:
        run = await dispatch_async("serve", "--help", env=os.environ)
        assert run.code == 0
        assert run.stdout.startswith("Usage: dispatch-async serve [OPTIONS]\n")
        shown = set(re.findall(r"^  (--[a-z-]+)", run.stdout, re.MULTILINE))
        parser = argument_parser()
        defined = {flag for action in parser._actions for flag in action.option_strings}
        defined -= {"-h", "--help"}  # click's own
        assert shown == defined
        assert "GET /_stats" in run.stdout
        assert "not part of the service" in run.stdout

    async def test_a_bad_value_is_refused_as_every_other_command_refuses_it(self) -> None:
        run = await dispatch_async("serve", "--fault-rate", "429", env=os.environ)
        assert run.code == 2
        assert "Error: Invalid value for '--fault-rate': expected CODE=RATE" in run.stderr
        assert "Usage: dispatch-async serve [OPTIONS]" in run.stderr


class TestHelp:
    async def test_lists_the_commands_and_the_version(self) -> None:
        run = await dispatch_async("--help", env=os.environ)
        assert run.code == 0
        for command in ("send", "demo", "serve"):
            assert command in run.stdout
        version = await dispatch_async("--version", env=os.environ)
        assert version.stdout.startswith("dispatch-async, version ")

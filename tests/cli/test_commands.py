"""The ``dispatch-async`` command, run as a real process against the simulator on 127.0.0.1.

The simulator runs in the test's event loop, so its counters can be read directly; the
command runs as a subprocess, exactly as a user runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import pty
import re
import signal
import socket
import struct
import termios
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from click.testing import CliRunner

import dispatch_async as da
from dispatch_async import DispatchSession, RateLimitedError, RetryPolicy
from dispatch_async._cli.commands import cli
from dispatch_async._cli.job.plan import run_plan
from dispatch_async._cli.job.send import run_send
from dispatch_async._cli.job.spec import (
    Connection,
    Display,
    InputSpec,
    JobSpec,
    SendSettings,
    Target,
)
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.callbacks import DeliveryStatus, DeliveryTracker
from dispatch_async.testing import FakeDispatchServer, Fault, argument_parser
from tests.cli_helpers import (
    COMMAND,
    by_line,
    dispatch_async,
    files,
    forget,
    has_journal,
    kept_options,
    killed_with_a_request_in_flight,
    line_count,
    outcomes,
    records,
    stopped_by_its_deadline,
    wait_for_records,
    write_csv,
    write_jsonl,
)
from tests.conftest import HANG, SECRET, numbers
from tests.receiver_process import receiver_process

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# -- what goes on the wire ----------------------------------------------------------

WEBHOOK = "https://hooks.example.com/dispatch"
CALLBACK = "https://hooks.example.com/callback"


def dispatched(server: FakeDispatchServer) -> list[dict[str, Any]]:
    """The bodies of the dispatch requests the simulator received, in order."""
    endpoints = ("basic", "single", "template", "webhook")
    return [r.json for r in server.requests if r.endpoint in endpoints]


def envelope(body: dict[str, Any]) -> dict[str, Any]:
    """A dispatch request's fields other than its recipients."""
    return {name: value for name, value in body.items() if name != "messages"}


class TestWhatIsSent:
    """Each flag says what goes on the wire, and nothing else goes."""

    async def test_send_template_sends_the_template_every_option_and_the_columns_as_vars(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "template", "--template-id", "pix_reminder", "--webhook", WEBHOOK,
            "--campaign-name", "março", "--callback", CALLBACK, "--fallback-sms", "Seu Pix",
            "--account", "acme-sp", "-i", contacts, "-o", tmp_path / "r.jsonl", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        [body] = dispatched(server)
        assert envelope(body) == {
            "account": "acme-sp",  # the flag over DISPATCH_ACCOUNT
            "template_id": "pix_reminder",
            "webhook": WEBHOOK,
            "campaign_name": "março",
            "callback": CALLBACK,
            "fallback": [{"channel": "sms", "content": "Seu Pix"}],
        }
        assert body["messages"][:2] == [
            {"number": numbers(4)[0], "vars": {"name": "Ana", "pixCode": "PIX0"}},
            {"number": numbers(4)[1], "vars": {"name": "Ana", "pixCode": "PIX1"}},
        ]
        assert len(body["messages"]) == 5

    @pytest.mark.parametrize("endpoint", ["basic", "single"])
    async def test_send_basic_and_single_send_the_text_under_the_environments_account(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        contacts: Path,
        tmp_path: Path,
        endpoint: str,
    ) -> None:
        run = await dispatch_async(
            "send", endpoint, "--text", "Olá, tudo bem?", "-i", contacts,
            "-o", tmp_path / "r.jsonl", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        [request] = [r for r in server.requests if r.endpoint == endpoint]
        assert envelope(request.json) == {
            "account": "acme",
            "content": {"text": {"message": "Olá, tudo bem?"}},
        }

    async def test_send_webhook_sends_its_webhook_text_template_and_options(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "webhook", "--webhook", WEBHOOK, "--text", "Olá", "--template-id", "otp",
            "--campaign-name", "c1", "--callback", CALLBACK, "--fallback-sms", "sms",
            "-i", contacts, "-o", out, env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=4, invalid=1)
        [request] = server.requests[1:]
        assert request.path == "/api/v3/webhook"
        assert envelope(request.json) == {
            "account": "acme",
            "webhook": WEBHOOK,
            "content": {"text": {"message": "Olá"}},
            "template_id": "otp",
            "campaign_name": "c1",
            "callback": CALLBACK,
            "fallback": [{"channel": "sms", "content": "sms"}],
        }

    async def test_resume_sends_what_the_first_run_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(4))
        out = tmp_path / "r.jsonl"
        server.latency = 0.5  # the deadline passes with the first chunk in flight
        first = await dispatch_async(
            "send", "template", "--template-id", "t1", "--webhook", WEBHOOK,
            "--campaign-name", "c", "--callback", CALLBACK, "--fallback-sms", "f",
            "-i", source, "-o", out, "--chunk-size", "2", "--concurrency", "1",
            "--deadline", "0.2", env=env,
        )  # fmt: skip
        assert first.code == 1, first.stderr
        assert outcomes(out) == Counter(maybe_sent=2, not_sent=2)
        server.latency = 0
        resumed = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert resumed.code == 1, resumed.stderr  # the maybe_sent lines are still there
        assert outcomes(out) == Counter(maybe_sent=2, sent=2)

        # The job's options came from the journal: its flags were not given again.
        cut, resent = dispatched(server)
        assert resent["messages"] == [{"number": n, "vars": {}} for n in numbers(4)[2:]]
        expected = {
            "account": "acme",
            "template_id": "t1",
            "webhook": WEBHOOK,
            "campaign_name": "c",
            "callback": CALLBACK,
            "fallback": [{"channel": "sms", "content": "f"}],
        }
        assert envelope(cut) == envelope(resent) == expected

    async def test_every_request_carries_the_contract_headers(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--chunk-size", "2", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        token, *requests = server.requests
        assert token.form == {"grant_type": "client_credentials"}
        assert len(requests) == 3
        for request in requests:
            assert request.headers["Authorization"] == "Bearer <redacted>"
            assert request.headers["X-Auth-Type"] == "JWT"
            assert request.headers["Content-Type"] == "application/json"
            assert request.headers["User-Agent"].startswith("dispatch-async/")

    async def test_the_input_format_flag_overrides_the_file_name(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        # CSV in a file named .jsonl: by its name it would be read as JSON lines.
        source = write_csv(tmp_path / "contacts.jsonl", "number,name", [f"{numbers(1)[0]},Ana"])
        by_name = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "a.jsonl", env=env
        )
        forced = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "b.jsonl",
            "--format", "csv", env=env,
        )  # fmt: skip
        assert outcomes(tmp_path / "a.jsonl") == Counter(invalid=2), by_name.stderr
        assert forced.code == 0, forced.stderr
        assert [b["messages"] for b in dispatched(server)] == [
            [{"number": numbers(1)[0], "vars": {"name": "Ana"}}]
        ]


class TestConnectionFlags:
    async def test_timeout_bounds_one_request(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        server.script(Fault.hang())
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", out, "--timeout", "0.5",
            env=env,
        )  # fmt: skip
        assert run.code == 1, run.stderr
        assert outcomes(out) == Counter(maybe_sent=5)
        assert {r["error_type"] for r in records(out)} == {"RequestTimeoutError"}
        assert server.stats.requests == 1, "a timed-out request may have been acted on"

    async def test_max_retry_time_bounds_the_retries_of_one_request(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        server.script(*[Fault.status(503, retry_after="0.3")] * 100)
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", out,
            "--attempts", "100", "--max-retry-time", "0.5", env=env,
        )  # fmt: skip
        assert run.code == 1, run.stderr
        assert outcomes(out) == Counter(not_sent=5)
        assert {r["error_type"] for r in records(out)} == {"ServiceUnavailableError"}
        # 0.3 s apart, for 0.5 s: the first try and one or two more, of the 100 allowed.
        assert 2 <= server.stats.requests <= 3
        assert server.pending_faults == 100 - server.stats.requests

    @pytest.mark.parametrize("flag", ["-v", "--verbose"])
    async def test_verbose_logs_each_retry(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        contacts: Path,
        tmp_path: Path,
        flag: str,
    ) -> None:
        args = ("send", "basic", "--text", "hi", "-i", contacts, "--chunk-size", "3")
        server.script(Fault.status(503, retry_after="0"))
        quiet = await dispatch_async(*args, "-o", tmp_path / "a.jsonl", env=env)
        server.script(Fault.status(503, retry_after="0"))
        verbose = await dispatch_async(*args, "-o", tmp_path / "b.jsonl", flag, env=env)
        assert (quiet.code, verbose.code) == (0, 0), quiet.stderr + verbose.stderr
        assert "retrying" not in quiet.stderr
        assert verbose.stderr.count("retrying after the service answered HTTP 503") == 1
        assert "DEBUG" not in verbose.stderr  # -vv for that


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

    async def test_a_bar_of_a_job_stopped_early_ends_at_the_lines_done_of_the_total(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        # Stopped (here by --deadline, as by a double Ctrl-C): not "100% 60.0/60.0".
        source = write_csv(tmp_path / "c.csv", "number", numbers(200))
        server.latency = 0.3
        try:
            code, shown = await on_a_terminal(
                "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "r.jsonl",
                "--chunk-size", "20", "--concurrency", "1", "--deadline", "1",
                env=env, columns=120,
            )  # fmt: skip
        finally:
            server.latency = 0
        assert code == 1
        last = [part for part in shown.split("\r") if "sending:" in part][-1]
        assert re.search(r"sending: +\d+%\|[^|]*\| [\d.]+/200 ", last), last
        assert "100%" not in last, last

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

    async def test_deadline_stops_the_job_and_records_every_line_read(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        out, run = await stopped_by_its_deadline(server, env, tmp_path)
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
        assert SECRET not in (tmp_path / "a.jsonl").read_text()
        assert not (tmp_path / "b.jsonl").exists(), "a refused secret writes nothing"


class TestFlagsRefusedBeforeAnything:
    """In-process (click's runner): a flag's value is refused with exit 2, nothing written."""

    def refused(self, tmp_path: Path, *flags: str, send: tuple[str, ...] | None = None) -> str:
        source = write_csv(tmp_path / "c.csv", "number", numbers(1))
        out = tmp_path / "r.jsonl"
        if send is None:
            send = ("send", "basic", "--text", "hi", "-i", str(source))
        done = CliRunner().invoke(
            cli,
            [*send, "-o", str(out), *flags],
            env={"DISPATCH_BASE_URL": "http://127.0.0.1:9", "DISPATCH_ACCOUNT": "acme"},
        )
        assert done.exit_code == 2, done.output
        assert not out.exists()
        return done.output.splitlines()[-1]

    def test_send_needs_an_endpoint_its_options_after_it_and_an_input(self, tmp_path: Path) -> None:
        assert self.refused(tmp_path, send=("send",)) == (
            "Error: name the endpoint (send template|basic|single|webhook ...), or continue a "
            "job with: send --resume -o FILE"
        )
        assert self.refused(tmp_path, send=("send", "--dedupe", "basic", "--text", "hi")) == (
            "Error: --dedupe: give the options after the endpoint"
        )
        assert self.refused(tmp_path, send=("send", "basic", "--text", "hi")) == (
            "Error: Missing option '-i' / '--input'."
        )

    def test_job_goes_with_queue_and_queue_with_job_and_no_local_option(
        self, tmp_path: Path
    ) -> None:
        queue = ("--queue", "redis://127.0.0.1:9/0")
        assert self.refused(tmp_path, "--job", "j") == "Error: --job goes with --queue"
        assert self.refused(tmp_path, *queue) == (
            "Error: --queue needs --job ID (the same ID continues the job)"
        )
        assert self.refused(tmp_path, *queue, "--job", "j", "--dedupe", "--concurrency", "3") == (
            "Error: --dedupe, --concurrency (set --max-jobs on the workers) cannot go with --queue"
        )

    def test_export_of_a_job_whose_journal_cannot_be_read_names_it(self, tmp_path: Path) -> None:
        results = tmp_path / "r.jsonl"
        results.write_text('{"line": 2, "number": "+5511900000001", "outcome": "not_sent"}\n')
        (tmp_path / "r.jsonl.pending").mkdir()
        done = CliRunner().invoke(cli, ["export", str(results)])
        assert done.exit_code == 2, done.output
        assert done.output.splitlines()[-1] == (
            f"Error: cannot read the journal of {results}: Is a directory"
        )

    def test_a_rate_that_is_not_a_number(self, tmp_path: Path) -> None:
        assert self.refused(tmp_path, "--rate", "fast") == (
            "Error: Invalid value for '--rate': 'fast' is neither a positive number nor 'auto'"
        )

    def test_a_secret_file_that_is_empty_or_not_text(self, tmp_path: Path) -> None:
        secret = tmp_path / "secret"
        secret.write_text("  \n")
        assert self.refused(tmp_path, "--client-secret-file", str(secret)) == (
            f"Error: --client-secret-file {secret} is empty"
        )
        secret.write_bytes(b"\xff\xfe s3cr3t")
        # Not Python's decoding error: it quotes a byte of the secret, and its position.
        assert self.refused(tmp_path, "--client-secret-file", str(secret)) == (
            f"Error: cannot read --client-secret-file {secret}: it is not UTF-8 text"
        )


class TestSendInProcess:
    """In-process: ``run_send`` against the simulator in the test's own loop."""

    def spec(self, server: FakeDispatchServer, source: Path, **more: Any) -> JobSpec:
        return JobSpec(
            Target("basic", text="hi"),
            Connection(server.url, SECRET, "acme"),
            InputSpec(str(source)),
            more.pop("output"),
            **more,
        )

    async def test_a_job_needs_a_results_file_and_fields_the_endpoint_takes(
        self, server: FakeDispatchServer, tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(1))
        with pytest.raises(Problem, match=r"^--output FILE is required"):
            await run_send(self.spec(server, source, output=None))
        wrong = attrs.evolve(
            self.spec(server, source, output=tmp_path / "r.jsonl"),
            settings=SendSettings(chunk_size=0),
        )
        with pytest.raises(Problem, match="chunk_size"):
            await run_send(wrong)
        assert (server.stats.token_calls, await asyncio.to_thread(files, tmp_path)) == (
            0, ["c.csv"],
        )  # fmt: skip

    async def test_a_resume_says_it_dropped_a_torn_last_record_and_sends_its_line(
        self, server: FakeDispatchServer, tmp_path: Path
    ) -> None:
        one, two = numbers(2)
        source = write_csv(tmp_path / "c.csv", "number", [one, two])
        out = tmp_path / "r.jsonl"
        first = {"line": 2, "number": one, "outcome": "sent", "id": "a"}
        out.write_text(json.dumps(first) + '\n{"line": 3, "num')
        (tmp_path / "r.jsonl.pending").write_bytes(b"dispatch-async journal 1\n")
        err = io.StringIO()
        spec = self.spec(server, source, output=out, resume=True, display=Display(stream=err))
        assert await run_send(spec) == 0
        assert "; a torn last record was dropped" in err.getvalue()
        assert server.stats.received == Counter([two])
        assert [r["outcome"] for r in records(out)] == ["sent", "sent"]

    async def test_a_job_cancelled_from_outside_raises_and_keeps_its_journal(
        self, server: FakeDispatchServer, tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(40))
        out = tmp_path / "r.jsonl"
        settings = SendSettings(chunk_size=20, concurrency=1)
        spec = self.spec(server, source, output=out, settings=settings, display=Display(quiet=True))
        server.latency = 3600
        job = asyncio.ensure_future(run_send(spec))
        try:
            await server.wait_until(lambda: server.in_flight > 0, timeout=HANG)
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job
        finally:
            server.latency = 0
        assert has_journal(out), "a resume settles what may have been sent"


# -- credentials first -------------------------------------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class TestCredentialsFirst:
    """A token is fetched before the input is read through or any file is created.

    A wrong secret, a refused caller or an unreachable service ends the run with one
    line and nothing written: the same command works once the mistake is fixed.
    """

    @staticmethod
    def send(contacts: Path, out: Path) -> tuple[str | Path, ...]:
        return ("send", "basic", "--text", "hi", "-i", contacts, "-o", out)

    async def test_a_refused_secret_exits_2_and_the_same_command_works_once_fixed(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            *self.send(contacts, out), env=env | {"DISPATCH_CLIENT_SECRET": "wrong"}
        )
        assert run.code == 2
        assert run.stderr == (
            "Error: the service rejected the client secret (HTTP 401); "
            "nothing was sent or written\n"
        )
        assert files(tmp_path) == [contacts.name], "no output, no journal"
        assert server.stats.dispatch_calls == 0

        fixed = await dispatch_async(*self.send(contacts, out), env=env)
        assert fixed.code == 0, fixed.stderr
        assert outcomes(out) == Counter(sent=4, invalid=1)

    async def test_a_caller_the_service_refuses_exits_2_with_nothing_written(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        async with FakeDispatchServer(client_secret=SECRET, allowed_ips=["192.0.2.1"]) as walled:
            run = await dispatch_async(
                *self.send(contacts, out), env=env | {"DISPATCH_BASE_URL": walled.url}
            )
        assert run.code == 2
        [line] = run.stderr.splitlines()
        assert line.startswith("Error: the service refused this caller (HTTP 403)")
        assert line.endswith("; nothing was sent or written")
        assert files(tmp_path) == [contacts.name]
        assert (walled.stats.forbidden, walled.stats.dispatch_calls) == (1, 0)

    async def test_an_unreachable_service_exits_1_naming_why_without_ssl_noise(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        port = closed_port()
        run = await dispatch_async(
            *self.send(contacts, out), "--attempts", "1",
            env=env | {"DISPATCH_BASE_URL": f"http://127.0.0.1:{port}"},
        )  # fmt: skip
        assert run.code == 1
        assert run.stderr == (
            f"Error: could not get an access token: could not connect to 127.0.0.1:{port}: "
            "Connection refused; nothing was sent or written\n"
        )
        assert files(tmp_path) == [contacts.name]

        reachable = await dispatch_async(*self.send(contacts, out), env=env)
        assert reachable.code == 0, reachable.stderr


# -- failures, as a person reads them ----------------------------------------------


class TestFailuresAreToldByCause:
    """Each cause of failure once, with its count and input lines; event lines with -v."""

    async def test_each_cause_is_told_once_and_summed_up_with_its_lines(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(600))
        out = tmp_path / "r.jsonl"
        server.script(*[Fault.status(500)] * 4, *[Fault.status(503)] * 2)
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "100",
            "--concurrency", "1", "--attempts", "1", env=env,
        )  # fmt: skip
        assert run.code == 1
        assert outcomes(out) == Counter(maybe_sent=400, not_sent=200)
        assert "ChunkAnswered" not in run.stderr
        assert "WARNING" not in run.stderr
        told = [line for line in run.stderr.splitlines() if line.startswith(("maybe", "not"))]
        assert told == [
            "maybe_sent: the service answered HTTP 500: 100 rows, lines 2-101 (further rows "
            "failing this way are counted in the summary)",
            "not_sent: the service answered HTTP 503: 100 rows, lines 402-501 (further rows "
            "failing this way are counted in the summary)",
            "maybe_sent rows may have reached the service: check them before sending them "
            "again (they may arrive twice); dispatch-async export "
            f"{out} --outcome maybe_sent -o {tmp_path / 'maybe_sent.csv'} writes them out "
            "as an input of their own; once checked, dispatch-async send --resume "
            f"--resend-maybe-sent -o {out} sends them again",
        ]
        assert (
            "  failed rows, by cause:\n"
            "    400 maybe_sent: the service answered HTTP 500 (lines 2-401)\n"
            "    200 not_sent: the service answered HTTP 503 (lines 402-601)\n"
        ) in run.stderr

    async def test_the_event_lines_show_with_verbose(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        server.script(Fault.status(500))
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--attempts", "1", "-v", env=env,
        )  # fmt: skip
        assert run.code == 1
        assert "WARNING: ChunkAnswered" in run.stderr
        assert "maybe_sent: the service answered HTTP 500: 5 rows, lines 2-6" in run.stderr

    async def test_the_progress_line_counts_sent_invalid_and_failed(
        self, server: FakeDispatchServer, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        server.script(Fault.status(503))
        run = await dispatch_async(
            "send", "template", "--template-id", "t", "-i", contacts, "-o", tmp_path / "r.jsonl",
            "--chunk-size", "2", "--concurrency", "1", "--attempts", "1",
            "--progress-every", "0", env=env,
        )  # fmt: skip
        assert run.code == 1
        progress = [line for line in run.stderr.splitlines() if line.startswith("progress:")]
        assert progress[0].startswith("progress: 2/5 lines (40%): 0 sent, 0 invalid, 2 failed")
        assert progress[-1].startswith("progress: 5/5 lines (100%): 2 sent, 1 invalid, 2 failed")

    async def test_what_the_service_said_about_a_template_it_has_not_is_shown(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        async with FakeDispatchServer(
            client_secret=SECRET, templates={"pix_reminder": ["pixCode"]}
        ) as strict:
            run = await dispatch_async(
                "send", "template", "--template-id", "pix_remindr", "-i", contacts, "-o", out,
                env=env | {"DISPATCH_BASE_URL": strict.url},
            )  # fmt: skip
        assert run.code == 1
        said = (
            "the service answered HTTP 400: template_id 'pix_remindr' is not a template of "
            "this account (templates: 'pix_reminder')"
        )
        assert f"    5 not_sent: {said} (lines 2-6)" in run.stderr
        assert {record["error"] for record in records(out)} == {said}
        assert strict.stats.dispatch_calls == 0


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


def dry_run(tmp_path: Path, source: Path, **more: Any) -> tuple[int, str, str]:
    """``send basic --dry-run`` in-process: the exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    spec = JobSpec(
        Target("basic", text="hi"),
        Connection(None, None, None),
        InputSpec(str(source), **more.pop("input", {})),
        more.pop("output", None),
        display=Display(stream=err),
        **more,
    )
    code = asyncio.run(run_plan(spec, out))
    return code, out.getvalue(), err.getvalue()


class TestDryRunInProcess:
    """In-process: the plan a dry run prints, for inputs and jobs of every shape."""

    def test_a_jsonl_input_names_its_format_and_the_vars_each_line_gives(
        self, tmp_path: Path
    ) -> None:
        source = write_jsonl(
            tmp_path / "c.jsonl",
            [{"number": n} for n in numbers(7)] + [{"no": "number"}] * 12,
        )
        code, out, err = dry_run(tmp_path, source, settings=SendSettings(chunk_size=1))
        assert code == 0
        assert f"input: {source} (JSONL)" in out
        assert "vars: as each line gives them" in out
        assert "  chunk 5: 1 recipient, line 5\n  ... 1 more chunk ...\n  chunk 7:" in out
        assert err.count("malformed input row") == 10, "the first ten are named, then counted"
        six = write_jsonl(tmp_path / "six.jsonl", [{"number": n} for n in numbers(6)])
        _, out, _ = dry_run(tmp_path, six, settings=SendSettings(chunk_size=1))
        assert "  chunk 5: 1 recipient, line 5\n  chunk 6: 1 recipient, line 6\n" in out

    def test_an_input_with_no_row_to_send_shows_no_example(self, tmp_path: Path) -> None:
        source = write_jsonl(tmp_path / "c.jsonl", [{"no": "number"}])
        code, out, _ = dry_run(tmp_path, source)
        assert code == 0
        assert "plan: 0 chunks" in out
        assert "example" not in out

    def test_a_resume_tells_what_a_killed_run_may_have_sent_and_what_dedupe_refuses(
        self, tmp_path: Path
    ) -> None:
        one, two, three = numbers(3)
        source = write_csv(tmp_path / "c.csv", "number", [one, two, three, one])
        output = tmp_path / "r.jsonl"
        output.write_text(
            json.dumps({"line": 2, "number": one, "outcome": "sent", "id": "a"}) + "\n"
        )
        (tmp_path / "r.jsonl.pending").write_bytes(b"dispatch-async journal 1\n3-3\n")
        code, out, _ = dry_run(
            tmp_path, source, output=output, resume=True, settings=SendSettings(dedupe=True)
        )
        assert code == 0
        table = out.split("\nplan:")[0]
        assert re.search(r"already recorded +1 ", table)
        assert re.search(r"maybe sent by a killed run +1 ", table)
        assert re.search(r"refused: sent by an earlier run +1 ", table)
        assert re.search(r"to send +1\n", table)

    def test_what_it_cannot_read_or_plan_is_refused_by_name(self, tmp_path: Path) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(1))
        with pytest.raises(Problem, match="Is a directory"):
            dry_run(tmp_path, source, output=tmp_path, resume=True)
        with pytest.raises(Problem, match="chunk_size"):
            dry_run(tmp_path, source, settings=SendSettings(chunk_size=0))
        with pytest.raises(Problem, match=f"^cannot read {tmp_path}/gone.csv: No such file"):
            dry_run(tmp_path, tmp_path / "gone.csv")
        jsonl = write_jsonl(tmp_path / "c.jsonl", [{"number": numbers(1)[0]}])
        with pytest.raises(Problem, match="apply to CSV input only"):
            dry_run(tmp_path, jsonl, input={"number_column": "phone"})


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
        assert f"--input '{other}' is not what the job writing {out} was started" in run.stderr
        forget(kept_options(out))  # results of an earlier version: the lines tell
        earlier = await dispatch_async(
            "send", "basic", "--text", "x", "-i", other, "-o", out, "--resume", env=env
        )
        assert earlier.code == 2
        assert "line 2 of the input is not the recipient" in earlier.stderr

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

    async def test_a_second_sigint_stops_at_once_and_what_was_in_flight_is_maybe_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(200))
        out = tmp_path / "r.jsonl"
        server.latency = 3600  # every request is held: only a forced stop ends the run
        process = await asyncio.create_subprocess_exec(
            *COMMAND, "send", "basic", "--text", "hi", "-i", str(source), "-o", str(out),
            "--chunk-size", "20", "--concurrency", "1",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            await server.wait_until(lambda: server.in_flight > 0, timeout=60)
            process.send_signal(signal.SIGINT)
            assert process.stderr is not None
            told = b""
            async with asyncio.timeout(HANG):
                while b"SIGINT: stopping;" not in told:  # the first one is handled
                    told += await process.stderr.readline()
                process.send_signal(signal.SIGINT)
                _, rest = await process.communicate()
            err = told + rest
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            server.latency = 0
        assert process.returncode == 1
        assert "SIGINT: stopping now; requests in flight become maybe_sent" in err.decode()
        found = records(out)
        maybe = {r["number"] for r in found if r["outcome"] == "maybe_sent"}
        assert maybe == set(server.stats.received), "maybe_sent is what reached the service"
        assert len(maybe) == 20, "the one chunk in flight"
        assert {r["outcome"] for r in found} <= {"maybe_sent", "not_sent"}, "nothing answered"
        assert has_journal(out)

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
        await killed_with_a_request_in_flight(
            server, env, *args, "--chunk-size", "500", "--concurrency", "4", records=2000
        )
        assert line_count(out) < total, "killed mid-way, not after the end"

        resumed = await dispatch_async(*args, env=env)
        assert resumed.code == 2, "the output exists: resuming needs --resume"
        resumed = await dispatch_async(*args, "--resume", env=env)
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

    async def test_after_a_kill_maybe_sent_is_exactly_what_reached_the_service_unrecorded(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        total, chunk, concurrency = 40_000, 500, 4
        given = numbers(total)
        source = write_csv(tmp_path / "c.csv", "number,name", [f"{n},Ana" for n in given])
        out = tmp_path / "r.jsonl"
        args = ("send", "template", "--template-id", "t", "-i", source, "-o", out, "--quiet")
        # Chunks 6 to 9 hang: once they hold every slot, no request can start, while the
        # SDK has read chunks ahead of them that it never started.
        for index in range(6, 6 + concurrency):
            server.script_for(given[index * chunk], Fault.hang())
        await killed_with_a_request_in_flight(
            server, env, *args, "--chunk-size", str(chunk), "--concurrency", str(concurrency),
            hold=False,
            until=lambda: server.in_flight == concurrency and server.pending_faults == 0,
        )  # fmt: skip
        # What the killed run wrote, bar a line the kill may have cut short.
        lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
        written = [json.loads(line) for line in lines if line.endswith("\n")]
        recorded_sent = {r["number"] for r in written if r["outcome"] == "sent"}
        reached = {m["number"] for body in dispatched(server) for m in body["messages"]}
        assert len(reached) == 10 * chunk, "chunks 0 to 9, and no other"

        resumed = await dispatch_async(*args, "--resume", env=env)
        assert resumed.code == 1, resumed.stderr
        found = by_line(out)
        assert sorted(found) == list(range(2, total + 2))
        maybe = {r["number"] for r in found.values() if r["outcome"] == "maybe_sent"}
        # The chunks read ahead were never started: sent on resume, not left maybe_sent.
        assert maybe == reached - recorded_sent
        assert set(given[6 * chunk : 10 * chunk]) <= maybe, "the requests held in flight"
        assert not server.stats.duplicates


class TestResumeCounts:
    """One set of counts around a resume: the whole job and this run told apart."""

    async def test_the_counts_add_up_and_malformed_rows_are_not_told_twice(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        lines = []
        for index, number in enumerate(numbers(100)):
            lines.append(f"{number},Ana")
            if index % 8 == 3 and index < 96:
                lines.append("not a row")  # 12 malformed rows: more than the ten named
            if index % 25 == 10:
                lines.append(",")  # 4 empty rows: no record
        source = write_csv(tmp_path / "c.csv", "number,name", lines)
        out = tmp_path / "r.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "-o", out, "--chunk-size", "20")
        args += ("--concurrency", "1", "--attempts", "1", "--progress-every", "0")
        server.script(Fault.status(503))  # the first chunk: not_sent
        first = await dispatch_async(*args, env=env)
        assert first.code == 1
        assert re.search(r"\n  total +112\n", first.stderr), first.stderr
        assert first.stderr.count("malformed input row:") == 10

        second = await dispatch_async(*args, "--resume", env=env)
        assert second.code == 0, second.stderr
        assert (
            "resuming: input lines recorded by earlier runs: 112; kept and skipped: 80; "
            "not_sent, sent again: 20; malformed, read again (a fixed row is sent): 12\n"
        ) in second.stderr
        assert "malformed input row:" not in second.stderr, "the notes are not repeated"
        for outcome, this_run, whole_job in (
            ("sent", 20, 100),
            ("invalid", 0, 12),
            ("not_sent", 0, 0),
            ("total", 20, 112),
        ):
            assert re.search(rf"\n  {outcome} +{this_run} +{whole_job}\n", second.stderr)
        for run in (first, second):
            progress = [line for line in run.stderr.splitlines() if line.startswith("progress")]
            assert progress[-1].startswith("progress: 116/116 lines (100%)"), "4 empty rows"
        assert outcomes(out) == Counter(sent=100, invalid=12)


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
            env=bare | {"TMPDIR": str(tmp_path)},
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
        self.assert_delivery_tracked(run.stderr, sent=found["sent"])

    @staticmethod
    def assert_delivery_tracked(stderr: str, *, sent: int) -> None:
        """The demo's delivery line agrees with what the simulator posted: each tracked
        message got its echo and one outcome (DELIVERED, by RCS or SMS, or a failure), and
        the read ones a READ; the receiver's counts are of what it stored."""
        line = re.search(
            r"delivery callbacks \(([\d,]+) messages?, the first sent\): ([\d,]+) delivered "
            r"\(([\d,]+) by SMS fallback\), ([\d,]+) read, ([\d,]+) not delivered; "
            r"([\d,]+) events? posted by the simulator",
            stderr,
        )
        assert line is not None, stderr
        tracked, delivered, sms, read, failed, posted = (
            int(group.replace(",", "")) for group in line.groups()
        )
        assert tracked == min(sent, 2000)
        assert delivered + failed == tracked
        assert posted == 2 * tracked + read
        if tracked >= 500:  # 15% by SMS, half the rest read, 3% failed: all seen
            assert 0 < sms < delivered
            assert 0 < read < delivered - sms
            assert failed > 0

    async def test_the_seed_decides_the_sample_data(self, tmp_path: Path) -> None:
        bare = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        env = bare | {"TMPDIR": str(tmp_path)}

        async def invalid_lines(seed: int, name: str) -> set[int]:
            out = tmp_path / name
            run = await dispatch_async(
                "demo", "-o", out, "--recipients", "300", "--seed", str(seed), "-q", env=env
            )
            assert run.code == 0, run.stderr
            return {r["line"] for r in records(out) if r["outcome"] == "invalid"}

        first, again, other = (
            await invalid_lines(1, "a.jsonl"),
            await invalid_lines(1, "b.jsonl"),
            await invalid_lines(2, "c.jsonl"),
        )
        assert first, "about 3% of the sample numbers are invalid"
        assert first == again
        assert first != other


@attrs.define
class Served:
    """A `serving` simulator: its URL, and what it said on stderr once stopped."""

    url: str
    stderr: str = ""


@contextlib.asynccontextmanager
async def serving(*flags: str, stop: signal.Signals = signal.SIGTERM) -> AsyncIterator[Served]:
    """`dispatch-async serve` with *flags*, stopped with *stop*; it must exit 0."""
    process = await asyncio.create_subprocess_exec(
        *COMMAND, "serve", "--port", "0", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            served = Served((await process.stdout.readline()).decode().strip())
        yield served
    finally:
        if process.returncode is None:
            process.send_signal(stop)
        async with asyncio.timeout(20):
            _, err = await process.communicate()
    served.stderr = err.decode()
    assert process.returncode == 0


async def raw_dispatch(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """One basic dispatch to the simulator at *url* with its default secret; read."""
    form = {"grant_type": "client_credentials", "client_secret": "test-secret"}
    async with http.post(f"{url}/oauth/token", data=form) as answer:
        token = (await answer.json())["access_token"]
    body = {
        "account": "a",
        "content": {"text": {"message": "hi"}},
        "messages": [{"number": "+5511999990000"}],
    }
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(f"{url}/api/v3/basic", json=body, headers=headers) as answer:
        await answer.read()
    return answer


class TestServe:
    async def test_host_fault_rate_and_random_retry_after_answer_as_told(self) -> None:
        flags = ("--host", "127.0.0.1", "--fault-rate", "429=1", "--random-retry-after", "7")
        async with serving(*flags) as served, aiohttp.ClientSession() as http:
            answer = await raw_dispatch(http, served.url)
        assert served.url.startswith("http://127.0.0.1:")
        assert (answer.status, answer.headers["Retry-After"]) == (429, "7")

    async def test_with_callbacks_a_send_ends_tracked_by_the_receiver(self, tmp_path: Path) -> None:
        # The guide's delivery-tracking flow with the commands alone: no script of one's own.
        store = tmp_path / "deliveries.sqlite3"
        source = write_csv(tmp_path / "c.csv", "number", numbers(5))
        async with serving("--callbacks") as served, receiver_process(store) as receiver:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")} | {
                "DISPATCH_BASE_URL": served.url,
                "DISPATCH_CLIENT_SECRET": SECRET,
                "DISPATCH_ACCOUNT": "acme",
                "DISPATCH_CALLBACK_URL": receiver.url,
            }
            out = tmp_path / "r.jsonl"
            run = await dispatch_async(
                "send", "basic", "--text", "oi", "-i", source, "-o", out,
                "--campaign-name", "trial", env=env,
            )  # fmt: skip
            assert run.code == 0, run.stderr
            ids = {record["id"] for record in records(out)}
            async with DeliveryTracker(store) as tracker, asyncio.timeout(30):
                # Another process posts them: polled (bounded) until every one is stored.
                stored = 0
                while stored < len(ids):
                    await asyncio.sleep(0.05)
                    stored = sum((await tracker.counts("trial")).values())
                for id_ in ids:
                    state = await tracker.message(id_)
                    assert state is not None
                    assert state.status in (DeliveryStatus.DELIVERED, DeliveryStatus.READ)

    async def test_the_seed_repeats_the_random_faults_and_fast_ids_are_numbered(self) -> None:
        flags = ("--fault-rate", "503=0.5", "--seed", "11", "--fast-ids", "--latency", "0.05")
        runs: list[list[int]] = []
        ids: list[str] = []
        for _ in range(2):
            async with serving(*flags) as served, aiohttp.ClientSession() as http:
                answers = [await raw_dispatch(http, served.url) for _ in range(16)]
                first_ok = next(a for a in answers if a.status == 200)
                ids.append((await first_ok.json())["validMessages"][0]["id"])
            runs.append([a.status for a in answers])
        assert runs[0] == runs[1]
        assert set(runs[0]) == {200, 503}
        assert ids == ["00000000-0000-4000-8000-000000000000"] * 2

    async def test_latency_delays_every_dispatch_answer(self) -> None:
        loop = asyncio.get_running_loop()
        async with serving("--latency", "0.3") as served, aiohttp.ClientSession() as http:
            started = loop.time()
            answer = await raw_dispatch(http, served.url)
            took = loop.time() - started
        assert answer.status == 200
        assert took >= 0.3

    async def test_runs_the_simulator_with_the_given_flags_until_sigterm(self) -> None:
        flags = ("--secret", "serve-secret", "--token-lifetime", "42", "--fault-rate", "429=1.0")
        async with serving(*flags) as served:
            url = served.url
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

    async def test_ctrl_c_prints_what_it_saw_and_get_stats_shows_it_meanwhile(self) -> None:
        async with serving("--secret", "serve-secret", stop=signal.SIGINT) as served:
            async with DispatchSession(
                served.url, client_secret="serve-secret", account="a"
            ) as session:
                await session.send_basic(numbers(3), text="hi")
            async with aiohttp.ClientSession() as http, http.get(f"{served.url}/_stats") as answer:
                stats = await answer.json()
            assert (stats["dispatch_calls"], stats["recipients_received"]) == (1, 3)
        assert "simulator stopped: 1 token request, 1 /api/v3 request, 1 dispatch" in served.stderr
        assert "3 recipients received (0 more than once)" in served.stderr

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
        assert "not part of the service" in " ".join(run.stdout.split())  # wrapped by click

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
        assert (await dispatch_async("-V", env=os.environ)).stdout == version.stdout


class TestSignalsWhileACommandRuns:
    """A command run in process (a test, an application) hears SIGINT and SIGTERM on its
    loop, then leaves them as it found them: asyncio's own removal turns Ctrl-C on, even
    in a process started in the background, which ignores it."""

    @pytest.mark.parametrize("found", [signal.SIG_IGN, signal.default_int_handler])
    async def test_a_signal_is_heard_and_the_handler_found_is_put_back(self, found: Any) -> None:
        before = signal.signal(signal.SIGINT, found)
        heard: list[int] = []
        got = asyncio.Event()

        def on_signal(signum: int) -> None:
            heard.append(signum)
            got.set()

        try:
            with da.on_stop_signals(on_signal):
                signal.raise_signal(signal.SIGINT)
                async with asyncio.timeout(HANG):
                    await got.wait()
            after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        finally:
            signal.signal(signal.SIGINT, before)
        assert heard == [signal.SIGINT]
        assert after == (found, signal.SIG_DFL)

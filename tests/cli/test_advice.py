"""Every command the software tells a person to run works as printed (issues 37, 39).

The summary of a finished job names commands (``screen/advice.py``): export the rows of
an outcome, resume the job. Each is taken from the real command's stderr and run, as
printed, against the job's results file alone: a finished job has no journal, and its
options are kept beside its results. Resuming a finished job sends its ``not_sent`` rows,
its ``maybe_sent`` rows only with ``--resend-maybe-sent``, and a ``sent`` row never.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from dispatch_async._cli.commands import cli
from dispatch_async._cli.job.spec import SendSettings
from dispatch_async.callbacks import DeliveryTracker, SQLiteDeliveryStore
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.cli.test_commands import dispatched, dry_run
from tests.cli_helpers import (
    dispatch_async,
    forget,
    has_journal,
    kept_options,
    outcomes,
    stopped_by_its_deadline,
    write_csv,
)
from tests.conftest import numbers

#: A command in a line of advice: up to the words that say what it does.
#: (Not a title line: "dispatch-async send basic: done in 0.16 s".)
_COMMAND = re.compile(
    r"dispatch-async (?:send|export) (?![a-z]+:).+?(?= writes | sends | continues|, then |$)"
)
_SENT, _MAYBE, _NOT_SENT = numbers(2), numbers(2, 2), numbers(2, 4)
#: Rejected by the service, local numbers of Brazil: the summary names --prevalidate.
_LOCAL = ["(11) 98765-4321", "(11) 98765-4322"]
_CALLBACK = "https://hooks.example.com/cb/s3cr3t-token"


def printed(stderr: str) -> list[str]:
    """The commands a run's stderr tells a person to run, in order."""
    return [match.group(0) for line in stderr.splitlines() for match in _COMMAND.finditer(line)]


def sent_numbers(server: FakeDispatchServer) -> Counter[str]:
    """How many times each number reached the service in a request."""
    return Counter(m["number"] for body in dispatched(server) for m in body["messages"])


async def finished_job(
    server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
) -> tuple[Path, Path, str]:
    """A job run to its end with every outcome: its input, its results, its stderr.

    Chunks of two, one at a time: the first is answered 500 (maybe_sent), the second
    503 (not_sent), then two sent and two local numbers the service rejects.
    """
    source = write_csv(
        tmp_path / "lista.csv",
        "number,name",
        [f"{n},Ana" for n in [*_MAYBE, *_NOT_SENT, *_SENT, *_LOCAL]],
    )
    out = tmp_path / "r.jsonl"
    server.script(Fault.status(500), Fault.status(503))
    run = await dispatch_async(
        "send", "basic", "--text", "Olá", "-i", source, "-o", out, "--chunk-size", "2",
        "--concurrency", "1", "--attempts", "1", "--callback", _CALLBACK, env=env,
    )  # fmt: skip
    assert run.code == 1, run.stderr
    assert outcomes(out) == Counter(maybe_sent=2, not_sent=2, sent=2, invalid=2)
    assert not has_journal(out), "the job finished: its journal is gone"
    return source, out, run.stderr


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def run_printed(command: str, env: dict[str, str]) -> tuple[int, str]:
    name, *args = shlex.split(command)
    assert name == "dispatch-async"
    run = await dispatch_async(*args, env=env)
    return run.code, run.stderr


class TestEveryPrintedCommandWorks:
    async def test_each_command_a_finished_job_prints_runs_as_printed(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source, out, stderr = await finished_job(server, env, tmp_path)
        commands = printed(stderr)
        assert commands == [
            f"dispatch-async export {out} --outcome invalid -o {tmp_path / 'invalid.csv'}",
            f"dispatch-async send --resume -o {out}",
            f"dispatch-async export {out} --outcome maybe_sent -o {tmp_path / 'maybe_sent.csv'}",
            f"dispatch-async send --resume --resend-maybe-sent -o {out}",
        ], stderr
        before = sent_numbers(server)
        export_invalid, resume, export_maybe, resend = commands

        for export, rows in ((export_invalid, _LOCAL), (export_maybe, _MAYBE)):
            code, said = await run_printed(export, env)
            assert code == 0, said
            assert text(Path(shlex.split(export)[-1])) == "number,name\n" + "".join(
                f"{n},Ana\n" for n in rows
            )

        code, said = await run_printed(resume, env)
        assert code == 1, said  # the maybe_sent rows are still there: checked, not sent
        assert "usage" not in said.lower()
        assert sent_numbers(server) - before == Counter(_NOT_SENT), "only the not_sent rows"
        assert outcomes(out) == Counter(maybe_sent=2, sent=4, invalid=2)
        callbacks = {body.get("callback") for body in dispatched(server)}
        assert callbacks == {_CALLBACK}, "the job's own options, from its results file"

        code, said = await run_printed(resend, env)
        assert code == 0, said
        assert sent_numbers(server) - before == Counter(_NOT_SENT + _MAYBE)
        assert outcomes(out) == Counter(sent=6, invalid=2)
        assert source.exists()

    async def test_the_command_a_stopped_job_prints_runs_as_printed(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        out, stopped = await stopped_by_its_deadline(server, env, tmp_path)
        assert stopped.code == 1, stopped.stderr
        assert has_journal(out), "stopped before its end"
        resume = printed(stopped.stderr)[0]
        assert resume == f"dispatch-async send --resume -o {out}", stopped.stderr
        server.latency = 0
        code, said = await run_printed(resume, env)
        assert code == 1, said  # the two chunks in flight at the deadline stay maybe_sent
        assert outcomes(out) == Counter(sent=30, maybe_sent=10)
        assert max(sent_numbers(server).values()) == 1, "nothing sent twice"

    async def test_the_command_callbacks_reconcile_prints_runs_as_printed(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        _, out, _ = await finished_job(server, env, tmp_path)
        store = tmp_path / "deliveries.sqlite3"
        async with DeliveryTracker(SQLiteDeliveryStore(store)):
            pass  # an empty store: no callback confirms a maybe_sent record
        reconciled = await dispatch_async(
            "callbacks", "reconcile", "-o", out, "--store", store, "--campaign-name", "pix",
            env=env,
        )  # fmt: skip
        assert reconciled.code == 1, reconciled.stderr
        [export] = printed(reconciled.stderr)
        assert export == (
            f"dispatch-async export {out} --outcome maybe_sent -o {tmp_path / 'maybe_sent.csv'}"
        )
        code, said = await run_printed(export, env)
        assert code == 0, said
        assert text(tmp_path / "maybe_sent.csv") == "number,name\n" + "".join(
            f"{n},Ana\n" for n in _MAYBE
        )

    async def test_the_options_kept_beside_the_results_are_private(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        _, out, _ = await finished_job(server, env, tmp_path)
        kept = kept_options(out)
        assert mode(kept) == 0o600, "the callback URL's token is in it"
        assert _CALLBACK in text(kept)


class TestResumingAFinishedJob:
    """Issue 39.1: from its results file alone, in either command form."""

    @pytest.mark.parametrize(
        "form",
        [("send", "--resume", "-o"), ("send", "basic", "--resume", "-o")],
        ids=["send --resume -o FILE", "send basic --resume -o FILE"],
    )
    async def test_sends_only_the_not_sent_rows_with_the_job_s_options(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        tmp_path: Path,
        form: tuple[str, ...],
    ) -> None:
        _, out, _ = await finished_job(server, env, tmp_path)
        before = sent_numbers(server)
        run = await dispatch_async(*form, out, env=env)
        assert run.code == 1, run.stderr  # the maybe_sent rows stay, and are told
        assert sent_numbers(server) - before == Counter(_NOT_SENT)
        texts = {body["content"]["text"]["message"] for body in dispatched(server)}
        assert texts == {"Olá"}, "the job's own text, from its results file"
        assert outcomes(out) == Counter(maybe_sent=2, sent=4, invalid=2)
        again = await dispatch_async(*form, out, env=env)
        assert sent_numbers(server) - before == Counter(_NOT_SENT), "nothing sent twice"
        assert again.code == 1, again.stderr

    async def test_a_finished_job_whose_results_were_deleted_is_not_sent_again(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        _, out, _ = await finished_job(server, env, tmp_path)
        before = sent_numbers(server)
        forget(out)  # the record of what was sent: gone, its options kept beside it
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 2
        assert f"{out} does not exist: no job to resume there" in run.stderr
        assert sent_numbers(server) == before

    async def test_a_flag_given_again_must_match_the_job(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        _, out, _ = await finished_job(server, env, tmp_path)
        before = sent_numbers(server)
        run = await dispatch_async(
            "send", "basic", "--text", "other", "--resume", "-o", out, env=env
        )
        assert run.code == 2
        assert "--text 'other' is not what the job" in run.stderr
        assert sent_numbers(server) == before

    def test_the_help_says_the_endpoint_s_flag_is_not_needed_with_resume(self) -> None:
        shown = CliRunner().invoke(cli, ["send", "template", "--help"], terminal_width=200)
        assert shown.exit_code == 0
        assert "--template-id TEXT" in shown.output
        assert "[required, except with --resume]" in shown.output

    async def test_a_new_job_without_its_required_flag_is_still_refused(
        self, env: dict[str, str], contacts: Path, tmp_path: Path
    ) -> None:
        run = await dispatch_async(
            "send", "basic", "-i", contacts, "-o", tmp_path / "r.jsonl", env=env
        )
        assert run.code == 2
        assert "Missing option '--text'" in run.stderr


class TestResultsOfAnEarlierVersion:
    """A results file without the options kept beside it: the job's flags, given again."""

    async def test_export_and_resume_take_the_flags_and_say_which(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source, out, _ = await finished_job(server, env, tmp_path)
        forget(kept_options(out))
        bare = await dispatch_async("export", out, "--outcome", "maybe_sent", env=env)
        assert bare.code == 2
        assert "Give it with --input" in bare.stderr
        given = await dispatch_async(
            "export", out, "--outcome", "maybe_sent", "-i", source, env=env
        )
        assert given.code == 0, given.stderr
        assert given.stdout == "number,name\n" + "".join(f"{n},Ana\n" for n in _MAYBE)

        before = sent_numbers(server)
        missing = await dispatch_async("send", "basic", "--resume", "-o", out, env=env)
        assert missing.code == 2
        assert "Missing option '--text'" in missing.stderr
        flags = await dispatch_async(
            "send", "basic", "--text", "Olá", "-i", source, "--resume", "-o", out, env=env
        )
        assert flags.code == 1, flags.stderr
        assert sent_numbers(server) - before == Counter(_NOT_SENT)
        assert kept_options(out).name in os.listdir(tmp_path), "kept again by the run that ended"


class TestTheDryRunExample:
    """Issue 39.5: the example is the first row sent; a refused row is told apart."""

    def test_the_example_is_never_a_row_the_screening_refuses(self, tmp_path: Path) -> None:
        first, second = numbers(2)
        source = write_csv(
            tmp_path / "c.csv", "number,name", ["12345,Bia", '"5,51199E+12",Cai', f"{first},Ana"]
        )
        code, out, _ = dry_run(
            tmp_path, source, settings=SendSettings(prevalidate=True, region="BR", chunk_size=2)
        )
        assert code == 0
        assert f"\nexample, line 4: number '{first}', name 'Ana'\n" in out
        assert "\nfirst refused, line 2: number '12345': " in out
        assert second not in out


class TestExportFromTheKeptOptions:
    async def test_an_input_changed_since_the_job_finished_is_refused_unless_given(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source, out, _ = await finished_job(server, env, tmp_path)
        rows = [f"{n},Ana" for n in [*_MAYBE, *_NOT_SENT, *_SENT, *_LOCAL]]
        write_csv(source, "number,name", ["+5511999999999,Novo", *rows])  # a row on top
        run = await dispatch_async("export", out, "--outcome", "maybe_sent", env=env)
        assert run.code == 2
        assert "changed since the job finished" in run.stderr
        assert run.stdout == ""
        given = await dispatch_async(
            "export", out, "--outcome", "maybe_sent", "-i", source, env=env
        )
        assert given.code == 0, given.stderr

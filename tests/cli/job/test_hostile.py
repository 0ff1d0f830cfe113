"""The command under hostile conditions: a full disk, a kill, a second path, a corrupt file.

Every test runs the real command as a subprocess against the simulator, as test_commands does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import resource
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from dispatch_async._cli.job.journal import JobFiles, stored_options
from dispatch_async._cli.job.recorded import Recorded, fingerprint, fingerprints, new_record
from dispatch_async._cli.job.source import Source, check_input
from dispatch_async._cli.job.spec import InputSpec, SendSettings, sent_as
from dispatch_async._cli.reading.csv import csv_records
from dispatch_async._cli.reading.input import InputProblem, Row, open_rows
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.cli_helpers import (
    COMMAND,
    Run,
    by_line,
    dispatch_async,
    has_journal,
    killed_with_a_request_in_flight,
    line_count,
    outcomes,
    records,
    wait_for_records,
    write_csv,
)
from tests.conftest import HANG, numbers


async def run_with_file_size_limit(*args: str | Path, env: dict[str, str], limit: int) -> Run:
    """Run the command with RLIMIT_FSIZE set, SIGXFSZ ignored, so a write past it fails."""

    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        *map(str, args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # Not measured by coverage (nox -s tests): its data file could not be written past
        # the limit either, and it would say so on stderr.
        env={k: v for k, v in env.items() if not k.startswith("COVERAGE_")},
        preexec_fn=limit_writes,
    )
    async with asyncio.timeout(HANG):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


class TestWriteErrors:
    async def test_a_full_disk_keeps_the_journal_and_resume_sends_nothing_twice(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "in.csv", "number", numbers(2000))
        out = tmp_path / "out.jsonl"
        # Big enough for the journal and some records, far too small for 2,000 records.
        run = await run_with_file_size_limit(
            "send",
            "basic",
            "--text",
            "hi",
            "-q",
            "-i",
            source,
            "-o",
            out,
            env=env,
            limit=150 * 512,
        )
        assert run.code == 1, run.stderr
        assert "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "File too large" in run.stderr
        assert has_journal(out)

        again = await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out, "--resume", env=env
        )
        assert again.code in (0, 1), again.stderr
        assert not server.stats.duplicates
        assert sorted(by_line(out)) == list(range(2, 2002))


class TestOneRunPerOutput:
    @pytest.mark.parametrize("alias", ["symlink", "hardlink"])
    async def test_a_second_path_to_the_same_output_is_refused_while_the_first_runs(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path, alias: str
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(200))
        out = tmp_path / "r.jsonl"
        other = tmp_path / "alias.jsonl"
        args = ("send", "basic", "--text", "hi", "-i", source, "--chunk-size", "10")
        server.latency = 0.05
        process = await asyncio.create_subprocess_exec(
            *COMMAND, *map(str, args), "-o", str(out), "--concurrency", "1",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            await wait_for_records(out, 10, process)
            # The first run holds its next request until the server closes: it is still
            # running (and holding the output) however slowly the second one starts.
            server.latency = 3600
            if alias == "symlink":
                other.symlink_to(out)
            else:
                other.hardlink_to(out)
            second = await dispatch_async(*args, "-o", other, "--resume", env=env)
        finally:
            process.kill()
            await process.wait()
        assert second.code == 2, second.stderr
        assert "another dispatch-async run is using" in second.stderr
        assert other.is_symlink() == (alias == "symlink"), "the alias was left as it was"
        assert not server.stats.duplicates


async def killed_with_requests_held(
    server: FakeDispatchServer,
    source: Path,
    out: Path,
    env: dict[str, str],
    *,
    concurrency: int,
    acted: int,
    recorded: int = 0,
) -> None:
    """Send *source* in chunks of 10 and kill -9 the run once the service has acted on
    *acted* recipients, *recorded* records are written and a request is held (the test
    scripts the faults that hold it)."""
    await killed_with_a_request_in_flight(
        server, env,
        "send", "basic", "--text", "hi", "-i", source, "-o", out, "-q",
        "--chunk-size", "10", "--concurrency", str(concurrency), "--attempts", "1",
        records=recorded, hold=False, until=lambda: server.stats.recipients_received == acted,
    )  # fmt: skip


def rewrite_csv(path: Path, rows: list[str]) -> None:
    write_csv(path, "number,name", rows)


#: 40 contacts (lines 2-41), and 3 new ones a user adds to the file.
CONTACTS = tuple(f"{n},Ana" for n in numbers(40))
NEW = tuple(f"{n},Nova" for n in numbers(3, start=900))


class TestEditedInput:
    """Lines a killed run may have sent must still hold what it sent, or resume refuses."""

    @pytest.mark.parametrize(
        ("edit", "first_changed"),
        [
            (lambda rows: [*NEW, *rows], 2),
            (lambda rows: [*rows[:9], *rows[10:]], 11),
            (lambda rows: [*rows[:13], "+5511999999999,Ana", *rows[14:]], 15),
        ],
        ids=["three-rows-inserted-at-the-top", "a-sent-row-deleted", "a-number-edited"],
    )
    async def test_a_bare_resume_refuses_an_input_whose_journaled_lines_changed(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        tmp_path: Path,
        edit: Callable[[list[str]], list[str]],
        first_changed: int,
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number,name", CONTACTS)
        out = tmp_path / "r.jsonl"
        # The service acts on both chunks in flight (lines 2-11, 12-21), then the kill.
        server.script(Fault.hang(), Fault.hang())
        await killed_with_requests_held(server, source, out, env, concurrency=2, acted=20)
        assert line_count(out) == 0, "no answer came back: only the journal knows"
        acted = Counter(server.stats.received)

        rewrite_csv(source, edit(list(CONTACTS)))
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert f"line {first_changed} of the input" in run.stderr
        assert server.stats.received == acted, "nothing was sent"
        assert line_count(out) == 0, "nothing was recorded"

        # The input as it was, with the new contacts at the end: the job carries on.
        rewrite_csv(source, [*CONTACTS, *NEW])
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 1, run.stderr  # the 20 lines in flight stay maybe_sent
        found = by_line(out)
        assert sorted(found) == list(range(2, 45))
        assert outcomes(out) == Counter(maybe_sent=20, sent=23)
        assert {found[line]["number"] for line in range(2, 22)} == set(acted)
        assert server.stats.received == Counter(numbers(40) + numbers(3, start=900))

    async def test_no_row_is_sent_before_a_changed_line_further_on_is_found(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number,name", CONTACTS)
        out = tmp_path / "r.jsonl"
        # Lines 2-11 refused (not_sent, to send again), lines 12-21 acted on and held.
        server.script(Fault.status(503), Fault.hang())
        await killed_with_requests_held(
            server, source, out, env, concurrency=1, acted=10, recorded=10
        )
        assert outcomes(out) == Counter(not_sent=10)
        requests = server.stats.requests

        # One not_sent row deleted: line 11 now holds the row that was at line 12, which
        # the service acted on; it is read (and would be sent) before line 12 is.
        rewrite_csv(source, [*CONTACTS[:3], *CONTACTS[4:]])
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 2, run.stderr
        assert "line 12 of the input" in run.stderr
        assert server.stats.requests == requests, "nothing was sent"
        assert not server.stats.duplicates

    async def test_a_fixed_malformed_row_is_sent_on_a_bare_resume_after_a_kill(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        broken = list(CONTACTS)
        broken[3] = f"{numbers(1, start=4)[0]}"  # line 5: one field of two
        source = write_csv(tmp_path / "c.csv", "number,name", broken)
        out = tmp_path / "r.jsonl"
        server.script(Fault.hang(), Fault.hang())
        await killed_with_requests_held(
            server, source, out, env, concurrency=2, acted=20, recorded=1
        )
        assert [r["line"] for r in records(out)] == [5], "the malformed row is recorded"

        rewrite_csv(source, list(CONTACTS))  # the row fixed in place
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 1, run.stderr  # the 20 lines in flight stay maybe_sent
        found = by_line(out)
        assert found[5]["outcome"] == "sent"
        assert sorted(found) == list(range(2, 42))
        assert server.stats.received == Counter(numbers(40)), "each number once"


class TestSourceInProcess:
    """In-process: how a job's reader checks the input against what the job recorded."""

    def recorded(self, line: int, number: str) -> Recorded:
        recorded = new_record(False, None, max_line=100)
        sent = {"line": line, "number": number, "outcome": "sent", "id": "a"}
        recorded._add(json.dumps(sent).encode() + b"\n", "r.jsonl line 1")
        return recorded

    def test_a_changed_line_read_from_a_pipe_is_refused_as_it_is_read(self, tmp_path: Path) -> None:
        one, two = numbers(2)
        source = write_csv(tmp_path / "c.csv", "number", [two])
        rows = open_rows(str(source))
        reader = Source(rows, self.recorded(2, one), tmp_path / "r.jsonl")
        try:
            recorded_by = re.escape(f"the recipient {tmp_path / 'r.jsonl'} recorded for it")
            with pytest.raises(Problem, match=f"^line 2 of the input is not {recorded_by}"):
                reader.read(10)
        finally:
            rows.close()

    def test_the_check_before_a_resume_ends_at_a_record_csv_cannot_read(
        self, tmp_path: Path
    ) -> None:
        one, two = numbers(2)
        recorded = self.recorded(4, one)
        source = tmp_path / "c.csv"
        source.write_text(f'number,name\n{one},Ana\n{one},"Bia"x\n{two},Caio\n')
        check_input(InputSpec(str(source)), recorded, tmp_path / "r.jsonl")  # no refusal
        source.write_text(f"number,name\n{one},Ana\n{one},Bia\n{two},Caio\n")
        with pytest.raises(Problem, match=r"^line 4 of the input is not the recipient /"):
            check_input(InputSpec(str(source)), recorded, tmp_path / "r.jsonl")

    def test_a_long_run_of_lines_already_recorded_is_skipped_a_bounded_batch_at_a_time(
        self, tmp_path: Path
    ) -> None:
        recorded = new_record(False, None, max_line=10_000)
        for line in range(1, 4002):
            sent = {"line": line, "number": "+5511900000001", "outcome": "sent", "id": "a"}
            recorded._add(json.dumps(sent).encode() + b"\n", "r.jsonl")
        source = tmp_path / "c.jsonl"
        source.write_text('{"number": "+5511900000001"}\n' * 4002)
        rows = open_rows(str(source))
        reader = Source(rows, recorded, tmp_path / "r.jsonl")
        try:
            first = reader.read(10)
            assert (first.skipped, len(first.rows), first.end) == (4000, 0, False)
            second = reader.read(10)
            assert (second.skipped, len(second.rows), second.end) == (1, 1, True)
        finally:
            rows.close()

    def test_a_long_run_of_malformed_rows_is_settled_a_bounded_batch_at_a_time(
        self, tmp_path: Path
    ) -> None:
        source = tmp_path / "c.jsonl"
        source.write_text("{}\n" * 4001 + json.dumps({"number": numbers(1)[0]}) + "\n")
        rows = open_rows(str(source))
        reader = Source(rows, new_record(False, None, max_line=10_000), None)
        try:
            first = reader.read(10)
            assert (len(first.records), len(first.rows), first.end) == (4000, 0, False)
            second = reader.read(10)
            assert (len(second.records), len(second.rows), second.end) == (1, 1, True)
        finally:
            rows.close()


class TestDedupeAcrossResume:
    @pytest.mark.parametrize("prevalidate", [False, True], ids=["raw", "e164"])
    async def test_dedupe_holds_across_a_kill_and_resume(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path, prevalidate: bool
    ) -> None:
        half = 20_000
        first = numbers(half)
        # Every number again later: the same text, or (with --prevalidate) its national form.
        again = [n.removeprefix("+55") for n in first] if prevalidate else first
        source = write_csv(tmp_path / "c.csv", "number", first + again)
        out = tmp_path / "r.jsonl"
        args = ["send", "basic", "--text", "hi", "-i", source, "-o", out, "-q", "--dedupe"]
        if prevalidate:
            args += ["--prevalidate", "--region", "BR"]
        await killed_with_a_request_in_flight(
            server, env, *args, "--chunk-size", "500", "--concurrency", "4", records=2000
        )
        assert line_count(out) < half, "killed in the first half"

        resumed = await dispatch_async(*args, "--resume", env=env)
        assert resumed.code in (0, 1), resumed.stderr
        assert sorted(by_line(out)) == list(range(2, 2 * half + 2))
        assert not server.stats.duplicates, "no number was received twice"


class TestBrokenCsv:
    PLANTED = "+5511990099"

    def planted(self, tmp_path: Path, size: int) -> Path:
        """Row 2 has a quoted field of *size* characters hiding a recipient line."""
        hidden = "x" * size + f"\n{self.PLANTED},INJECTED\n" + "y" * 10
        good = numbers(3)
        text = f'number,note\n{good[0]},"{hidden}"\n{good[1]},ok\n{good[2]},ok\n'
        path = tmp_path / "c.csv"
        path.write_text(text, encoding="utf-8")
        return path

    async def test_a_long_quoted_field_is_one_field(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = self.planted(tmp_path, 200_000)
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out, env=env
        )
        assert run.code == 0, run.stderr
        assert self.PLANTED not in server.stats.received
        assert set(server.stats.received) == set(numbers(3))

    async def test_an_unreadable_csv_record_ends_the_input_without_resynchronising(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = self.planted(tmp_path, 20_000_000)  # beyond any sane field size
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out, env=env
        )
        assert run.code == 1, run.stderr
        assert "Traceback" not in run.stderr
        assert "line 2" in run.stderr
        assert self.PLANTED not in server.stats.received
        assert not server.stats.received, "nothing after the broken record is trusted"
        assert has_journal(out), "the job is not complete"

    async def test_a_dry_run_names_the_unreadable_csv_record(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = self.planted(tmp_path, 20_000_000)
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-i", source, "-o", tmp_path / "r.jsonl",
            "--dry-run", env=env,
        )  # fmt: skip
        assert run.code == 1, run.stderr
        assert "Traceback" not in run.stderr
        assert "line 2 of the input is not valid CSV" in run.stderr
        assert self.PLANTED not in run.stdout + run.stderr


class TestCsvShapesInProcess:
    """In-process: CSV files of unusual shapes, read as a job reads them."""

    def rows(self, path: Path, **how: Any) -> list[Row]:
        rows = open_rows(str(path), "csv", **how)
        try:
            return list(rows)
        finally:
            rows.close()

    def test_an_empty_file_has_no_rows_and_exports_none(self, tmp_path: Path) -> None:
        empty = tmp_path / "c.csv"
        empty.write_bytes(b"\n\n")
        assert self.rows(empty) == []
        with csv_records(str(empty)) as (layout, found):
            assert (layout.header, list(found)) == (None, [])

    def test_blank_lines_before_the_header_keep_the_files_line_numbers(
        self, tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"
        source.write_text("\n ,  \n\nnumber,,name\n+5511900000001,x,Ana\n")
        [row] = self.rows(source)
        assert (row.line, row.number, row.message) == (
            5, "+5511900000001", {"number": "+5511900000001", "vars": {"name": "Ana"}},
        )  # fmt: skip

    def test_a_header_csv_cannot_parse_is_refused_with_its_line(self, tmp_path: Path) -> None:
        source = tmp_path / "c.csv"
        source.write_text('\n"Nome"x;number\n+5511900000001;Ana\n')
        with pytest.raises(InputProblem, match=r"^the CSV header \(line 2\) is unreadable: "):
            self.rows(source)
        source.write_text("n" * (9 << 20) + "\n")  # over any field limit: no separator found
        with pytest.raises(InputProblem, match=r"^the CSV header \(line 1\) is unreadable: "):
            self.rows(source)

    def test_a_short_row_whose_number_is_not_in_the_encoding_gets_no_number(
        self, tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"
        source.write_bytes(b"number,name\n+55119\xff\n")
        [row] = self.rows(source, encoding="utf-8")
        assert (row.line, row.number, row.problem) == (2, None, "expected 2 fields, found 1")


class TestInvalidUtf8:
    """Bytes the encoding (here forced: UTF-8 or Windows-1252 is found otherwise) cannot
    read."""

    async def test_a_csv_header_that_is_not_utf8_is_refused_before_anything_is_written(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"
        source.write_bytes(b"number,n\xe9me\n" + "".join(f"{n},Ana\n" for n in numbers(3)).encode())
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out,
            "--encoding", "utf-8", env=env,
        )  # fmt: skip
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert "header" in run.stderr
        assert "UTF-8" in run.stderr
        assert not out.exists()
        assert not has_journal(out)
        assert not server.stats.received

    async def test_a_data_row_that_is_not_utf8_is_recorded_malformed_and_not_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        good = numbers(2)
        source = tmp_path / "c.csv"
        source.write_bytes(
            f"number,name\n{good[0]},Ana\n".encode() + b"+5511900000009,B\xeda\n"
            + f"{good[1]},Bia\n".encode()
        )  # fmt: skip
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out,
            "--encoding", "utf-8", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert found[3]["outcome"] == "invalid"
        assert found[3]["detail"] == "the row is not valid UTF-8"
        assert set(server.stats.received) == set(good)


class TestCorruptJobFiles:
    JOURNAL_HEADER = b"dispatch-async journal 1\n"

    async def resume_after(
        self, env: dict[str, str], tmp_path: Path, *, journal: bytes | None, output: bytes
    ) -> Run:
        source = write_csv(tmp_path / "c.csv", "number", numbers(5))
        out = tmp_path / "r.jsonl"
        out.write_bytes(output)
        if journal is not None:
            (tmp_path / "r.jsonl.pending").write_bytes(journal)
        return await dispatch_async(
            "send", "basic", "--text", "hi", "-q", "-i", source, "-o", out, "--resume", env=env
        )

    @pytest.mark.parametrize(
        "journal",
        [
            JOURNAL_HEADER + b"1-3000000000\n",
            JOURNAL_HEADER + b"reset\n99999999999999-99999999999999\nend\n",
            JOURNAL_HEADER + b"3-1\n",
            JOURNAL_HEADER + b"garbage\n",
            b"dispatch-async jour\n",
        ],
        ids=["huge-range", "huge-reset", "backwards", "garbage", "truncated-header"],
    )
    async def test_a_corrupt_journal_is_refused_with_exit_2(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path, journal: bytes
    ) -> None:
        run = await self.resume_after(env, tmp_path, journal=journal, output=b"")
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert "MemoryError" not in run.stderr
        assert ".pending" in run.stderr
        assert not server.stats.received

    @pytest.mark.parametrize(
        "record",
        [b'{"line": 99999999999999, "outcome": "sent", "number": "+5511900000000"}\n'],
    )
    async def test_an_output_naming_a_line_beyond_the_input_is_refused_with_exit_2(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path, record: bytes
    ) -> None:
        run = await self.resume_after(env, tmp_path, journal=None, output=record)
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert "line 99,999,999,999,999" in run.stderr
        assert not server.stats.received

    async def test_a_journal_that_is_a_directory_is_refused_with_exit_2(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        (tmp_path / "r.jsonl.pending").mkdir()
        run = await self.resume_after(env, tmp_path, journal=None, output=b"")
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert not server.stats.received


class TestJobFilesInProcess:
    """In-process: the output and its journal, refused or repaired before a row is read."""

    HEADER = b"dispatch-async journal 1\n"

    def start(self, out: Path, *, resume: bool = True) -> None:
        files = JobFiles(out, max_line=100)
        try:
            files.start(resume=resume, resend_maybe_sent=False, dedupe=None)
        finally:
            files.close()

    def refusal(self, out: Path) -> Problem:
        with pytest.raises(Problem) as refused:
            self.start(out)
        return refused.value

    def test_an_output_that_cannot_be_one_is_refused_by_name(self, tmp_path: Path) -> None:
        assert self.refusal(tmp_path).message == f"--output {tmp_path} is a directory"
        nowhere = tmp_path / "no" / "r.jsonl"
        assert self.refusal(nowhere).message == (
            f"the directory of --output {nowhere} does not exist"
        )
        out = tmp_path / "r.jsonl"
        (tmp_path / "r.jsonl.pending").mkdir()
        refused = self.refusal(out)
        assert refused.message == f"cannot use {tmp_path}/r.jsonl.pending: Is a directory"
        assert refused.exit_code == 2

    def test_a_journal_that_is_not_one_or_whose_entry_is_corrupt_is_refused(
        self, tmp_path: Path
    ) -> None:
        out, journal = tmp_path / "r.jsonl", tmp_path / "r.jsonl.pending"
        cases = {
            b"lines 1-3 went out\n": "is not a dispatch-async journal",
            self.HEADER + b"1-2 !!!not base64\n": "fingerprints do not match its lines",
            self.HEADER + b"1-2 " + base64.b64encode(b"1234") + b"\n": "fingerprints do not",
            self.HEADER + b"1-1 " + base64.b64encode(b"1234") + b" yesterday\n": "start is not",
            self.HEADER + b"1-1 " + base64.b64encode(b"1234") + b" 2026-01-01T09:00\n": "start",
        }
        for content, message in cases.items():
            journal.write_bytes(content)
            assert message in self.refusal(out).message
            assert journal.read_bytes() == content, "a journal refused is left as it was"
        journal.write_bytes(b"lines 1-3 went out\n")
        with pytest.raises(Problem, match="is not a dispatch-async journal"):  # --dry-run's
            JobFiles(out, max_line=100).inspect(resend_maybe_sent=False, dedupe=None)

    def test_a_torn_last_entry_is_cut_off_and_an_end_without_reset_is_ignored(
        self, tmp_path: Path
    ) -> None:
        out, journal = tmp_path / "r.jsonl", tmp_path / "r.jsonl.pending"
        journal.write_bytes(self.HEADER + b"1-2\nend\n3-")
        files = JobFiles(out, max_line=100)
        recorded = files.inspect(resend_maybe_sent=False, dedupe=None)
        assert [recorded.is_pending(line) for line in (1, 2, 3)] == [True, True, False]
        self.start(out)
        # "3-" is cut off; then the pending lines (without fingerprints: version 1) follow.
        assert journal.read_bytes() == self.HEADER + b"1-2\nend\nreset\n1-2 AAAAAAAAAAA=\nend\n"

    def test_a_dry_run_of_a_job_never_started_finds_nothing_recorded(self, tmp_path: Path) -> None:
        files = JobFiles(tmp_path / "r.jsonl", max_line=100)
        recorded = files.inspect(resend_maybe_sent=False, dedupe=None)
        assert (recorded.recorded_lines, recorded.pending_lines) == (0, 0)
        files.append([b"{}"])  # not started: nothing to append to, nothing written
        files.sync()
        assert not (tmp_path / "r.jsonl").exists()

    def test_a_last_record_complete_but_for_its_newline_is_kept(self, tmp_path: Path) -> None:
        out = tmp_path / "r.jsonl"
        out.write_bytes(
            b'{"line":1,"number":"+5511900000001","outcome":"sent","id":"a"}\n'
            b'{"line":2,"number":"+5511900000002","outcome":"sent","id":"b"}'
        )
        (tmp_path / "r.jsonl.pending").write_bytes(self.HEADER)
        self.start(out)
        assert out.read_bytes().endswith(b'"id":"b"}\n')

    def test_an_output_record_that_is_not_one_is_refused_and_a_repeat_not_kept(self) -> None:
        recorded = new_record(False, None, max_line=100)
        where = "r.jsonl line 7"
        with pytest.raises(Problem, match=f"^{where} is not a dispatch-async record; fix"):
            recorded._add(b"[1, 2]\n", where)
        with pytest.raises(Problem, match=f"^{where} has no valid line and outcome; fix"):
            recorded._add(b'{"line": 0, "outcome": "sent"}\n', where)
        sent = b'{"line": 2, "number": "+5511900000001", "outcome": "sent", "id": "a"}\n'
        assert recorded._add(sent, where)
        assert not recorded._add(sent, where)
        assert (recorded.duplicates, recorded.kept["sent"]) == (1, 1)

    def test_a_number_holding_a_line_break_has_the_fingerprint_of_its_own(self) -> None:
        numbers_ = ["+5511900000001", "+55 11\n900000002", "+5511900000003"]
        assert list(fingerprints(numbers_)) == [fingerprint(n) for n in numbers_]

    def test_lines_in_flight_keep_their_runs_start_and_wire_form_across_resumes(
        self, tmp_path: Path
    ) -> None:
        """Run 1 (09:00) journaled lines 3-4 and was killed; run 2 (10:00) sent line 4
        again (--resend-maybe-sent) and line 5, and was killed: each line may have gone
        since its earliest run's start. Two resumes, the first killed before it recorded
        anything, record them maybe_sent with that start and the number as sent."""
        out, journal = tmp_path / "r.jsonl", tmp_path / "r.jsonl.pending"
        local = [n[3:] for n in numbers(4)]
        source = write_csv(tmp_path / "c.csv", "number", local)
        out.write_text(
            json.dumps({"line": 2, "number": local[0], "outcome": "sent", "id": "a"}) + "\n"
        )
        run_1, run_2 = b"2026-01-01T09:00:00+00:00", b"2026-01-01T10:00:00+00:00"
        crcs = [base64.b64encode(fingerprints(local[at:end]).tobytes()) for at, end in
                ((0, 3), (2, 4))]  # fmt: skip
        journal.write_bytes(
            self.HEADER + b"2-4 " + crcs[0] + b" " + run_1 + b"\n4-5 " + crcs[1] + b" " + run_2
            + b"\n"
        )  # fmt: skip
        for _ in range(2):  # the first resume is killed before it records a line
            files = JobFiles(out, max_line=100)
            try:
                recorded = files.start(resume=True, resend_maybe_sent=False, dedupe=None)
            finally:
                files.close()
            assert recorded.since == {3: run_1.decode(), 4: run_1.decode(), 5: run_2.decode()}
        rows = open_rows(str(source))
        try:
            wire = sent_as(SendSettings(prevalidate=True, region="BR"))
            settled = Source(rows, recorded, out, None, wire).read(10).records
        finally:
            rows.close()
        assert [json.loads(r) for r in settled] == [
            {"line": line, "number": local[line - 2], "outcome": "maybe_sent",
             "error": ANY, "error_type": "Interrupted", "sent_as": numbers(4)[line - 2],
             "since": since.decode()}
            for line, since in ((3, run_1), (4, run_1), (5, run_2))
        ]  # fmt: skip

    def test_stored_options_that_are_not_an_object_are_refused(self, tmp_path: Path) -> None:
        out, journal = tmp_path / "r.jsonl", tmp_path / "r.jsonl.pending"
        for header in (b"dispatch-async journal 3 {not json\n", b"dispatch-async journal 3 {}]\n"):
            journal.write_bytes(header)
            with pytest.raises(Problem, match="has a header that is not a job's options"):
                stored_options(out)


class TestStoredOptions:
    """What a journal's header stores is checked as the flags are: one line, exit 2."""

    def good_options(self, source: Path) -> dict[str, object]:
        """What `send basic --text hi -i SOURCE --chunk-size 10` stores."""
        return {
            "endpoint": "basic",
            "text": "hi",
            "template_id": None,
            "webhook": None,
            "campaign_name": None,
            "fallback_sms": None,
            "callback": None,
            "input_path": str(source),
            "input_format": "csv",
            "number_column": "number",
            "columns": None,
            "delimiter": None,
            "chunk_size": 10,
            "dedupe": False,
            "prevalidate": False,
            "region": None,
        }

    async def resume_with(
        self, env: dict[str, str], tmp_path: Path, change: dict[str, object]
    ) -> tuple[Run, Path]:
        source = write_csv(tmp_path / "c.csv", "number", numbers(5))
        out = tmp_path / "r.jsonl"
        stored = json.dumps(self.good_options(source) | change).encode()
        (tmp_path / "r.jsonl.pending").write_bytes(b"dispatch-async journal 2 " + stored + b"\n")
        return await dispatch_async("send", "--resume", "-o", out, "-q", env=env), out

    async def test_the_options_as_a_job_stores_them_resume(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        run, out = await self.resume_with(env, tmp_path, {})
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=5)
        assert server.stats.received == Counter(numbers(5))

    @pytest.mark.parametrize(
        ("change", "named"),
        [
            ({"columns": ["number"]}, "--columns"),
            ({"delimiter": ";;"}, "--delimiter"),
            ({"endpoint": "sms"}, "endpoint 'sms'"),
            ({"endpoint": None}, "endpoint None"),
            ({"number_column": 5}, "--number-column"),
            ({"number_column": None}, "--number-column"),
            ({"input_path": 5}, "--input"),
            ({"input_path": "/nonexistent/c.csv"}, "--input"),
            ({"input_format": "xml"}, "--format"),
            ({"region": 5}, "--region"),
            ({"dedupe": "no"}, "--dedupe"),
            ({"prevalidate": 1}, "--prevalidate"),
            ({"chunk_size": 0}, "--chunk-size"),
            ({"chunk_size": "10"}, "--chunk-size"),
            ({"chunk_size": 10.5}, "--chunk-size"),
            ({"text": None}, "--text"),
            ({"text": ["hi"]}, "--text"),
            ({"template_id": "t"}, "--template-id"),
            ({"encoding": "latin-9"}, "--encoding"),
            ({"encoding": 1252}, "--encoding"),
            ({"variables": "pixCode=Pix"}, "--var"),
            ({"variables": [5]}, "--var"),
            ({"variables": ["pixCode"]}, "--var"),
            ({"only_vars": "yes"}, "--only-vars"),
            ({"exclude": "/nonexistent/optouts.csv"}, "--exclude"),
            ({"endpoint": "template", "text": None, "template_id": None}, "--template-id"),
        ],
        ids=lambda value: json.dumps(value) if isinstance(value, dict) else None,
    )
    async def test_a_stored_value_the_flag_would_refuse_is_refused(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        tmp_path: Path,
        change: dict[str, object],
        named: str,
    ) -> None:
        run, out = await self.resume_with(env, tmp_path, change)
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert run.stderr.startswith("Error: "), run.stderr
        assert named in run.stderr, run.stderr
        assert "r.jsonl.pending" in run.stderr, "the file to fix is named"
        assert server.stats.requests == 0
        assert not out.exists()

    @pytest.mark.parametrize(
        ("change", "named"),
        [({"delimiter": ";;"}, "--delimiter"), ({"input_format": "xml"}, "--format")],
    )
    async def test_export_takes_the_input_from_the_journal_through_the_same_checks(
        self, env: dict[str, str], tmp_path: Path, change: dict[str, object], named: str
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", numbers(1))
        out = tmp_path / "r.jsonl"
        out.write_text(json.dumps({"line": 2, "number": numbers(1)[0], "outcome": "not_sent"}))
        stored = json.dumps(self.good_options(source) | change).encode()
        (tmp_path / "r.jsonl.pending").write_bytes(b"dispatch-async journal 2 " + stored + b"\n")
        run = await dispatch_async("export", out, env=env)
        assert run.code == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert named in run.stderr, run.stderr
        assert run.stdout == "", "no row is written"

"""Bulk imports from the files people export from spreadsheets, end to end.

The fixtures in tests/data/spreadsheets/ are written as Excel (pt-BR: ``;``, a BOM, CRLF,
accents, a quoted multi-line cell, trailing ``;;;`` rows), Google Sheets (``,``) and a
tab-separated export write them. Every test runs the real command against the simulator,
whose counters show what reached the service, and how often.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dispatch_async._cli.job.export import ExportSpec, run_export
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.cli_helpers import (
    by_line,
    dispatch_async,
    forget,
    has_journal,
    interrupted,
    kept_options,
    killed_with_a_request_in_flight,
    outcomes,
    raw,
    records,
    write_csv,
)
from tests.conftest import numbers

DATA = Path(__file__).parents[2] / "data" / "spreadsheets"

#: The numbers of contatos_excel.csv by line, as written, and as E.164 (region BR).
EXCEL_NUMBERS = {
    2: "(11) 98765-4321",
    3: "11987654322",
    4: "+55 11 98765-4323",
    6: "(21) 99876-5432",
}
EXCEL_E164 = {2: "+5511987654321", 3: "+5511987654322", 4: "+5511987654323", 6: "+5521998765432"}
SHEETS_NUMBERS = {2: "+5511987650001", 3: "+5511987650002", 5: "+5511987650003"}


@pytest.fixture
def excel(tmp_path: Path) -> Path:
    return Path(shutil.copy(DATA / "contatos_excel.csv", tmp_path / "contatos_excel.csv"))


@pytest.fixture
def sheets(tmp_path: Path) -> Path:
    return Path(shutil.copy(DATA / "google_sheets.csv", tmp_path / "google_sheets.csv"))


@pytest.fixture
def local_numbers(tmp_path: Path) -> Path:
    """An Excel pt-BR export of 50 Pix reminders: 40 numbers written as at home."""
    return Path(shutil.copy(DATA / "pix_numeros_locais.csv", tmp_path / "pix.csv"))


@pytest.fixture
def tsv(tmp_path: Path) -> Path:
    return Path(shutil.copy(DATA / "contatos.tsv", tmp_path / "contatos.tsv"))


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as stream:
        stream.write(data)


def send_args(source: Path, out: Path, *more: str) -> tuple[str | Path, ...]:
    return ("send", "basic", "--text", "Olá", "-i", source, "-o", out, *more)


# -- separators ----------------------------------------------------------------------


class TestSeparators:
    async def test_an_excel_pt_br_export_is_read_with_its_semicolons(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            *send_args(excel, out, "--number-column", "Telefone", "--prevalidate"),
            "--region", "BR", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert {line: found[line]["number"] for line in EXCEL_NUMBERS} == EXCEL_NUMBERS
        assert all(found[line]["outcome"] == "sent" for line in EXCEL_NUMBERS)
        assert server.stats.received == Counter(EXCEL_E164.values())

    async def test_google_sheets_commas_and_tabs_are_read_too(
        self, server: FakeDispatchServer, env: dict[str, str], sheets: Path, tsv: Path,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        first = await dispatch_async(
            *send_args(sheets, tmp_path / "a.jsonl", "--number-column", "Phone Number"), env=env
        )
        second = await dispatch_async(
            *send_args(tsv, tmp_path / "b.jsonl", "--number-column", "telefone"), env=env
        )
        assert (first.code, second.code) == (0, 0), first.stderr + second.stderr
        assert sorted(by_line(tmp_path / "a.jsonl")) == [2, 3, 5]  # line 3's cell spans 2
        assert server.stats.received == Counter(
            [*SHEETS_NUMBERS.values(), "+5511987650101", "+5511987650102"]
        )

    async def test_a_pipe_separated_file_and_a_header_whose_names_hold_a_comma(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        piped = write_csv(tmp_path / "p.csv", "nome|number", [f"Ana|{numbers(1)[0]}"])
        # Two semicolons against one comma: read as ';', not as csv.Sniffer would.
        mixed = write_csv(
            tmp_path / "m.csv", "Nome;number;Data, hora", [f"Bia;{numbers(1, 1)[0]};1, 2"]
        )
        for source in (piped, mixed):
            run = await dispatch_async(
                *send_args(source, tmp_path / f"{source.stem}.jsonl"), env=env
            )
            assert run.code == 0, run.stderr
        assert server.stats.received == Counter(numbers(2))

    async def test_delimiter_forces_the_separator_and_the_error_names_the_one_used(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        forced = await dispatch_async(
            *send_args(excel, out, "--number-column", "Telefone", "--delimiter", ","), env=env
        )
        assert forced.code == 2
        assert "no 'Telefone' column" in forced.stderr
        assert "separator ',' (comma)" in forced.stderr
        assert "--delimiter" in forced.stderr
        tab = await dispatch_async(
            *send_args(excel, out, "--number-column", "Telefone", "--delimiter", "tab"), env=env
        )
        assert "separator tab" in tab.stderr
        bad = await dispatch_async(*send_args(excel, out, "--delimiter", ":"), env=env)
        assert bad.code == 2
        assert "--delimiter" in bad.stderr
        assert server.stats.requests == 0
        assert not out.exists()


# -- column names ----------------------------------------------------------------------


class TestColumnNames:
    async def test_match_ignoring_case_surrounding_spaces_and_a_bom(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"
        # Two BOMs (a file saved twice): the second one is part of the first name.
        source.write_text(
            "\ufeff\ufeff TELEFONE ;Nome\n" + "".join(f"{n};Ana\n" for n in numbers(2)),
            encoding="utf-8",
        )
        run = await dispatch_async(
            *send_args(source, tmp_path / "r.jsonl", "--number-column", "telefone"), env=env
        )
        assert run.code == 0, run.stderr
        assert server.stats.received == Counter(numbers(2))

    async def test_the_default_number_column_matches_number_in_capitals(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "Name,Number", [f"Ana,{n}" for n in numbers(2)])
        run = await dispatch_async(*send_args(source, tmp_path / "r.jsonl"), env=env)
        assert run.code == 0, run.stderr
        assert server.stats.received == Counter(numbers(2))

    async def test_an_ambiguous_name_is_refused_naming_the_columns(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "Telefone,telefone ", [f"{numbers(1)[0]},x"])
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_args(source, out, "--number-column", "TELEFONE"), env=env)
        assert run.code == 2
        assert "matches the columns 'Telefone', 'telefone'" in run.stderr
        assert server.stats.requests == 0
        assert not out.exists()

    @pytest.mark.parametrize(
        "names",
        [
            ("nome", "Nome"),
            ("N\u00famero", "Nu\u0301mero"),  # Número in NFC, then in NFD (as macOS writes it)
            ("nome", " nome"),
            ("\ufeffnome", "nome"),
        ],
        ids=["case", "unicode-normal-forms", "spaces", "bom"],
    )
    async def test_two_names_that_match_as_one_are_refused_as_a_repeat(
        self,
        server: FakeDispatchServer,
        env: dict[str, str],
        tmp_path: Path,
        names: tuple[str, str],
    ) -> None:
        header = "telefone;" + ";".join(names)
        source = write_csv(tmp_path / "c.csv", header, [f"{n};Ana;Bia" for n in numbers(2)])
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_args(source, out, "--number-column", "telefone"), env=env)
        assert run.code == 2, run.stderr
        assert "repeats" in run.stderr
        assert repr(names[0].replace("\ufeff", "")) in run.stderr, run.stderr
        assert server.stats.requests == 0
        assert not out.exists()


# -- empty rows ----------------------------------------------------------------------


class TestEmptyRows:
    async def test_rows_with_every_field_empty_are_skipped_and_counted(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_args(excel, out, "--number-column", "Telefone"), env=env)
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert sorted(found) == [2, 3, 4, 6, 7], "lines 8-10 are ;;; and get no record"
        assert found[7]["detail"] == "the number is empty", "a row with other fields is one"
        assert "skipped 3 empty rows" in run.stderr
        assert "line 8" not in run.stderr
        assert server.stats.recipients_received == 4


# -- local numbers ------------------------------------------------------------------------


class TestLocalNumbers:
    """Numbers written as at home, ``(11) 98765-4321``: the service refuses them as written."""

    ADVICE = "40 of the 40 numbers rejected look like local numbers of BR"

    async def test_sent_as_written_the_summary_says_so_and_names_the_flags(
        self, env: dict[str, str], local_numbers: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            *send_args(local_numbers, out, "--number-column", "Telefone"), env=env
        )
        assert run.code == 0, "rejected numbers are an outcome, not a failure, by default"
        assert outcomes(out) == Counter(sent=10, invalid=40)
        assert self.ADVICE in run.stderr
        assert "--prevalidate --region BR sends them in E.164" in run.stderr
        assert f"dispatch-async export {out} --outcome invalid" in run.stderr
        for number in ("(11) 98001-2001", "11 98001-2001"):
            assert number not in run.stderr, "phone numbers stay out of the terminal"

    async def test_with_the_flags_every_row_is_sent_in_e164(
        self, server: FakeDispatchServer, env: dict[str, str], local_numbers: Path,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            *send_args(local_numbers, out, "--number-column", "Telefone", "--prevalidate"),
            env=env | {"DISPATCH_REGION": "BR"},
        )
        assert run.code == 0, run.stderr
        assert outcomes(out) == Counter(sent=50)
        assert all(number.startswith("+55") for number in server.stats.received)
        assert "look like local numbers" not in run.stderr

    async def test_dispatch_region_is_the_region_named(
        self, env: dict[str, str], local_numbers: Path, tmp_path: Path
    ) -> None:
        """With the region already set, the advice names only the flag still missing."""
        run = await dispatch_async(
            *send_args(local_numbers, tmp_path / "r.jsonl", "--number-column", "Telefone"),
            env=env | {"DISPATCH_REGION": "BR"},
        )
        assert self.ADVICE in run.stderr
        assert ": --prevalidate sends them in E.164" in run.stderr

        prevalidated = await dispatch_async(
            *send_args(local_numbers, tmp_path / "p.jsonl", "--number-column", "Telefone"),
            "--prevalidate", env=env,
        )  # fmt: skip
        assert outcomes(tmp_path / "p.jsonl") == Counter(sent=10, invalid=40)
        assert ": --region BR sends them in E.164" in prevalidated.stderr

    async def test_numbers_that_are_not_phone_numbers_get_no_such_advice(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "number", ["12345", "0800", *numbers(2)])
        run = await dispatch_async(*send_args(source, tmp_path / "r.jsonl"), env=env)
        assert run.code == 0, run.stderr
        assert outcomes(tmp_path / "r.jsonl") == Counter(sent=2, invalid=2)
        assert "look like local numbers" not in run.stderr

    async def test_max_invalid_makes_too_many_rejected_exit_1(
        self, env: dict[str, str], local_numbers: Path, tmp_path: Path
    ) -> None:
        args = ("--number-column", "Telefone", "--max-invalid")
        over = await dispatch_async(
            *send_args(local_numbers, tmp_path / "a.jsonl", *args, "50"), env=env
        )
        assert over.code == 1
        assert over.stderr.strip().splitlines()[-1] == (
            "too many rejected: 40 of the job's 50 lines are invalid (80.0%, over "
            "--max-invalid 50%)"
        )
        under = await dispatch_async(
            *send_args(local_numbers, tmp_path / "b.jsonl", *args, "80"), env=env
        )
        assert under.code == 0, under.stderr
        assert "too many rejected" not in under.stderr


# -- resume without retyping -----------------------------------------------------------


def excel_export(path: Path, count: int, *, empty_rows: int = 3) -> dict[int, str]:
    """A pt-BR Excel export of *count* contacts (BOM, CRLF, ';'); its numbers by line."""
    lines = dict(enumerate(numbers(count), 2))
    rows = "".join(
        f"Cliente {line};{number};São Paulo;observação {line}\r\n" for line, number in lines.items()
    )
    text = "Nome;Telefone;Cidade;Observação\r\n" + rows + ";;;\r\n" * empty_rows
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    return lines


def write_journal_header(out: Path, header: bytes) -> None:
    """Replace the first line of *out*'s journal by *header* (all of it, without a newline)."""
    journal = Path(f"{out}.pending")
    rest = journal.read_bytes().split(b"\n", 1)[1] if journal.exists() else None
    journal.write_bytes(header if rest is None else header + b"\n" + rest)


class TestResumeWithoutFlags:
    async def test_a_stopped_job_continues_from_its_journal_and_sends_nothing_twice(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "contatos.csv"
        expected = excel_export(source, 2000)
        out = tmp_path / "r.jsonl"
        await interrupted(
            server, env,
            "send", "template", "--template-id", "pix", "-i", source, "-o", out,
            "--number-column", "telefone", "--chunk-size", "20", "--concurrency", "2",
            after=100,
        )  # fmt: skip
        kept = outcomes(out)
        assert kept["maybe_sent"] == 0, "the chunks in flight finished"
        recorded = kept["sent"]  # the rows read but not started are not_sent: sent again
        assert 0 < recorded < 2000

        plan = await dispatch_async("send", "--resume", "-o", out, "--dry-run", env=env)
        assert plan.code == 0, plan.stderr
        assert re.search(rf"\n  to send +{2000 - recorded:,}\n", plan.stdout), plan.stdout
        assert re.search(rf"\n  already recorded +{recorded:,}  ", plan.stdout), plan.stdout
        assert re.search(r"\n  empty rows +3  ", plan.stdout), plan.stdout

        resumed = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert resumed.code == 0, resumed.stderr
        assert "dispatch-async send template" in resumed.stderr
        found = by_line(out)
        assert {line: record["number"] for line, record in found.items()} == expected
        assert outcomes(out) == Counter(sent=2000)
        assert server.stats.received == Counter(expected.values()), "each number once"
        assert server.stats.calls_by_path.keys() == {"template"}
        assert not has_journal(out)

    async def test_after_kill_9_resume_without_flags_never_sends_a_row_twice(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "contatos.csv"
        expected = excel_export(source, 20_000)
        out = tmp_path / "r.jsonl"
        await killed_with_a_request_in_flight(
            server, env,
            "send", "template", "--template-id", "pix", "-i", source, "-o", out,
            "--number-column", "TELEFONE", "--chunk-size", "500", "--concurrency", "4", "-q",
            records=2000,
        )  # fmt: skip

        resumed = await dispatch_async("send", "--resume", "-o", out, "-q", env=env)
        assert resumed.code == 1, resumed.stderr  # the lines in flight stay maybe_sent
        found = by_line(out)
        assert {line: record["number"] for line, record in found.items()} == expected
        sent = {r["number"] for r in found.values() if r["outcome"] == "sent"}
        maybe = {r["number"] for r in found.values() if r["outcome"] == "maybe_sent"}
        assert maybe, "the kill left chunks in flight, recorded maybe_sent"
        assert len(sent) + len(maybe) == 20_000
        assert not server.stats.duplicates, "no number was received twice"
        assert sent <= set(server.stats.received) <= sent | maybe
        assert not has_journal(out)

    async def test_a_flag_given_again_must_say_the_same_or_the_run_is_refused(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "contatos.csv"
        excel_export(source, 400)
        other = tmp_path / "other.csv"
        excel_export(other, 400)
        out = tmp_path / "r.jsonl"
        job = ("-i", source, "-o", out, "--number-column", "Telefone", "--chunk-size", "10")
        await interrupted(
            server, env, "send", "basic", "--text", "Olá", *job, "--concurrency", "1", after=20
        )
        requests = server.stats.requests
        refusals = {
            "--chunk-size 7": ("send", "--resume", "-o", out, "--chunk-size", "7"),
            "--input": ("send", "--resume", "-o", out, "-i", other),
            "--text 'Oi'": ("send", "basic", "--text", "Oi", *job, "--resume"),
            "--prevalidate given": ("send", "--resume", "-o", out, "--prevalidate"),
            "`send basic` job, not `send single`": ("send", "single", "--text", "Olá", *job,
                                                   "--resume"),
        }  # fmt: skip
        for named, args in refusals.items():
            run = await dispatch_async(*args, env=env)
            assert run.code == 2, (named, run.stderr)
            assert named in run.stderr, run.stderr
        from_env = await dispatch_async(
            "send", "--resume", "-o", out, env=env | {"DISPATCH_CHUNK_SIZE": "50"}
        )
        assert from_env.code == 2
        assert "--chunk-size 50 (from $DISPATCH_CHUNK_SIZE)" in from_env.stderr
        assert server.stats.requests == requests, "a refused run sends nothing"

        # The same flags again (another path to the same file) are fine.
        same = await dispatch_async(
            "send", "basic", "--text", "Olá", "-i", f"{tmp_path}/./contatos.csv", "-o", out,
            "--chunk-size", "10", "--resume", env=env,
        )  # fmt: skip
        assert same.code == 0, same.stderr
        assert sum(server.stats.received.values()) == 400
        assert not server.stats.duplicates

    async def test_a_journal_from_before_stored_options_resumes_with_the_flags_as_before(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "contatos.csv"
        expected = excel_export(source, 400)
        out = tmp_path / "r.jsonl"
        job = ("send", "basic", "--text", "Olá", "-i", source, "-o", out)
        await interrupted(
            server, env, *job, "--number-column", "Telefone", "--chunk-size", "10",
            "--concurrency", "1", after=20,
        )  # fmt: skip
        write_journal_header(out, b"dispatch-async journal 1")  # as the old code wrote it

        bare = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert bare.code == 2
        assert "holds no options (it was written by an earlier dispatch-async" in bare.stderr
        flags = await dispatch_async(*job, "--number-column", "Telefone", "--resume", env=env)
        assert flags.code == 0, flags.stderr
        assert sorted(by_line(out)) == sorted(expected)
        assert server.stats.received == Counter(expected.values())

    async def test_a_finished_job_resumes_from_its_results_and_an_earlier_one_says_how(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        done = await dispatch_async(*send_args(excel, out, "--number-column", "Telefone"), env=env)
        assert done.code == 0, done.stderr
        run = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert run.code == 0, run.stderr
        assert server.stats.dispatch_calls == 1, "every row was sent: none again"

        forget(kept_options(out))  # as an earlier dispatch-async left a finished job
        earlier = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert earlier.code == 2
        assert "has no journal and no r.jsonl.job beside it" in earlier.stderr
        assert "dispatch-async export" in earlier.stderr
        assert server.stats.dispatch_calls == 1

    async def test_a_journal_header_torn_by_a_kill_is_written_again(
        self, server: FakeDispatchServer, env: dict[str, str], sheets: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        write_journal_header(out, b'dispatch-async journal 2 {"endpoint": "ba')
        args = send_args(sheets, out, "--number-column", "phone number", "--resume")
        run = await dispatch_async(*args, env=env)
        assert run.code == 0, run.stderr
        assert server.stats.received == Counter(SHEETS_NUMBERS.values())


# -- export: the rows to send again --------------------------------------------------------


class TestExport:
    async def test_writes_the_failed_rows_as_they_were_then_they_send_as_a_new_job(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(503))  # the first chunk (lines 2-5) is not acted on
        first = await dispatch_async(
            *send_args(excel, out, "--number-column", "Telefone", "--chunk-size", "3"),
            "--concurrency", "1", "--attempts", "1", env=env,
        )  # fmt: skip
        assert first.code == 1
        assert {r["line"] for r in records(out) if r["outcome"] == "not_sent"} == {2, 3, 4}

        retry = tmp_path / "retry.csv"
        export = await dispatch_async(
            "export", out, "--outcome", "not_sent,maybe_sent", "-i", excel, "-o", retry,
            env=env,
        )  # fmt: skip
        assert export.code == 0, export.stderr
        assert "3 rows" in export.stderr
        assert "has not finished" not in export.stderr  # every row has its outcome
        original = raw(excel)
        # BOM, header, then lines 2 to 5 (line 4's cell spans two lines), CRLF, ';', quotes.
        assert raw(retry) == original[: original.index("Zé".encode())]

        again = await dispatch_async(
            *send_args(retry, tmp_path / "retry.jsonl", "--number-column", "Telefone"), env=env
        )
        assert again.code == 0, again.stderr
        assert sorted(by_line(tmp_path / "retry.jsonl")) == [2, 3, 4]
        assert server.stats.received == Counter(EXCEL_NUMBERS.values()), "each once"

    async def test_finds_the_input_in_the_journal_of_a_stopped_job(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "nome|number", [f"A|{n}" for n in numbers(40)])
        out = tmp_path / "r.jsonl"
        server.latency = 0.5
        stopped = await dispatch_async(
            *send_args(source, out, "--chunk-size", "5", "--concurrency", "2"),
            "--deadline", "0.2", env=env,
        )  # fmt: skip
        assert stopped.code == 1
        maybe = sorted(r["line"] for r in records(out) if r["outcome"] == "maybe_sent")
        assert len(maybe) == 10

        export = await dispatch_async("export", out, "--outcome", "maybe_sent", env=env)
        assert export.code == 0, export.stderr
        lines = source.read_text().splitlines()
        assert export.stdout.splitlines() == ["nome|number"] + [lines[n - 1] for n in maybe]
        # The rows the deadline kept it from reading have no outcome: said, with the way on.
        assert len(records(out)) < 40
        assert f"the job writing {out} has not finished" in export.stderr
        assert f"dispatch-async send --resume -o {out} sends them" in export.stderr

    async def test_jsonl_lines_are_written_byte_for_byte(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "c.jsonl"
        lines = [f'{{"number": "{n}", "vars": {{"nome": "Jo\\u00e3o"}}}}\n' for n in numbers(4)]
        source.write_text("".join(lines), encoding="utf-8")
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(503))
        args = send_args(source, out, "--chunk-size", "2", "--concurrency", "1", "--attempts", "1")
        assert (await dispatch_async(*args, env=env)).code == 1
        export = await dispatch_async("export", out, "-i", source, env=env)
        assert export.code == 0, export.stderr
        assert export.stdout == "".join(lines[:2])

    async def test_format_reads_the_input_as_told_whatever_its_name(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"  # JSON lines, in a file named as a CSV
        lines = [f'{{"number": "{n}"}}\n' for n in numbers(4)]
        source.write_text("".join(lines), encoding="utf-8")
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(503))
        args = send_args(source, out, "--chunk-size", "2", "--concurrency", "1", "--attempts", "1")
        assert (await dispatch_async(*args, "--format", "jsonl", env=env)).code == 1
        assert server.stats.received == Counter(numbers(4)[2:])

        by_name = await dispatch_async("export", out, "-i", source, env=env)
        told = await dispatch_async("export", out, "-i", source, "--format", "jsonl", env=env)
        assert told.code == 0, told.stderr
        assert told.stdout == "".join(lines[:2])
        # By its name the file is a CSV: its lines are then rows, quoted as CSV.
        assert by_name.stdout.startswith('"{""number"": ')

    async def test_a_finished_job_names_its_input_an_earlier_one_needs_it_given(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        done = await dispatch_async(*send_args(excel, out, "--number-column", "Telefone"), env=env)
        assert done.code == 0, done.stderr
        found = await dispatch_async("export", out, "--outcome", "invalid", env=env)
        assert found.code == 0, found.stderr
        assert f"of {excel} (" in found.stderr, "the input the job kept beside its results"
        forget(kept_options(out))  # as an earlier dispatch-async left a finished job
        bare = await dispatch_async("export", out, env=env)
        assert bare.code == 2
        assert "--input" in bare.stderr
        onto = await dispatch_async("export", out, "-i", excel, "-o", excel, env=env)
        assert onto.code == 2
        assert "exists" in onto.stderr
        assert raw(excel) == raw(DATA / "contatos_excel.csv")

    async def test_a_torn_last_record_is_left_out_and_a_foreign_output_is_refused(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        append(out, b'{"line":2,"number":"(11) 98765-4321","outcome":"not_sent","error":"x",'
                    b'"error_type":"X"}\n{"line":3,"number":"1198')  # fmt: skip
        run = await dispatch_async("export", out, "-i", excel, env=env)
        assert run.code == 0, run.stderr
        assert run.stdout.splitlines()[1:] == ["Ana Souza;(11) 98765-4321;São Paulo;cliente antiga"]
        foreign = tmp_path / "foreign.jsonl"
        append(foreign, b'{"line":90000,"number":"1","outcome":"not_sent"}\n')
        refused = await dispatch_async("export", foreign, "-i", excel, env=env)
        assert refused.code == 2
        assert "does not name a line of the input" in refused.stderr


def record(line: int, outcome: str, **more: str) -> str:
    return json.dumps({"line": line, "number": "+5511900000001", "outcome": outcome, **more})


def results_file(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class TestExportRefusals:
    """In-process: what export refuses, with one clear line."""

    def refusal(self, spec: ExportSpec) -> Problem:
        with pytest.raises(Problem) as refused:
            run_export(spec, io.StringIO())
        return refused.value

    def test_what_it_is_asked_for_must_make_sense(self, tmp_path: Path) -> None:
        results = results_file(tmp_path / "r.jsonl", record(2, "not_sent"))
        out = tmp_path / "retry.csv"
        csv_in = write_csv(tmp_path / "c.csv", "number", ["+5511900000001"])
        unknown = ExportSpec(results, frozenset({"failed"}), str(csv_in), output=out)
        assert self.refusal(unknown).message == (
            "--outcome failed: not one of sent, invalid, not_sent, maybe_sent"
        )
        jsonl_in = tmp_path / "c.jsonl"
        jsonl_in.write_text('{"number": "+5511900000001"}\n')
        reasons = ExportSpec(
            results, frozenset({"not_sent"}), str(jsonl_in), output=out, with_reason=True
        )
        assert self.refusal(reasons).message.startswith("--with-reason adds columns to a CSV")
        assert not out.exists()

    def test_files_it_cannot_read_or_write_are_named_with_why(self, tmp_path: Path) -> None:
        results = results_file(tmp_path / "r.jsonl", record(2, "not_sent"))
        csv_in = write_csv(tmp_path / "c.csv", "number", ["+5511900000001"])
        wanted = frozenset({"not_sent"})
        cases = {
            f"cannot read {tmp_path}: Is a directory": ExportSpec(tmp_path, wanted, str(csv_in)),
            f"cannot write {tmp_path}/no/retry.csv: No such file or directory": ExportSpec(
                results, wanted, str(csv_in), output=tmp_path / "no" / "retry.csv"
            ),
            f"cannot read {tmp_path}/gone.jsonl: No such file or directory": ExportSpec(
                results, wanted, str(tmp_path / "gone.jsonl"), output=tmp_path / "a.jsonl"
            ),
            f"cannot read {tmp_path}/gone.csv: No such file or directory": ExportSpec(
                results, wanted, str(tmp_path / "gone.csv"), output=tmp_path / "a.csv"
            ),
        }
        for message, spec in cases.items():
            assert self.refusal(spec).message == message
        # Nothing is left behind under -o: the corrected command would find it "exists".
        assert not (tmp_path / "a.jsonl").exists()
        assert not (tmp_path / "a.csv").exists()

    def test_a_results_line_that_is_not_a_record_is_named(self, tmp_path: Path) -> None:
        results = results_file(tmp_path / "r.jsonl", record(2, "not_sent"), '{"line": 3}')
        csv_in = write_csv(tmp_path / "c.csv", "number", ["+5511900000001", "+5511900000002"])
        spec = ExportSpec(results, frozenset({"not_sent"}), str(csv_in), output=tmp_path / "x")
        assert self.refusal(spec).message == f"{results} line 2 is not a dispatch-async record"

    def test_an_input_csv_cannot_parse_fails_the_export_and_one_it_cannot_decode_is_refused(
        self, tmp_path: Path
    ) -> None:
        results = results_file(tmp_path / "r.jsonl", record(2, "not_sent"), record(3, "sent"))
        broken = tmp_path / "broken.csv"
        broken.write_bytes(b'number,name\n+5511900000001,"Ana"x\n+5511900000002,Bia\n')
        spec = ExportSpec(results, frozenset({"not_sent"}), str(broken), output=tmp_path / "a")
        unreadable = self.refusal(spec)
        assert unreadable.exit_code == 1
        assert unreadable.message.startswith(f"{broken}: line 2 of the input is not valid CSV")
        undecodable = tmp_path / "undecodable.csv"
        undecodable.write_bytes(b"number,name\n+5511900000001,\x81\x8d\x8f\x90\x9d\n")
        spec = ExportSpec(results, frozenset({"not_sent"}), str(undecodable), output=tmp_path / "b")
        refused = self.refusal(spec)
        assert refused.exit_code == 2
        assert refused.message.startswith(f"{undecodable}: ")


class TestExportChoosesRows:
    """In-process: which rows an export writes, and how."""

    def test_a_line_recorded_twice_is_exported_by_its_first_record(self, tmp_path: Path) -> None:
        results = results_file(
            tmp_path / "r.jsonl",
            record(2, "not_sent", error="x"),
            record(3, "sent", id="m-3"),
            record(3, "not_sent", error="x"),
        )
        csv_in = write_csv(tmp_path / "c.csv", "number", ["+5511900000001", "+5511900000002"])
        out = tmp_path / "retry.csv"
        err = io.StringIO()
        spec = ExportSpec(results, frozenset({"not_sent"}), str(csv_in), output=out)
        assert run_export(spec, err) == 0
        assert out.read_text() == "number\n+5511900000001\n"
        assert "1 row of" in err.getvalue()

    def test_a_headerless_input_read_with_columns_is_written_without_a_header(
        self, tmp_path: Path
    ) -> None:
        results = results_file(tmp_path / "r.jsonl", record(1, "sent"), record(2, "not_sent"))
        csv_in = tmp_path / "c.csv"
        csv_in.write_text("+5511900000001,Ana\n+5511900000002,Bia\n")
        out = tmp_path / "retry.csv"
        spec = ExportSpec(
            results, frozenset({"not_sent"}), str(csv_in), columns=("number", "name"), output=out
        )
        assert run_export(spec, io.StringIO()) == 0
        assert out.read_text() == "+5511900000002,Bia\n"

    def test_with_reason_on_an_earlier_export_fills_its_outcome_and_reason_columns(
        self, tmp_path: Path
    ) -> None:
        earlier = tmp_path / "fix.csv"
        earlier.write_text(
            "number,Outcome,name,reason\n+5511900000001,invalid,Ana,old\n+5511900000002\n"
        )
        results = results_file(
            tmp_path / "r.jsonl",
            record(2, "invalid", reason="blocked", detail="by the carrier"),
            record(3, "not_sent", error="=1+1"),
        )
        out = tmp_path / "fix2.csv"
        spec = ExportSpec(
            results,
            frozenset({"invalid", "not_sent"}),
            str(earlier),
            output=out,
            with_reason=True,
        )
        assert run_export(spec, io.StringIO()) == 0
        assert out.read_text().splitlines() == [
            "number,Outcome,name,reason",
            "+5511900000001,invalid,Ana,blocked: by the carrier",
            "+5511900000002,not_sent,,'=1+1",
        ]


class TestRecords:
    async def test_carry_the_number_sent_when_prevalidate_rewrote_it(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, sheets: Path,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        for source, column in ((excel, "Telefone"), (sheets, "Phone Number")):
            run = await dispatch_async(
                *send_args(source, tmp_path / f"{source.stem}.jsonl", "--number-column", column),
                "--prevalidate", "--region", "BR", env=env,
            )  # fmt: skip
            assert run.code == 0, run.stderr
        rewritten = by_line(tmp_path / "contatos_excel.jsonl")
        assert {line: rewritten[line]["sent_as"] for line in EXCEL_NUMBERS} == EXCEL_E164
        assert {line: rewritten[line]["number"] for line in EXCEL_NUMBERS} == EXCEL_NUMBERS
        as_given = by_line(tmp_path / "google_sheets.jsonl")
        assert not any("sent_as" in record for record in as_given.values())
        assert server.stats.received == Counter([*EXCEL_E164.values(), *SHEETS_NUMBERS.values()])


# -- the dry run ----------------------------------------------------------------------------


class TestDryRun:
    async def test_one_table_says_what_is_sent_and_why_the_rest_is_not(
        self, server: FakeDispatchServer, env: dict[str, str], excel: Path, tmp_path: Path
    ) -> None:
        with excel.open("ab") as stream:  # a repeated number and an impossible one
            stream.write(b"Dup;11 98765-4321;SP;\r\nErrado;12345;SP;\r\n")
        run = await dispatch_async(
            *send_args(excel, tmp_path / "r.jsonl", "--number-column", "Telefone"),
            "--prevalidate", "--region", "BR", "--dedupe", "--dry-run", env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        table = run.stdout.split("\nplan:")[0].splitlines()[2:]
        parsed = {}
        for line in table:
            row = re.fullmatch(r"  (.+?) +([\d,]+)(?:  \((.+)\))?", line)
            assert row is not None, line
            parsed[row[1]] = int(row[2].replace(",", ""))
        assert parsed == {
            "to send": 4,
            "refused: malformed input row": 1,
            "refused: duplicate": 1,
            "refused: number must be a valid phone number (checked locally)": 1,
            "empty rows": 3,
            "total": 10,
        }
        assert "separator ';' (semicolon)" in run.stdout
        assert "chunk 1: 4 recipients, lines 2-12" in run.stdout
        assert (server.stats.token_calls, server.stats.requests) == (0, 0)

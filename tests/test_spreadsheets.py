"""Bulk imports from the files people export from spreadsheets, end to end.

The fixtures in tests/data/spreadsheets/ are written as Excel (pt-BR: ``;``, a BOM, CRLF,
accents, a quoted multi-line cell, trailing ``;;;`` rows), Google Sheets (``,``) and a
tab-separated export write them. Every test runs the real command against the simulator,
whose counters show what reached the service, and how often.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest

from dispatch_async.testing import FakeDispatchServer, Fault
from tests import test_cli
from tests.test_cli import (
    COMMAND,
    by_line,
    dispatch_async,
    has_journal,
    numbers,
    outcomes,
    records,
    wait_for_records,
    write_csv,
)

server = test_cli.server
env = test_cli.env

DATA = Path(__file__).parent / "data" / "spreadsheets"

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
def tsv(tmp_path: Path) -> Path:
    return Path(shutil.copy(DATA / "contatos.tsv", tmp_path / "contatos.tsv"))


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

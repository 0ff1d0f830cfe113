"""What a send reads: CSV and JSONL rows, their problems, and line counts of what is not a file.

The command runs as a subprocess against the simulator, as in test_commands.
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from dispatch_async._cli.reading.input import (
    InputProblem,
    count_lines,
    is_regular_file,
    line_bound,
    open_rows,
)
from dispatch_async.testing import FakeDispatchServer
from tests.cli_helpers import (
    by_line,
    dispatch_async,
    records,
    write_csv,
    write_jsonl,
)
from tests.conftest import numbers

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


class TestJsonlRowProblems:
    """In-process: each JSONL line that cannot be a recipient says why, in its record."""

    def problems(self, tmp_path: Path, *lines: str) -> list[str | None]:
        source = tmp_path / "rows.jsonl"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        rows = open_rows(str(source))
        try:
            return [row.problem for row in rows]
        finally:
            rows.close()

    def test_each_wrong_field_is_named_with_the_json_kind_found(self, tmp_path: Path) -> None:
        assert self.problems(
            tmp_path,
            '{"number": "  "}',
            '{"number": "+5511987654321", "name": "Ana"}',
            '{"number": "+5511987654321", "vars": ["Ana"]}',
            '{"number": "+5511987654321", "vars": {"name": null}}',
            '{"number": "+5511987654321", "vars": {"name": true}}',
            '{"number": "+5511987654321", "vars": {"name": {"first": "Ana"}}}',
            '{"number": 5511987654321}',
            '"+5511987654321"',
            '{"number": "+5511987654321", "vars": null}',
        ) == [
            "'number' is empty",
            "unknown field 'name': a row has number and vars",
            "'vars' must be an object, not an array",
            "vars['name'] must be a string, not null",
            "vars['name'] must be a string, not a boolean",
            "vars['name'] must be a string, not an object",
            "'number' must be a string, not a number",
            "expected a JSON object, found a string",
            None,
        ]

    def test_stdin_is_left_open_when_its_header_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        stdin = io.TextIOWrapper(io.BytesIO(b"name,phone\nAna,+5511987654321\n"))
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(InputProblem, match="number"):
            open_rows("-", "csv")
        assert not stdin.buffer.closed


class TestLineCountsOfWhatIsNotAFile:
    """In-process: the progress total and the bound on line numbers a path allows."""

    def test_a_missing_path_has_no_line_count_and_the_bound_of_a_pipe(self, tmp_path: Path) -> None:
        missing = str(tmp_path / "gone.csv")
        assert not is_regular_file(missing)
        assert count_lines(missing) is None
        assert line_bound(missing) == line_bound("-") > 10**8

    def test_a_regular_file_that_fails_to_read_has_no_line_count(self) -> None:
        # /proc/self/mem is a regular file whose read at offset 0 fails (EIO).
        assert is_regular_file("/proc/self/mem")
        assert count_lines("/proc/self/mem") is None

    def test_a_file_counts_its_last_line_without_a_newline(self, tmp_path: Path) -> None:
        source = tmp_path / "c.csv"
        source.write_bytes(b"number\n+5511987654321\n+5511987654322")
        assert count_lines(str(source)) == 3
        assert line_bound(str(source)) == source.stat().st_size + 1

"""``--exclude``: which numbers an opt-out list holds, in whatever form either side wrote them.

Sending to someone who opted out cannot be undone (LGPD): a number in one form on the list
and in another in the job is one number, and a list read from the wrong column is refused
rather than read. The end-to-end tests run the real command against the simulator, whose
counters show what reached the service.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dispatch_async._cli.reading.exclude import ExcludeList, opt_out_form
from dispatch_async._cli.reading.problems import InputProblem
from dispatch_async.testing import FakeDispatchServer
from tests.cli_helpers import by_line, dispatch_async, write_csv

PHONE = "5511987654321"  # as the service and its callbacks' user_id write it
OTHER = "5521987650003"
NO_REGION = " (a number without its country code needs --region)"


def listed(
    tmp_path: Path, text: str, number_column: str = "number", region: str | None = None
) -> ExcludeList:
    path = tmp_path / "optouts.csv"
    path.write_text(text, encoding="utf-8")
    return ExcludeList(str(path), number_column, region)


class TestOneNumberInEveryForm:
    @pytest.mark.parametrize("region", [None, "BR"])
    def test_the_services_form_and_the_plus_form_are_one_number(self, region: str | None) -> None:
        assert opt_out_form(PHONE, region) == PHONE
        assert opt_out_form(f"+{PHONE}", region) == PHONE
        assert opt_out_form("+55 (11) 98765-4321", region) == PHONE

    def test_a_national_number_is_read_in_the_region(self) -> None:
        assert opt_out_form("(11) 98765-4321", "BR") == PHONE
        assert opt_out_form("11987654321", "BR") == PHONE
        assert opt_out_form("(11) 98765-4321", None) is None, "no country to read it in"

    def test_a_foreign_number_without_plus_is_the_services_form_even_with_a_region(
        self,
    ) -> None:
        assert opt_out_form("14155552671", "BR") == "14155552671"
        assert opt_out_form("+1 415 555 2671", "BR") == "14155552671"

    @pytest.mark.parametrize("value", ["", "nenhum", "2024-03-01", "12345", "+55 11 9000"])
    def test_what_is_not_a_phone_number_has_no_form(self, value: str) -> None:
        assert opt_out_form(value, "BR") is None

    @pytest.mark.parametrize("region", [None, "BR"])
    @pytest.mark.parametrize(
        ("on_the_list", "in_the_job"),
        [(PHONE, f"+{PHONE}"), (f"+{PHONE}", PHONE), ("+1 415 555 2671", "14155552671")],
        ids=["service-form-listed", "plus-form-listed", "foreign"],
    )
    def test_a_number_listed_in_one_form_excludes_it_in_the_other(
        self, tmp_path: Path, region: str | None, on_the_list: str, in_the_job: str
    ) -> None:
        found = listed(tmp_path, f"{on_the_list}\n{OTHER}\n", region=region)
        try:
            assert found.among([in_the_job, "+5531987650004"]) == {in_the_job}
        finally:
            found.close()

    def test_with_a_region_a_national_number_is_excluded_by_its_international_form(
        self, tmp_path: Path
    ) -> None:
        found = listed(tmp_path, f"{PHONE}\n", region="BR")
        try:
            assert found.among(["(11) 98765-4321", "11 98765-4322"]) == {"(11) 98765-4321"}
        finally:
            found.close()


class TestTheListsColumn:
    def test_the_column_named_like_the_jobs_number_column_is_read(self, tmp_path: Path) -> None:
        found = listed(tmp_path, f"fixo,celular\n+5511333344444,{PHONE}\n", "Celular")
        try:
            assert found.among([PHONE, "+5511333344444"]) == {PHONE}
            assert found.describe() == f"exclude: 1 number from {found.path}, never sent"
        finally:
            found.close()

    @pytest.mark.parametrize(
        ("text", "said"),
        [
            (f"id,telefone\n1,{PHONE}\n2,+{OTHER}\n", "its column 'telefone'"),
            (f"1;{PHONE}\n2;+{OTHER}\n", "its column 2"),
        ],
        ids=["header", "no-header"],
    )
    def test_else_the_only_column_holding_phone_numbers_is_read_and_said(
        self, tmp_path: Path, text: str, said: str
    ) -> None:
        found = listed(tmp_path, text, "celular")
        try:
            assert found.among([f"+{PHONE}", OTHER, "1", "2"]) == {f"+{PHONE}", OTHER}
            assert found.describe() == (
                f"exclude: 2 numbers from {found.path} ({said}, the only one holding phone "
                "numbers), never sent"
            )
        finally:
            found.close()

    def test_several_columns_holding_numbers_none_named_is_refused_naming_them(
        self, tmp_path: Path
    ) -> None:
        with pytest.raises(
            InputProblem,
            match=r"has no column 'celular' or 'number' and several of its columns hold "
            r"phone numbers \('telefone', 'fixo'\): rename the one to read 'number'$",
        ):
            listed(tmp_path, f"id;telefone;fixo\n1;{PHONE};+551133334444\n", "celular")
        with pytest.raises(InputProblem, match=r"has no header and several columns .* \(1, 2\)"):
            listed(tmp_path, f"{PHONE};+551133334444\n", "celular")

    @pytest.mark.parametrize(
        ("text", "region", "hint"),
        [
            ("nome;data\nAna;2024-03-01\n", "BR", ""),
            ("celular\n12345\nnenhum\n", "BR", ""),
            ("celular\n(11) 98765-4321\n", None, NO_REGION),
            ("\n\n", "BR", ""),
            ("id;data\n" + "7;2024\n" * 1000 + f"8;{PHONE}\n", "BR", " in its first 1,000 rows"),
        ],
        ids=[
            "no-column-holds-one", "the-named-column-holds-none", "national-without-region",
            "empty", "none-in-the-rows-looked-at",
        ],
    )  # fmt: skip
    def test_a_list_none_of_whose_values_is_a_phone_number_is_refused(
        self, tmp_path: Path, text: str, region: str | None, hint: str
    ) -> None:
        with pytest.raises(InputProblem) as refused:
            listed(tmp_path, text, "celular", region)
        assert (
            str(refused.value)
            == f"--exclude {tmp_path / 'optouts.csv'} holds no phone number{hint}"
        )


# -- end to end ----------------------------------------------------------------------------


def send(source: Path, out: Path, *more: str | Path) -> tuple[str | Path, ...]:
    return (
        "send", "basic", "--text", "Olá", "-i", source, "-o", out,
        "--number-column", "celular", *more,
    )  # fmt: skip


class TestAnOptedOutNumberIsNeverSent:
    async def test_in_the_services_form_on_the_list_and_another_column_name(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        """The callbacks' user_id pasted into an opt-out list excludes the job's +form."""
        rows = ["Ana,+5511987654321", "Bia,+5521987650003", "Caio,+5531987650004"]
        source = write_csv(tmp_path / "c.csv", "nome,celular", rows)
        optouts = tmp_path / "optouts.csv"
        optouts.write_text("id,telefone\n1,5511987654321\n2,5521987650003\n", encoding="utf-8")
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send(source, out, "--exclude", optouts), env=env)
        assert run.code == 0, run.stderr
        assert server.stats.received == Counter(["+5531987650004"])
        assert {line: r["outcome"] for line, r in by_line(out).items()} == {
            2: "invalid",
            3: "invalid",
            4: "sent",
        }
        assert (
            f"exclude: 2 numbers from {optouts} (its column 'telefone', the only one holding "
            "phone numbers), never sent"
        ) in run.stderr

    async def test_a_list_whose_column_is_in_doubt_stops_before_anything_is_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = write_csv(tmp_path / "c.csv", "nome,celular", ["Ana,+5511987654321"])
        optouts = tmp_path / "optouts.csv"
        optouts.write_text("telefone;fixo\n5511987654321;+551133334444\n", encoding="utf-8")
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send(source, out, "--exclude", optouts), env=env)
        assert run.code == 2, run.stderr
        assert "several of its columns hold phone numbers ('telefone', 'fixo')" in run.stderr
        assert server.stats.requests == 0
        assert not out.exists()

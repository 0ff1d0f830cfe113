"""A Brazilian sender's bulk job, end to end: Excel's Windows-1252 export, template vars
mapped from its columns, an opt-out list, and the rows to fix exported with their reason.

Every test runs the real command against the simulator. A recording proxy in front of
the simulator shows what each request carried (the simulator counts numbers, not vars).
``tests/data/spreadsheets/pix_excel_windows_1252.csv`` is an Excel pt-BR "CSV (separado
por vírgulas)" export: Windows-1252, ``;``, CRLF, no BOM, two ``;;;;`` rows at the end;
it was written with ``text.encode("cp1252")``, as Excel writes it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dispatch_async._cli.job.export import correction
from dispatch_async._cli.job.source import load_exclude
from dispatch_async._cli.job.spec import Connection, InputSpec, JobSpec, Target
from dispatch_async._cli.reading.exclude import ExcludeList
from dispatch_async._cli.screen.problem import Problem
from dispatch_async.testing import FakeDispatchServer, Fault
from tests.cli_helpers import by_line, dispatch_async, interrupted, raw, records

DATA = Path(__file__).parents[1] / "data" / "spreadsheets"
#: The fixture's numbers by line, and its names as Excel wrote them.
PIX_NUMBERS = {
    2: "+5511987650001",
    3: "+5511987650002",
    4: "+5521987650003",
    5: "+5531987650004",
    6: "+5511987650005",
}
PIX_NAMES = {
    2: "João da Silva",
    3: "Maria da Conceição",
    4: "Sebastião Araújo",
    5: "José Inácio",
    6: "Conceição Brandão",
}


@pytest.fixture
def pix(tmp_path: Path) -> Path:
    return Path(shutil.copy(DATA / "pix_excel_windows_1252.csv", tmp_path / "clientes.csv"))


class Recorder:
    """A proxy to the simulator that keeps every message each dispatch request carried."""

    def __init__(self) -> None:
        self.url = ""
        self.messages: list[dict[str, Any]] = []

    def vars_by_number(self) -> dict[str, dict[str, str]]:
        return {message["number"]: message.get("vars", {}) for message in self.messages}


@pytest.fixture
async def recorder(server: FakeDispatchServer) -> AsyncIterator[Recorder]:
    recorded = Recorder()
    async with aiohttp.ClientSession() as client:

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            if request.path.startswith("/api/v3/") and body:
                recorded.messages += json.loads(body).get("messages", [])
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            async with client.request(
                request.method, server.url + request.path_qs, data=body, headers=headers
            ) as answer:
                return web.Response(
                    body=await answer.read(),
                    status=answer.status,
                    content_type=answer.content_type,
                )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        recorded.url = f"http://127.0.0.1:{port}"
        try:
            yield recorded
        finally:
            await runner.cleanup()


@pytest.fixture
def proxied(env: dict[str, str], recorder: Recorder) -> dict[str, str]:
    """The user's environment, with the service behind the recording proxy."""
    return env | {"DISPATCH_BASE_URL": recorder.url}


def send_pix(source: Path, out: Path | None, *more: str | Path) -> tuple[str | Path, ...]:
    output: tuple[str | Path, ...] = ("-o", out) if out is not None else ()
    return (
        "send", "template", "--template-id", "pix_reminder", "-i", source, *output,
        "--number-column", "telefone", *more,
    )  # fmt: skip


# -- item 1: Excel's encoding ------------------------------------------------------------


class TestExcelEncoding:
    async def test_a_windows_1252_export_is_read_whole_and_said_so(
        self, server: FakeDispatchServer, proxied: dict[str, str], recorder: Recorder,
        pix: Path, tmp_path: Path,
    ) -> None:  # fmt: skip
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_pix(pix, out), env=proxied)
        assert run.code == 0, run.stderr
        assert "input encoding: Windows-1252 (detected" in run.stderr
        assert Counter(r["outcome"] for r in records(out)) == Counter(sent=5)
        assert server.stats.received == Counter(PIX_NUMBERS.values())
        sent = recorder.vars_by_number()
        assert {n: sent[n]["Nome"] for n in PIX_NUMBERS.values()} == {
            PIX_NUMBERS[line]: name for line, name in PIX_NAMES.items()
        }
        assert sent[PIX_NUMBERS[6]]["Observação"] == "€ 10,00 de juros"

    async def test_utf8_with_or_without_a_bom_is_read_as_utf8(
        self, server: FakeDispatchServer, proxied: dict[str, str], recorder: Recorder,
        pix: Path, tmp_path: Path,
    ) -> None:  # fmt: skip
        text = raw(pix).decode("cp1252")
        for name, data in (("bom", b"\xef\xbb\xbf" + text.encode()), ("plain", text.encode())):
            source = tmp_path / f"{name}.csv"
            source.write_bytes(data)
            run = await dispatch_async(*send_pix(source, tmp_path / f"{name}.jsonl"), env=proxied)
            assert run.code == 0, run.stderr
            assert "input encoding: UTF-8 (detected" in run.stderr
        assert {m["vars"]["Nome"] for m in recorder.messages} == set(PIX_NAMES.values())
        assert len(recorder.messages) == 10

    async def test_encoding_forces_one_and_a_header_it_cannot_read_is_refused(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_pix(pix, out, "--encoding", "utf-8"), env=env)
        assert run.code == 2
        assert "the CSV header (line 1) is not valid UTF-8: give --encoding" in run.stderr
        bad = await dispatch_async(*send_pix(pix, out, "--encoding", "latin-9"), env=env)
        assert bad.code == 2
        assert "--encoding" in bad.stderr
        forced = await dispatch_async(*send_pix(pix, out, "--encoding", "cp1252"), env=env)
        assert forced.code == 0, forced.stderr
        assert "input encoding: Windows-1252 (given)" in forced.stderr
        assert server.stats.recipients_received == 5

    @pytest.mark.parametrize(
        ("data", "said"),
        [
            (
                "Nome;Telefone\r\nJoão;+5511987650001\r\n".encode()
                + b"".join(b"Ana;+55119876%05d\r\n" % i for i in range(2, 2000))
                + "Conceição;+5511987600000\r\n".encode("cp1252"),
                "the file mixes encodings: line 2 is UTF-8, line 2001 is not",
            ),
            ("Nome;Telefone\r\nJoão;+5511987650001\r\n".encode("utf-16"), "UTF-16"),
            (b"PK\x03\x04\x14\x00\x06\x00Telefone\xc3\x00", "NUL byte"),
            (b"Nome;Telefone\r\nJo\x81o;+5511987650001\r\n", "neither UTF-8 nor Windows-1252"),
        ],
        ids=["mixed", "utf-16", "xlsx", "undefined-byte"],
    )
    async def test_a_file_that_is_neither_gets_one_error_before_anything_is_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path,
        data: bytes, said: str,
    ) -> None:  # fmt: skip
        source = tmp_path / "c.csv"
        source.write_bytes(data)
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_pix(source, out), env=env)
        assert run.code == 2, run.stderr
        assert run.stderr.startswith("Error: "), run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert said in run.stderr
        assert not out.exists()
        assert (server.stats.token_calls, server.stats.requests) == (0, 0)

    async def test_stdin_is_judged_on_its_first_line_beyond_ascii(
        self, server: FakeDispatchServer, proxied: dict[str, str], recorder: Recorder,
        pix: Path, tmp_path: Path,
    ) -> None:  # fmt: skip
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_pix(Path("-"), out), env=proxied, stdin=raw(pix))
        assert run.code == 0, run.stderr
        assert "Windows-1252" in run.stderr
        assert {m["vars"]["Nome"] for m in recorder.messages} == set(PIX_NAMES.values())

    async def test_export_writes_the_rows_back_in_the_encoding_read(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "r.jsonl"
        server.script(Fault.status(503))  # the first chunk (lines 2 to 4) is not acted on
        args = ("--chunk-size", "3", "--concurrency", "1", "--attempts", "1")
        assert (await dispatch_async(*send_pix(pix, out, *args), env=env)).code == 1
        retry = tmp_path / "retry.csv"
        export = await dispatch_async("export", out, "-i", pix, "-o", retry, env=env)
        assert export.code == 0, export.stderr
        assert "(in Windows-1252, as the input is)" in export.stderr
        original = raw(pix)
        assert raw(retry) == original[: original.index("José".encode("cp1252"))]

    async def test_a_resume_reads_as_the_job_did_and_keeps_its_var_mapping(
        self, server: FakeDispatchServer, env: dict[str, str], recorder: Recorder,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        source = tmp_path / "clientes.csv"
        lines = dict(enumerate((f"+55119{i:08d}" for i in range(600)), 2))
        rows = "".join(f"Conceição {line};{n};PIX{line}\r\n" for line, n in lines.items())
        source.write_bytes(("Nome;Telefone;Código Pix\r\n" + rows).encode("cp1252"))
        out = tmp_path / "r.jsonl"
        proxied = env | {"DISPATCH_BASE_URL": recorder.url}
        job = send_pix(source, out, "--var", "pixCode=Código Pix", "--only-vars")
        await interrupted(
            server, proxied, *job, "--chunk-size", "10", "--concurrency", "1", after=30
        )
        stored = json.loads(raw(Path(f"{out}.pending")).split(b"\n")[0].split(b" ", 3)[3])
        assert stored["encoding"] == "windows-1252"
        assert stored["variables"] == ["pixCode=Código Pix"]

        other = await dispatch_async("send", "--resume", "-o", out, "--encoding", "utf-8", env=env)
        assert other.code == 2
        assert "--encoding 'utf-8' is not what the job" in other.stderr
        resumed = await dispatch_async("send", "--resume", "-o", out, env=proxied)
        assert resumed.code == 0, resumed.stderr
        # Not typed by the person resuming: said where it came from.
        assert "input encoding: Windows-1252 (from the journal)" in resumed.stderr
        assert sorted(by_line(out)) == sorted(lines)
        sent = recorder.vars_by_number()
        assert sent == {number: {"pixCode": f"PIX{line}"} for line, number in lines.items()}
        assert not server.stats.duplicates


# -- item 4: template vars from columns --------------------------------------------------


class TestVariables:
    async def test_var_sends_a_column_under_the_templates_name(
        self, server: FakeDispatchServer, proxied: dict[str, str], recorder: Recorder,
        pix: Path, tmp_path: Path,
    ) -> None:  # fmt: skip
        run = await dispatch_async(
            *send_pix(pix, tmp_path / "a.jsonl", "--var", "pixCode=Código Pix"), env=proxied
        )
        assert run.code == 0, run.stderr
        first = recorder.vars_by_number()[PIX_NUMBERS[2]]
        assert first == {
            "Nome": "João da Silva",
            "pixCode": "00020126580014BR.GOV.BCB.PIX0136joao",
            "Cidade": "São Paulo",
            "Observação": "cliente desde 2019",
        }

    async def test_only_vars_sends_just_the_mapped_columns(
        self, server: FakeDispatchServer, proxied: dict[str, str], recorder: Recorder,
        pix: Path, tmp_path: Path,
    ) -> None:  # fmt: skip
        run = await dispatch_async(
            *send_pix(pix, tmp_path / "a.jsonl", "--var", "pixCode=código pix",
                      "--var", "nome=NOME", "--only-vars"),
            env=proxied,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        assert recorder.vars_by_number()[PIX_NUMBERS[3]] == {
            "nome": "Maria da Conceição",
            "pixCode": "00020126580014BR.GOV.BCB.PIX0136maria",
        }
        assert len(recorder.messages) == 5

    @pytest.mark.parametrize(
        ("given", "said"),
        [
            (
                ("--var", "pixCode=Codigo Pix"),
                "--var pixCode='Codigo Pix': the CSV has no column 'Codigo Pix' (columns: "
                "'Nome', 'Telefone', 'Código Pix', 'Cidade', 'Observação')",
            ),
            (("--var", "pixCode"), "is not NAME=COLUMN"),
            (("--var", "a=Nome", "--var", "a=Cidade"), "the var 'a' is mapped twice"),
            (("--var", "Cidade=Nome"), "the CSV also has a column 'Cidade'"),
        ],
        ids=["missing-column", "no-column", "twice", "collision"],
    )
    async def test_a_mapping_that_cannot_hold_is_exit_2_before_anything_is_sent(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path,
        given: tuple[str, ...], said: str,
    ) -> None:  # fmt: skip
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(*send_pix(pix, out, *given), env=env)
        assert run.code == 2, run.stderr
        assert said in run.stderr
        assert not out.exists()
        assert server.stats.requests == 0

    async def test_the_dry_run_lists_the_vars_with_one_example_row(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path
    ) -> None:
        run = await dispatch_async(
            *send_pix(pix, None, "--var", "pixCode=Código Pix", "--var", "nome=Nome",
                      "--only-vars", "--dry-run"),
            env=env,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        assert "\nvars: nome (column 'Nome'), pixCode (column 'Código Pix')\n" in run.stdout
        assert (
            "\nexample, line 2: number '+5511987650001', nome 'João da Silva', "
            "pixCode '00020126580014BR.GOV.BCB.PIX0136joao'\n"
        ) in run.stdout
        assert "+5511987650001" not in run.stderr, "the example is for stdout only"
        assert (server.stats.token_calls, server.stats.requests) == (0, 0)


# -- item 9: export, what it reads and what it writes --------------------------------------


class TestExportArguments:
    async def failed_job(self, server: FakeDispatchServer, env: dict[str, str], pix: Path,
                         out: Path) -> None:  # fmt: skip
        server.script(Fault.status(503))
        args = ("--chunk-size", "3", "--concurrency", "1", "--attempts", "1")
        assert (await dispatch_async(*send_pix(pix, out, *args), env=env)).code == 1

    async def test_the_natural_guess_gets_a_one_line_correction(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "resultados.jsonl"
        await self.failed_job(server, env, pix, out)
        retry = tmp_path / "retry.csv"
        guess = await dispatch_async("export", "-i", out, "-o", retry, env=env)
        assert guess.code == 2
        error = [line for line in guess.stderr.splitlines() if line.startswith("Error: ")]
        assert error == [
            f"Error: {out} is a job's results: name it first, `dispatch-async export {out} "
            f"-o {retry}` (-i is the job's input, the spreadsheet it read)"
        ]
        assert not retry.exists()
        swapped = await dispatch_async("export", pix, "-i", out, env=env)
        assert swapped.code == 2
        assert f"`dispatch-async export {out} -i {pix} ...`" in swapped.stderr
        done = await dispatch_async("export", out, "-i", pix, "-o", retry, env=env)
        assert done.code == 0, done.stderr
        assert f"export: 3 rows of {pix} (3 not_sent) written to {retry}" in done.stderr

    def test_a_missing_results_file_and_a_results_file_given_as_o_are_named(
        self, tmp_path: Path
    ) -> None:
        missing = tmp_path / "resultados.jsonl"
        assert correction(missing, None, None) == f"RESULTS {missing} does not exist"
        done = tmp_path / "done.jsonl"
        done.write_text('{"line": 2, "number": "+5511987650001", "outcome": "not_sent"}\n')
        assert correction(None, None, done) == (
            f"{done} is a job's results, which export reads, and -o is the file it writes: "
            f"`dispatch-async export {done} -o retry.csv`"
        )
        assert correction(None, None, None) == (
            "Missing argument 'RESULTS': the results file of the job (what its `send -o` wrote)"
        )

    async def test_with_reason_appends_outcome_and_reason_and_neutralises_formulas(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path
    ) -> None:
        formulas = ['=HYPERLINK("http://x.example","clique")', "+1+1", "-2+3", "@SUM(A1)"]
        server.script(
            Fault.wrong_shape(
                body={
                    "validMessages": [{"number": PIX_NUMBERS[6], "id": "m-6"}],
                    "invalidMessages": [
                        {"number": PIX_NUMBERS[line], "reason": reason}
                        for line, reason in zip(range(2, 6), formulas, strict=True)
                    ],
                }
            )
        )
        out = tmp_path / "r.jsonl"
        assert (await dispatch_async(*send_pix(pix, out), env=env)).code == 0
        fix = tmp_path / "corrigir.csv"
        export = await dispatch_async(
            "export", out, "-i", pix, "--outcome", "invalid", "--with-reason", "-o", fix, env=env
        )
        assert export.code == 0, export.stderr
        lines = raw(fix).decode("cp1252").split("\r\n")
        assert lines[0] == "Nome;Telefone;Código Pix;Cidade;Observação;outcome;reason"
        assert lines[1] == (
            "João da Silva;+5511987650001;00020126580014BR.GOV.BCB.PIX0136joao;São Paulo;"
            'cliente desde 2019;invalid;"\'=HYPERLINK(""http://x.example"",""clique"")"'
        )
        reasons = [line.rsplit(";", 1)[1] for line in lines[2:5]]
        assert reasons == ["'+1+1", "'-2+3", "'@SUM(A1)"]
        assert [line.split(";")[1] for line in lines[1:5]] == [
            PIX_NUMBERS[line] for line in range(2, 6)
        ], "the input's own +55 numbers are written as they were"


# -- item 10: opt-outs -----------------------------------------------------------------------


class TestExclude:
    async def test_excluded_numbers_are_recorded_with_their_reason_and_never_sent(
        self, server: FakeDispatchServer, env: dict[str, str], pix: Path, tmp_path: Path
    ) -> None:
        optouts = tmp_path / "optouts.csv"
        optouts.write_text("telefone;data\n(11) 98765-0002;2024-03-01\n+55 31 98765 0004;x\n")
        out = tmp_path / "r.jsonl"
        plan = await dispatch_async(
            *send_pix(pix, None, "--exclude", optouts, "--region", "BR", "--dry-run"), env=env
        )
        assert plan.code == 0, plan.stderr
        assert "refused: excluded  2  (--exclude; recorded invalid)" in plan.stdout
        run = await dispatch_async(
            *send_pix(pix, out, "--exclude", optouts, "--region", "BR"), env=env
        )
        assert run.code == 0, run.stderr
        found = by_line(out)
        assert {line: r["reason"] for line, r in found.items() if r["outcome"] == "invalid"} == {
            3: "excluded",
            5: "excluded",
        }
        assert server.stats.received == Counter(PIX_NUMBERS[line] for line in (2, 4, 6))
        assert "invalid includes 2 excluded numbers (--exclude)" in run.stderr
        fix = tmp_path / "fix.csv"
        export = await dispatch_async(
            "export", out, "-i", pix, "--outcome", "invalid", "-o", fix, env=env
        )
        assert export.code == 0, export.stderr
        assert raw(fix).count(b"\n") == 1, "the header alone: an opt-out is never exported"
        assert "2 excluded rows (--exclude) left out" in export.stderr

    async def test_a_resume_excludes_with_the_jobs_list_read_again(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = tmp_path / "c.csv"
        numbers = [f"+55119{i:08d}" for i in range(400)]
        source.write_text("telefone\n" + "".join(n + "\n" for n in numbers))
        optouts = tmp_path / "optouts.txt"
        optouts.write_text(f"{numbers[0]}\n")
        out = tmp_path / "r.jsonl"
        await interrupted(
            server, env, *send_pix(source, out, "--exclude", optouts, "--chunk-size", "10",
                                   "--concurrency", "1"), after=40,
        )  # fmt: skip
        optouts.write_text(f"{numbers[0]}\n{numbers[-1]}\n")  # a new opt-out meanwhile
        moved = Path(shutil.copy(optouts, tmp_path / "elsewhere.txt"))
        refused = await dispatch_async("send", "--resume", "-o", out, "--exclude", moved, env=env)
        assert refused.code == 2
        assert "--exclude" in refused.stderr
        assert "is not what the job writing" in refused.stderr
        resumed = await dispatch_async("send", "--resume", "-o", out, env=env)
        assert resumed.code == 0, resumed.stderr
        excluded = [r["number"] for r in records(out) if r["outcome"] == "invalid"]
        assert sorted(excluded) == [numbers[0], numbers[-1]]
        assert set(server.stats.received) == set(numbers[1:-1])

    async def test_a_list_without_a_number_or_that_cannot_be_read_is_refused_by_name(
        self, tmp_path: Path
    ) -> None:
        def job(exclude: Path) -> JobSpec:
            return JobSpec(
                Target("basic", text="oi"),
                Connection(None, None, None),
                InputSpec(str(tmp_path / "c.csv")),
                None,
                exclude=str(exclude),
            )

        headers = tmp_path / "headers.csv"
        headers.write_text("telefone;data\nnenhum;2024-03-01\n")
        with pytest.raises(Problem, match=f"^--exclude {headers} holds no phone number "):
            await load_exclude(job(headers))
        missing = tmp_path / "missing.csv"
        with pytest.raises(
            Problem, match=f"^cannot read --exclude {missing}: No such file or directory$"
        ):
            await load_exclude(job(missing))
        broken = tmp_path / "broken.csv"
        broken.write_text("+5511900000001\n" + "9" * (9 << 20) + "\n")  # over csv's field limit
        with pytest.raises(Problem, match=f"^--exclude {broken} is not a list of numbers"):
            await load_exclude(job(broken))

    def test_rows_without_a_number_in_its_column_are_skipped(self, tmp_path: Path) -> None:
        optouts = tmp_path / "optouts.csv"
        optouts.write_text(
            "nome,telefone\nAna,+5511900000001\nsem número,\nBia\nCaio,+5511900000003\n"
        )
        found = ExcludeList(str(optouts), "telefone")
        try:
            assert found.count == 2
            assert found.among(["+5511900000001", "+5511900000002", "+5511900000003"]) == {
                "+5511900000001",
                "+5511900000003",
            }
        finally:
            found.close()

    def test_a_large_list_is_held_on_disk_not_in_memory(self, tmp_path: Path) -> None:
        def peak_kib(count: int) -> int:
            path = tmp_path / f"optouts-{count}.txt"
            path.write_text("".join(f"+55119{i:08d}\n" for i in range(count)))
            script = (
                "import resource\n"
                "from dispatch_async._cli.reading.exclude import ExcludeList\n"
                f"found = ExcludeList({str(path)!r}, 'number')\n"
                "assert found.count == %d\n"
                "assert found.among(['+5511900000007', '+5511999999999']) == {'+5511900000007'}\n"
                "found.close()\n"
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n" % count
            )
            done = subprocess.run(  # noqa: S603 - our own interpreter, a fixed script
                [sys.executable, "-c", script], capture_output=True, text=True, check=True
            )
            return int(done.stdout)

        # 250,000 numbers: a set of them takes over 20 MB.
        assert peak_kib(250_000) - peak_kib(1000) < 12_000

"""``--encoding``: a given encoding is taken as it is, unless the file says otherwise.

A UTF-8 BOM says the file is UTF-8: read as Windows-1252 it would be sent garbled
(``{'ï»¿nome': 'JoÃ£o'}``), so that pair is refused before anything is read.
"""

from __future__ import annotations

import codecs
import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from dispatch_async._cli.reading.encoding import UTF8, WINDOWS_1252, detect_encoding
from dispatch_async._cli.reading.problems import InputProblem
from dispatch_async.testing import FakeDispatchServer
from tests.cli_helpers import dispatch_async, raw

DATA = Path(__file__).parents[2] / "data" / "spreadsheets"
TEXT = "nome;number\r\nJoão;+5511987654321\r\n".encode()
Opener = Callable[[bytes], IO[bytes]]
REFUSED = (
    "the file starts with a UTF-8 BOM, so it is UTF-8, not Windows-1252: "
    "give --encoding utf-8 (or leave --encoding out)"
)


@pytest.fixture(params=["file", "pipe"])
def opened(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens bytes as a seekable file or as a pipe (read once, from its start)."""
    kind = request.param
    streams: list[IO[bytes]] = []

    def open_bytes(data: bytes) -> IO[bytes]:
        if kind == "file":
            stream: IO[bytes] = io.BytesIO(data)
        else:
            read, write = os.pipe()
            os.write(write, data)  # smaller than a pipe's buffer
            os.close(write)
            stream = open(read, "rb")  # noqa: SIM115 - closed by the fixture
        streams.append(stream)
        return stream

    yield open_bytes
    for stream in streams:
        stream.close()


class TestAGivenEncodingAndABom:
    def test_windows_1252_given_for_a_file_with_a_utf8_bom_is_refused(self, opened: Opener) -> None:
        with pytest.raises(InputProblem) as refused:
            detect_encoding(opened(codecs.BOM_UTF8 + TEXT), WINDOWS_1252)
        assert str(refused.value) == REFUSED

    @pytest.mark.parametrize(
        ("data", "given"),
        [
            (TEXT.decode().encode("cp1252"), WINDOWS_1252),
            (codecs.BOM_UTF8 + TEXT, UTF8),
            (b"", WINDOWS_1252),
            (b"\xef\xbb", WINDOWS_1252),
        ],
        ids=["no-bom", "utf-8-given", "empty", "two-bytes-of-a-bom"],
    )  # fmt: skip
    def test_otherwise_the_file_is_read_from_its_start_in_the_encoding_given(
        self, opened: Opener, data: bytes, given: str
    ) -> None:
        stream, found = detect_encoding(opened(data), given)
        assert (found.codec, found.detected) == (given, False)
        assert stream.read() == data


class TestTheCommand:
    async def test_refuses_a_bom_with_windows_1252_before_anything_is_sent(
        self, server: FakeDispatchServer, env: dict[str, str], tmp_path: Path
    ) -> None:
        source = Path(shutil.copy(DATA / "contatos_excel.csv", tmp_path / "contatos.csv"))
        assert raw(source).startswith(codecs.BOM_UTF8), "Excel's CSV UTF-8"
        out = tmp_path / "r.jsonl"
        run = await dispatch_async(
            "send", "basic", "--text", "Olá {{Nome}}", "-i", source, "-o", out,
            "--number-column", "Telefone", "--encoding", "windows-1252", env=env,
        )  # fmt: skip
        assert run.code == 2, run.stderr
        assert run.stderr == f"Error: {source}: {REFUSED}\n"
        assert (server.stats.token_calls, server.stats.requests) == (0, 0)
        assert not out.exists()

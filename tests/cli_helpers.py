"""Running the real command as a subprocess, reading what it wrote, killing it mid-request.

The fixtures these go with (``server``, ``env``, ``contacts``) are in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from dispatch_async.testing import FakeDispatchServer

COMMAND = (sys.executable, "-m", "dispatch_async._cli")


@attrs.frozen
class Run:
    code: int
    stdout: str
    stderr: str


async def dispatch_async(
    *args: str | Path,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    kill_after: float = 300.0,
) -> Run:
    """Run the command to its end; kill it if it is still running after *kill_after* s
    (a bound only a hang reaches: a big job under coverage on a loaded machine is slow)."""
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


async def killed_with_a_request_in_flight(
    server: FakeDispatchServer,
    env: Mapping[str, str],
    *args: str | Path,
    records: int = 0,
    hold: bool = True,
    until: Callable[[], bool] = lambda: True,
) -> None:
    """Run *args*, then kill -9 it once *records* records are written, *until* holds and
    the service holds a request of it in flight, so that the kill always cuts a request.

    With *hold* (the default) every request started after the records are written is held
    until the server closes; without it, the test scripts the faults that hold requests
    (``Fault.hang()``). The server answers at once again afterwards."""
    out = Path(args[args.index("-o") + 1])
    process = await asyncio.create_subprocess_exec(
        *COMMAND, *map(str, args),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=dict(env),
    )  # fmt: skip
    try:
        await wait_for_records(out, records, process)
        if hold:
            server.latency = 3600
        await server.wait_until(lambda: server.in_flight > 0 and until(), timeout=60)
    finally:
        process.kill()
        await process.wait()
    server.latency = 0
    assert process.returncode == -signal.SIGKILL
    assert has_journal(out), "killed before the end"


async def stopped_by_its_deadline(
    server: FakeDispatchServer, env: Mapping[str, str], tmp_path: Path
) -> tuple[Path, Run]:
    """A job of 40 rows stopped by ``--deadline`` with two requests of 5 in flight (the
    simulator answers after 0.5 s): its results file and how it ended. (The numbers are
    ``tests.conftest.numbers(40)``, which imports this module.)"""
    source = write_csv(tmp_path / "c.csv", "number", [f"+55119{i:08d}" for i in range(40)])
    out = tmp_path / "r.jsonl"
    server.latency = 0.5
    run = await dispatch_async(
        "send", "basic", "--text", "hi", "-i", source, "-o", out,
        "--chunk-size", "5", "--concurrency", "2", "--deadline", "0.2", env=env,
    )  # fmt: skip
    return out, run


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


def files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def has_journal(output: Path) -> bool:
    return Path(f"{output}.pending").exists()


def kept_options(output: Path) -> Path:
    """Where a finished job keeps its options: beside its results."""
    return Path(f"{output}.job")


def forget(path: Path) -> None:
    """Delete *path* (a plain call, not an await)."""
    path.unlink()


async def wait_for_records(path: Path, count: int, process: asyncio.subprocess.Process) -> None:
    """Poll the output until it has *count* records (bounded: fail rather than hang)."""
    async with asyncio.timeout(120):
        while line_count(path) < count:
            assert process.returncode is None, "the job ended before it could be stopped"
            await asyncio.sleep(0.01)


async def interrupted(
    server: FakeDispatchServer, env: dict[str, str], *args: str | Path, after: int
) -> None:
    """Run *args*, Ctrl-C it once *after* records are written, wait for it to stop."""
    out = Path(args[args.index("-o") + 1])
    server.latency = 0.02
    process = await asyncio.create_subprocess_exec(
        *COMMAND, *map(str, args),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    await wait_for_records(out, after, process)
    process.send_signal(signal.SIGINT)
    async with asyncio.timeout(20):
        await process.wait()
    server.latency = 0
    assert process.returncode == 1, "stopped before the end"
    assert has_journal(out)


def raw(path: Path) -> bytes:
    """A file's bytes, for a test that compares them (a plain call, not an await)."""
    return path.read_bytes()

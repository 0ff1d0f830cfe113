"""Crash at every step: the bulk job killed, cut off and failed at each of its I/O points.

A small ``send`` job (360 rows in chunks of 10, malformed rows, numbers the service
rejects, one request retried after a 503) is run once with its file-system calls
counted (see ``tests/crash_interpose.py``): N points. Then, for every k, the same job is
run again and, at its k-th point, SIGKILLed before the call, SIGKILLed just after it,
cut off by a power loss, or made to fail with ENOSPC, EIO or a short write; a
``send --resume`` follows, with nothing failing, and the files and the simulator's own
counters are checked. The same is done to a resume: phase 2 starts from a job killed
half-way and explores the points of its ``--resume`` (the compaction included).

``python -m tests.crash_points`` (``nox -s crash``) explores every point and ends with
one line, ``crash points: N explored, 0 lost, 0 sent twice`` (or what broke, and where);
``--sample 20`` tries 20 scenarios spread over the points; ``--only 1:17:enospc``
replays one. The test suite runs a sample on every run (tests/test_crash_points.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from dispatch_async.testing import FakeDispatchServer, Fault

from .crash_interpose import FAULTS, KILLS

SECRET = "crash-explorer-secret"
ROOT = Path(__file__).resolve().parent.parent
ROWS, CHUNK = 360, 10
MODES = (*KILLS, *FAULTS)
RUN_TIMEOUT = 60.0
#: Where the files of a failing scenario are kept (its runs' stderr and traces included).
KEPT = Path(tempfile.gettempdir()) / "crash-points-failed"
_RANGE = re.compile(rb"^(\d+)-(\d+)")


def job_rows() -> list[str]:
    """The input's data rows: valid numbers, some malformed rows, some the service rejects."""
    rows = []
    for i in range(ROWS):
        if i % 37 == 5:
            rows.append(f"+5511{i:09d},Ana,extra")  # three fields: malformed, never sent
        elif i % 41 == 7:
            rows.append(f"12{i},Bia")  # the service answers invalid
        else:
            rows.append(f"+5511{i:09d},Caio")
    return rows


#: The number whose first request is answered 503 (retried at once).
RETRIED = "+5511000000045"


def sent_numbers() -> set[str]:
    return {row.split(",")[0] for row in job_rows() if row.count(",") == 1}


@attrs.frozen
class Scenario:
    phase: int  # 1: a fresh job; 2: the resume of a job killed half-way
    k: int
    mode: str

    @property
    def name(self) -> str:
        return f"{self.phase}:{self.k}:{self.mode}"


@attrs.frozen
class Verdict:
    scenario: Scenario
    point: str  # what the k-th point was ("" if the run ended before it)
    lost: bool = False
    twice: bool = False
    broke: str = ""  # what else broke, if anything


class Zygote:
    """One warm fork server (tests/crash_interpose.py): runs one command at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls) -> Zygote:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.crash_interpose",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
        )  # fmt: skip
        return cls(process)

    async def run(self, request: dict[str, Any]) -> dict[str, int]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps(request).encode() + b"\n")
        await stdin.drain()
        pid = json.loads(await stdout.readline())["pid"]
        try:
            async with asyncio.timeout(RUN_TIMEOUT):
                return json.loads(await stdout.readline())  # type: ignore[no-any-return]
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await stdout.readline()
            return {"code": -1, "hung": 1}

    async def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        await self._process.wait()


class Workspace:
    """One scenario's files: the input outside the job's directory, the job inside it."""

    def __init__(self, base: Path, name: str) -> None:
        self.base = base / name.replace(":", "-")
        self.jobdir = self.base / "job"
        self.jobdir.mkdir(parents=True)
        # One input for all (a resumed job must name the input it was started with).
        self.input = base / "contacts.csv"
        if not self.input.exists():
            self.input.write_text(
                "number,name\n" + "".join(r + "\n" for r in job_rows()), encoding="utf-8"
            )
        self.output = self.jobdir / "results.jsonl"
        self.journal = self.jobdir / "results.jsonl.pending"
        self.runs = 0

    def argv(self, *, resume: bool) -> list[str]:
        argv = [
            "send", "template", "--template-id", "t", "-i", str(self.input),
            "-o", str(self.output), "--chunk-size", str(CHUNK), "--concurrency", "2", "--quiet",
        ]  # fmt: skip
        return [*argv, "--resume"] if resume else argv

    def request(
        self, server: FakeDispatchServer, mode: str, k: int, *, resume: bool
    ) -> dict[str, Any]:
        self.runs += 1
        env = {key: v for key, v in os.environ.items() if not key.startswith("DISPATCH_")}
        env |= {
            "DISPATCH_BASE_URL": server.url,
            "DISPATCH_CLIENT_SECRET": SECRET,
            "DISPATCH_ACCOUNT": "acme",
        }
        return {
            "argv": self.argv(resume=resume),
            "env": env,
            "cwd": str(self.base),
            "jobdir": str(self.jobdir),
            "mode": mode,
            "k": k,
            "trace": str(self.base / f"trace{self.runs}"),
            "stdout": str(self.base / f"stdout{self.runs}"),
            "stderr": str(self.base / f"stderr{self.runs}"),
        }

    def stderr(self) -> str:
        return (self.base / f"stderr{self.runs}").read_text(encoding="utf-8", errors="replace")

    def trace(self) -> list[str]:
        path = self.base / f"trace{self.runs}"
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []

    def covered(self) -> set[int]:
        """The lines every entry of the journal names (what may have reached the service)."""
        if not self.journal.exists():
            return set()
        lines: set[int] = set()
        for entry in self.journal.read_bytes().split(b"\n"):
            for span in entry.partition(b" ")[0].split(b","):
                if match := _RANGE.match(span):
                    lines.update(range(int(match[1]), int(match[2]) + 1))
        return lines


@contextlib.asynccontextmanager
async def simulator() -> AsyncIterator[FakeDispatchServer]:
    async with FakeDispatchServer(client_secret=SECRET) as server:
        server.script_for(RETRIED, Fault.status(503, retry_after="0"))
        yield server


@attrs.define
class Prepared:
    """Phase 2's starting point: a job killed half-way, its files and what it sent."""

    files: dict[str, bytes]
    received: Counter[str]
    covered: set[int]


class Explorer:
    def __init__(self, base: Path, workers: int) -> None:
        self.base = base
        self.workers = workers
        self.zygotes: asyncio.Queue[Zygote] = asyncio.Queue()
        self.prepared: Prepared | None = None

    async def __aenter__(self) -> Explorer:
        for _ in range(self.workers):
            self.zygotes.put_nowait(await Zygote.start())
        return self

    async def __aexit__(self, *exc: object) -> None:
        while not self.zygotes.empty():
            await self.zygotes.get_nowait().close()

    async def _run(self, request: dict[str, Any]) -> dict[str, int]:
        zygote = await self.zygotes.get()
        try:
            return await zygote.run(request)
        finally:
            self.zygotes.put_nowait(zygote)

    async def count(self, phase: int) -> list[str]:
        """The points of a run of *phase*, in order, as ``k op file``."""
        space = Workspace(self.base, f"count{phase}")
        async with simulator() as server:
            if phase == 2:
                self._restore(space)
            answer = await self._run(space.request(server, "count", 0, resume=phase == 2))
        if answer.get("code") not in (0, 1):
            raise RuntimeError(f"the job failed unprovoked: {answer} {space.stderr()}")
        return space.trace()

    async def prepare(self, points: Sequence[str]) -> None:
        """Kill a fresh job just after the journal's fsync half-way through its points."""
        middle = len(points) // 2
        at = next(
            int(p.split()[0])
            for p in points[middle:]
            if p.split()[1:] == ["fsync", "results.jsonl.pending"]
        )
        space = Workspace(self.base, "prepared")
        async with simulator() as server:
            answer = await self._run(space.request(server, "kill-after", at, resume=False))
            received = Counter(server.stats.received)
        assert answer.get("signal") == signal.SIGKILL, answer
        files = {p.name: p.read_bytes() for p in space.jobdir.iterdir()}
        self.prepared = Prepared(files, received, space.covered())

    def _restore(self, space: Workspace) -> None:
        assert self.prepared is not None
        for name, data in self.prepared.files.items():
            (space.jobdir / name).write_bytes(data)

    async def explore(self, scenario: Scenario) -> Verdict:
        space = Workspace(self.base, scenario.name)
        phase2 = scenario.phase == 2
        async with simulator() as server:
            if phase2:
                self._restore(space)
            first = await self._run(space.request(server, scenario.mode, scenario.k, resume=phase2))
            trace = space.trace()
            point = " ".join(trace[-1].split()[1:]) if trace else ""
            covered = space.covered()
            broke = _check_first(scenario, first, space.stderr(), reached=bool(trace))
            resumed = await self._run(space.request(server, "count", 0, resume=True))
            received = Counter(server.stats.received)
        if phase2:
            assert self.prepared is not None
            received += self.prepared.received
            covered |= self.prepared.covered
        if resumed.get("code") not in (0, 1) or "Traceback" in space.stderr():
            broke = broke or f"the resume ended with {resumed}: {_last(space.stderr())}"
        verdict = _check_files(space, received, covered)
        return attrs.evolve(verdict, scenario=scenario, point=point, broke=verdict.broke or broke)

    def settle(self, verdict: Verdict) -> Verdict:
        """Delete a scenario's files; keep those of a failure, and say where."""
        here = self.base / verdict.scenario.name.replace(":", "-")
        if not verdict.broke:
            shutil.rmtree(here, ignore_errors=True)
            return verdict
        kept = KEPT / here.name
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(here, kept)
        return attrs.evolve(verdict, broke=f"{verdict.broke} (files in {kept})")


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(nothing on stderr)"


def _check_first(scenario: Scenario, answer: dict[str, int], stderr: str, *, reached: bool) -> str:
    """What is wrong with how the provoked run ended ("" if nothing)."""
    if answer.get("hung"):
        return "the run hung"
    if "Traceback" in stderr:
        return f"a traceback: {_last(stderr)}"
    if not reached:
        return "" if answer.get("code") in (0, 1) else f"ended with {answer}: {_last(stderr)}"
    if scenario.mode in KILLS:
        return "" if answer.get("signal") == signal.SIGKILL else f"not killed: {answer}"
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    if answer.get("code") != 1 or len(errors) != 1:
        return f"not one Error: line and exit 1 but {answer}: {_last(stderr)}"
    return ""


def _check_files(space: Workspace, received: Counter[str], covered: set[int]) -> Verdict:
    """The checks after the resume: one record per line, nothing twice, nothing lost."""
    scenario = Scenario(0, 0, "")
    try:
        records = [json.loads(line) for line in space.output.read_bytes().splitlines()]
    except (OSError, ValueError) as exc:
        return Verdict(scenario, "", lost=True, broke=f"the output does not parse: {exc}")
    twice = bool(+Counter({n: c for n, c in received.items() if c > 1}))
    by_line = Counter(r["line"] for r in records)
    expected = set(range(2, ROWS + 2))
    lost = set(by_line) != expected or any(c != 1 for c in by_line.values())
    broke = ""
    if lost:
        missing = sorted(expected - set(by_line))[:5]
        doubled = sorted(line for line, c in by_line.items() if c > 1)[:5]
        broke = f"lines without a record {missing}, lines recorded twice {doubled}"
    elif twice:
        broke = f"sent twice: {sorted(n for n, c in received.items() if c > 1)[:5]}"
    elif space.journal.exists():
        broke = "the journal is still there after the resume"
    elif not_sent := [r["line"] for r in records if r["outcome"] == "not_sent"]:
        broke = f"lines recorded not_sent after the resume: {not_sent[:5]}"
    elif outside := [
        r["line"] for r in records if r["outcome"] == "maybe_sent" and r["line"] not in covered
    ]:
        broke = f"maybe_sent lines whose chunk had not started: {outside[:5]}"
    elif unsent := {r["number"] for r in records if r["outcome"] == "sent"} - set(received):
        broke = f"recorded sent, never received: {sorted(unsent)[:5]}"
    elif forgotten := set(received) - {r["number"] for r in records}:
        broke = f"received, recorded as nothing: {sorted(forgotten)[:5]}"
    return Verdict(scenario, "", lost=lost, twice=twice, broke=broke)


def scenarios(points: dict[int, list[str]]) -> list[Scenario]:
    """Every (phase, k, mode); a short write only where the k-th write is."""
    every = []
    for phase, trace in points.items():
        writes = sum(1 for p in trace if p.split()[1] == "write")
        for k in range(1, len(trace) + 1):
            every += [Scenario(phase, k, mode) for mode in MODES if mode != "short"]
        every += [Scenario(phase, k, "short") for k in range(1, writes + 1)]
    return every


def sample(every: list[Scenario], size: int, seed: int) -> list[Scenario]:
    """About *size* scenarios, as many of each phase and mode, at random points."""
    groups: dict[tuple[int, str], list[Scenario]] = {}
    for scenario in every:
        groups.setdefault((scenario.phase, scenario.mode), []).append(scenario)
    each = max(1, size // len(groups))
    pick = random.Random(seed)
    chosen = [s for group in groups.values() for s in pick.sample(group, min(each, len(group)))]
    return sorted(chosen, key=lambda s: (s.phase, s.k, s.mode))


async def run(
    *,
    sample_size: int = 0,
    seed: int = 29,
    only: Sequence[str] = (),
    workers: int = 2,
    budget: float = 19 * 60,
) -> tuple[int, list[str]]:
    """Explore; the exit code and the report's lines (the last one is the verdict)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crash-points-") as tmp:
        async with Explorer(Path(tmp), workers) as explorer:
            first = await explorer.count(1)
            await explorer.prepare(first)
            points = {1: first, 2: await explorer.count(2)}
            every = scenarios(points)
            if only:
                todo = [s for s in every if s.name in only]
            elif sample_size:
                todo = sample(every, sample_size, seed)
            else:
                todo = every
            verdicts = await _explore_all(explorer, todo, started + budget)
    explored = {(v.scenario.phase, v.scenario.k) for v in verdicts}
    lost = sum(v.lost for v in verdicts)
    twice = sum(v.twice for v in verdicts)
    failed = [v for v in verdicts if v.broke]
    modes = Counter(v.scenario.mode for v in verdicts)
    lines = [
        f"points: {len(points[1])} in a fresh job, {len(points[2])} in a resume; "
        f"{len(verdicts)} scenarios ({', '.join(f'{m} {n}' for m, n in modes.items())}) "
        f"in {time.monotonic() - started:.0f} s"
    ]
    lines += [f"FAILED {v.scenario.name} ({v.point}): {v.broke}" for v in failed[:20]]
    line = f"crash points: {len(explored)} explored, {lost} lost, {twice} sent twice"
    if len(verdicts) < len(todo):
        line += f"; time budget spent after {len(verdicts)} of {len(todo)} scenarios"
    if failed:
        first_failure = failed[0]
        line += (
            f"; {len(failed)} failed, first k={first_failure.scenario.k} "
            f"(phase {first_failure.scenario.phase}, {first_failure.point}) "
            f"{first_failure.scenario.mode}: {first_failure.broke}"
        )
    lines.append(line)
    return (1 if failed or len(verdicts) < len(todo) else 0), lines


async def _explore_all(explorer: Explorer, todo: list[Scenario], deadline: float) -> list[Verdict]:
    queue = list(reversed(todo))
    verdicts: list[Verdict] = []

    async def worker() -> None:
        while queue and time.monotonic() < deadline:
            scenario = queue.pop()
            verdicts.append(explorer.settle(await explorer.explore(scenario)))

    await asyncio.gather(*(worker() for _ in range(explorer.workers)))
    return sorted(verdicts, key=lambda v: (v.scenario.phase, v.scenario.k, v.scenario.mode))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.crash_points", description=__doc__)
    parser.add_argument("--sample", type=int, default=0, help="try this many scenarios only")
    parser.add_argument("--seed", type=int, default=29, help="the sample's seed")
    parser.add_argument("--only", nargs="*", default=(), help="scenarios, as phase:k:mode")
    parser.add_argument("--workers", type=int, default=2, help="runs at once")
    parser.add_argument("--budget", type=float, default=19 * 60, help="seconds, at most")
    args = parser.parse_args(argv)
    code, lines = asyncio.run(
        run(
            sample_size=args.sample, seed=args.seed, only=args.only, workers=args.workers,
            budget=args.budget,
        )
    )  # fmt: skip
    sys.stdout.write("\n".join(lines) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())

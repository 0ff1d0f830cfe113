"""Crash at every step, sampled: ``nox -s crash`` tries every point (tests/crash_points.py).

Each run here kills, cuts off or fails a real ``send`` (a subprocess, against the
simulator on 127.0.0.1) at a few of its I/O points, resumes it, and checks that every
input line has one record and that no number reached the simulator twice. The sample
changes from run to run; a failure names its seed (CRASH_POINTS_SEED replays it) and the
scenario (``python -m tests.crash_points --only PHASE:K:MODE``).
"""

from __future__ import annotations

import os
import random
import re

from .crash_points import run

VERDICT = re.compile(r"crash points: (\d+) explored, 0 lost, 0 sent twice$")


async def explore(**options: object) -> tuple[int, list[str]]:
    code, lines = await run(**options)  # type: ignore[arg-type]
    return code, lines


class TestSampledCrashPoints:
    async def test_a_job_crashed_or_failed_at_sampled_points_loses_nothing_and_sends_nothing_twice(
        self,
    ) -> None:
        seed = int(os.environ.get("CRASH_POINTS_SEED", random.randrange(1 << 30)))
        code, lines = await explore(sample_size=24, seed=seed)
        report = "\n".join(lines)
        assert code == 0, f"CRASH_POINTS_SEED={seed}:\n{report}"
        verdict = VERDICT.match(lines[-1])
        assert verdict is not None, report
        assert int(verdict[1]) >= 12, "both phases, every mode"


class TestDefectsTheExplorerFound:
    """Each scenario (PHASE:K:MODE, k counting the job's I/O points) broke before its fix."""

    async def test_a_journal_killed_before_its_header_is_written_is_resumed(self) -> None:
        # Before: the journal, created but empty, was "not a dispatch-async journal".
        code, lines = await explore(only=["1:1:kill-after", "1:3:kill-before", "1:2:eio"])
        assert code == 0, "\n".join(lines)

    async def test_a_journal_that_cannot_be_written_ends_the_run_with_one_error_naming_it(
        self,
    ) -> None:
        # Before: "the job stopped: before_send raised", and no Error: line saying why.
        code, lines = await explore(only=["1:10:enospc", "1:11:eio"])
        assert code == 0, "\n".join(lines)

    async def test_a_disk_failing_as_the_job_starts_exits_1_not_2(self) -> None:
        # Before: "cannot use (or read) ...: No space left on device", exit 2 (usage).
        code, lines = await explore(only=["1:1:short", "2:5:enospc", "2:1:eio"])
        assert code == 0, "\n".join(lines)

    async def test_a_directory_that_cannot_be_synced_is_a_write_error_not_ignored(self) -> None:
        # Before: the error was swallowed, and a power cut could then lose the journal.
        code, lines = await explore(only=["2:15:eio", "2:16:enospc", "1:133:eio"])
        assert code == 0, "\n".join(lines)

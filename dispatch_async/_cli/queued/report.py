"""The queued job's report, and the two commands that end with one: the producer
(``send ... --queue``, which with ``-o`` waits for the workers) and ``report``.

Exit codes as for ``send``: 0 every line sent or validly rejected, 1 some lines failed
or the job is not finished (a line without a record is not finished), 2 a usage or
configuration error.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import attrs
import orjson

import dispatch_async as da

from ..job.spec import InputSpec, Target
from ..screen.outcomes import OUTCOMES
from ..screen.problem import FAILED, OK, Problem
from ..screen.progress import Tally, render_summary
from ..screen.words import counted
from .chunks import (
    DEFAULT_TTL,
    QueueRedis,
    check_job_id,
    check_prefix,
    connected,
    job_keys,
    where,
)
from .producer import enqueue
from .waiting import wait_until_done

__all__ = ["QueueReport", "report", "run_enqueue", "run_queue_report"]


@attrs.define
class QueueReport:
    """The whole job, as a single-machine run would sum it up."""

    job: str
    chunks: int
    lines: int
    states: Counter[str]
    outcomes: Counter[str]
    records: int
    seconds: float
    complete_input: bool

    @property
    def lost(self) -> int:
        """Lines of done chunks without a record: their rows were gone from Redis."""
        return max(self.lines - self.records, 0) if self.all_done else 0

    @property
    def all_done(self) -> bool:
        return self.complete_input and self.states["done"] == self.chunks

    @property
    def complete(self) -> bool:
        """Every chunk done and every input line recorded."""
        return self.all_done and self.records >= self.lines

    @property
    def failed(self) -> int:
        return self.outcomes["not_sent"] + self.outcomes["maybe_sent"]


async def report(
    redis: QueueRedis,
    *,
    job: str,
    output: Path | None,
    key_prefix: str = da.DEFAULT_KEY_PREFIX,
) -> QueueReport:
    """Gather every chunk's records into *output* (one line per input line, in line order).

    Raises:
        Problem: there is no such job.
    """
    keys = job_keys(redis, check_prefix(key_prefix), check_job_id(job))
    meta = await redis.hgetall(keys.meta)
    if not meta:
        raise Problem(f"no job {job!r} in this Redis (under prefix {key_prefix!r})")
    chunks = int(meta.get(b"chunks", 0))
    states = Counter(state.decode() for state in (await redis.hgetall(keys.state)).values())
    outcomes: Counter[str] = Counter()
    records = 0
    sink = await asyncio.to_thread(_open_output, output)
    try:
        for first in range(0, chunks, 100):
            fields = [str(i) for i in range(first, min(first + 100, chunks))]
            for value in await redis.hmget(keys.out, fields):
                if not value:
                    continue
                lines = sorted(
                    (orjson.loads(raw) for raw in value.split(b"\n")), key=lambda r: r["line"]
                )
                records += len(lines)
                outcomes.update(record["outcome"] for record in lines)
                if sink is not None:
                    data = b"".join(orjson.dumps(record) + b"\n" for record in lines)
                    await asyncio.to_thread(sink.write, data)
    finally:
        if sink is not None:
            await asyncio.to_thread(sink.close)
    started = float(meta.get(b"created", 0))
    ended = float(meta.get(b"last_done", started))
    return QueueReport(
        job=job,
        chunks=chunks,
        lines=int(meta.get(b"lines", 0)),
        states=states,
        outcomes=Counter({o: outcomes[o] for o in OUTCOMES}),
        records=records,
        seconds=max(ended - started, 0.0),
        complete_input=b"chunks" in meta,
    )


def _open_output(output: Path | None) -> Any:
    if output is None:
        return None
    try:
        return open(output, "wb")  # closed by report()
    except OSError as exc:
        raise Problem(f"cannot write {output}: {exc.strerror}") from None


async def run_enqueue(
    *,
    queue_url: str,
    job: str,
    target: Target,
    account: str | None,
    input_spec: InputSpec,
    chunk_size: int,
    key_prefix: str,
    output: Path | None,
    quiet: bool,
    err: TextIO | None = None,
) -> int:
    """Enqueue the job's chunks; with *output*, wait for the workers and write the report."""
    err = err or sys.stderr
    async with connected(queue_url) as redis:
        produced = await enqueue(
            redis,
            job=job,
            target=target,
            account=account,
            input_spec=input_spec,
            chunk_size=chunk_size,
            key_prefix=key_prefix,
            ttl=DEFAULT_TTL,
        )
        print(
            f"job {job}: {counted(produced.lines, 'input line')} in "
            f"{counted(produced.chunks, 'chunk')}; "
            f"{produced.enqueued:,} enqueued now, {produced.known:,} already done "
            f"(queue {where(queue_url)})",
            file=err,
        )
        if output is None:
            print(
                f"start workers with `dispatch-async worker --queue URL`; then "
                f"`dispatch-async report --queue URL --job {job} -o FILE`",
                file=err,
            )
            return OK

        def progress(done: int, chunks: int) -> None:
            if not quiet:
                print(f"job {job}: {done:,}/{counted(chunks, 'chunk')} done", file=err)

        await wait_until_done(redis, job=job, key_prefix=key_prefix, on_progress=progress)
        summary = await report(redis, job=job, output=output, key_prefix=key_prefix)
    return _conclude(summary, output, err)


async def run_queue_report(
    *, queue_url: str, job: str, key_prefix: str, output: Path | None, err: TextIO | None = None
) -> int:
    """Write the job's records to *output* and print its summary."""
    err = err or sys.stderr
    async with connected(queue_url) as redis:
        summary = await report(redis, job=job, output=output, key_prefix=key_prefix)
    return _conclude(summary, output, err)


def _conclude(summary: QueueReport, output: Path | None, err: TextIO) -> int:
    tally = Tally(outcomes=Counter(summary.outcomes), started=0.0, ended=summary.seconds)
    print(render_summary(f"job {summary.job}", tally, kept=None, output=output), file=err)
    states = ", ".join(f"{n:,} {s}" for s, n in sorted(summary.states.items()))
    print(f"  chunks: {summary.chunks:,} ({states or 'none'})", file=err)
    if summary.lost:
        print(
            f"job {summary.job} is not finished: {counted(summary.lost, 'input line')} "
            "without a record (their chunk's rows were gone from Redis: evicted or expired); "
            "they may have been sent: check them before sending them again",
            file=err,
        )
        return FAILED
    if not summary.complete:
        print(
            f"job {summary.job} is not finished: {summary.records:,} of "
            f"{counted(summary.lines, 'input line')} recorded; run report again once the "
            "workers are done",
            file=err,
        )
        return FAILED
    if summary.failed:
        print(
            f"failed: {summary.outcomes['not_sent']:,} not_sent, "
            f'{summary.outcomes["maybe_sent"]:,} maybe_sent (see "outcome" in the report); '
            "not_sent lines are safe to send again in a new job",
            file=err,
        )
        return FAILED
    return OK

"""The queued job's commands: ``send ... --queue`` (producer), ``worker``, ``report``.

Exit codes as for ``send``: 0 every line sent or validly rejected, 1 some lines failed
or the job is not finished, 2 a usage or configuration error (raised as Problem).
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

from ._cli.progress import Tally, render_summary
from ._cli.spec import FAILED, OK, InputSpec, Problem, Target
from ._exceptions import ConfigurationError
from ._fleet_queue import (
    DEFAULT_TTL,
    ArqRedis,
    QueueReport,
    connect,
    enqueue,
    report,
    wait_until_done,
)
from ._fleet_worker import WorkerConfig, run_worker
from ._redis import redacted_url, redis_errors

__all__ = ["run_enqueue", "run_queue_report", "run_queue_worker"]


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
    redis = await _connect(queue_url)
    try:
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
            f"job {job}: {produced.lines:,} input lines in {produced.chunks:,} chunks; "
            f"{produced.enqueued:,} enqueued now, {produced.known:,} already done "
            f"(queue {redacted_url(queue_url)})",
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
                print(f"job {job}: {done:,}/{chunks:,} chunks done", file=err)

        await wait_until_done(
            redis, job=job, key_prefix=key_prefix, every=0.5, on_progress=progress
        )
        summary = await report(redis, job=job, output=output, key_prefix=key_prefix)
    except redis_errors() as exc:
        raise Problem(f"Redis failed: {type(exc).__name__}: {exc}", FAILED) from None
    finally:
        await redis.aclose()
    return _conclude(summary, output, err)


async def run_queue_report(
    *, queue_url: str, job: str, key_prefix: str, output: Path | None, err: TextIO | None = None
) -> int:
    """Write the job's records to *output* and print its summary."""
    err = err or sys.stderr
    redis = await _connect(queue_url)
    try:
        summary = await report(redis, job=job, output=output, key_prefix=key_prefix)
    except redis_errors() as exc:
        raise Problem(f"Redis failed: {type(exc).__name__}: {exc}", FAILED) from None
    finally:
        await redis.aclose()
    return _conclude(summary, output, err)


async def run_queue_worker(config: WorkerConfig, *, verbose: int) -> int:
    """Run one worker process until a signal (or, with burst, an empty queue)."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return await run_worker(config)
    except ConfigurationError as exc:
        raise Problem(str(exc)) from None
    except redis_errors() as exc:
        raise _unreachable(config.queue_url, exc) from None


async def _connect(queue_url: str) -> ArqRedis:
    try:
        return await connect(queue_url)
    except ConfigurationError as exc:
        raise Problem(str(exc)) from None
    except redis_errors() as exc:
        raise _unreachable(queue_url, exc) from None


def _unreachable(queue_url: str, exc: BaseException) -> Problem:
    # redis-py's messages name host and port, never the password; the URL is redacted.
    message = f"cannot use the Redis queue {redacted_url(queue_url)}: {type(exc).__name__}: {exc}"
    return Problem(" ".join(message.split()))


def _conclude(summary: QueueReport, output: Path | None, err: TextIO) -> int:
    tally = Tally(outcomes=Counter(summary.outcomes), started=0.0, ended=summary.seconds)
    print(render_summary(f"job {summary.job}", tally, kept=None, output=output), file=err)
    states = ", ".join(f"{n:,} {s}" for s, n in sorted(summary.states.items()))
    print(f"  chunks: {summary.chunks:,} ({states or 'none'})", file=err)
    if not summary.complete:
        print(
            f"job {summary.job} is not finished: {summary.records:,} of {summary.lines:,} "
            "input lines recorded; run report again once the workers are done",
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

"""The commands of a queued job's other side: ``worker``, which sends its chunks, and
``report``, which sums it up (the producer is ``send ... --queue``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from .exits import exit_with
from .options import connection, connection_options, prefix_option, queue_option

__all__ = ["report", "worker"]

_QUEUE_HELP = (
    "The Redis of the queue: redis://, rediss://, unix://, any node of a Cluster, "
    "redis+sentinel://HOST:PORT,.../SERVICE [DISPATCH_QUEUE_URL]."
)


@click.command()
@queue_option(required=True, help=_QUEUE_HELP)
@prefix_option
@connection_options
@click.option(
    "--max-jobs",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    envvar="DISPATCH_MAX_JOBS",
    help="Chunks this worker sends at once.",
)
@click.option(
    "--job-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    envvar="DISPATCH_JOB_TIMEOUT",
    help="Seconds one chunk's sending may take (its deadline is 80% of it).",
)
@click.option(
    "--takeover-after",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    envvar="DISPATCH_TAKEOVER_AFTER",
    help="Seconds before another worker takes over the chunks of a worker that died.",
)
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    envvar="DISPATCH_METRICS_PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (the prometheus extra).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="DISPATCH_METRICS_HOST",
    help="Address for --metrics-port (0.0.0.0 to be scraped from other hosts).",
)
@click.option("--poll-delay", type=click.FloatRange(min=0.01), default=2.0, hidden=True)
@click.option("-v", "--verbose", count=True, help="Log each chunk (-vv: debug). Never secrets.")
def worker(
    queue: str,
    key_prefix: str,
    max_jobs: int,
    job_timeout: float,
    takeover_after: float,
    burst: bool,
    metrics_port: int | None,
    metrics_host: str,
    poll_delay: float,
    verbose: int,
    **options: Any,
) -> None:
    """Send the chunks of queued jobs (`send ... --queue`), until Ctrl-C or SIGTERM.

    Start as many as you like, on any host that reaches the Redis: they share one token
    and, with --rate, one request rate.
    """
    from .queued.worker import WorkerConfig, run_queue_worker

    config = WorkerConfig(
        queue_url=queue,
        key_prefix=key_prefix,
        connection=connection(options),
        max_jobs=max_jobs,
        job_timeout=job_timeout,
        takeover_after=takeover_after,
        burst=burst,
        poll_delay=poll_delay,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    exit_with(lambda: asyncio.run(run_queue_worker(config, verbose=verbose)))


@click.command()
@queue_option(required=True, help=_QUEUE_HELP)
@prefix_option
@click.option("--job", required=True, metavar="ID", help="The job's id.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one result line per input line here (as `send -o` does).",
)
def report(queue: str, key_prefix: str, job: str, output: Path | None) -> None:
    """Sum up a queued job; exit 0 only when it is finished with no failed line."""
    from .queued.report import run_queue_report

    exit_with(
        lambda: asyncio.run(
            run_queue_report(queue_url=queue, job=job, key_prefix=key_prefix, output=output)
        )
    )

"""The ``dispatch-async`` command line: argument parsing only (click), each option once.

The jobs themselves are in the wings below: ``job`` (send, plan, export), ``queued`` (the
queue's producer and workers); ``demo`` here. The queue's ``worker`` and ``report`` commands
are in ``queue_commands``. Exit codes: 0 every recipient sent or validly rejected, 1 some
recipients failed (or the job was stopped before the end), 2 a usage or configuration error.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import attrs
import click
from click.core import ParameterSource

import dispatch_async as da
import dispatch_async.testing

from .callbacks import callbacks
from .exits import exit_with, failure
from .job.plan import run_plan
from .job.resume import job_options, resumed, stored_job
from .job.send import run_send
from .job.spec import Display, InputSpec, JobSpec, SendSettings, Target
from .options import (
    JobOption,
    connection,
    export_options,
    progress_every_option,
    quiet_option,
    send_options,
    verbose_option,
)
from .queue_commands import report, worker
from .reading.columns import var_pairs
from .reading.input import Format
from .screen.problem import Problem
from .serve import serve_command

__all__ = ["cli"]

F = TypeVar("F", bound=Callable[..., Any])

_SECRET_VARIABLE = "DISPATCH_CLIENT_SECRET"  # noqa: S105 - a variable's name


# -- the commands --------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(da.__version__, "-V", "--version", prog_name="dispatch-async")
def cli() -> None:
    """Bulk message dispatch from the command line: resumable, crash safe, never twice.

    Start with `dispatch-async demo`: no credentials needed.
    """


@cli.group(invoke_without_command=True, no_args_is_help=True)
@send_options
@click.pass_context
def send(ctx: click.Context, /, **options: Any) -> None:
    """Send to every recipient of a CSV or JSONL file, one result line per input line.

    The connection comes from DISPATCH_BASE_URL, DISPATCH_CLIENT_SECRET and
    DISPATCH_ACCOUNT (or --base-url, --client-secret-file, --account).

    `send --resume -o FILE` continues a stopped or finished job with the options it
    was started with (its not_sent rows; maybe_sent ones with --resend-maybe-sent); a
    flag given again must match them.
    """
    given = [
        p.opts[-1]
        for p in ctx.command.params
        if p.name and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    ]
    if ctx.invoked_subcommand is not None:
        if given:
            raise click.UsageError(f"{', '.join(given)}: give the options after the endpoint")
        return
    if not options["resume"] or not options["output"]:
        raise click.UsageError(
            "name the endpoint (send template|basic|single|webhook ...), or continue a job "
            "with: send --resume -o FILE"
        )
    _send(None, options)


@send.command("template")
@click.option("--template-id", cls=JobOption, required=True, help="The template to send.")
@click.option("--webhook", metavar="URL", help="Webhook address for this dispatch.")
@send_options
def send_template(template_id: str, webhook: str | None, **options: Any) -> None:
    """Send a template (POST /api/v3/template); CSV columns fill its vars."""
    _send(Target("template", template_id=template_id, webhook=webhook, **_fields(options)), options)


@send.command("basic")
@click.option("--text", cls=JobOption, required=True, help="The message text.")
@send_options
def send_basic(text: str, **options: Any) -> None:
    """Send a text message (POST /api/v3/basic)."""
    _send(Target("basic", text=text, **_fields(options)), options)


@send.command("single")
@click.option("--text", cls=JobOption, required=True, help="The message text.")
@send_options
def send_single(text: str, **options: Any) -> None:
    """Send a text message through POST /api/v3/single."""
    _send(Target("single", text=text, **_fields(options)), options)


@send.command("webhook")
@click.option(
    "--webhook", cls=JobOption, required=True, metavar="URL", help="Where the service reports."
)
@click.option("--text", help="The message text.")
@click.option("--template-id", help="Or a template.")
@send_options
def send_webhook(webhook: str, text: str | None, template_id: str | None, **options: Any) -> None:
    """Send with the service reporting to a webhook (POST /api/v3/webhook)."""
    target = Target(
        "webhook", webhook=webhook, text=text, template_id=template_id, **_fields(options)
    )
    _send(target, options)


@cli.command()
@click.option(
    "--recipients",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="How many synthetic recipients.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results file (default: in a new temporary directory).",
)
@click.option("--seed", type=int, default=2024, show_default=True, help="For the sample data.")
@quiet_option
@verbose_option
@progress_every_option
def demo(
    recipients: int,
    output: Path | None,
    seed: int,
    quiet: bool,
    verbose: int,
    progress_every: float,
) -> None:
    """Send to 100,000 synthetic recipients through a local simulator: no credentials.

    The same job as `send template`, with invalid numbers and 429/503 faults to retry.
    """
    from .demo import run_demo

    display = Display(
        title="dispatch-async demo", quiet=quiet, verbose=verbose, progress_every=progress_every
    )
    exit_with(
        lambda: asyncio.run(
            run_demo(recipients=recipients, output=output, seed=seed, display=display)
        )
    )


@cli.command()
@click.argument(
    "results", required=False, metavar="RESULTS", type=click.Path(dir_okay=False, path_type=Path)
)
@export_options
def export(
    results: Path | None,
    outcome: str,
    input_path: str | None,
    output: Path | None,
    input_format: Format,
    delimiter: str | None,
    columns: str | None,
    encoding: str | None,
    with_reason: bool,
) -> None:
    """Write the input rows of chosen outcomes, as they were, to send them as a new job.

    Reads RESULTS (what `send -o` wrote) and the job's input; writes -o (default: stdout),
    with the input's header, separator, columns and encoding:
    `export results.jsonl -o retry.csv`, then `send ... -i retry.csv -o retry-results.jsonl`.
    """
    from .job.export import ExportSpec, correction, run_export

    if (wrong := correction(results, input_path, output)) is not None:
        raise click.UsageError(wrong)
    assert results is not None
    spec = ExportSpec(
        results=results,
        outcomes=frozenset(o.strip() for o in outcome.split(",") if o.strip()),
        input_path=input_path,
        input_format=input_format,
        delimiter=delimiter,
        columns=tuple(columns.split(",")) if columns else None,
        encoding=encoding,
        output=output,
        with_reason=with_reason,
    )
    ctx = click.get_current_context()
    exit_with(lambda: run_export(spec, sys.stderr, None if input_path else _stored(ctx, results)))


cli.add_command(serve_command())


cli.add_command(callbacks)
cli.add_command(worker)
cli.add_command(report)


# -- from options to a job -----------------------------------------------------------


def _fields(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "campaign_name": options["campaign_name"],
        "fallback_sms": options["fallback_sms"],
        "callback": options["callback"],
    }


def _input(options: dict[str, Any]) -> InputSpec:
    columns = options["columns"]
    return InputSpec(
        path=options["input_path"],
        format=options["input_format"],
        number_column=options["number_column"],
        columns=tuple(columns.split(",")) if columns else None,
        delimiter=options["delimiter"],
        encoding=options["encoding"],
        variables=var_pairs(options["variables"]),
        only_vars=options["only_vars"],
    )


def _send(target: Target | None, options: dict[str, Any]) -> None:
    if options["resume"] and options["output"] and not options["queue"]:
        try:
            target, options = resumed(click.get_current_context(), target, options, send.commands)
        except Problem as problem:
            raise failure(problem) from None
    assert target is not None
    if not options["input_path"]:
        raise click.UsageError("Missing option '-i' / '--input'.")
    if options["queue"]:
        _enqueue(target, options)
    if options["job"]:
        raise click.UsageError("--job goes with --queue")
    spec = attrs.evolve(_spec(target, options), job_options=job_options(target, options))
    if options["dry_run"]:
        exit_with(lambda: asyncio.run(run_plan(spec, sys.stdout)))
    else:
        exit_with(lambda: asyncio.run(run_send(spec)))


_NOT_QUEUED = (
    "resume",
    "resend_maybe_sent",
    "dedupe",
    "prevalidate",
    "exclude",
    "deadline",
    "dry_run",
    "max_invalid",
)


def _enqueue(target: Target, options: dict[str, Any]) -> NoReturn:
    from .queued.report import run_enqueue

    if not options["job"]:
        raise click.UsageError("--queue needs --job ID (the same ID continues the job)")
    given = [f"--{name.replace('_', '-')}" for name in _NOT_QUEUED if options[name]]
    source = click.get_current_context().get_parameter_source("concurrency")
    if source is ParameterSource.COMMANDLINE:
        # The producer sends nothing: each worker's --max-jobs is its concurrency.
        given.append("--concurrency (set --max-jobs on the workers)")
    if given:
        raise click.UsageError(f"{', '.join(given)} cannot go with --queue")
    exit_with(
        lambda: asyncio.run(
            run_enqueue(
                queue_url=options["queue"],
                job=options["job"],
                target=target,
                account=options["account"],
                input_spec=_input(options),
                chunk_size=options["chunk_size"],
                key_prefix=options["key_prefix"],
                output=options["output"],
                quiet=options["quiet"],
            )
        )
    )


def _spec(target: Target, options: dict[str, Any]) -> JobSpec:
    if options["resend_maybe_sent"] and not options["resume"]:
        raise click.UsageError("--resend-maybe-sent goes with --resume")
    return JobSpec(
        target=target,
        connection=connection(options),
        input=_input(options),
        output=options["output"],
        settings=SendSettings(
            chunk_size=options["chunk_size"],
            concurrency=options["concurrency"],
            dedupe=options["dedupe"],
            prevalidate=options["prevalidate"],
            region=options["region"],
            deadline=options["deadline"],
        ),
        resume=options["resume"],
        resend_maybe_sent=options["resend_maybe_sent"],
        exclude=options["exclude"],
        max_invalid=options["max_invalid"],
        display=Display(
            title=f"dispatch-async send {target.endpoint}",
            quiet=options["quiet"],
            verbose=options["verbose"],
            progress_every=options["progress_every"],
        ),
    )


def _stored(ctx: click.Context, output: Path) -> dict[str, Any] | None:
    """The options the job writing *output* stored, checked as ``send --resume`` does."""
    try:
        return stored_job(ctx, output, send.commands)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Problem(f"cannot read the journal of {output}: {exc.strerror}") from None

"""The command line's options, each declared once and shared by the commands that take it.

Defaults are the SDK's (``spec.DEFAULTS``), never written here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .job.spec import DEFAULTS, Connection
from .reading.columns import parse_vars
from .reading.csv import DELIMITERS
from .reading.encoding import ENCODINGS

__all__ = [
    "JobOption",
    "connection",
    "connection_options",
    "export_options",
    "prefix_option",
    "progress_every_option",
    "queue_option",
    "quiet_option",
    "send_options",
    "verbose_option",
]

F = TypeVar("F", bound=Callable[..., Any])

_SECRET_VARIABLE = "DISPATCH_CLIENT_SECRET"  # noqa: S105 - a variable's name


def _options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | str | None:
    """A positive number of requests per second, or "auto"."""
    if value is None or value.strip().lower() == "auto":
        return value and "auto"
    return _positive(ctx, param, value, "is neither a positive number nor 'auto'")


def _max_rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    return None if value is None else _positive(ctx, param, value, "is not a positive number")


def _positive(ctx: click.Context, param: click.Parameter, value: str, otherwise: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = math.nan
    if not (rate > 0 and math.isfinite(rate)):
        raise click.BadParameter(f"{value!r} {otherwise}", ctx, param)
    return rate


class JobOption(click.Option):
    """A flag an endpoint requires, except with ``--resume``: the job's stored options
    give it then (``job.resume`` says what is missing when none are stored).

    Still ``required`` to what reads the flag (the help, ``resume.stored_job``).
    """

    def handle_parse_result(self, ctx: click.Context, opts: Any, args: Any) -> Any:
        ctx.meta[_RESUMING] = bool(opts.get("resume"))
        return super().handle_parse_result(ctx, opts, args)

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        if ctx.meta.get(_RESUMING) and self.value_is_missing(value):
            return None
        return super().process_value(ctx, value)

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if extra.pop("required", None):
            extra["required"] = "required, except with --resume"
        return extra


_RESUMING = "dispatch_async.resuming"


# -- options shared by several commands (each declared here, once) ------------------

connection_options = _options(
    click.option(
        "--account", envvar="DISPATCH_ACCOUNT", help="Sending account [DISPATCH_ACCOUNT]."
    ),
    click.option(
        "--base-url", envvar="DISPATCH_BASE_URL", help="Service address [DISPATCH_BASE_URL]."
    ),
    click.option(
        "--client-secret-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        envvar="DISPATCH_CLIENT_SECRET_FILE",
        help=f"File holding the client secret (else ${_SECRET_VARIABLE}; never a flag: "
        "flags show in ps).",
    ),
    click.option(
        "--proxy",
        metavar="URL",
        envvar="DISPATCH_PROXY",
        help="Forward proxy to the service, http://[USER:PASSWORD@]HOST:PORT (never shown) "
        "[DISPATCH_PROXY; else HTTPS_PROXY, unless NO_PROXY names the host].",
    ),
    click.option(
        "--ca-file",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="DISPATCH_CA_FILE",
        help="PEM file of a private CA to trust as well as the system's (a company's "
        "TLS inspection, an internal certificate) [DISPATCH_CA_FILE].",
    ),
    click.option(
        "--rate",
        metavar="RATE|auto",
        callback=_rate,
        envvar="DISPATCH_RATE",
        help="At most this many requests per second (a worker's: across every worker, "
        "shared in Redis), or 'auto': learned from the service's 429s.",
    ),
    click.option(
        "--max-rate",
        metavar="RATE",
        callback=_max_rate,
        envvar="DISPATCH_MAX_RATE",
        help="With --rate auto: the most it may learn, or adopt from the other workers.",
    ),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULTS.timeout,
        show_default=True,
        envvar="DISPATCH_TIMEOUT",
        help="Seconds for one request.",
    ),
    click.option(
        "--attempts",
        type=click.IntRange(min=1),
        default=DEFAULTS.attempts,
        show_default=True,
        envvar="DISPATCH_ATTEMPTS",
        help="Tries per request the service did not act on (429, 503, no connection).",
    ),
    click.option(
        "--max-retry-time",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULTS.max_retry_time,
        show_default=True,
        envvar="DISPATCH_MAX_RETRY_TIME",
        help="Seconds to keep retrying one request.",
    ),
)


def queue_option(*, required: bool, help: str) -> Callable[[F], F]:
    return click.option(
        "--queue", required=required, metavar="REDIS_URL", envvar="DISPATCH_QUEUE_URL", help=help
    )


prefix_option = click.option(
    "--key-prefix",
    default=DEFAULTS.key_prefix,
    show_default=True,
    envvar="DISPATCH_KEY_PREFIX",
    help="Every Redis key (queue, tokens, deliveries) starts with it [DISPATCH_KEY_PREFIX].",
)
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress display.")
verbose_option = click.option(
    "-v", "--verbose", count=True, help="Log retries and more (-vv: debug). Never secrets."
)
progress_every_option = click.option(
    "--progress-every",
    type=click.FloatRange(min=0),
    default=5.0,
    hidden=True,
    help="Seconds between plain progress lines (when stderr is not a terminal).",
)


def connection(options: dict[str, Any]) -> Connection:
    if options["max_rate"] is not None and options["rate"] != "auto":
        raise click.UsageError("--max-rate bounds a learned rate: it goes with --rate auto")
    return Connection(
        base_url=options["base_url"],
        client_secret=_client_secret(options["client_secret_file"]),
        account=options["account"],
        timeout=options["timeout"],
        attempts=options["attempts"],
        max_retry_time=options["max_retry_time"],
        rate=options["rate"],
        max_rate=options["max_rate"],
        proxy=options["proxy"] or None,
        ca_file=options["ca_file"],
    )


delimiter_option = click.option(
    "--delimiter",
    metavar="SEP",
    callback=lambda _ctx, _param, value: _delimiter(value),
    help="CSV separator: , ; | or tab (default: the one that splits the header most).",
)

encoding_option = click.option(
    "--encoding",
    metavar="utf-8|windows-1252",
    callback=lambda _ctx, _param, value: _encoding(value),
    help="The CSV's encoding (default: UTF-8, or Windows-1252 as Excel's pt-BR \"CSV "
    '(separado por vírgulas)" writes it, found from the file).',
)

send_options = _options(
    click.option(
        "-i",
        "--input",
        "input_path",
        type=click.Path(exists=True, dir_okay=False, allow_dash=True),
        help="CSV or JSONL recipients; - for stdin. (Required, except with --resume.)",
    ),
    click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Results file (JSON lines), appended as chunks complete. Required to send.",
    ),
    click.option(
        "--format",
        "input_format",
        type=click.Choice(["auto", "csv", "jsonl"]),
        default="auto",
        show_default=True,
        help="Input format; auto goes by the file name, then by the first character.",
    ),
    click.option(
        "--number-column",
        default="number",
        show_default=True,
        help="CSV column with the phone number; every other column becomes a var.",
    ),
    delimiter_option,
    click.option(
        "--columns",
        metavar="NAME,NAME,...",
        help="Column names for a CSV without a header row (its first line is then a row).",
    ),
    encoding_option,
    click.option(
        "--var",
        "variables",
        multiple=True,
        metavar="NAME=COLUMN",
        callback=parse_vars,
        help='Send COLUMN as the template var NAME (--var pixCode="Código Pix"); repeatable.',
    ),
    click.option(
        "--only-vars",
        is_flag=True,
        help="Send only the columns named by --var as vars (not every other column).",
    ),
    click.option(
        "--exclude",
        type=click.Path(exists=True, dir_okay=False),
        metavar="FILE",
        help="Numbers never to send (an opt-out list, one a line or a CSV column, any "
        'format): their rows are recorded invalid, "excluded".',
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Continue the job that wrote --output, stopped or finished, with its options "
        "(kept with its results): skip every recorded line, send the not_sent ones again.",
    ),
    click.option(
        "--resend-maybe-sent",
        is_flag=True,
        help="With --resume: also send the maybe_sent lines again (they may arrive twice).",
    ),
    click.option(
        "--dry-run",
        is_flag=True,
        help="Check the input and print the chunk plan; send and write nothing.",
    ),
    click.option("--campaign-name", help="Label for the batch."),
    click.option("--fallback-sms", metavar="TEXT", help="SMS text when the main channel fails."),
    click.option(
        "--callback",
        metavar="URL",
        envvar="DISPATCH_CALLBACK_URL",
        help="Callback address sent with each request [DISPATCH_CALLBACK_URL: keeps its "
        "token out of ps].",
    ),
    connection_options,
    click.option(
        "--chunk-size",
        type=click.IntRange(min=1),
        default=DEFAULTS.chunk_size,
        show_default=True,
        envvar="DISPATCH_CHUNK_SIZE",
        help="Recipients per request.",
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=DEFAULTS.concurrency,
        show_default=True,
        envvar="DISPATCH_CONCURRENCY",
        help="Requests in flight at once.",
    ),
    click.option(
        "--dedupe",
        is_flag=True,
        help="Send each number once, across resumes too. Numbers are compared in E.164 "
        "with --prevalidate; without it, as written: 11987654322 and +5511987654322 are "
        "then two numbers.",
    ),
    click.option(
        "--prevalidate",
        is_flag=True,
        help="Check numbers locally (phonenumbers) and send them as E.164.",
    ),
    click.option(
        "--region",
        envvar="DISPATCH_REGION",
        metavar="CC",
        help="Default country for --prevalidate, e.g. BR [DISPATCH_REGION].",
    ),
    click.option(
        "--max-invalid",
        type=click.FloatRange(0, 100),
        metavar="PERCENT",
        help="Exit 1 when more than this percent of the job's lines are invalid (for cron "
        "jobs: a list of local numbers sent without --prevalidate fails loudly).",
    ),
    click.option(
        "--deadline",
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
        help="Stop sending after this long; the rest is recorded not_sent.",
    ),
    quiet_option,
    verbose_option,
    queue_option(
        required=False,
        help="Enqueue the job for `dispatch-async worker` processes instead of sending "
        "(redis://, rediss://, unix://, a Cluster node's URL, redis+sentinel://...); with "
        "-o, wait for them and write the report [DISPATCH_QUEUE_URL].",
    ),
    click.option("--job", metavar="ID", help="With --queue: the job's id (again to continue it)."),
    prefix_option,
    progress_every_option,
)


export_options = _options(
    click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The file to write, a new one (default: stdout).",
    ),
    click.option(
        "--outcome",
        default="not_sent",
        show_default=True,
        metavar="OUTCOME,...",
        help="Rows with these outcomes: sent, invalid, not_sent, maybe_sent (maybe_sent rows "
        "may have arrived: sending them again may send them twice).",
    ),
    click.option(
        "-i",
        "--input",
        "input_path",
        type=click.Path(exists=True, dir_okay=False),
        help="The job's input, which the rows are taken from (default: the one the job "
        "stored; needed for the results of an earlier dispatch-async).",
    ),
    click.option(
        "--with-reason",
        is_flag=True,
        help="Add the columns outcome and reason, for whoever fixes the rows (a reason that "
        "could run as a spreadsheet formula starts with ').",
    ),
    click.option(
        "--format",
        "input_format",
        type=click.Choice(["auto", "csv", "jsonl"]),
        default="auto",
        help="As for send.",
    ),
    delimiter_option,
    click.option("--columns", metavar="NAME,NAME,...", help="As for send (no header is written)."),
    encoding_option,
)


def _delimiter(value: str | None) -> str | None:
    if value is None:
        return None
    value = {"tab": "\t", "\\t": "\t"}.get(value.lower(), value)
    if value not in DELIMITERS:
        raise click.BadParameter("expected one of , ; | tab", param_hint="--delimiter")
    return value


def _encoding(value: str | None) -> str | None:
    if value is None or value.strip().lower() == "auto":
        return None
    codec = ENCODINGS.get(value.strip().lower())
    if codec is None:
        raise click.BadParameter(
            f"{value!r}: expected utf-8 or windows-1252 (cp1252)", param_hint="--encoding"
        )
    return codec


def _client_secret(path: Path | None) -> str | None:
    if path is None:
        return os.environ.get(_SECRET_VARIABLE) or None
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.UsageError(
            f"cannot read --client-secret-file {path}: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:  # its text would quote a byte of the secret
        raise click.UsageError(
            f"cannot read --client-secret-file {path}: it is not UTF-8 text"
        ) from None
    if not secret:
        raise click.UsageError(f"--client-secret-file {path} is empty")
    return secret

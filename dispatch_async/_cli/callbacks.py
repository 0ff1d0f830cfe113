"""``dispatch-async callbacks``: receive the service's delivery callbacks; reconcile a job.

``callbacks serve`` runs a `CallbackServer` (the SDK's `CallbackReceiver` on an HTTP
server of the SDK's own) until Ctrl-C or SIGTERM (then it commits what it acknowledged
and stops). The token that authenticates the service is read from
``DISPATCH_CALLBACK_TOKEN`` or a token file, made on first use (mode 0600) beside the
store: never a flag, which ``ps`` would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import click

import dispatch_async as da
from dispatch_async.callbacks import (
    CallbackReceiver,
    CallbackServer,
    DeliveryStore,
    DeliveryTracker,
    RedisDeliveryStore,
    SQLiteDeliveryStore,
)

from .job.reconcile import reconcile as reconcile_results
from .job.reconcile import still_maybe_sent
from .options import prefix_option
from .screen.problem import Problem

__all__ = ["callbacks"]

_TOKEN_VARIABLE = "DISPATCH_CALLBACK_TOKEN"  # noqa: S105 - a variable's name


@attrs.frozen
class ServeConfig:
    """Where to listen and what to store into."""

    store: Path | None
    redis: str | None
    key_prefix: str
    host: str
    port: int
    path: str
    token_file: Path | None
    allowed_ips: tuple[str, ...]
    max_body_bytes: int
    verbose: int


@click.group()
def callbacks() -> None:
    """Receive the service's delivery callbacks (delivered, read, SMS fallback...)."""


_store_option = click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The SQLite file of delivery state (made if missing); put it beside the results.",
)
_redis_option = click.option(
    "--redis", metavar="URL", help="Or a Redis store (a fleet of receivers)."
)


@callbacks.command()
@_store_option
@_redis_option
@prefix_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--path", default="/callbacks", show_default=True, help="Where the URL starts.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The URL's secret token (else ${_TOKEN_VARIABLE}, else STORE.token, made if missing).",
)
@click.option(
    "--allow-ip",
    "allowed_ips",
    multiple=True,
    metavar="ADDRESS|NETWORK",
    help="Only these callers (repeatable); default: any.",
)
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=64 * 1024, hidden=True)
@click.option("-v", "--verbose", count=True, help="Log refusals (-vv: every event). Never secrets.")
def serve(**options: Any) -> None:
    """Store every callback, answering 200 only once it is durable, until Ctrl-C.

    The callback URL is http://HOST:PORT/PATH/TOKEN (TOKEN: the token file's content);
    give it to `send --callback`, behind your HTTPS proxy.
    """
    allowed_ips = tuple(options.pop("allowed_ips"))
    config = ServeConfig(**options, allowed_ips=allowed_ips)
    if (config.store is None) == (config.redis is None):
        raise click.UsageError("give --store FILE or --redis URL (one of them)")
    if config.store is None and config.token_file is None and _TOKEN_VARIABLE not in os.environ:
        raise click.UsageError(f"with --redis, give --token-file FILE or ${_TOKEN_VARIABLE}")
    raise SystemExit(asyncio.run(run_serve(config)))


async def run_serve(config: ServeConfig) -> int:
    """Serve until a signal; 0 after a clean stop, 2 for a configuration problem."""
    level = logging.WARNING if config.verbose == 0 else logging.DEBUG
    if config.verbose == 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        server = CallbackServer(
            DeliveryTracker(_store(config.store, config.redis, config.key_prefix)),
            token=_token(config),
            host=config.host,
            port=config.port,
            path=config.path,
            allowed_ips=config.allowed_ips or None,
            max_body_bytes=config.max_body_bytes,
        )
        await server.start()
    except (da.ConfigurationError, da.DeliveryStoreError, OSError) as exc:
        click.echo(f"Error: {exc}", err=True)
        return 2
    stopping = asyncio.Event()
    try:
        with da.on_stop_signals(lambda _: stopping.set()):
            where = "Redis" if config.store is None else str(config.store)
            click.echo(f"listening on {server.base}/<token>, storing into {where}")
            click.echo(f"the token is in {_token_source(config)}: keep it secret", err=True)
            sys.stdout.flush()
            await stopping.wait()
    finally:
        await server.aclose()
    click.echo("stopped: every acknowledged event is stored", err=True)
    return 0


@callbacks.command()
@click.option(
    "-o",
    "--results",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The finished job's results (send -o).",
)
@_store_option
@_redis_option
@prefix_option
@click.option("--campaign-name", required=True, help="The job's --campaign-name.")
def reconcile(
    results: Path, store: Path | None, redis: str | None, key_prefix: str, campaign_name: str
) -> None:
    """Make the maybe_sent records that the stored callbacks confirm sent records.

    A callback for the record's number with the job's campaign name proves the service
    acted: the record becomes sent, with the callback's reference as id. The others stay
    maybe_sent (silence proves nothing); `export --outcome maybe_sent` lists them. Exit
    0 when none is left, 1 when some are, 2 for a problem.
    """
    if (store is None) == (redis is None):
        raise click.UsageError("give --store FILE or --redis URL (one of them)")
    if store is not None and not store.is_file():
        # A mistyped name would make an empty store, and report nothing confirmed.
        raise click.UsageError(f"--store {store} does not exist: give the receiver's file")
    raise SystemExit(
        asyncio.run(run_reconcile(results, _store(store, redis, key_prefix), campaign_name))
    )


async def run_reconcile(results: Path, store: DeliveryStore, campaign_name: str) -> int:
    """Reconcile *results*; the exit code."""
    try:
        async with DeliveryTracker(store) as tracker:
            done = await reconcile_results(results, tracker, campaign_name)
            if done.maybe_sent and not await tracker.counts(campaign_name):
                click.echo(
                    f"warning: the store has no message of campaign {campaign_name!r}: "
                    "is it the job's store, and its --campaign-name?",
                    err=True,
                )
    except Problem as problem:
        click.echo(f"Error: {problem.message}", err=True)
        return problem.exit_code
    except (da.ConfigurationError, da.DeliveryStoreError) as exc:
        click.echo(f"Error: {exc}", err=True)
        return 2
    click.echo(
        f"{done.maybe_sent:,} maybe_sent: {done.confirmed:,} confirmed sent by callbacks, "
        f"{done.left:,} still maybe_sent",
        err=True,
    )
    if done.left and (export := still_maybe_sent(results)) is not None:
        click.echo(f"{export} writes them out", err=True)
    return 0 if done.left == 0 else 1


def _store(store: Path | None, redis: str | None, key_prefix: str) -> DeliveryStore:
    if store is not None:
        return SQLiteDeliveryStore(store)
    return RedisDeliveryStore(str(redis), key_prefix=key_prefix)


def _token(config: ServeConfig) -> str:
    """The token, from the environment or the token file (made once if missing).

    An empty one is refused: the server would otherwise run with a token nobody knows.
    """
    given = os.environ.get(_TOKEN_VARIABLE)
    if given is not None and config.token_file is None:
        if not given.strip():
            raise da.ConfigurationError(f"${_TOKEN_VARIABLE} is empty")
        return given.strip()
    path = _token_file(config)
    if not path.exists():
        _make_token_file(path)
    token = path.read_text().strip()
    if not token:
        raise da.ConfigurationError(f"the token file {path} is empty")
    return token


def _make_token_file(path: Path) -> None:
    """A new private token file, whole or not at all: written aside, then linked in."""
    scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(CallbackReceiver.new_token() + "\n")
            file.flush()
            os.fsync(file.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
    directory = os.open(path.absolute().parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _token_file(config: ServeConfig) -> Path:
    if config.token_file is not None:
        return config.token_file
    assert config.store is not None  # checked with the options
    return config.store.with_name(config.store.name + ".token")


def _token_source(config: ServeConfig) -> str:
    if os.environ.get(_TOKEN_VARIABLE) is not None and config.token_file is None:
        return f"${_TOKEN_VARIABLE}"
    return str(_token_file(config))

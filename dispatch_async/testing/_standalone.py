"""Running the simulator as a process: ``python -m dispatch_async.testing`` and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._callbacks import CallbackPlan
from ._recorder import DEFAULT_RECORDED_REQUESTS
from ._server import FakeDispatchServer
from ._stats import ServerStats

__all__ = ["argument_parser", "main", "serve_forever"]


def _announce(url: str) -> None:
    # One flushed line: a parent process reads it to learn the port.
    sys.stdout.write(url + "\n")
    sys.stdout.flush()


async def serve_forever(
    server: FakeDispatchServer,
    *,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Start ``server``, call ``ready(url)``, serve until SIGINT/SIGTERM (or ``stop``), close.

    Args:
        server: a server not yet started.
        ready: told the URL once listening; None prints it on stdout, one line.
        stop: set it to stop from inside the process (tests, embedding).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Like the SDK's on_stop_signals (the simulator shares no code with the SDK): the
    # handlers found are put back, where asyncio's removal would turn Ctrl-C on.
    found = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        # Not available off the main thread or on Windows: Ctrl-C still interrupts there.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
            found[signum] = previous
    try:
        async with server:
            (ready or _announce)(server.url)
            await stop.wait()
    finally:
        for signum, previous in found.items():
            loop.remove_signal_handler(signum)
            if previous is not None:
                signal.signal(signum, previous)


def _fault_rate(text: str) -> tuple[int, float]:
    code, sep, rate = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(code), float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CODE=RATE (e.g. 429=0.02), got {text!r}"
        ) from None


def _template(text: str) -> tuple[str, tuple[str, ...]]:
    name, _, needs = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(
            f"expected ID[:VAR,...] (e.g. pix_reminder:pixCode), got {text!r}"
        )
    return name, tuple(var for var in needs.split(",") if var)


def argument_parser(prog: str = "python -m dispatch_async.testing") -> argparse.ArgumentParser:
    """The simulator's command-line options, each defined once: `main` parses with it, and
    ``dispatch-async serve`` builds its options from it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the dispatch API simulator until interrupted; prints its URL.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=0, help="port, 0 for a free one")
    parser.add_argument("--secret", default="test-secret", help="accepted client_secret")
    parser.add_argument(
        "--token-lifetime", type=float, default=3600.0, metavar="SECONDS", help="token lifetime"
    )
    parser.add_argument(
        "--fault-rate",
        type=_fault_rate,
        action="append",
        default=[],
        metavar="CODE=RATE",
        help="random status faults, repeatable (e.g. --fault-rate 429=0.02)",
    )
    parser.add_argument(
        "--random-retry-after",
        default="0",
        metavar="VALUE",
        help="Retry-After of random 429s (default: 0)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for the random faults")
    parser.add_argument(
        "--latency", type=float, default=0.0, metavar="SECONDS", help="delay on every dispatch"
    )
    parser.add_argument(
        "--fast-ids", action="store_true", help="counter-based message ids (benchmarks)"
    )
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="R",
        help="dispatch requests/s allowed per account; beyond it 429 with Retry-After "
        '(change it while running: PUT /_rate_limit {"rate": R})',
    )
    parser.add_argument(
        "--jwt-tokens",
        action="store_true",
        help="issue JWTs with iat/exp claims, not opaque tokens",
    )
    parser.add_argument(
        "--expires-in",
        default=None,
        metavar="VALUE",
        help='the token answer\'s expires_in as this text (e.g. "1h", "<time>") '
        "instead of the lifetime in seconds",
    )
    parser.add_argument(
        "--token-body",
        choices=("form", "json", "any"),
        default="form",
        help="what the token endpoint reads (default: %(default)s, the spec's)",
    )
    parser.add_argument(
        "--allow-ip",
        action="append",
        default=None,
        metavar="ADDRESS",
        help="serve only these callers, 403 to others (an IP allow-list), repeatable",
    )
    parser.add_argument(
        "--no-session-ids",
        action="store_true",
        help="leave session_id out of accepted messages (the spec's bare answer)",
    )
    parser.add_argument(
        "--recorded-requests",
        type=int,
        default=DEFAULT_RECORDED_REQUESTS,
        metavar="N",
        help="latest requests kept for GET /_requests (default: %(default)s; 0: none)",
    )
    parser.add_argument(
        "--template",
        type=_template,
        action="append",
        default=[],
        metavar="ID[:VAR,...]",
        help="the account's only templates, with the vars each needs, repeatable: another "
        "template_id, or a recipient without one of its vars, gets 400 (default: any)",
    )
    parser.add_argument(
        "--callbacks",
        action="store_true",
        help="post delivery callbacks to each request's callback URL (on loopback) for the "
        "messages acted on, as CallbackPlan() does: every one delivered, about half read",
    )
    parser.epilog = (
        "GET /_stats answers the simulator's counters as JSON; they are also printed to "
        "stderr when it stops. GET /_requests answers the latest requests it received "
        "(credentials removed). Both are the simulator's, not part of the service."
    )
    return parser


def main(
    argv: Sequence[str] | None = None, *, prog: str = "python -m dispatch_async.testing"
) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and serve until SIGINT/SIGTERM.

    *prog* is the command's name in ``--help`` and usage errors.
    """
    parser = argument_parser(prog)
    args = parser.parse_args(argv)
    optional: dict[str, Any] = {}
    if args.expires_in is not None:
        optional["expires_in"] = args.expires_in
    if args.template:
        optional["templates"] = dict(args.template)
    if args.callbacks:
        optional["callbacks"] = CallbackPlan(seed=args.seed)
    try:
        server = FakeDispatchServer(
            client_secret=args.secret,
            token_lifetime=args.token_lifetime,
            host=args.host,
            port=args.port,
            latency=args.latency,
            fault_rates=dict(args.fault_rate),
            seed=args.seed,
            random_retry_after=args.random_retry_after,
            fast_ids=args.fast_ids,
            rate_limit=args.rate_limit,
            jwt_tokens=args.jwt_tokens,
            token_body=args.token_body,
            allowed_ips=args.allow_ip,
            session_ids=not args.no_session_ids,
            recorded_requests=args.recorded_requests,
            **optional,
        )
    except ValueError as exc:
        parser.error(str(exc))
    # This process only serves: parsing a large chunk allocates thousands of small dicts,
    # and the default collector thresholds make that a third of the parse time. The
    # payloads hold no cycles, so collecting rarely costs nothing but a little memory.
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)
    # Where signal handlers could not be installed, Ctrl-C is the way out.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(server))
    sys.stderr.write(_summary(server.stats) + "\n")
    return 0


def _summary(stats: ServerStats) -> str:
    """What the simulator saw, for a person who just stopped it."""
    statuses = ", ".join(f"{code}: {n:,}" for code, n in sorted(stats.status_counts.items()))
    return (
        f"simulator stopped: {_counted(stats.token_calls, 'token request')}, "
        f"{_counted(stats.requests, '/api/v3 request')}, "
        f"{_counted(stats.dispatch_calls, 'dispatch', 'dispatches')} acted on, "
        f"{_counted(stats.recipients_received, 'recipient')} received "
        f"({sum(stats.duplicates.values()):,} more than once), {stats.rate_limited:,} "
        f"rate-limited; answers by status: {statuses or 'none'}"
    )


def _counted(count: int, singular: str, plural: str | None = None) -> str:
    # The simulator shares no code with the client: its own two lines.
    return f"{count:,} {singular if count == 1 else plural or singular + 's'}"

"""``dispatch-async serve``: the simulator's own command line, as a click command.

The options are defined once, in ``dispatch_async.testing.argument_parser`` (what
``python -m dispatch_async.testing`` parses); each becomes a click option here, so
``serve --help`` looks like every other command's and a bad value is refused the same
way. Once click has checked them, the arguments as given go to
``dispatch_async.testing.main``, which runs the simulator exactly as on its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import click

import dispatch_async.testing

__all__ = ["serve_command"]

_PROG = "dispatch-async serve"


class _ArgparseType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2
    """An argparse ``type=`` function as a click type (its message when it refuses)."""

    def __init__(self, convert: Callable[[str], Any], metavar: str) -> None:
        self._convert = convert
        self.name = metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # pragma: no cover - no simulator default is one
            return value
        try:
            return self._convert(value)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            self.fail(str(exc), param, ctx)


class _ServeCommand(click.Command):
    """Keeps the arguments as given, for ``testing.main`` to parse once click checked them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["serve.argv"] = list(args)
        return super().parse_args(ctx, args)


def serve_command() -> click.Command:
    """The ``serve`` command, with an option for each of the simulator's arguments."""
    parser = dispatch_async.testing.argument_parser(_PROG)
    # argparse has no public list of a parser's arguments; ``_actions`` is the one it keeps.
    options = [_option(action) for action in parser._actions if action.dest != "help"]

    @click.pass_context
    def serve(ctx: click.Context, /, **_: Any) -> None:
        raise SystemExit(dispatch_async.testing.main(ctx.meta["serve.argv"], prog=_PROG))

    return _ServeCommand(
        "serve",
        params=list(options),
        callback=serve,
        help="Run the simulator until Ctrl-C; prints its URL, and what it saw when stopped.",
        short_help="Run the simulator until Ctrl-C; prints its URL.",
        epilog=parser.epilog,
    )


def _option(action: argparse.Action) -> click.Option:
    """*action* as a click option: the same flags, default, choices, type and help."""
    extra: dict[str, Any] = {}
    if action.nargs == 0:  # store_true
        extra["is_flag"] = True
    else:
        if isinstance(action, argparse._AppendAction):
            extra["multiple"] = True
        if action.choices is not None:
            extra["type"] = click.Choice(list(action.choices))
        elif action.type in (int, float):
            extra["type"] = action.type
        elif callable(action.type):
            extra["type"] = _ArgparseType(action.type, str(action.metavar or action.dest))
        if action.metavar is not None:
            extra["metavar"] = str(action.metavar)
        default = action.default
        if not (extra.get("multiple") and not default):
            extra["default"] = default
            # Unless its help says it already.
            extra["show_default"] = default is not None and "default" not in (action.help or "")
    flags = list(action.option_strings)
    return click.Option([*flags, action.dest], help=_help(action), **extra)


def _help(action: argparse.Action) -> str | None:
    if action.help is None:  # pragma: no cover - every simulator argument has a help
        return None
    return action.help % {**vars(action), "prog": _PROG}  # as argparse fills it in

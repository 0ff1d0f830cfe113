"""How a command's run ends: with its exit code, or a Problem as one ``Error:`` line."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import click

from .screen.problem import Problem

__all__ = ["exit_with", "failure"]


class _UsageFailure(click.ClickException):
    """A usage or configuration Problem, as click prints it: ``Error: <one line>``."""

    exit_code = 2


class _JobFailure(click.ClickException):
    """A Problem that ended a job part way: exit 1."""

    exit_code = 1


def failure(problem: Problem) -> click.ClickException:
    """The click exception that prints *problem* as one ``Error:`` line, with its code."""
    kind = _UsageFailure if problem.exit_code == 2 else _JobFailure
    return kind(problem.message)


def exit_with(run: Callable[[], int]) -> NoReturn:
    """Exit with what *run* returns; a Problem it raises as one ``Error:`` line."""
    try:
        code = run()
    except Problem as problem:
        raise failure(problem) from None
    raise SystemExit(code)

"""``send --resume`` without retyping: the job's options, stored in its journal's header.

A new job writes what defines it (the endpoint and its fields, the input and how it is
read, the chunk size and screening) into the journal it starts, and keeps them beside its
results when it finishes (``jobfile``). ``--resume`` reads them back, in either form
(``send --resume -o FILE`` or ``send ENDPOINT -o FILE --resume``): a flag left out
takes the job's value, a flag given again must say the same or the run is refused (exit
2, naming the flag). Run-time flags (connection, concurrency, deadline, display) are not
part of a job and may change from run to run.

What the journal stores is taken as the flag takes it: through the flag's own click type
and callback, after a check that the JSON value is of the kind that flag gives (a string,
a whole number, true or false). A value the flag would refuse is refused the same way,
naming the journal and the flag, before anything is read or sent. ``export`` reads the
input's options through the same ``stored_job``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import click
from click.core import ParameterSource

from ..reading.rows import Rows
from ..screen.problem import DISK_ERRORS, FAILED, USAGE, Problem
from .jobfile import job_path
from .journal import journal_path, stored_options
from .spec import Target

__all__ = ["as_read", "job_options", "resumed", "stored_job"]

#: What a job stores, by option name, with the flag that sets it (None: the command).
_STORED: Final = {
    "endpoint": None,
    "text": "--text",
    "template_id": "--template-id",
    "webhook": "--webhook",
    "campaign_name": "--campaign-name",
    "fallback_sms": "--fallback-sms",
    "callback": "--callback",
    "input_path": "--input",
    "input_format": "--format",
    "number_column": "--number-column",
    "columns": "--columns",
    "delimiter": "--delimiter",
    "encoding": "--encoding",
    "variables": "--var",
    "only_vars": "--only-vars",
    "exclude": "--exclude",
    "chunk_size": "--chunk-size",
    "dedupe": "--dedupe",
    "prevalidate": "--prevalidate",
    "region": "--region",
}
_TARGET_FIELDS: Final = tuple(field.name for field in attrs.fields(Target))
_GIVEN: Final = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
#: The stored options that name files: compared by the file they name.
_PATHS: Final = ("input_path", "exclude")


def job_options(target: Target, options: dict[str, Any]) -> dict[str, Any]:
    """What the journal of a new job stores (paths made absolute).

    ``encoding`` is the one given; the job stores the one it read (see ``send``).
    """
    values: dict[str, Any] = {name: options.get(name) for name in _STORED}
    values |= attrs.asdict(target)
    for name in _PATHS:
        if values[name] not in (None, "-"):
            values[name] = os.path.abspath(values[name])
    return values


def as_read(options: dict[str, Any], rows: Rows) -> dict[str, Any]:
    """*options* with the encoding the input was read in: a resume reads it the same way."""
    if rows.layout is None or "encoding" not in options:
        return options
    return options | {"encoding": rows.layout.encoding.codec}


def resumed(
    ctx: click.Context,
    target: Target | None,
    options: dict[str, Any],
    endpoints: Mapping[str, click.Command],
) -> tuple[Target, dict[str, Any]]:
    """The target and options of ``--resume``: the job's, checked against flags given.

    *target* is None for ``send --resume -o FILE`` (no endpoint named); *endpoints* are
    the ``send`` subcommands, whose options check what the journal stores.

    Raises:
        Problem: no options are stored and the flags were not given, a stored value is
            one its flag would refuse, or a flag given says something else than the job.
    """
    output = Path(options["output"])
    journal = journal_path(output)
    try:
        stored = stored_job(ctx, output, endpoints, target)
    except FileNotFoundError:
        if target is not None:
            # A job finished by an earlier dispatch-async, resumed with its flags.
            return _given(target, endpoints, output), options
        if not output.exists():
            raise Problem(
                f"{output} does not exist: no job to resume there (its results are the "
                "record of what was sent; without them every row would be sent again)"
            ) from None
        raise Problem(
            f"{output} has no journal and no {job_path(output).name} beside it (a job "
            "finished by an earlier dispatch-async, or none ran): give the job's flags "
            f"again (send ENDPOINT ... -o {output} --resume) to send its not_sent lines, or "
            f"write them to a retry file with: dispatch-async export {output} --input FILE "
            "-o retry.csv"
        ) from None
    except OSError as exc:
        code = FAILED if exc.errno in DISK_ERRORS else USAGE
        raise Problem(f"cannot read {journal}: {exc.strerror}", code) from None
    if stored is None:
        if target is not None:
            return _given(target, endpoints, output), options
        raise Problem(
            f"{journal} holds no options (it was written by an earlier "
            "dispatch-async, or cut short before anything was sent): give the job's flags "
            f"again (send ENDPOINT ... -o {output} --resume)"
        )
    endpoint = stored["endpoint"]
    if target is not None and target.endpoint != endpoint:
        raise Problem(
            f"{output} is the output of a `send {endpoint}` job, not `send "
            f"{target.endpoint}`: resume it with `send --resume -o {output}`"
        )
    combined = options | (attrs.asdict(target) if target is not None else {})
    for name, value in stored.items():
        source = ctx.get_parameter_source(name)
        if source in _GIVEN and not _same(name, combined[name], value):
            where = _envvar(ctx, name) if source is ParameterSource.ENVIRONMENT else ""
            raise Problem(
                f"{_STORED[name]} {_show(combined[name])}{where} is not what the job writing "
                f"{output} was started with ({_show(value)}): leave it out to continue the "
                "job, or choose another --output for a new one"
            )
        combined[name] = value
    fields: dict[str, Any] = {field: combined.get(field) for field in _TARGET_FIELDS}
    return Target(**fields), combined


def _given(target: Target, endpoints: Mapping[str, click.Command], output: Path) -> Target:
    """*target* when every flag its endpoint requires was given (no options are stored).

    Raises:
        Problem: a required flag is missing (``JobOption`` lets it be with --resume).
    """
    given = attrs.asdict(target)
    for param in endpoints[target.endpoint].params:
        if param.required and param.name in given and given[param.name] is None:
            raise Problem(
                f"Missing option '{param.opts[-1]}': {output} has no options stored with "
                "it (a job of an earlier dispatch-async), so give the job's flags again"
            )
    return target


def stored_job(
    ctx: click.Context,
    output: Path,
    endpoints: Mapping[str, click.Command],
    target: Target | None = None,
) -> dict[str, Any] | None:
    """The options the job writing *output* stored, each as its flag takes it.

    An option the journal does not store is left out (its flag decides), unless the
    endpoint requires it. None for a journal that stores none (see ``stored_options``).
    *target*: the endpoint named on the command line, for a journal without one.

    Raises:
        FileNotFoundError: *output* has no journal.
        OSError: the journal cannot be read.
        Problem: the journal is not one, or stores a value its flag would refuse.
    """
    stored = stored_options(output)
    if stored is None:
        return None
    journal = journal_path(output)
    endpoint = stored.get("endpoint", target.endpoint if target is not None else None)
    if not isinstance(endpoint, str) or endpoint not in endpoints:
        raise Problem(
            f"{journal} stores the endpoint {endpoint!r}, not one of "
            f"{', '.join(endpoints)}: fix that value in its first line"
        )
    flags = {p.name: p for p in endpoints[endpoint].params if isinstance(p, click.Option)}
    checked: dict[str, Any] = {"endpoint": endpoint}
    for name, flag in _STORED.items():
        param = flags.get(name)
        if name != "endpoint" and (name in stored or (param is not None and param.required)):
            checked[name] = _as_flag(ctx, param, stored.get(name), flag, endpoint, journal)
    return checked


def _as_flag(
    ctx: click.Context,
    param: click.Option | None,
    value: object,
    flag: str | None,
    endpoint: str,
    journal: Path,
) -> object:
    """A stored *value* as its flag takes it (the flag's type and callback), or Problem.

    JSON is checked for the kind of value the flag gives first: click would turn a list
    into its repr, ``"no"`` into False and 10.5 into 10.
    """
    stored = f"{journal} stores {flag} {value!r}"
    if param is None:  # a field of another endpoint (--text of `send template`)
        if value is None:
            return None
        raise Problem(
            f"{stored}, which `send {endpoint}` does not take: fix that value in its first line"
        )
    info = param.to_info_dict()
    if value is None:
        if info["required"] or info["default"] is not None:
            needs = f"`send {endpoint}` needs" if info["required"] else "always has a value"
            raise Problem(
                f"{journal} stores no {flag}, which {needs}: fix that value in its first line"
            )
        return None
    kind, what = _kind(param)
    wrong = not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
    if isinstance(value, list) and not all(isinstance(item, str) for item in value):
        wrong = True
    if wrong:
        raise Problem(f"{stored}, which is not {what}: fix that value in its first line")
    try:
        value = param.type_cast_value(ctx, value)
        if param.callback is not None:
            value = param.callback(ctx, param, value)
    except click.BadParameter as exc:
        reason = exc.message.rstrip(".")
        raise Problem(
            f"{stored}, which the flag refuses ({reason}): fix that value in its first line"
        ) from None
    return value


def _kind(param: click.Option) -> tuple[type | tuple[type, ...], str]:
    """The JSON kind of value the flag gives, and its name for a message."""
    if param.is_flag:
        return bool, "true or false"
    if param.multiple:
        return list, "a list of strings"
    if isinstance(param.type, click.types.IntParamType):
        return int, "a whole number"
    if isinstance(param.type, click.types.FloatParamType):  # pragma: no cover - none stored yet
        return (int, float), "a number"
    return str, "a string"


def _envvar(ctx: click.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and isinstance(param, click.Option) and param.envvar:
            return f" (from ${param.envvar})"
    return ""  # pragma: no cover - an option read from the environment names its variable


def _same(name: str, given: object, stored: object) -> bool:
    if name in _PATHS and isinstance(given, str) and isinstance(stored, str):
        return given == stored or os.path.realpath(given) == os.path.realpath(stored)
    return given == stored


def _show(value: object) -> str:
    if value is True:
        return "given"
    if value is False or value is None:
        return "not given"
    return repr(value)

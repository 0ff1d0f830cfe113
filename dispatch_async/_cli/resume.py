"""``send --resume`` without retyping: the job's options, stored in its journal's header.

A new job writes what defines it (the endpoint and its fields, the input and how it is
read, the chunk size and screening) into the journal it starts. ``--resume`` reads them
back: a flag left out takes the job's value, a flag given again must say the same or the
run is refused (exit 2, naming the flag). Run-time flags (connection, concurrency,
deadline, display) are not part of a job and may change from run to run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import attrs
import click
from click.core import ParameterSource

from .journal import journal_path, stored_options
from .spec import Problem, Target

__all__ = ["job_options", "resumed"]

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
    "chunk_size": "--chunk-size",
    "dedupe": "--dedupe",
    "prevalidate": "--prevalidate",
    "region": "--region",
}
_TARGET_FIELDS: Final = tuple(field.name for field in attrs.fields(Target))
_GIVEN: Final = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def job_options(target: Target, options: dict[str, Any]) -> dict[str, Any]:
    """What the journal of a new job stores (the input path made absolute)."""
    values = {name: options.get(name) for name in _STORED} | attrs.asdict(target)
    if values["input_path"] not in (None, "-"):
        values["input_path"] = os.path.abspath(values["input_path"])
    return values


def resumed(
    ctx: click.Context, target: Target | None, options: dict[str, Any]
) -> tuple[Target, dict[str, Any]]:
    """The target and options of ``--resume``: the job's, checked against flags given.

    *target* is None for ``send --resume -o FILE`` (no endpoint named).

    Raises:
        Problem: no options are stored and the flags were not given, or a flag given
            says something else than the job.
    """
    output = Path(options["output"])
    try:
        stored = stored_options(output)
    except FileNotFoundError:
        if target is not None:
            return target, options  # a finished job resumed with its flags, as always
        raise Problem(
            f"{output} has no journal ({journal_path(output).name}): the job ran to its "
            "end, so its options are gone. Give its flags again (send ENDPOINT ... -o "
            f"{output} --resume) to send its not_sent lines, or write them to a retry "
            f"file with: dispatch-async export -o {output} --input FILE"
        ) from None
    except OSError as exc:
        raise Problem(f"cannot read {journal_path(output)}: {exc.strerror}") from None
    if stored is None:
        if target is not None:
            return target, options
        raise Problem(
            f"{journal_path(output)} holds no options (it was written by an earlier "
            "dispatch-async, or cut short before anything was sent): give the job's flags "
            f"again (send ENDPOINT ... -o {output} --resume)"
        )
    combined = options | (attrs.asdict(target) if target is not None else {})
    for name, flag in _STORED.items():
        if name not in stored:
            continue
        value = stored[name]
        if name == "endpoint":
            if target is not None and target.endpoint != value:
                raise Problem(
                    f"{output} is the output of a `send {value}` job, not `send "
                    f"{target.endpoint}`: resume it with `send --resume -o {output}`"
                )
            combined[name] = value
            continue
        source = ctx.get_parameter_source(name)
        if source in _GIVEN and not _same(name, combined[name], value):
            where = _envvar(ctx, name) if source is ParameterSource.ENVIRONMENT else ""
            raise Problem(
                f"{flag} {_show(combined[name])}{where} is not what the job writing {output} "
                f"was started with ({_show(value)}): leave it out to continue the job, or "
                "choose another --output for a new one"
            )
        combined[name] = value
    return Target(**{field: combined[field] for field in _TARGET_FIELDS}), combined


def _envvar(ctx: click.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and isinstance(param, click.Option) and param.envvar:
            return f" (from ${param.envvar})"
    return ""


def _same(name: str, given: object, stored: object) -> bool:
    if name == "input_path" and isinstance(given, str) and isinstance(stored, str):
        return given == stored or os.path.realpath(given) == os.path.realpath(stored)
    return given == stored


def _show(value: object) -> str:
    if value is True:
        return "given"
    if value is False or value is None:
        return "not given"
    return repr(value)

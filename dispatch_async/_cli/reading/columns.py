"""CSV column names: how they are matched, and which template vars they become.

Names match ignoring case, surrounding spaces, a BOM and the Unicode normal form: one
rule for ``--number-column``, ``--var`` and repeated names. Without ``--var`` every
named column but the number's becomes a var under its own name. ``--var NAME=COLUMN``
sends COLUMN under NAME instead, and ``--only-vars`` sends only the mapped columns.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import click

from .problems import InputProblem

__all__ = ["column_key", "parse_vars", "var_columns", "var_pairs"]


def column_key(name: str) -> str:
    """The form column names are compared in, for a match and for a repeat alike.

    Case, surrounding spaces, a BOM and the Unicode normal form (``Número`` typed on
    macOS is NFD) are ignored.
    """
    return unicodedata.normalize("NFC", name.replace("\ufeff", "")).strip().casefold()


def parse_vars(
    _ctx: click.Context | None, _param: click.Parameter | None, values: Sequence[str]
) -> tuple[str, ...]:
    """``--var``'s values, checked, sorted by name (the order they are given says nothing)."""
    names: set[str] = set()
    for value in values:
        name, sep, column = value.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not name or not column:
            raise click.BadParameter(
                f'{value!r} is not NAME=COLUMN (e.g. pixCode="Código Pix")', param_hint="--var"
            )
        if name in names:
            raise click.BadParameter(f"the var {name!r} is mapped twice", param_hint="--var")
        names.add(name)
    return tuple(sorted(values, key=lambda value: value.partition("=")[0].strip()))


def var_pairs(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--var``'s values as ``(var, column)`` pairs."""
    pairs = (value.partition("=") for value in values)
    return tuple((name.strip(), column.strip()) for name, _, column in pairs)


def var_columns(
    names: Sequence[str],
    number_at: int,
    variables: Sequence[tuple[str, str]],
    only_vars: bool,
) -> list[tuple[int, str]]:
    """``(column index, var)`` for every var a row carries, in the order of the columns.

    Raises:
        InputProblem: a mapped column is not in the header, or a var would get two values.
    """
    keys = [column_key(name) for name in names]
    mapped: dict[int, list[str]] = {}
    for var, column in variables:
        if column_key(column) not in keys:
            shown = ", ".join(repr(name) for name in names if name) or "none"
            raise InputProblem(
                f"--var {var}={column!r}: the CSV has no column {column!r} (columns: {shown})"
            )
        mapped.setdefault(keys.index(column_key(column)), []).append(var)
    taken: list[tuple[int, str]] = []
    for index, name in enumerate(names):
        if index in mapped:
            taken += [(index, var) for var in mapped[index]]
        elif not only_vars and index != number_at and name:
            # Columns without a name cannot become a var (a trailing comma in the header).
            taken.append((index, name))
    given = [var for _, var in taken]
    twice = sorted({var for var in given if given.count(var) > 1})
    if twice:
        raise InputProblem(
            f"--var {twice[0]}=...: the CSV also has a column {twice[0]!r}, which is sent as "
            "that var too: map it to another name, or send only the mapped columns with "
            "--only-vars"
        )
    return taken

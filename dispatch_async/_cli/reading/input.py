"""Reading recipients from CSV or JSONL as a stream of rows, each with its line number.

Nothing here holds more than one row: a ten-million-line file streams through. A row
that cannot be a recipient is still yielded, with the problem, so the job can record
it; only a problem with the input as a whole (no number column) is raised.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from typing import IO, Literal

import orjson

from .csv import csv_rows, open_input
from .rows import MALFORMED, Format, InputProblem, Row, Rows, UnreadableInput

__all__ = [
    "MALFORMED",
    "Format",
    "InputProblem",
    "Row",
    "Rows",
    "UnreadableInput",
    "count_lines",
    "is_regular_file",
    "line_bound",
    "open_rows",
]

_BOM = b"\xef\xbb\xbf"
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_FIELDS = frozenset({"number", "vars"})
#: Lines a job from a pipe may run to (two bytes of bookkeeping per line: 1 GiB).
_PIPE_LINE_BOUND = 1 << 29


def open_rows(
    path: str,
    fmt: Format = "auto",
    *,
    number_column: str = "number",
    columns: Sequence[str] | None = None,
    delimiter: str | None = None,
    encoding: str | None = None,
    variables: Sequence[tuple[str, str]] = (),
    only_vars: bool = False,
) -> Rows:
    """Open *path* (``-`` for stdin) and read its header, if any.

    *delimiter* None: the one of ``DELIMITERS`` that splits the first line most;
    *encoding* None: UTF-8 or Windows-1252, as the file says. *variables* and *only_vars*:
    see ``columns.var_columns``.

    Raises:
        OSError: the file cannot be opened.
        InputProblem: the header does not name the number column or a ``--var`` column,
            repeats a name, or the file is neither UTF-8 nor Windows-1252.
    """
    stream, owned = open_input(path)
    try:
        kind = fmt if fmt != "auto" else _guess_format(path, stream)
        rows = Rows(stream, owned=owned, kind=kind)
        if kind == "jsonl":
            rows._rows = _jsonl_rows(stream, rows)
        else:
            csv_rows(
                stream,
                rows,
                number_column=number_column,
                columns=columns,
                delimiter=delimiter,
                encoding=encoding,
                variables=variables,
                only_vars=only_vars,
            )
    except BaseException:
        if owned:
            stream.close()
        raise
    return rows


def is_regular_file(path: str) -> bool:
    """Whether *path* can be read again from the start (not stdin, a pipe or a device)."""
    try:
        return path != "-" and stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def count_lines(path: str) -> int | None:
    """How many lines a regular file has (for a progress total); None for stdin or a pipe."""
    if not is_regular_file(path):
        return None
    try:
        lines = 0
        last = b"\n"
        with open(path, "rb") as stream:
            while block := stream.read(1 << 20):
                lines += block.count(b"\n")
                last = block[-1:]
    except OSError:
        return None
    return lines + (last != b"\n")


def line_bound(path: str) -> int:
    """No input line number can be above this: a file of N bytes has at most N + 1 lines.

    What a corrupt output or journal says is checked against it, so it never sizes memory.
    A pipe has no size: its bound is the most lines a job's memory is meant to track.
    """
    try:
        info = os.stat(path) if path != "-" else None
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        return _PIPE_LINE_BOUND
    return info.st_size + 1


def _guess_format(path: str, stream: IO[bytes]) -> Literal["csv", "jsonl"]:
    lowered = path.lower()
    if lowered.endswith(".csv"):
        return "csv"
    if lowered.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    # Unknown name (or stdin): a JSON object starts with "{", a CSV header does not.
    peek = getattr(stream, "peek", None)
    head: bytes = peek(64) if peek is not None else b""
    return "jsonl" if head.removeprefix(_BOM).lstrip().startswith(b"{") else "csv"


def _jsonl_rows(stream: IO[bytes], rows: Rows) -> Iterator[Row]:
    loads = orjson.loads
    for line, raw in enumerate(stream, 1):
        if line == 1:
            raw = raw.removeprefix(_BOM)
        try:
            item = loads(raw)
        except orjson.JSONDecodeError as exc:
            if raw.strip():
                yield Row(line, None, None, f"not valid JSON: {exc}")
            else:  # a blank line is not a row
                rows.empty += 1
            continue
        yield _jsonl_row(line, item)


def _jsonl_row(line: int, item: object) -> Row:
    if type(item) is not dict:
        return Row(line, None, None, f"expected a JSON object, found {_json_kind(item)}")
    number = item.get("number")
    if type(number) is not str:
        problem = (
            "'number' is missing"
            if number is None
            else f"'number' must be a string, not {_json_kind(number)}"
        )
        return Row(line, None, None, problem)
    number = number.strip()
    if not number:
        return Row(line, None, None, "'number' is empty")
    if len(item) > 2 or not _FIELDS.issuperset(item):
        unknown = ", ".join(sorted(repr(k) for k in item if k not in _FIELDS))
        return Row(line, number, None, f"unknown field {unknown}: a row has number and vars")
    values = item.get("vars")
    if values is None:
        values = {}
    elif type(values) is not dict:
        return Row(line, number, None, f"'vars' must be an object, not {_json_kind(values)}")
    else:
        for key, value in values.items():
            if type(value) is not str:
                return Row(
                    line, number, None, f"vars[{key!r}] must be a string, not {_json_kind(value)}"
                )
    return Row(line, number, {"number": number, "vars": values})


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"

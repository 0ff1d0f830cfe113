"""Reading recipients from CSV or JSONL as a stream of rows, each with its line number.

Nothing here holds more than one row: a ten-million-line file streams through. A row
that cannot be a recipient is still yielded, with the problem, so the job can record
it; only a problem with the input as a whole (no number column) is raised.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any, Literal, NamedTuple

import orjson

__all__ = [
    "MALFORMED",
    "Format",
    "InputProblem",
    "Row",
    "UnreadableInput",
    "count_lines",
    "line_bound",
    "open_rows",
]

#: The reason recorded for every row that could not be read as a recipient.
MALFORMED = "malformed input row"

Format = Literal["auto", "csv", "jsonl"]

_BOM = b"\xef\xbb\xbf"
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_FIELDS = frozenset({"number", "vars"})


#: The longest CSV field read (csv's default, 131,072, is less than some real notes).
_FIELD_LIMIT = 1 << 23
#: Lines a job from a pipe may run to (two bytes of bookkeeping per line: 1 GiB).
_PIPE_LINE_BOUND = 1 << 29


class InputProblem(Exception):
    """The input as a whole cannot be read (a missing column, an unreadable header)."""


class UnreadableInput(InputProblem):
    """The input cannot be read past a line: what follows it is not trusted as rows."""


class Row(NamedTuple):
    """One input row: a recipient ready to send, or the reason it is not one.

    ``line`` is the 1-based line of the file where the row starts; ``number`` is None
    only when the row has no usable number at all.
    """

    line: int
    number: str | None
    message: dict[str, Any] | None
    problem: str | None = None


class Rows:
    """An open input: iterate it for rows; ``close()`` releases the file (never stdin)."""

    def __init__(self, rows: Iterator[Row], stream: IO[bytes], *, owned: bool, kind: str) -> None:
        self._rows = rows
        self._stream = stream
        self._owned = owned
        self.kind = kind

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def __next__(self) -> Row:
        return next(self._rows)

    def close(self) -> None:
        if self._owned:
            self._stream.close()


def open_rows(
    path: str,
    fmt: Format = "auto",
    *,
    number_column: str = "number",
    columns: Sequence[str] | None = None,
) -> Rows:
    """Open *path* (``-`` for stdin) and read its header, if any.

    Raises:
        OSError: the file cannot be opened.
        InputProblem: the header does not name the number column, or repeats a name.
    """
    if path == "-":
        stream: IO[bytes] = sys.stdin.buffer
        owned = False
    else:
        stream = open(path, "rb")  # noqa: SIM115 - closed by Rows.close
        owned = True
    try:
        kind = fmt if fmt != "auto" else _guess_format(path, stream)
        if kind == "jsonl":
            rows = _jsonl_rows(stream)
        else:
            rows = _csv_rows(stream, number_column=number_column, columns=columns)
    except BaseException:
        if owned:
            stream.close()
        raise
    return Rows(rows, stream, owned=owned, kind=kind)


def count_lines(path: str) -> int | None:
    """How many lines a regular file has (for a progress total); None for stdin or a pipe."""
    if path == "-":
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
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


def _jsonl_rows(stream: IO[bytes]) -> Iterator[Row]:
    loads = orjson.loads
    for line, raw in enumerate(stream, 1):
        if line == 1:
            raw = raw.removeprefix(_BOM)
        try:
            item = loads(raw)
        except orjson.JSONDecodeError as exc:
            if raw.strip():  # a blank line is not a row
                yield Row(line, None, None, f"not valid JSON: {exc}")
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


def _csv_rows(
    stream: IO[bytes], *, number_column: str, columns: Sequence[str] | None
) -> Iterator[Row]:
    # Bad bytes become surrogates instead of ending the job; the row is then malformed.
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
    # strict: a stray quote is reported on its row instead of swallowing the file's rest.
    reader = csv.reader(text, strict=True)
    csv.field_size_limit(_FIELD_LIMIT)
    names = [name.strip() for name in columns] if columns is not None else _header(reader)
    if names is None:
        _detach(text)
        return iter(())
    return _detached_at_end(_csv_records(reader, names, number_column), text)


def _detached_at_end(rows: Iterator[Row], text: io.TextIOWrapper) -> Iterator[Row]:
    try:
        yield from rows
    finally:
        _detach(text)


def _detach(text: io.TextIOWrapper) -> None:
    # The stream is Rows's to close: a wrapper dropped still attached closes it (with a
    # ResourceWarning) as soon as the rows run out, before the caller is done.
    with contextlib.suppress(ValueError):  # the stream was closed first
        text.detach()


def _header(reader: Any) -> list[str] | None:
    while True:
        try:
            fields: list[str] = next(reader)
        except StopIteration:
            return None  # an empty file has no rows
        except csv.Error as exc:
            raise InputProblem(
                f"the CSV header (line {reader.line_num}) is unreadable: {exc}"
            ) from None
        if fields and any(f.strip() for f in fields):
            if not _is_utf8(fields):
                raise InputProblem(
                    f"the CSV header (line {reader.line_num}) is not valid UTF-8: "
                    "save the file as UTF-8"
                )
            return [name.strip() for name in fields]


def _csv_records(reader: Any, names: list[str], number_column: str) -> Iterator[Row]:
    if number_column not in names:
        shown = ", ".join(repr(n) for n in names if n) or "none"
        raise InputProblem(
            f"the CSV has no {number_column!r} column (columns: {shown}); "
            "name it with --number-column, or give --columns for a file without a header"
        )
    named = [n for n in names if n]
    if len(set(named)) != len(named):
        repeated = sorted({n for n in named if named.count(n) > 1})
        raise InputProblem(f"the CSV header repeats column(s) {', '.join(map(repr, repeated))}")
    width = len(names)
    number_at = names.index(number_column)
    # Columns without a name cannot become a vars entry (a trailing comma in the header).
    var_columns = [(i, n) for i, n in enumerate(names) if i != number_at and n]
    return _csv_iter(reader, width, number_at, var_columns)


def _csv_iter(
    reader: Any, width: int, number_at: int, var_columns: list[tuple[int, str]]
) -> Iterator[Row]:
    while True:
        start = reader.line_num + 1
        try:
            fields: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            # Reading on would start inside the broken record (a quoted field's text could
            # become recipients): nothing after it is trusted.
            raise UnreadableInput(
                f"line {start} of the input is not valid CSV ({exc}); nothing from there on "
                "was read: fix the file, then run again with --resume"
            ) from None
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # a blank line is not a row
        if len(fields) != width:
            number = (fields[number_at].strip() or None) if len(fields) > number_at else None
            yield Row(
                start,
                _printable(number),
                None,
                f"expected {width} fields, found {len(fields)}",
            )
            continue
        number = fields[number_at].strip()
        if not number:
            yield Row(start, None, None, "the number is empty")
            continue
        if not _is_utf8(fields):
            yield Row(start, _printable(number), None, "the row is not valid UTF-8")
            continue
        values = {name: fields[i] for i, name in var_columns}
        yield Row(start, number, {"number": number, "vars": values})


def _is_utf8(fields: list[str]) -> bool:
    joined = "".join(fields)
    if joined.isascii():
        return True
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate: the file had bytes that are not UTF-8
        return False
    return True


def _printable(number: str | None) -> str | None:
    if number is None or _is_utf8([number]):
        return number
    return None

"""Reading a CSV as spreadsheets export it: any of four separators, loose column names.

The separator is the one of ``,`` ``;`` tab ``|`` that splits the header line into the
most fields (``--delimiter`` forces one); column names match ignoring case, surrounding
spaces, a BOM and the Unicode normal form, and two names that match each other are a
repeat; a row whose every field is empty (``;;;``) is not a row. The encoding is UTF-8
or Windows-1252 (see ``encoding``); ``--var`` names the vars columns become (see
``variables``). Nothing here holds more than one row.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

from .columns import column_key, var_columns
from .encoding import Encoding, detect_encoding
from .problems import InputProblem, UnreadableInput
from .rows import CsvLayout, Row, Rows

__all__ = [
    "DELIMITERS",
    "csv_records",
    "csv_rows",
    "detect_delimiter",
    "open_input",
]

#: The separators a CSV is read with, in the order a tie is settled.
DELIMITERS = (",", ";", "\t", "|")
#: The longest CSV field read (csv's default, 131,072, is less than some real notes).
_FIELD_LIMIT = 1 << 23


def open_input(path: str) -> tuple[IO[bytes], bool]:
    """The byte stream of *path* (``-``: stdin), and whether the caller must close it."""
    if path == "-":
        return sys.stdin.buffer, False
    return open(path, "rb"), True  # the caller closes it


def csv_rows(
    stream: IO[bytes],
    rows: Rows,
    *,
    number_column: str,
    columns: Sequence[str] | None,
    delimiter: str | None,
    encoding: str | None = None,
    variables: Sequence[tuple[str, str]] = (),
    only_vars: bool = False,
) -> None:
    """Read the header of *stream* and set *rows* to iterate its records.

    *encoding*: the codec to read with (None: detected); *variables*: ``(var, column)``
    pairs, the vars those columns become (with *only_vars*, the only ones).
    """
    text, found = _text(stream, encoding)
    try:
        reader, rows.layout = _start_csv(text, delimiter, columns, found)
        if reader is None:
            _detach(text)
            return
        records = _csv_records(reader, rows.layout, number_column, rows, variables, only_vars)
    except BaseException:
        _detach(text)  # a refused header: the stream is the caller's (stdin stays open)
        raise
    rows._rows = _detached_at_end(records, text)


@contextlib.contextmanager
def csv_records(
    path: str,
    *,
    delimiter: str | None = None,
    columns: Sequence[str] | None = None,
    encoding: str | None = None,
) -> Iterator[tuple[CsvLayout, Iterator[tuple[int, list[str]]]]]:
    """The CSV's layout and its records as written, ``(first line, fields)``, header apart.

    Read exactly as ``open_rows`` reads them (the same separator, encoding and line
    numbers), for writing chosen rows back out. Every record is yielded, empty ones too.

    Raises:
        OSError: the file cannot be opened.
        InputProblem: the file is neither UTF-8 nor Windows-1252.
        UnreadableInput: a record is not valid CSV (nothing after it is trusted).
    """
    stream, owned = open_input(path)
    try:
        text, found = _text(stream, encoding)
        try:
            reader, layout = _start_csv(text, delimiter, columns, found)
            yield layout, _raw_records(reader)
        finally:
            _detach(text)
    finally:
        if owned:
            stream.close()


def _raw_records(reader: Any) -> Iterator[tuple[int, list[str]]]:
    if reader is None:
        return
    while True:
        start = reader.line_num + 1
        try:
            fields: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise UnreadableInput(f"line {start} of the input is not valid CSV ({exc})") from None
        yield start, fields


def detect_delimiter(line: str) -> str:
    """The one of ``DELIMITERS`` that splits *line* (a header) into the most fields.

    Each candidate is tried with the csv module itself, so quoted names count right.
    Not ``csv.Sniffer``: it prefers ``,`` whenever one appears, and a pt-BR header such
    as ``Nome;Telefone;Data, hora`` has one.
    """
    best, most = DELIMITERS[0], 1
    for delimiter in DELIMITERS:
        try:
            fields = next(csv.reader([line], delimiter=delimiter))
        except (csv.Error, StopIteration):
            continue
        if len(fields) > most:
            best, most = delimiter, len(fields)
    return best


def _text(stream: IO[bytes], encoding: str | None) -> tuple[io.TextIOWrapper, Encoding]:
    source, found = detect_encoding(stream, encoding)
    # Bad bytes become surrogates instead of ending the job; the row is then malformed.
    text = io.TextIOWrapper(source, encoding=found.codec, errors="surrogateescape", newline="")
    return text, found


def _start_csv(
    text: io.TextIOWrapper,
    delimiter: str | None,
    columns: Sequence[str] | None,
    encoding: Encoding,
) -> tuple[Any, CsvLayout]:
    """A csv reader past the header, and the layout; the reader is None for an empty file.

    The separator is found on the first line that is not blank (the header, or the first
    row with ``--columns``); the lines read to find it are handed back to the reader, so
    line numbers stay the file's.
    """
    lead: list[str] = []
    bom = False
    while line := text.readline():
        if not lead and line.startswith("\ufeff"):
            bom, line = True, line[1:]
        lead.append(line)
        if line.strip():
            break
    first = lead[-1] if lead else ""
    if delimiter is None:
        delimiter = detect_delimiter(first)
    newline = "\r\n" if first.endswith("\r\n") else "\n"
    # strict: a stray quote is reported on its row instead of swallowing the file's rest.
    reader = csv.reader(itertools.chain(lead, text), delimiter=delimiter, strict=True)
    csv.field_size_limit(_FIELD_LIMIT)
    if columns is not None:
        names = tuple(name.strip() for name in columns)
        return reader, CsvLayout(delimiter, names, None, bom, newline, encoding)
    header = _header(reader, encoding)
    if header is None:
        return None, CsvLayout(delimiter, (), None, bom, newline, encoding)
    names = tuple(name.replace("\ufeff", "").strip() for name in header)
    return reader, CsvLayout(delimiter, names, tuple(header), bom, newline, encoding)


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


def _header(reader: Any, encoding: Encoding) -> list[str] | None:
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
            if not _decoded(fields):
                raise InputProblem(
                    f"the CSV header (line {reader.line_num}) is not valid {encoding.name}: "
                    "give --encoding, or save the file as UTF-8 (in Excel: Save As, CSV UTF-8)"
                )
            return fields


def _csv_records(
    reader: Any,
    layout: CsvLayout,
    number_column: str,
    rows: Rows,
    variables: Sequence[tuple[str, str]],
    only_vars: bool,
) -> Iterator[Row]:
    names = list(layout.names)
    wanted = column_key(number_column)
    found = [i for i, name in enumerate(names) if column_key(name) == wanted]
    if not found:
        shown = ", ".join(repr(n) for n in names if n) or "none"
        raise InputProblem(
            f"the CSV has no {number_column!r} column (columns: {shown}, read with the "
            f"separator {layout.separator}); name it with --number-column, force the "
            "separator with --delimiter, or give --columns for a file without a header"
        )
    if len(found) > 1:
        shown = ", ".join(repr(names[i]) for i in found)
        raise InputProblem(
            f"--number-column {number_column!r} matches the columns {shown} (case and "
            "surrounding spaces are ignored): rename one of them"
        )
    # A repeat is decided by the rule that matches names: two names one key would find.
    by_key: dict[str, list[str]] = {}
    for name in names:
        if name:
            by_key.setdefault(column_key(name), []).append(name)
    repeated = [same for same in by_key.values() if len(same) > 1]
    if repeated:
        shown = "; ".join(", ".join(map(repr, same)) for same in repeated)
        raise InputProblem(
            f"the CSV header repeats column(s): {shown} (names are compared ignoring case, "
            "surrounding spaces, a BOM and Unicode normal form): rename or remove one"
        )
    width = len(names)
    number_at = found[0]
    taken = var_columns(names, number_at, variables, only_vars)
    rows.variables = tuple((var, names[i]) for i, var in taken)
    return _csv_iter(reader, width, number_at, taken, rows, layout.encoding)


def _csv_iter(
    reader: Any,
    width: int,
    number_at: int,
    var_columns: list[tuple[int, str]],
    rows: Rows,
    encoding: Encoding,
) -> Iterator[Row]:
    not_decoded = f"the row is not valid {encoding.name}"
    try:
        for start, fields in _raw_records(reader):
            if len(fields) != width:
                if _is_empty(fields):
                    rows.empty += 1
                    continue
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
                if _is_empty(fields):
                    rows.empty += 1
                else:
                    yield Row(start, None, None, "the number is empty")
                continue
            if not _decoded(fields):
                yield Row(start, _printable(number), None, not_decoded)
                continue
            values = {name: fields[i] for i, name in var_columns}
            yield Row(start, number, {"number": number, "vars": values})
    except UnreadableInput as exc:
        # Reading on would start inside the broken record (a quoted field's text could
        # become recipients): nothing after it is trusted.
        raise UnreadableInput(
            f"{exc}; nothing from there on was read: fix the file, then run again with --resume"
        ) from None


def _is_empty(fields: list[str]) -> bool:
    """A blank line, or a spreadsheet's empty row (``;;;``): not a row at all."""
    return not any(field.strip() for field in fields)


def _decoded(fields: list[str]) -> bool:
    """Whether every byte of *fields* was a character of the file's encoding."""
    joined = "".join(fields)
    if joined.isascii():
        return True
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate: bytes the encoding does not read
        return False
    return True


def _printable(number: str | None) -> str | None:
    if number is None or _decoded([number]):
        return number
    return None

"""What reading an input gives: rows, each with its line number, the errors, the CSV's layout.

Shared by the JSONL reader (``input``) and the CSV reader (``csv``). The layout is here,
not in ``csv``, so that ``rows`` imports nothing that imports it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any, Literal, NamedTuple

import attrs

from .encoding import UTF8, Encoding
from .problems import InputProblem, UnreadableInput

__all__ = [
    "MALFORMED",
    "CsvLayout",
    "Format",
    "InputProblem",
    "Row",
    "Rows",
    "UnreadableInput",
]

#: The reason recorded for every row that could not be read as a recipient.
MALFORMED = "malformed input row"

Format = Literal["auto", "csv", "jsonl"]

_DELIMITER_NAMES = {",": "',' (comma)", ";": "';' (semicolon)", "\t": "tab", "|": "'|' (pipe)"}
_UTF8 = Encoding(UTF8)


@attrs.frozen
class CsvLayout:
    """How a CSV file is written, so a retry file can be written the same way."""

    delimiter: str
    #: The column names rows are read with (the header's, stripped, or ``--columns``).
    names: tuple[str, ...]
    #: The header's fields as written; None for a file without a header (``--columns``).
    header: tuple[str, ...] | None
    bom: bool = False
    newline: str = "\n"
    encoding: Encoding = _UTF8

    @property
    def separator(self) -> str:
        """The delimiter as a person reads it in a message: "';' (semicolon)"."""
        return _DELIMITER_NAMES.get(self.delimiter, repr(self.delimiter))


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
    """An open input: iterate it for rows; ``close()`` releases the file (never stdin).

    ``empty`` counts the rows skipped so far because every field was empty (the ``;;;``
    lines spreadsheets export): they are not rows, so they get no record. ``variables``
    are the vars every row of a CSV carries, ``(var, column)``; None for JSONL, whose
    lines each say theirs.
    """

    def __init__(self, stream: IO[bytes], *, owned: bool, kind: str) -> None:
        self._rows: Iterator[Row] = iter(())
        self._stream = stream
        self._owned = owned
        self.kind = kind
        self.layout: CsvLayout | None = None
        self.variables: tuple[tuple[str, str], ...] | None = None
        self.empty = 0

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def close(self) -> None:
        if self._owned:
            self._stream.close()

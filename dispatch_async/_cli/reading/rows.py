"""What reading an input gives: rows, each with its line number, and the errors.

Shared by the JSONL reader (``input``) and the CSV reader (``csv``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from .csv import CsvLayout

__all__ = ["MALFORMED", "Format", "InputProblem", "Row", "Rows", "UnreadableInput"]

#: The reason recorded for every row that could not be read as a recipient.
MALFORMED = "malformed input row"

Format = Literal["auto", "csv", "jsonl"]


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

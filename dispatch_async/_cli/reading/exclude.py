"""``--exclude optouts.csv``: numbers never to send, held on disk, not in memory.

An opt-out list can hold millions of numbers, in any format (``(11) 98765-4321``,
``+55 11 98765-4321``, ``5511987654321`` as the service and its callbacks write them).
Each number is put in one form, ``opt_out_form``'s, both on the list and in the job, and
the list's forms are stored in a private temporary SQLite database, which SQLite deletes
when it is closed. Memory stays at SQLite's page cache (2 MB) whatever the list's size;
the rows of each read are looked up together, in the reader's thread, never on the loop.

The file is a list of numbers, one a line, or a CSV. Its column is the one named like the
job's number column (or ``number``); in a file with one column, that one; else the only
column whose values are phone numbers (in its first rows), said on stderr. A list where
several columns hold numbers and none is named, or where no value is a phone number, is
refused: read from the wrong column, it would let through everyone who opted out. A first
line without a digit, or naming the column, is a header.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Final

import dispatch_async as da

from ..screen.words import counted
from .columns import column_key
from .csv import detect_delimiter, open_input
from .encoding import detect_encoding
from .rows import InputProblem

__all__ = ["ExcludeList", "opt_out_form"]

#: Numbers asked about in one query (SQLite's oldest limit on parameters is 999).
_QUERY: Final = 500
_INSERT: Final = 10_000
#: Rows looked at to find the column that holds phone numbers, when none is named.
_SAMPLE: Final = 1_000
_NO_REGION: Final = " (a number without its country code needs --region)"


def opt_out_form(number: str, region: str | None) -> str | None:
    """*number*'s E.164 digits without ``+`` (``5511987654321``); None: not a phone number.

    A number written with ``+`` is read as such; one without it as a national number of
    *region* (as ``--prevalidate`` sends it), else as the service writes numbers (country
    code first, no ``+``). So ``+55 11 98765-4321``, ``5511987654321`` and, with
    ``--region BR``, ``(11) 98765-4321`` are one number; ``14155552671`` is ``+1 415...``.
    """
    e164 = da.to_e164(number, region)
    if e164 is None and number.lstrip()[:1] != "+":
        digits = _digits(number)
        e164 = da.to_e164("+" + digits) if digits else None
    return None if e164 is None else e164[1:]


class ExcludeList:
    """The numbers of an exclude file, in ``opt_out_form``; ``close()`` deletes them."""

    def __init__(self, path: str, number_column: str, region: str | None = None) -> None:
        """Read *path* whole (in a worker thread: it can be long).

        *region*: the country of numbers written without their country code.

        Raises:
            OSError: the file cannot be read.
            InputProblem: it is neither UTF-8 nor Windows-1252, its column is not known
                (see the module), or none of its values is a phone number.
            dispatch_async.ConfigurationError: phonenumbers is not installed.
        """
        self.path = path
        self.region = region
        names = [number_column] + ["number"] * (column_key(number_column) != "number")
        self._wanted = [column_key(name) for name in names]
        self._names = " or ".join(map(repr, names))
        #: How the column was chosen, when it was not by its name (for stderr).
        self.column: str | None = None
        opt_out_form("+5511987654321", None)  # without phonenumbers: before any reading
        # "": a private database on disk, deleted by SQLite on close.
        self._db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("CREATE TABLE excluded (number TEXT PRIMARY KEY) WITHOUT ROWID")
            self.count = self._read()
        except BaseException:
            self._db.close()
            raise

    def key(self, number: str) -> str:
        """The form *number* is compared in: ``opt_out_form``'s, else its digits.

        A number that is not a phone number is compared by its digits: ``(11) 98765-4321``
        and ``11 98765-4321`` are one number without ``--region`` too. For an opt-out
        list, a match in doubt is a message not sent.
        """
        return self._keyed(number)[0]

    def _keyed(self, number: str) -> tuple[str, bool]:
        """``key(number)``, and whether *number* is a phone number."""
        form = opt_out_form(number, self.region)
        return form or _digits(number) or number, form is not None

    def _read(self) -> int:
        stream, owned = open_input(self.path)
        try:
            source, encoding = detect_encoding(stream, None)
            text = io.TextIOWrapper(source, encoding=encoding.codec, errors="replace", newline="")
            first = ""
            while not first.strip() and (line := text.readline()):
                first = line
            reader = csv.reader(itertools.chain([first], text), delimiter=detect_delimiter(first))
            return self._load(self._column(reader))
        except csv.Error as exc:
            raise InputProblem(f"--exclude {self.path} is not a list of numbers ({exc})") from None
        finally:
            if owned:
                stream.close()

    def _column(self, reader: Iterator[list[str]]) -> Iterator[str]:
        """Every number of the file's column, as written (stripped), streamed."""
        first = next(reader, [])
        if not first:
            raise self._no_phone_number()
        keys = [column_key(field) for field in first]
        named = next((keys.index(k) for k in self._wanted if k in keys), None)
        header = named is not None or not any(map(_DIGIT, first))
        rows = reader if header else itertools.chain([first], reader)
        if named is not None:
            at = named
        elif len(first) == 1:
            at = 0
        else:
            at, rows = self._holding_numbers(first if header else None, rows)
        for fields in rows:
            if at < len(fields) and _DIGIT(number := fields[at]):
                yield number.strip()

    def _holding_numbers(
        self, header: list[str] | None, rows: Iterator[list[str]]
    ) -> tuple[int, Iterator[list[str]]]:
        """The only column of the first rows with a phone number; else InputProblem."""
        sample = list(itertools.islice(rows, _SAMPLE))
        width = max(map(len, sample), default=0)
        holding = [
            at
            for at in range(width)
            if any(at < len(fields) and self._is_phone(fields[at]) for fields in sample)
        ]

        def name(at: int) -> str:
            return repr(header[at]) if header is not None and at < len(header) else str(at + 1)

        if len(holding) == 1:
            self.column = f"its column {name(holding[0])}, the only one holding phone numbers"
            return holding[0], itertools.chain(sample, rows)
        where = "" if len(sample) < _SAMPLE else f" in its first {_SAMPLE:,} rows"
        if not holding:
            raise self._no_phone_number(where)
        columns = ", ".join(name(at) for at in holding)
        if header is None:
            raise InputProblem(
                f"--exclude {self.path} has no header and several columns hold phone numbers "
                f"({columns}): add a header that names the column to read 'number'"
            )
        raise InputProblem(
            f"--exclude {self.path} has no column {self._names} and several of its "
            f"columns hold phone numbers ({columns}): rename the one to read 'number'"
        )

    def _no_phone_number(self, where: str = "") -> InputProblem:
        hint = _NO_REGION if self.region is None else ""
        return InputProblem(f"--exclude {self.path} holds no phone number{where}{hint}")

    def _is_phone(self, value: str) -> bool:
        return _DIGIT(value) is not None and opt_out_form(value, self.region) is not None

    def _load(self, numbers: Iterator[str]) -> int:
        db = self._db
        phones = 0
        db.execute("BEGIN")
        while batch := list(itertools.islice(numbers, _INSERT)):
            keyed = [self._keyed(number) for number in batch]
            phones += sum(phone for _, phone in keyed)
            db.executemany("INSERT OR IGNORE INTO excluded VALUES (?)", ((k,) for k, _ in keyed))
        db.execute("COMMIT")
        if not phones:
            raise self._no_phone_number()
        (count,) = db.execute("SELECT count(*) FROM excluded").fetchone()
        return int(count)

    def among(self, numbers: Sequence[str]) -> set[str]:
        """Which of *numbers* (as written in the job) the list holds."""
        keys = [self.key(number) for number in numbers]
        found: set[str] = set()
        for at in range(0, len(keys), _QUERY):
            part = keys[at : at + _QUERY]
            marks = ",".join("?" * len(part))
            query = f"SELECT number FROM excluded WHERE number IN ({marks})"  # noqa: S608
            found.update(number for (number,) in self._db.execute(query, part))
        return {number for number, key in zip(numbers, keys, strict=True) if key in found}

    def describe(self) -> str:
        """For stderr: how many numbers, from where."""
        column = f" ({self.column})" if self.column is not None else ""
        return f"exclude: {counted(self.count, 'number')} from {self.path}{column}, never sent"

    def close(self) -> None:
        self._db.close()


def _digits(number: str) -> str:
    return "".join(filter(str.isdigit, number))


_DIGIT = re.compile(r"\d").search

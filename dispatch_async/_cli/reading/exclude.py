"""``--exclude optouts.csv``: numbers never to send, held on disk, not in memory.

An opt-out list can hold millions of numbers, in any format (``(11) 98765-4321``,
``+55 11 98765-4321``). It is read as a stream: each number is put in the job's
canonical form (``spec.exclude_key``: E.164, or its digits when it is not a phone
number) and stored in a private temporary SQLite database, which SQLite deletes when it
is closed. Memory stays at SQLite's page cache (2 MB) whatever the list's size; the rows
of each read are looked up together, in the reader's thread, never on the event loop.

The file is a list of numbers, one a line, or a CSV: the column named like the job's
number column (or ``number``) when its header has one, else the first column. A first
line without a digit in that column is a header.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from ..screen.words import counted
from .columns import column_key
from .csv import detect_delimiter, open_input
from .encoding import detect_encoding
from .rows import InputProblem

__all__ = ["ExcludeList"]

#: Numbers asked about in one query (SQLite's oldest limit on parameters is 999).
_QUERY: Final = 500
_INSERT: Final = 10_000


class ExcludeList:
    """The numbers of an exclude file, in canonical form; ``close()`` deletes them."""

    def __init__(self, path: str, key: Callable[[str], str], number_column: str) -> None:
        """Read *path* whole (in a worker thread: it can be long).

        Raises:
            OSError: the file cannot be read.
            InputProblem: it is neither UTF-8 nor Windows-1252, or holds no number.
        """
        self.path = path
        self.key = key
        # "": a private database on disk, deleted by SQLite on close.
        self._db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("CREATE TABLE excluded (number TEXT PRIMARY KEY) WITHOUT ROWID")
            self.count = self._load(_numbers(path, number_column), key)
        except BaseException:
            self._db.close()
            raise
        if not self.count:
            self._db.close()
            raise InputProblem(f"--exclude {path} holds no number")

    def _load(self, numbers: Iterator[str], key: Callable[[str], str]) -> int:
        db = self._db
        db.execute("BEGIN")
        while batch := list(itertools.islice(numbers, _INSERT)):
            db.executemany("INSERT OR IGNORE INTO excluded VALUES (?)", ((key(n),) for n in batch))
        db.execute("COMMIT")
        (count,) = db.execute("SELECT count(*) FROM excluded").fetchone()
        return int(count)

    def among(self, keys: Sequence[str]) -> set[str]:
        """Which of *keys* (canonical numbers) are excluded."""
        found: set[str] = set()
        for at in range(0, len(keys), _QUERY):
            part = keys[at : at + _QUERY]
            marks = ",".join("?" * len(part))
            query = f"SELECT number FROM excluded WHERE number IN ({marks})"  # noqa: S608
            found.update(number for (number,) in self._db.execute(query, part))
        return found

    def describe(self) -> str:
        """For stderr: how many numbers, from where."""
        return f"exclude: {counted(self.count, 'number')} from {self.path}, never sent"

    def close(self) -> None:
        self._db.close()


def _numbers(path: str, number_column: str) -> Iterator[str]:
    """Every number of the file, as written (stripped), streamed."""
    stream, owned = open_input(path)
    try:
        source, encoding = detect_encoding(stream, None)
        text = io.TextIOWrapper(source, encoding=encoding.codec, errors="replace", newline="")
        first = ""
        while not first.strip() and (line := text.readline()):
            first = line
        reader = csv.reader(itertools.chain([first], text), delimiter=detect_delimiter(first))
        header = next(reader, [])
        keys = [column_key(field) for field in header]
        at = next((keys.index(k) for k in (column_key(number_column), "number") if k in keys), 0)
        if at < len(header) and _DIGIT(header[at]):
            yield header[at].strip()  # not a header: the first number
        for fields in reader:
            if at < len(fields) and _DIGIT(number := fields[at]):
                yield number.strip()
    except csv.Error as exc:
        raise InputProblem(f"--exclude {path} is not a list of numbers ({exc})") from None
    finally:
        if owned:
            stream.close()


_DIGIT = re.compile(r"\d").search

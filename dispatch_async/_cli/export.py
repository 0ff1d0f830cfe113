"""``dispatch-async export``: the input rows of chosen outcomes, ready to send again.

A job's output says, line by line, what became of each input row. Export reads it,
picks the lines of the outcomes asked for (``not_sent`` by default), and writes those
rows of the original input out as they were: a CSV with the same header, separator,
columns, line ending and BOM; JSONL lines byte for byte. The result is a new input for
a new job (with its own ``-o``), so nothing is joined on line numbers by hand.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO

import attrs
import orjson

from .csv_input import csv_records, open_input
from .input import Format, UnreadableInput, line_bound
from .journal import journal_path
from .records import OUTCOMES
from .spec import FAILED, OK, Problem

__all__ = ["ExportSpec", "run_export"]

_WANTED, _OTHER = 1, 2


@attrs.frozen
class ExportSpec:
    """What ``export`` was asked: the results to read, the outcomes, the input and where."""

    results: Path
    outcomes: frozenset[str]
    input_path: str | None = None
    input_format: Format = "auto"
    delimiter: str | None = None
    columns: tuple[str, ...] | None = None
    to: Path | None = None


def run_export(spec: ExportSpec, err: TextIO, stored: Mapping[str, Any] | None = None) -> int:
    """Write the rows; the exit code (1 when some lines were not found in the input).

    *stored*: the options the job's journal stores, as ``resume.stored_job`` checked
    them; they name the input when ``--input`` is not given.
    """
    spec = _complete_from_journal(spec, stored)
    if spec.input_path is None:
        raise Problem(
            f"which input did the job writing {spec.results} read? Give it with --input "
            "(its journal, which remembers it, is gone once a job has finished)"
        )
    unknown = spec.outcomes.difference(OUTCOMES)
    if unknown:
        raise Problem(f"--outcome {', '.join(sorted(unknown))}: not one of {', '.join(OUTCOMES)}")
    if spec.to is not None and spec.to.exists():
        raise Problem(f"{spec.to} exists: export to a new file (or to stdout without --to)")
    status, counts = _read_results(spec, line_bound(spec.input_path))
    with _destination(spec.to) as sink:
        written = _write_rows(spec, status, sink)
    total = counts.total()
    chosen = ", ".join(f"{counts[o]:,} {o}" for o in OUTCOMES if o in spec.outcomes)
    where = spec.to if spec.to is not None else "stdout"
    print(
        f"export: {written:,} rows of {spec.input_path} ({chosen}) written to {where}",
        file=err,
    )
    journal = journal_path(spec.results)
    if journal.exists():
        # Rows a stopped job never reached have no record, so no outcome selects them.
        print(
            f"export: the job writing {spec.results} has not finished ({journal} is there): "
            "rows it has not reached have no outcome yet and are in no export; "
            f"dispatch-async send --resume -o {spec.results} sends them",
            file=err,
        )
    if written != total:
        print(
            f"export: {total - written:,} lines of {spec.results} are not rows of "
            f"{spec.input_path}: is it the input of that job?",
            file=err,
        )
        return FAILED
    return OK


def _complete_from_journal(spec: ExportSpec, stored: Mapping[str, Any] | None) -> ExportSpec:
    """The input and how to read it, from the job's options (checked) when not given."""
    if spec.input_path is not None or not stored or stored.get("input_path") is None:
        return spec
    columns, fmt = stored.get("columns"), stored.get("input_format")
    return attrs.evolve(
        spec,
        input_path=stored["input_path"],
        delimiter=spec.delimiter or stored.get("delimiter"),
        columns=spec.columns or (tuple(columns.split(",")) if columns else None),
        input_format=fmt if fmt in ("csv", "jsonl") else spec.input_format,
    )


def _read_results(spec: ExportSpec, max_line: int) -> tuple[bytearray, Counter[str]]:
    """Each line's first record (as a resume keeps it): wanted or not, and the counts."""
    status = bytearray()
    counts: Counter[str] = Counter()
    try:
        stream = open(spec.results, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise Problem(f"cannot read {spec.results}: {exc.strerror}") from None
    with stream:
        for number, raw in enumerate(stream, 1):
            try:
                record = orjson.loads(raw)
                line, outcome = record["line"], record["outcome"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                if not raw.endswith(b"\n"):
                    break  # a torn last record: its line is not settled
                raise Problem(
                    f"{spec.results} line {number} is not a dispatch-async record"
                ) from None
            if type(line) is not int or not 1 <= line <= max_line or outcome not in OUTCOMES:
                raise Problem(f"{spec.results} line {number} does not name a line of the input")
            if line >= len(status):
                status.extend(bytes(max(line + 1 - len(status), len(status))))
            if status[line]:
                continue
            wanted = outcome in spec.outcomes
            status[line] = _WANTED if wanted else _OTHER
            if wanted:
                counts[outcome] += 1
    return status, counts


@contextmanager
def _destination(to: Path | None) -> Iterator[IO[bytes]]:
    if to is None:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    try:
        sink = open(to, "xb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise Problem(f"cannot write {to}: {exc.strerror}") from None
    with sink:
        yield sink
        sink.flush()
        os.fsync(sink.fileno())


def _write_rows(spec: ExportSpec, status: bytearray, sink: IO[bytes]) -> int:
    assert spec.input_path is not None
    path = spec.input_path
    fmt = spec.input_format
    if fmt == "auto":
        fmt = "jsonl" if path.lower().endswith((".jsonl", ".ndjson", ".json")) else "csv"
    try:
        if fmt == "jsonl":
            return _write_jsonl(path, status, sink)
        return _write_csv(spec, status, sink)
    except UnreadableInput as exc:
        raise Problem(f"{path}: {exc}", FAILED) from None
    except OSError as exc:
        raise Problem(f"cannot read {path}: {exc.strerror}") from None


def _write_jsonl(path: str, status: bytearray, sink: IO[bytes]) -> int:
    stream, owned = open_input(path)
    written = 0
    try:
        for line, raw in enumerate(stream, 1):
            if line < len(status) and status[line] == _WANTED:
                sink.write(raw if raw.endswith(b"\n") else raw + b"\n")
                written += 1
    finally:
        if owned:
            stream.close()
    return written


def _write_csv(spec: ExportSpec, status: bytearray, sink: IO[bytes]) -> int:
    assert spec.input_path is not None
    written = 0
    with csv_records(spec.input_path, delimiter=spec.delimiter, columns=spec.columns) as (
        layout,
        records,
    ):
        # Bytes that were not UTF-8 in the input go back out as they were.
        text = _Encoder(sink)
        if layout.bom:
            text.write("\ufeff")
        writer = csv.writer(text, delimiter=layout.delimiter, lineterminator=layout.newline)
        if layout.header is not None:
            writer.writerow(layout.header)
        for line, fields in records:
            if line < len(status) and status[line] == _WANTED:
                writer.writerow(fields)
                written += 1
    return written


class _Encoder:
    """A text sink for csv.writer over a byte stream (surrogates back to their bytes)."""

    def __init__(self, sink: IO[bytes]) -> None:
        self._sink = sink

    def write(self, text: str) -> int:
        self._sink.write(text.encode("utf-8", "surrogateescape"))
        return len(text)

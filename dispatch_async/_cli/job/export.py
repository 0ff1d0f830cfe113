"""``dispatch-async export``: the input rows of chosen outcomes, ready to send again.

A job's output says, line by line, what became of each input row. Export reads it,
picks the lines of the outcomes asked for (``not_sent`` by default), and writes those
rows of the original input out as they were: a CSV with the same header, separator,
columns, line ending, BOM and encoding; JSONL lines byte for byte. The result is a new
input for a new job (with its own ``-o``), so nothing is joined on line numbers by hand.

``--with-reason`` adds two columns, ``outcome`` and ``reason`` (or fills them, when the
input has them from an earlier export), for whoever fixes the rows in a spreadsheet. A
reason is text from the service (or from this package): one that starts with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'``, so a spreadsheet
shows it instead of running it as a formula (CSV injection). The input's own cells are
written as they were: they are the user's data, and a ``+55...`` number must stay one.

A row the job excluded (``--exclude``, an opt-out) is never exported: the file is meant
to be sent again.
"""

from __future__ import annotations

import csv
import os
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO

import attrs
import orjson

import dispatch_async as da

from ..reading.columns import column_key
from ..reading.csv import csv_records, open_input
from ..reading.input import Format, InputProblem, UnreadableInput, line_bound
from ..reading.rows import CsvLayout
from ..screen.outcomes import OUTCOMES
from ..screen.problem import FAILED, OK, Problem
from ..screen.words import counted
from .jobfile import input_changed, job_path
from .journal import journal_path

__all__ = ["ExportSpec", "correction", "is_results", "neutralised", "run_export"]

_WANTED, _OTHER = 1, 2
_EXCLUDED = "excluded"  # counted apart: rows never written
#: The columns ``--with-reason`` adds.
REASON_COLUMNS = ("outcome", "reason")
#: What a spreadsheet takes as the start of a formula (OWASP: CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@attrs.frozen
class ExportSpec:
    """What ``export`` was asked: the results to read, the outcomes, the input and where."""

    results: Path
    outcomes: frozenset[str]
    input_path: str | None = None
    input_format: Format = "auto"
    delimiter: str | None = None
    columns: tuple[str, ...] | None = None
    encoding: str | None = None
    output: Path | None = None
    with_reason: bool = False


def is_results(path: Path | str) -> bool:
    """Whether *path* starts like the results file of a job (a record with line and outcome)."""
    try:
        with open(path, "rb") as stream:
            first = stream.readline(1 << 16)
        record = orjson.loads(first)
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(record, dict) and "line" in record and "outcome" in record


def correction(results: Path | None, input_path: str | None, output: Path | None) -> str | None:
    """The one line that says how to write the export a user meant; None: as given.

    What export reads (RESULTS, and the job's input with -i) and writes (-o) is easy to
    mix up: each mix-up that a file's first line can tell is named, with the command.
    """
    if results is not None:
        if not results.exists():
            return f"RESULTS {results} does not exist"
        if not is_results(results) and input_path is not None and is_results(input_path):
            return (
                f"{results} is the job's input and {input_path} its results: "
                f"`dispatch-async export {input_path} -i {results} ...`"
            )
        return None
    to = f" -o {output}" if output is not None else ""
    if input_path is not None and is_results(input_path):
        # A job of an earlier dispatch-async kept nothing to name its input: give it too.
        named = journal_path(Path(input_path)).exists() or job_path(Path(input_path)).exists()
        given = "" if named else " -i SPREADSHEET"
        return (
            f"{input_path} is a job's results: name it first, `dispatch-async export "
            f"{input_path}{given}{to}` (-i is the job's input, the spreadsheet it read)"
        )
    if output is not None and output.exists() and is_results(output):
        return (
            f"{output} is a job's results, which export reads, and -o is the file it writes: "
            f"`dispatch-async export {output} -o retry.csv`"
        )
    return "Missing argument 'RESULTS': the results file of the job (what its `send -o` wrote)"


def neutralised(cell: str) -> str:
    """*cell* as a spreadsheet shows it and never runs it: a leading ``'`` if needed."""
    return "'" + cell if cell.startswith(_FORMULA_STARTS) else cell


def run_export(spec: ExportSpec, err: TextIO, stored: Mapping[str, Any] | None = None) -> int:
    """Write the rows; the exit code (1 when some lines were not found in the input).

    *stored*: the options the job stored (in its journal, or once finished beside its
    results), as ``resume.stored_job`` checked them; they name the input when ``--input``
    is not given.
    """
    given = spec.input_path is not None
    spec = _complete_from_journal(spec, stored)
    if not given and spec.input_path is not None and input_changed(spec.results, spec.input_path):
        raise Problem(
            f"{spec.input_path}, the input of the job writing {spec.results}, changed since "
            "the job finished: its lines may no longer be the job's rows. Give the input "
            "as the job read it with --input (or this one, to export from it as it is)"
        )
    if spec.input_path is None:
        raise Problem(
            f"which input did the job writing {spec.results} read? Give it with --input "
            f"(a job of an earlier dispatch-async kept no {job_path(spec.results).name} "
            "to name it)"
        )
    unknown = spec.outcomes.difference(OUTCOMES)
    if unknown:
        raise Problem(f"--outcome {', '.join(sorted(unknown))}: not one of {', '.join(OUTCOMES)}")
    if spec.output is not None and spec.output.exists():
        raise Problem(f"{spec.output} exists: export to a new file (or to stdout without -o)")
    fmt = _format(spec)
    if fmt == "jsonl" and spec.with_reason:
        raise Problem(
            "--with-reason adds columns to a CSV; JSONL lines are written as they were "
            f"(the reasons are in {spec.results})"
        )
    status, counts, offsets = _read_results(spec, line_bound(spec.input_path))
    with _destination(spec.output) as sink:
        if fmt == "jsonl":
            written, how = _write_jsonl(spec.input_path, status, sink), ""
        else:
            written, layout = _write_csv(spec, status, offsets, sink)
            how = f" (in {layout.encoding.name}, as the input is)"
    excluded = counts.pop(_EXCLUDED, 0)
    total = counts.total()
    chosen = ", ".join(f"{counts[o]:,} {o}" for o in OUTCOMES if o in spec.outcomes)
    where = spec.output if spec.output is not None else "stdout"
    print(
        f"export: {counted(written, 'row')} of {spec.input_path} ({chosen}) "
        f"written to {where}{how}",
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
    if excluded:
        print(
            f"export: {counted(excluded, 'excluded row')} (--exclude) left out: they are not "
            "to be sent again",
            file=err,
        )
    if written != total:
        print(
            f"export: {counted(total - written, 'line')} of {spec.results} are not rows of "
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
        encoding=spec.encoding or stored.get("encoding"),
    )


def _format(spec: ExportSpec) -> Format:
    assert spec.input_path is not None
    if spec.input_format != "auto":
        return spec.input_format
    lowered = spec.input_path.lower()
    return "jsonl" if lowered.endswith((".jsonl", ".ndjson", ".json")) else "csv"


def _read_results(
    spec: ExportSpec, max_line: int
) -> tuple[bytearray, Counter[str], array[int] | None]:
    """Each line's first record (as a resume keeps it): wanted or not, and the counts.

    With ``--with-reason``, also where each line's record starts in the results file: the
    reasons are read back from there as the rows are written, so memory holds eight bytes
    a line, never the reasons themselves.
    """
    status = bytearray()
    offsets: array[int] | None = array("q") if spec.with_reason else None
    at = 0
    counts: Counter[str] = Counter()
    try:
        stream = open(spec.results, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise Problem(f"cannot read {spec.results}: {exc.strerror}") from None
    with stream:
        for number, raw in enumerate(stream, 1):
            start, at = at, at + len(raw)
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
                more = max(line + 1 - len(status), len(status))
                status.extend(bytes(more))
                if offsets is not None:
                    offsets.extend(array("q", bytes(8 * more)))
            if status[line]:
                continue
            wanted = outcome in spec.outcomes
            if wanted and outcome == "invalid" and record.get("reason") == da.EXCLUDED_REASON:
                wanted = False  # an opt-out: never in a file meant to be sent again
                counts[_EXCLUDED] += 1
            status[line] = _WANTED if wanted else _OTHER
            if wanted:
                counts[outcome] += 1
                if offsets is not None:
                    offsets[line] = start
    return status, counts, offsets


@contextmanager
def _destination(output: Path | None) -> Iterator[IO[bytes]]:
    if output is None:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    try:
        sink = open(output, "xb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise Problem(f"cannot write {output}: {exc.strerror}") from None
    with sink:
        try:
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
        except BaseException:
            # Not a partial export, and not a file in the way of the command run again.
            output.unlink(missing_ok=True)
            raise


def _write_jsonl(path: str, status: bytearray, sink: IO[bytes]) -> int:
    try:
        stream, owned = open_input(path)
    except OSError as exc:
        raise Problem(f"cannot read {path}: {exc.strerror}") from None
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


def _write_csv(
    spec: ExportSpec, status: bytearray, offsets: array[int] | None, sink: IO[bytes]
) -> tuple[int, CsvLayout]:
    path = spec.input_path
    assert path is not None
    written = 0
    try:
        with csv_records(
            path, delimiter=spec.delimiter, columns=spec.columns, encoding=spec.encoding
        ) as (layout, records):
            codec = layout.encoding.codec
            # Bytes the input's encoding did not read go back out as they were.
            text = _Encoder(sink, codec)
            if layout.bom:
                text.write("\ufeff")
            writer = csv.writer(text, delimiter=layout.delimiter, lineterminator=layout.newline)
            reasons = None if offsets is None else _Reasons(spec.results, offsets, codec)
            header = layout.header
            if header is not None:
                writer.writerow(header if reasons is None else reasons.header(list(header)))
            try:
                for line, fields in records:
                    if line < len(status) and status[line] == _WANTED:
                        writer.writerow(fields if reasons is None else reasons.row(line, fields))
                        written += 1
            finally:
                if reasons is not None:
                    reasons.close()
    except UnreadableInput as exc:
        raise Problem(f"{path}: {exc}", FAILED) from None
    except InputProblem as exc:
        raise Problem(f"{path}: {exc}") from None
    except OSError as exc:
        raise Problem(f"cannot read {exc.filename or path}: {exc.strerror}") from None
    return written, layout


class _Reasons:
    """The outcome and reason of each row written, read back from the results file."""

    def __init__(self, results: Path, offsets: array[int], codec: str) -> None:
        self._stream = open(results, "rb")  # noqa: SIM115 - closed by close()
        self._offsets = offsets
        self._codec = codec
        self._at: list[int] | None = None

    def header(self, names: list[str]) -> list[str]:
        """*names* with the two columns, or with them found where an earlier export put
        them."""
        keys = [column_key(name) for name in names]
        if all(column in keys for column in REASON_COLUMNS):
            self._at = [keys.index(column) for column in REASON_COLUMNS]
            return names
        return names + list(REASON_COLUMNS)

    def row(self, line: int, fields: list[str]) -> list[str]:
        self._stream.seek(self._offsets[line])
        record = orjson.loads(self._stream.readline())
        cells = [record["outcome"], self._fit(neutralised(_reason(record)))]
        if self._at is None:
            return fields + cells
        fields = fields + [""] * (max(self._at) + 1 - len(fields))
        for at, cell in zip(self._at, cells, strict=True):
            fields[at] = cell
        return fields

    def _fit(self, cell: str) -> str:
        # The service's words may hold characters Windows-1252 has not: shown as "?".
        return cell.encode(self._codec, "replace").decode(self._codec)

    def close(self) -> None:
        self._stream.close()


def _reason(record: dict[str, Any]) -> str:
    """Why a record's line has its outcome, in one cell."""
    reason = record.get("reason") or record.get("error") or ""
    detail = record.get("detail")
    text = f"{reason}: {detail}" if detail else str(reason)
    return text.replace("\r\n", " ").replace("\n", " ")


class _Encoder:
    """A text sink for csv.writer over a byte stream (surrogates back to their bytes)."""

    def __init__(self, sink: IO[bytes], codec: str) -> None:
        self._sink = sink
        self._codec = codec

    def write(self, text: str) -> int:
        self._sink.write(text.encode(self._codec, "surrogateescape"))
        return len(text)

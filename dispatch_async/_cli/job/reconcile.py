"""``dispatch-async callbacks reconcile``: ``maybe_sent`` records the callbacks confirm become sent.

A finished job's ``results.jsonl`` may hold ``maybe_sent`` records: recipients whose
request failed after the service may have acted. The callbacks stored while the job ran
(``callbacks serve``) say which of them the service did act on: those records are
replaced by ``sent`` records carrying the callback's ``reference`` as the id and
``"confirmed_by": "callback"``, through the SDK's `resolve_maybe_sent`, which takes every
record of the job at once: the records of one number from several runs (each with its
own ``since``) share its callbacks. The others stay ``maybe_sent``; ``export --outcome
maybe_sent`` then gives only those.

Crash safety: the new file is written beside the old one, fsynced, and renamed over it,
so a crash leaves either the old file or the new one, and running the command again
gives the same result. While it runs it holds the lock a ``send`` takes on the output
(and refuses a job that still has a journal: it is not finished, or is running).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import orjson

import dispatch_async as da
from dispatch_async.callbacks import DeliveryTracker, resolve_maybe_sent

from ..screen.advice import export_command
from ..screen.problem import Problem
from .jobfile import kept_options
from .journal import journal_path
from .records import CALLBACK, sent_record

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["Reconciled", "reconcile", "still_maybe_sent"]


@attrs.frozen
class Reconciled:
    """What a reconcile did: ``maybe_sent`` records found, confirmed, left."""

    maybe_sent: int
    confirmed: int

    @property
    def left(self) -> int:
        return self.maybe_sent - self.confirmed


def still_maybe_sent(results: Path) -> str | None:
    """The export command for the records left ``maybe_sent``, as the send's summary
    prints it; None when the job kept no options to run it as printed (an earlier
    version's results: ``export -i``)."""
    try:
        input_path = kept_options(results).get("input_path")
    except (OSError, Problem):
        return None
    return (
        export_command(results, "maybe_sent", input_path) if isinstance(input_path, str) else None
    )


async def reconcile(results: Path, tracker: DeliveryTracker, campaign_name: str) -> Reconciled:
    """Replace the ``maybe_sent`` records of *results* that *tracker*'s callbacks confirm.

    Raises:
        Problem: the file is missing, not a results file, or its job is not finished.
    """
    _check(results)
    with _locked(results):
        _check(results)  # again: a send --resume may have started before the lock
        failed, known = _read(results)
        # The whole job at once: a number's records from several runs share its callbacks.
        resolution = await resolve_maybe_sent(
            failed,
            tracker,
            campaign_name=campaign_name,
            known_ids=known,
            sent_after=_since,
        )
        confirmed = resolution.confirmed
        if confirmed:
            replaced = {
                m.position: sent_record(
                    m.position, _written(m), m.id, _as_sent(m), confirmed_by=CALLBACK
                )
                + b"\n"
                for m in confirmed
            }
            _rewrite(results, replaced)
    return Reconciled(len(failed), len(confirmed))


#: The ``ref`` key under which a recipient keeps its number as the record wrote it.
_WRITTEN = "written"


_SINCE = "since"
#: How far the service's clock may be behind ours: a callback up to this much before
#: the run started may still be of that run.
_CLOCK_SKEW = dt.timedelta(minutes=5)


def _since(recipient: da.FailedRecipient) -> dt.datetime | None:
    """When the run that may have sent *recipient* started, less the clocks' difference
    (None: the record does not say, so any callback can be its)."""
    since = _moment(recipient.recipient.ref.get(_SINCE))
    try:
        return None if since is None else since - _CLOCK_SKEW
    except OverflowError:  # a start within minutes of year 1: any callback is after it
        return None


def _moment(text: object) -> dt.datetime | None:
    try:
        moment = dt.datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return moment if moment is None or moment.tzinfo is not None else None


def _written(message: da.ValidMessage) -> str:
    return str((message.ref or {}).get(_WRITTEN, message.number))


def _as_sent(message: da.ValidMessage) -> Callable[[str], str]:
    return lambda _written: message.number


def _check(results: Path) -> None:
    if not results.is_file():
        raise Problem(f"{results} is not a results file")
    if journal_path(results).exists():
        raise Problem(
            f"{results} still has a journal ({journal_path(results)}): the job is running or "
            "not finished; finish it with send --resume first"
        )


def _read(results: Path) -> tuple[list[da.FailedRecipient], set[str]]:
    """The first record of each line that is ``maybe_sent``, and every id already given."""
    failed: list[da.FailedRecipient] = []
    known: set[str] = set()
    seen: set[int] = set()
    for where, record in _records(results):
        line, outcome = record.get("line"), record.get("outcome")
        if type(line) is not int or not isinstance(outcome, str):
            raise Problem(f"{where} is not a dispatch-async record")
        if line in seen:
            continue
        seen.add(line)
        id_, number = record.get("id"), record.get("number")
        if outcome == "sent" and isinstance(id_, str):
            known.add(id_)
        elif outcome == "maybe_sent" and isinstance(number, str) and number:
            error = da.DispatchError(str(record.get("error", "maybe sent")), maybe_sent=True)
            # The callbacks carry the number as sent (--prevalidate's E.164), kept in ref.
            sent_as = record.get("sent_as")
            wire = sent_as if isinstance(sent_as, str) and sent_as else number
            recipient = da.Recipient(wire, ref={_WRITTEN: number, _SINCE: record.get("since")})
            failed.append(da.FailedRecipient(recipient, error, True, position=line))
    return failed, known


def _records(results: Path) -> Iterator[tuple[str, dict[str, object]]]:
    with open(results, "rb") as stream:
        for number, raw in enumerate(stream, 1):
            where = f"{results} line {number}"
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise Problem(f"{where} is not a dispatch-async record") from None
            if not raw.endswith(b"\n") or type(record) is not dict:
                raise Problem(f"{where} is not a whole dispatch-async record")
            yield where, record


def _rewrite(results: Path, replaced: dict[int, bytes]) -> None:
    """*results* with the first record of each line in *replaced* swapped, atomically."""
    real = Path(os.path.realpath(results))
    scratch = Path(f"{real}.reconcile")
    done: set[int] = set()
    try:
        with open(real, "rb") as source, open(scratch, "wb") as sink:
            for raw in source:
                line = orjson.loads(raw)["line"]
                if line in replaced and line not in done:
                    done.add(line)
                    sink.write(replaced[line])
                else:
                    sink.write(raw)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(scratch, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            scratch.unlink()
        raise
    directory = os.open(real.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextlib.contextmanager
def _locked(results: Path) -> Iterator[None]:
    """Hold the lock ``send`` takes on its output, or refuse like a second run would."""
    descriptor = os.open(os.path.realpath(results), os.O_RDONLY)
    try:
        if fcntl is not None:  # pragma: no branch - None only on Windows
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise Problem(f"another dispatch-async run is using {results}") from None
        yield
    finally:
        os.close(descriptor)

"""Running one ``send``: rows in, one record per input line out, nothing sent twice.

A ``Source`` (run in a worker thread, so a slow stdin never stalls the event loop)
reads rows and decides for each what the input and earlier runs say: skip it (already
recorded), record it at once (malformed, interrupted, duplicate), or send it. The rows
to send go to a ``SendJob`` (``sending``), which feeds the SDK and records every outcome.

A token is fetched before the input is read through or any file is created: a refused
secret or an unreachable service leaves nothing behind, so the same command works once
it is fixed. Failures are told by cause (``causes``), not as the SDK's event lines,
which ``-v`` shows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TypeGuard

import orjson

import dispatch_async as da

from ..reading.exclude import ExcludeList
from ..reading.input import count_lines, line_bound
from ..screen.advice import export_command, resume_command, too_many_invalid
from ..screen.flags import in_our_words
from ..screen.problem import FAILED, OK, USAGE, Problem
from ..screen.progress import logging_to, make_progress, render_summary
from ..screen.words import counted
from .journal import JobFiles, Recorded
from .resume import as_read
from .sending import SendJob
from .source import Source, check_input, load_exclude
from .spec import JobSpec, dedupe_key, sent_as

__all__ = ["run_send"]


# -- the entry point ---------------------------------------------------------------


async def run_send(spec: JobSpec) -> int:
    """Run a send to the end and return the exit code (raises Problem for exit 2)."""
    display = spec.display
    if spec.output is None or str(spec.output) == "-":
        raise Problem("--output FILE is required: the results file, which --resume reads back")
    if not spec.connection.account:
        raise Problem("no account: set DISPATCH_ACCOUNT or pass --account")
    # The SDK's event lines only with -v: the terminal gets each cause of failure once.
    hooks = () if display.verbose <= 0 else None
    session = spec.connection.session(hooks=hooks, **spec.connection.rate_options())
    rows = spec.input.open()
    stored = None if spec.job_options is None else orjson.dumps(as_read(spec.job_options, rows))
    files = JobFiles(spec.output, max_line=line_bound(spec.input.path), options=stored)
    job = SendJob(spec, files)
    exclude: ExcludeList | None = None
    try:
        async with session:
            # Built first: it checks the endpoint's fields before any file is touched.
            try:
                parts = spec.target.stream(
                    session,
                    job.messages(),
                    before_send=job.before_send,
                    **spec.settings.options(),
                )
            except da.DispatchError as exc:
                raise Problem(in_our_words(exc)) from None
            await _check_credentials(session)
            exclude = await load_exclude(spec)
            recorded = files.start(
                resume=spec.resume,
                resend_maybe_sent=spec.resend_maybe_sent,
                dedupe=dedupe_key(spec.settings),
            )
            if spec.resume:
                await asyncio.to_thread(check_input, spec.input, recorded, spec.output)
            total = None
            if not display.quiet:
                total = await asyncio.to_thread(count_lines, spec.input.path)
                if total is not None and rows.kind == "csv" and spec.input.columns is None:
                    total -= 1  # the header
            progress = make_progress(
                quiet=display.quiet,
                total=total,
                initial=recorded.done_lines,
                every=display.progress_every,
                stream=display.err,
                status=job.counts,
            )
            job.begin(
                Source(rows, recorded, spec.output, exclude, sent_as(spec.settings)),
                progress,
                Counter(recorded.kept),
            )
            if not display.quiet:
                progress.note(_intro(spec, recorded))
                if rows.layout is not None:
                    encoding = rows.layout.encoding.describe(resumed=spec.resume)
                    progress.note(f"input encoding: {encoding}")
                if exclude is not None:
                    progress.note(exclude.describe())
            with logging_to(progress, display.verbose):
                # Only a run that returned can be complete: any exception (a write error, a
                # bug) leaves the journal, so --resume settles what may have been sent.
                ended_normally = False
                try:
                    ended = await job.run(parts)
                    ended_normally = True
                finally:
                    complete = ended_normally and job.complete
                    progress.close(complete=complete)
                    files.finish(complete=complete)
            return _conclude(spec, job, ended)
    except OSError as exc:
        raise Problem(f"cannot write {spec.output}: {exc.strerror or exc}", FAILED) from None
    finally:
        rows.close()
        files.close()
        if exclude is not None:
            exclude.close()


async def _check_credentials(session: da.DispatchSession) -> None:
    """A token now, before the input is read or a file created (Problem if none)."""
    try:
        await session.check_credentials()
    except da.DispatchError as exc:
        # A refused secret, this caller (403), or a way to the service set up wrong are
        # the configuration's (2); a service that could not be reached may come back (1).
        code = USAGE if _unhealable(exc) else FAILED
        said = in_our_words(exc)
        if _NOTHING in said:  # the SDK says so already: once is enough
            said = said.replace(_NOTHING, f"{_NOTHING} or written", 1)
        else:
            said += f"; {_NOTHING} or written"
        raise Problem(said, code) from None


_NOTHING = "nothing was sent"


def _unhealable(error: da.DispatchError | None) -> TypeGuard[da.DispatchError]:
    """Whether only a change of configuration can cure *error* (exit 2)."""
    return isinstance(error, da.AuthenticationError | da.NetworkConfigurationError)


def _intro(spec: JobSpec, recorded: Recorded) -> str:
    connection = spec.connection
    text = (
        f"{spec.display.title}: {spec.target.describe()} to {connection.base_url} "
        f"(account {connection.account}), from {spec.input.path}, results in {spec.output}"
    )
    if spec.resume:
        redo = recorded.redo
        text += (
            f"\nresuming: input lines recorded by earlier runs: {recorded.recorded_lines:,}; "
            f"kept and skipped: {recorded.done_lines:,}"
        )
        for what, count in (
            ("not_sent, sent again", redo["not_sent"]),
            ("malformed, read again (a fixed row is sent)", redo["malformed"]),
            ("maybe_sent, sent again (--resend-maybe-sent)", redo["maybe_sent"]),
        ):
            if count:
                text += f"; {what}: {count:,}"
        if recorded.pending_lines:
            text += (
                "; lines a killed run may have sent are sent again (--resend-maybe-sent)"
                if spec.resend_maybe_sent
                else "; lines a killed run may have sent are recorded maybe_sent, not sent"
            )
        if recorded.torn:
            text += "; a torn last record was dropped"
    return text


def _conclude(spec: JobSpec, job: SendJob, ended: da.DispatchError | None) -> int:
    """Print the summary and what went wrong; the exit code (or Problem for 2)."""
    tally = job.tally
    err = spec.display.err
    summary = render_summary(
        spec.display.title,
        tally,
        kept=job.kept if spec.resume else None,
        output=spec.output,
        stopped=bool(job.stopped),
    )
    print(summary, file=err)
    if job.causes:
        print("\n".join(job.causes.summary()), file=err)
    local = job.local.advice()
    if local is not None and spec.output is not None:
        print(local, file=err)
        again = export_command(spec.output, "invalid", spec.input.path)
        print(f"  to send the rows rejected: {again}, then send that file as a new job", file=err)
    if _unhealable(ended):
        raise Problem(in_our_words(ended))
    failure = job.failure
    if isinstance(failure, Problem):
        raise failure
    if failure is not None:
        raise Problem(f"the job stopped: {failure}", FAILED)
    if ended is not None and job.stopped is None:
        print(f"the job stopped: {ended}", file=err)
    if (job.stopped or not job.complete) and spec.output is not None:
        why = job.stopped or (
            "the deadline passed" if ended is None and spec.settings.deadline else "stopped"
        )
        print(
            f"{why} after input line {job.last_line:,}: {resume_command(spec.output)} continues",
            file=err,
        )
    totals = job.counts()
    code = OK if job.complete and ended is None else FAILED
    not_sent, maybe_sent = totals["not_sent"], totals["maybe_sent"]
    too_large = tally.too_large
    if not_sent or maybe_sent:
        others = "other " if too_large else ""
        hint = ""
        if not_sent > too_large and spec.output is not None:
            hint = f"; {resume_command(spec.output)} sends the {others}not_sent ones again"
        print(
            f"failed: {not_sent:,} not_sent, {maybe_sent:,} maybe_sent "
            f'(see "outcome" in {spec.output}){hint}',
            file=err,
        )
        code = FAILED
    if too_large:
        print(
            f"{counted(too_large, 'row')} not sent as the server takes no request that "
            "large, even of one recipient (HTTP 413): their vars are too long, and --resume "
            "would be refused the same way; shorten them, or raise the server's limit (nginx: "
            "client_max_body_size)",
            file=err,
        )
    if maybe_sent and spec.output is not None:
        print(
            "maybe_sent rows may have reached the service: check them before sending them "
            "again (they may arrive twice); "
            f"{export_command(spec.output, 'maybe_sent', spec.input.path)} writes them out "
            "as an input of their own; once checked, "
            f"{resume_command(spec.output, resend_maybe_sent=True)} sends them again",
            file=err,
        )
    too_many = too_many_invalid(totals, spec.max_invalid)
    if too_many is not None:
        print(too_many, file=err)
        code = FAILED
    return code

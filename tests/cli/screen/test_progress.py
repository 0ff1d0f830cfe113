"""What a person sees while a send runs and at its end: the progress display, the summary."""

from __future__ import annotations

import io
from collections import Counter

import pytest

from dispatch_async._cli.screen.progress import Tally, _Bar, make_progress, render_summary


class _NoSizeTerminal(io.StringIO):
    """A stream that says it is a terminal but has no file descriptor to size."""

    def isatty(self) -> bool:
        return True


class TestProgressInProcess:
    """In-process: the progress display and the summary, on a stream the test reads."""

    def test_a_terminal_that_cannot_be_sized_gets_plain_lines_without_a_total(self) -> None:
        stream = _NoSizeTerminal()
        status = Counter(sent=2, invalid=1)
        progress = make_progress(
            quiet=False, total=None, initial=0, every=0, stream=stream, status=lambda: status
        )
        progress.advance(3)
        progress.close(complete=True)
        assert stream.getvalue().startswith("progress: 3 lines: 2 sent, 1 invalid, 0 failed; ")

    def test_quiet_shows_notes_and_no_progress(self) -> None:
        stream = io.StringIO()
        progress = make_progress(
            quiet=True, total=10, initial=0, every=0, stream=stream, status=Counter
        )
        progress.advance(5)
        progress.note("retrying chunk 3")
        progress.close(complete=True)
        assert stream.getvalue() == "retrying chunk 3\n"

    @pytest.mark.parametrize(
        ("total", "done", "complete", "last"),
        [
            # The total counted blank lines, which have no record: the job's end is 100%.
            (10, 7, True, "100%|##########| 7.00/7.00 "),
            # A double Ctrl-C at line 6,500 of 20,000: not "100% 6.50k/6.50k".
            (20_000, 6_500, False, " 32%|###2      | 6.50k/20.0k "),
        ],
    )
    def test_a_bar_ends_at_the_lines_recorded_of_the_total_unless_the_job_is_complete(
        self, total: int, done: int, complete: bool, last: str
    ) -> None:
        stream = io.StringIO()
        bar = _Bar(total, 0, stream, Counter)
        bar.advance(done)
        bar.close(complete=complete)
        assert last in stream.getvalue().rsplit("\r", 1)[-1]

    def test_the_summary_names_numbers_the_service_made_up_and_no_results_without_o(
        self,
    ) -> None:
        tally = Tally(outcomes=Counter(sent=3), unexpected=1, started=0.0, ended=1.0)
        summary = render_summary("dispatch-async send", tally, kept=None, output=None)
        assert "  the service named 1 number that were not sent" in summary.splitlines()
        assert "results:" not in summary

"""The words a failure report is made of: line ranges (what the service said is the
error's own message: tests/test_errors_that_teach.py)."""

from __future__ import annotations

from dispatch_async._cli.screen.causes import line_ranges


class TestCausesInWords:
    """In-process: the words the failure report is made of."""

    def test_lines_are_told_as_ranges_and_past_the_most_only_counted(self) -> None:
        lines = [2, 3, 4, 1002, 7, 9, 10]
        assert line_ranges(lines) == "2-4, 7, 9-10, 1,002"
        assert line_ranges(lines, most=2) == "2-4, 7, and 2 more ranges"

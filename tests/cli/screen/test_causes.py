"""The words a failure report is made of: line ranges, what the service said."""

from __future__ import annotations

from dispatch_async._cli.screen.causes import line_ranges, said


class TestCausesInWords:
    """In-process: the words the failure report is made of."""

    def test_lines_are_told_as_ranges_and_past_the_most_only_counted(self) -> None:
        lines = [2, 3, 4, 1002, 7, 9, 10]
        assert line_ranges(lines) == "2-4, 7, 9-10, 1,002"
        assert line_ranges(lines, most=2) == "2-4, 7, and 2 more ranges"

    def test_what_the_service_said_is_its_message_else_the_start_of_its_body(self) -> None:
        assert said('{"message": "template not found", "code": 7}') == "template not found"
        assert said("<html>\n  Bad   Gateway\n</html>") == "<html> Bad Gateway </html>"
        assert said('{"error": "x"}') == '{"error": "x"}'
        assert said("x" * 500) == "x" * 300

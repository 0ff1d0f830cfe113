"""Failed rows as a person reads them: each cause once, with its count and input lines.

A failing service fails chunk after chunk for the same reason. The terminal is told of
each distinct cause (outcome and error) the first time it is seen, with the lines of the
chunk that met it; the summary gives every cause's count and line ranges. The records
in the output keep each row's own error.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .outcomes import Failure

__all__ = ["Causes", "line_ranges"]

#: How many line ranges of one cause the summary lists before it only counts them.
_SHOWN_RANGES = 5


@attrs.define
class _Cause:
    outcome: str
    error: str
    rows: int = 0
    lines: list[int] = attrs.field(factory=list)


class Causes:
    """The failed rows of one run, by cause."""

    def __init__(self) -> None:
        self._causes: dict[tuple[str, str], _Cause] = {}

    def __bool__(self) -> bool:
        return bool(self._causes)

    def add(self, failures: Iterable[Failure]) -> list[str]:
        """Count *failures* (one part's); a note for each cause not seen before."""
        new: dict[tuple[str, str], list[int]] = {}
        for line, maybe_sent, error, kind in failures:
            if kind == "Interrupted":  # a stop: the run says so itself
                continue
            key = ("maybe_sent" if maybe_sent else "not_sent", error)
            cause = self._causes.get(key)
            if cause is None:
                cause = self._causes[key] = _Cause(*key)
                new[key] = cause.lines
            cause.rows += 1
            cause.lines.append(line)
        return [
            f"{outcome}: {error}: {_rows(len(lines))}, lines {line_ranges(lines)} (further rows "
            "failing this way are counted in the summary)"
            for (outcome, error), lines in new.items()
        ]

    def summary(self) -> list[str]:
        """The summary's lines: every cause, most rows first, with its line ranges."""
        causes = sorted(self._causes.values(), key=lambda c: (-c.rows, c.outcome, c.error))
        lines = ["  failed rows, by cause:"]
        for cause in causes:
            ranges = line_ranges(cause.lines, _SHOWN_RANGES)
            lines.append(f"    {cause.rows:,} {cause.outcome}: {cause.error} (lines {ranges})")
        return lines


def line_ranges(lines: Iterable[int], most: int | None = None) -> str:
    """Input lines as ranges, ``"2-401, 1,002-1,198"``; past *most* ranges only counted."""
    runs: list[list[int]] = []
    for line in sorted(set(lines)):
        if runs and line == runs[-1][1] + 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    shown = [f"{a:,}" if a == b else f"{a:,}-{b:,}" for a, b in runs[:most]]
    if most is not None and len(runs) > most:
        shown.append(f"and {len(runs) - most:,} more ranges")
    return ", ".join(shown)


def _rows(count: int) -> str:
    return f"{count:,} row" if count == 1 else f"{count:,} rows"

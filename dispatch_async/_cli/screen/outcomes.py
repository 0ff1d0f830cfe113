"""The four outcomes a line ends with, and a failed row as the screen tells it.

Here, below every wing, because the records (``job``), the report (``queued``) and the
progress and causes on screen all count by them.
"""

from __future__ import annotations

__all__ = ["OUTCOMES", "Failure"]

OUTCOMES = ("sent", "invalid", "not_sent", "maybe_sent")
#: A failed row, as ``part_records`` reports it: (line, maybe_sent, error, error_type).
Failure = tuple[int, bool, str, str]

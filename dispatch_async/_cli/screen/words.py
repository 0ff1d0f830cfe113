"""Counts in words: "1 request", "2 requests", "1,000 chunks".

The SDK and the simulator have their own two lines for their messages: the command line
uses only the SDK's public names, and the simulator shares no code with the client.
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """*count* with thousands separators and the noun in the number it takes."""
    return f"{count:,} {singular if count == 1 else plural or singular + 's'}"

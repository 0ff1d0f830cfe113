"""Why an input cannot be read: the floor of the reading wing, imported by every reader."""

from __future__ import annotations

__all__ = ["InputProblem", "UnreadableInput"]


class InputProblem(Exception):
    """The input as a whole cannot be read (a missing column, an unreadable header)."""


class UnreadableInput(InputProblem):
    """The input cannot be read past a line: what follows it is not trusted as rows."""

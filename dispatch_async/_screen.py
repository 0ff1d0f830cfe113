"""Local checks that keep recipients from ever leaving the machine: dedupe, phone numbers.

Both are opt-in. Rejects land in the result's ``invalid`` with a reason, exactly as if
the service had refused them, but no request carries them.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._e164 import to_e164
from ._recipients import Chunk
from ._wire import encodable

__all__ = [
    "DUPLICATE",
    "LOCALLY_INVALID",
    "UNENCODABLE",
    "Screen",
    "without_unencodable",
]

DUPLICATE = "duplicate"
LOCALLY_INVALID = "number must be a valid phone number (checked locally)"
UNENCODABLE = "text that is not valid UTF-8 (a lone surrogate): it cannot be sent"


class Screen:
    """The local checks of one job; it remembers the numbers seen for dedupe."""

    def __init__(self, *, dedupe: bool, prevalidate: bool, region: str | None) -> None:
        self._seen: set[str] | None = set() if dedupe else None
        self._prevalidate = prevalidate
        self._region = region
        if prevalidate:
            to_e164("+5511987654321")  # fails early, with the install hint, without the extra

    @property
    def active(self) -> bool:
        return self._seen is not None or self._prevalidate

    def apply(self, chunk: Chunk) -> Chunk:
        """The chunk with local rejects moved to ``rejected`` and numbers in E.164."""
        if not self.active:
            return chunk
        messages: list[dict[str, Any]] = []
        given: list[str] = []
        where: list[int] = []
        rejected = list(chunk.rejected)
        changed = False
        for message, position in zip(chunk.messages, chunk.message_positions(), strict=True):
            number: str = message["number"]
            wire_number = number
            if self._prevalidate:
                e164 = to_e164(number, self._region)
                if e164 is None:
                    rejected.append((number, LOCALLY_INVALID, position))
                    continue
                wire_number = e164
            if self._seen is not None:
                if wire_number in self._seen:
                    rejected.append((number, DUPLICATE, position))
                    continue
                self._seen.add(wire_number)
            if wire_number != number:
                changed = True
                message = {**message, "number": wire_number}
            messages.append(message)
            given.append(number)
            where.append(position)
        return attrs.evolve(
            chunk,
            messages=messages,
            given=given if changed else None,
            rejected=rejected,
            where=where if len(where) < len(chunk.messages) else chunk.where,
        )


def without_unencodable(chunk: Chunk) -> Chunk:
    """The chunk with every recipient whose text cannot go on the wire moved to ``rejected``.

    Checked only after encoding the whole chunk failed: a rare path, and a bad
    recipient then costs only itself.
    """
    given = chunk.given_numbers()
    messages: list[dict[str, Any]] = []
    kept: list[str] = []
    where: list[int] = []
    rejected = list(chunk.rejected)
    for message, number, position in zip(
        chunk.messages, given, chunk.message_positions(), strict=True
    ):
        if encodable(message):
            messages.append(message)
            kept.append(number)
            where.append(position)
        else:
            shown = number if encodable(number) else repr(number)
            rejected.append((shown, UNENCODABLE, position))
    changed = chunk.given is not None
    return attrs.evolve(
        chunk, messages=messages, given=kept if changed else None, rejected=rejected, where=where
    )

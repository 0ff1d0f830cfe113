"""Local checks that keep recipients from ever leaving the machine: phone numbers, an
exclude list (opt-outs), dedupe.

All are opt-in. Rejects land in the result's ``invalid`` with a reason, exactly as if
the service had refused them, but no request carries them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Set
from typing import Any, TypeAlias

import attrs

from ._batch_settings import BatchSettings
from ._e164 import to_e164
from ._exceptions import CallbackError
from ._recipients import Chunk
from ._wire import encodable

__all__ = [
    "DUPLICATE",
    "EXCLUDED",
    "LOCALLY_INVALID",
    "UNENCODABLE",
    "Exclude",
    "Screen",
    "without_unencodable",
]

#: Numbers never to send: a set, or a callable that says True for one.
Exclude: TypeAlias = "Set[str] | Callable[[str], object]"

DUPLICATE = "duplicate"
EXCLUDED = "excluded"
LOCALLY_INVALID = "number must be a valid phone number (checked locally)"
UNENCODABLE = "text that is not valid UTF-8 (a lone surrogate): it cannot be sent"

#: A chunk's checks give the event loop a turn after this long (seconds), looking at the
#: clock every few numbers: checking costs 2-70 us a number, a chunk can be thousands.
_TURN_AFTER = 0.001
_CLOCK_EVERY = 16


class Screen:
    """The local checks of one job; it remembers the numbers seen for dedupe."""

    def __init__(
        self,
        *,
        dedupe: bool,
        prevalidate: bool,
        region: str | None,
        exclude: Exclude | None = None,
    ) -> None:
        self._seen: set[str] | None = set() if dedupe else None
        self._prevalidate = prevalidate
        self._region = region
        self._excluded: Callable[[str], object] | None = (
            exclude.__contains__ if isinstance(exclude, Set) else exclude
        )
        if prevalidate:
            to_e164("+5511987654321")  # fails early, with the install hint, without the extra

    @classmethod
    def of(cls, settings: BatchSettings) -> Screen:
        """The checks *settings* ask for."""
        return cls(
            dedupe=settings.dedupe,
            prevalidate=settings.prevalidate,
            region=settings.region,
            exclude=settings.exclude,
        )

    @property
    def active(self) -> bool:
        return self._seen is not None or self._prevalidate or self._excluded is not None

    async def apply(self, chunk: Chunk) -> Chunk:
        """The chunk with local rejects moved to ``rejected`` and numbers in E.164.

        Other tasks get a turn every millisecond or so of checks: a web backend's loop
        is never held for a whole chunk.
        """
        if not self.active:
            return chunk
        messages: list[dict[str, Any]] = []
        given: list[str] = []
        where: list[int] = []
        rejected = list(chunk.rejected)
        changed = False
        clock = time.perf_counter
        turn_at = clock() + _TURN_AFTER
        pairs = zip(chunk.messages, chunk.message_positions(), strict=True)
        for done, (message, position) in enumerate(pairs, 1):
            if not done % _CLOCK_EVERY and clock() >= turn_at:
                await asyncio.sleep(0)
                turn_at = clock() + _TURN_AFTER
            number: str = message["number"]
            wire_number = number
            if self._prevalidate:
                e164 = to_e164(number, self._region)
                if e164 is None:
                    rejected.append((number, LOCALLY_INVALID, position))
                    continue
                wire_number = e164
            if self._excluded is not None and self._is_excluded(wire_number):
                rejected.append((number, EXCLUDED, position))
                continue
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

    def _is_excluded(self, number: str) -> bool:
        assert self._excluded is not None
        try:
            return bool(self._excluded(number))
        except Exception as exc:
            # Never the number: it is personal data, and this message may be logged.
            raise CallbackError(
                f"exclude raised {type(exc).__name__}; this chunk was not sent"
            ) from exc


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

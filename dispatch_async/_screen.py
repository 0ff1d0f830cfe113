"""Local checks that keep recipients from ever leaving the machine: dedupe, phone numbers.

Both are opt-in. Rejects land in the result's ``invalid`` with a reason, exactly as if
the service had refused them, but no request carries them.
"""

from __future__ import annotations

from typing import Any

from ._exceptions import ConfigurationError
from ._recipients import Chunk
from ._wire import encodable

__all__ = ["DUPLICATE", "LOCALLY_INVALID", "UNENCODABLE", "Screen", "without_unencodable"]

DUPLICATE = "duplicate"
LOCALLY_INVALID = "number must be a valid phone number (checked locally)"
UNENCODABLE = "text that is not valid UTF-8 (a lone surrogate): it cannot be sent"


class Screen:
    """The local checks of one job; it remembers the numbers seen for dedupe."""

    def __init__(self, *, dedupe: bool, prevalidate: bool, region: str | None) -> None:
        self._seen: set[str] | None = set() if dedupe else None
        self._phonenumbers: Any = None
        self._region = region
        if prevalidate:
            try:
                import phonenumbers
            except ImportError:  # pragma: no cover - depends on the installed extras
                raise ConfigurationError(
                    "prevalidate needs the phonenumbers extra: "
                    'pip install "dispatch-async[phonenumbers]"'
                ) from None
            self._phonenumbers = phonenumbers

    @property
    def active(self) -> bool:
        return self._seen is not None or self._phonenumbers is not None

    def apply(self, chunk: Chunk) -> Chunk:
        """The chunk with local rejects moved to ``rejected`` and numbers in E.164."""
        if not self.active:
            return chunk
        messages: list[dict[str, Any]] = []
        given: list[str] = []
        rejected = list(chunk.rejected)
        changed = False
        for message in chunk.messages:
            number: str = message["number"]
            wire_number = number
            if self._phonenumbers is not None:
                e164 = self._e164(number)
                if e164 is None:
                    rejected.append((number, LOCALLY_INVALID))
                    continue
                wire_number = e164
            if self._seen is not None:
                if wire_number in self._seen:
                    rejected.append((number, DUPLICATE))
                    continue
                self._seen.add(wire_number)
            if wire_number != number:
                changed = True
                message = {**message, "number": wire_number}
            messages.append(message)
            given.append(number)
        return Chunk(chunk.start, chunk.size, messages, given if changed else None, rejected)

    def canonical(self, number: str) -> str:
        """The form dedupe compares: E.164 with prevalidate (if valid), else the text as given.

        Without prevalidate, ``11987654322`` and ``+5511987654322`` are two numbers.
        """
        if self._phonenumbers is None:
            return number
        return self._e164(number) or number

    def _e164(self, number: str) -> str | None:
        pn = self._phonenumbers
        try:
            parsed = pn.parse(number, self._region)
        except pn.NumberParseException:
            return None
        if not pn.is_valid_number(parsed):
            return None
        return str(pn.format_number(parsed, pn.PhoneNumberFormat.E164))


def without_unencodable(chunk: Chunk) -> Chunk:
    """The chunk with every recipient whose text cannot go on the wire moved to ``rejected``.

    Checked only after encoding the whole chunk failed: a rare path, and a bad
    recipient then costs only itself.
    """
    given = chunk.given_numbers()
    messages: list[dict[str, Any]] = []
    kept: list[str] = []
    rejected = list(chunk.rejected)
    for message, number in zip(chunk.messages, given, strict=True):
        if encodable(message):
            messages.append(message)
            kept.append(number)
        else:
            rejected.append((number if encodable(number) else repr(number), UNENCODABLE))
    changed = chunk.given is not None
    return Chunk(chunk.start, chunk.size, messages, kept if changed else None, rejected)

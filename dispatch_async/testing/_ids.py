"""Message ids in UUID form, made in bulk because a large send asks for a million of them."""

from __future__ import annotations

import os
from typing import Final

__all__ = ["IdFactory"]

# The variant nibble of a random UUID is 10xx: map a random hex digit onto 8, 9, a or b.
_VARIANT: Final = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


class IdFactory:
    """Hands out message ids.

    Random ids are version-4 UUIDs from ``os.urandom`` like `uuid.uuid4`, formatted from
    one random block per call (about five times cheaper than ``str(uuid4())`` per id).
    ``fast=True`` numbers them instead (still valid UUID strings, unique per server) so
    a benchmark's counterpart spends nothing on randomness.
    """

    def __init__(self, *, fast: bool = False) -> None:
        self._fast = fast
        self._next = 0

    def take(self, n: int) -> list[str]:
        """``n`` fresh ids."""
        if self._fast:
            start = self._next
            self._next = start + n
            return [f"00000000-0000-4000-8000-{i:012x}" for i in range(start, start + n)]
        h = os.urandom(16 * n).hex()
        v = _VARIANT
        return [
            f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
            f"{v[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
            for i in range(0, 32 * n, 32)
        ]

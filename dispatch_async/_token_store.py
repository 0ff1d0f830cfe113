"""Where a fleet of processes keeps the one access token they share.

A ``TokenStore`` holds the token and a lock; the ``TokenKeeper`` (``_auth.py``) keeps the
refresh-ahead logic and decides when to read, lock, fetch and save. Times in a store are
wall-clock (``time.time()``): monotonic clocks differ from one process to the next.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

import attrs

__all__ = ["StoredToken", "TokenStore", "TokenStoreUnavailable"]


class TokenStoreUnavailable(Exception):
    """The store could not be reached; the keeper falls back to fetching locally.

    The message names the failure, never the token.
    """


@attrs.frozen
class StoredToken:
    """A token as kept in a store: its value, when it was issued (wall clock), its lifetime."""

    value: str = attrs.field(repr=False)
    issued_at: float
    lifetime: float


class TokenStore(Protocol):
    """A token shared between processes, and a lock so only one of them refreshes it."""

    async def load(self) -> StoredToken | None:
        """The stored token, or None. Raises `TokenStoreUnavailable`."""
        ...

    async def save(self, token: StoredToken, ttl: float) -> None:
        """Store *token*, forgotten after *ttl* seconds. Raises `TokenStoreUnavailable`."""
        ...

    def lock(self, wait: float) -> AbstractAsyncContextManager[bool]:
        """Hold the refresh lock; enters with False if it was not had within *wait* seconds.

        Raises `TokenStoreUnavailable` on entering.
        """
        ...

    async def aclose(self) -> None:
        """Release the connections (the store may be used again afterwards)."""
        ...

"""Bearer tokens: issued at random, expiring on the server's monotonic clock."""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Callable

__all__ = ["IssuedTokens", "TokenState"]


class TokenState(enum.Enum):
    """What the server makes of a presented token."""

    VALID = "valid"
    MISSING = "missing"
    UNKNOWN = "unknown"
    EXPIRED = "expired"
    REVOKED = "revoked"


class IssuedTokens:
    """Issued tokens and their deadlines.

    Expired tokens are kept (they are small) so that using one is told apart from using
    a token the server never issued: the two are different client bugs.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._deadlines: dict[str, float] = {}
        self._revoked: set[str] = set()

    def issue(self, lifetime: float) -> str:
        """A new opaque token valid for ``lifetime`` seconds from now."""
        token = secrets.token_urlsafe(32)
        self._deadlines[token] = self._clock() + lifetime
        return token

    def check(self, token: str | None) -> TokenState:
        """The state of ``token`` now."""
        if token is None:
            return TokenState.MISSING
        deadline = self._deadlines.get(token)
        if deadline is None:
            return TokenState.UNKNOWN
        if token in self._revoked:
            return TokenState.REVOKED
        if self._clock() >= deadline:
            return TokenState.EXPIRED
        return TokenState.VALID

    def revoke(self, token: str) -> None:
        """Make ``token`` unusable from now on."""
        self._revoked.add(token)

    def expire_all(self) -> None:
        """Make every token issued so far expired, as if their lifetime had passed."""
        now = self._clock()
        for token, deadline in self._deadlines.items():
            self._deadlines[token] = min(deadline, now)

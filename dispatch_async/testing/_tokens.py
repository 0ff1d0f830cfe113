"""Bearer tokens: issued at random, expiring on the server's monotonic clock."""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable

import orjson

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

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._deadlines: dict[str, float] = {}
        self._revoked: set[str] = set()
        self._key = secrets.token_bytes(32)

    def issue(self, lifetime: float, *, jwt: bool = False) -> str:
        """A new token valid for ``lifetime`` seconds from now.

        Opaque by default; with *jwt*, a signed JWT (HS256, a key of this server's)
        whose ``iat`` and ``exp`` claims are whole seconds, ``exp`` rounded down so the
        token never outlives its claim.
        """
        now = self._wall_clock()
        token = self._jwt(math.floor(now), math.floor(now + lifetime)) if jwt else None
        token = token or secrets.token_urlsafe(32)
        self._deadlines[token] = self._clock() + lifetime
        return token

    def _jwt(self, iat: int, exp: int) -> str:
        header = _segment({"alg": "HS256", "typ": "JWT"})
        payload = _segment({"iat": iat, "exp": exp, "jti": secrets.token_urlsafe(12)})
        signing_input = f"{header}.{payload}".encode()
        signature = hmac.new(self._key, signing_input, hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(signature)}"

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


def _segment(claims: dict[str, object]) -> str:
    return _b64(orjson.dumps(claims))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

"""How long an access token lives, from whatever the token answer says.

The vendor documents ``expires_in`` as a string of unstated unit (``"<time>"`` in its
example) for a JWT bearer token. So a lifetime is read from every form a Node JWT stack
emits (seconds as a number or text, durations such as ``"1h30m"``), and from the token's
own ``exp`` claim. What cannot be read is None, never an error: the token is usable even
when its lifetime is not, and the caller falls back to a bounded default (`_auth`).
"""

from __future__ import annotations

import base64
import binascii
import math
import re

import orjson

__all__ = ["jwt_claims_lifetime", "parse_lifetime"]

# The units of vercel/ms (what jsonwebtoken's ``expiresIn`` takes), in seconds.
_UNITS: dict[str, float] = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400.0),
    **dict.fromkeys(("y", "yr", "yrs", "year", "years"), 365.25 * 86400.0),
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)", re.IGNORECASE)
_DURATION = re.compile(r"(?:\s*\d+(?:\.\d+)?\s*[a-z]+)+\s*", re.IGNORECASE)
#: Longer than any token text worth parsing: the rest is not looked at.
_MAX_TEXT = 64


def parse_lifetime(value: object) -> float | None:
    """Seconds from ``3600``, ``"3600"``, ``"3600.0"``, ``"1h"``, ``"1h30m"``, ``"2 days"``.

    None for what is absent, zero, negative, not finite, a boolean or not a lifetime
    (``"<time>"``): an unknown lifetime, not a reason to refuse the token.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= _MAX_TEXT:
        seconds = _seconds_in(value.strip())
    else:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _seconds_in(text: str) -> float:
    try:
        return float(text)  # plain seconds; "NaN" and "Infinity" are refused by the caller
    except ValueError:
        pass
    if not _DURATION.fullmatch(text):
        return math.nan
    total = 0.0
    for amount, unit in _PART.findall(text):
        scale = _UNITS.get(unit.lower())
        if scale is None:
            return math.nan
        total += float(amount) * scale
    return total


def jwt_claims_lifetime(token: str, now: float) -> float | None:
    """Seconds the JWT *token* has left by its claims, at wall-clock time *now*.

    The payload is decoded, never verified (the service checks its own signature) and
    never logged. ``exp - now`` is the lifetime by this machine's clock; ``exp - iat``
    the lifetime by the issuer's, which bounds the first when this clock runs behind.
    None when the token is not a JWT, has no usable ``exp``, or ``exp`` has passed by
    this clock (a clock running ahead, or a stale token: the 401 path handles the latter).
    """
    claims = _jwt_payload(token)
    if claims is None:
        return None
    exp = _number(claims.get("exp"))
    if exp is None:
        return None
    left = exp - now
    iat = _number(claims.get("iat"))
    if iat is not None and iat < exp:
        left = min(left, exp - iat)
    return left if left > 0 else None


def _jwt_payload(token: str) -> dict[str, object] | None:
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > 8192:
        return None
    segment = parts[1]
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        claims = orjson.loads(raw)
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None

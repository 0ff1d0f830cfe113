"""Secrets blanked out of what the service says: the one implementation.

A service that echoes a credential echoes it in the form it was sent or stored: the
token request's form body is percent-encoded ("+" for a space, hex in either case), a
JSON encoder may escape "/" (PHP's default) or any character as \\uXXXX, a header dump
may be base64. Each secret becomes one pattern that matches it however each of its
characters is written, so mixed escaping is caught too.
"""

from __future__ import annotations

import base64
import functools
import re
import string
import urllib.parse

import orjson

__all__ = ["masked_numbers", "redacted", "redacted_excerpt", "service_reason", "url_secrets"]

#: The most characters of a service's reason put in an error's message.
REASON_CHARS = 200
#: A body larger than this is not parsed for its reason: its start is shown instead.
_PARSED_BYTES = 64 * 1024
#: Eight digits or more, maybe with "+", spaces, dots, hyphens or parentheses between:
#: a phone number, to be masked in what is shown (personal data).
_PHONE = re.compile(r"\+?\(?\d(?:[\s().-]{0,2}\d){7,}")


def masked_numbers(text: str) -> str:
    """*text* with each run that could be a phone number cut to ``***`` and its last two digits."""
    return _PHONE.sub(lambda found: "***" + found[0][-2:], text)


def service_reason(body: bytes, secrets: tuple[str, ...]) -> str:
    """Why a refusing service refused, made safe for an error's message.

    Its JSON ``message`` (else ``error`` or ``detail``) when the body is a JSON object
    that has one, else the start of the body; on one line, at most `REASON_CHARS`
    characters, with *secrets* blanked out and phone numbers masked. Empty without a body.
    """
    text = None
    if len(body) <= _PARSED_BYTES:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if isinstance(answer, dict):
            said = (answer.get(key) for key in ("message", "error", "detail"))
            text = next((s for s in said if isinstance(s, str) and s.strip()), None)
    if text is None:
        text = redacted_excerpt(body, secrets, REASON_CHARS * 2)
    text = masked_numbers(redacted(" ".join(text.split()), secrets))
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def redacted(text: str, secrets: tuple[str, ...]) -> str:
    """*text* with every secret blanked out, in every standard form it may be echoed in."""
    pattern = _redaction(secrets)[0]
    return text if pattern is None else pattern.sub("***", text)


def url_secrets(*urls: str | None) -> tuple[str, ...]:
    """The keys in callback and webhook URLs, as secrets for `redacted`.

    The vendor offers no signature, so a URL's token is the receiver's only key: its last
    path segment (where `CallbackReceiver.url` puts it), its password and query values.
    """
    found: list[str] = []
    for url in filter(None, urls):
        try:
            parts = urllib.parse.urlsplit(url)
            query = urllib.parse.parse_qsl(parts.query)
            password = parts.password
        except ValueError:  # not a URL urllib reads: all of it, then
            found.append(url)
            continue
        found.append(parts.path.rstrip("/").rpartition("/")[2])
        found.append(password or "")
        found.extend(value for _, value in query)
    return tuple(secret for secret in found if len(secret) >= _SHORTEST_SECRET)


def redacted_excerpt(body: bytes, secrets: tuple[str, ...], chars: int) -> str:
    """The start of *body*, at most *chars* characters, with every secret blanked out."""
    pattern, longest = _redaction(secrets)
    window = chars * 4 + longest  # UTF-8 takes up to 4 bytes a character
    text = body[:window].decode("utf-8", "replace")
    if pattern is not None:
        text = pattern.sub("***", text)
        if len(body) > window:
            # A copy cut short by the window matched nothing, and blanking the copies
            # before it shortened the text: drop whatever could be the start of one.
            text = text[: max(len(text) - longest, 0)]
    return text[:chars]


_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_PLAIN = frozenset(string.ascii_letters + string.digits + "-._~")
#: The longest way one character can be written: a JSON surrogate pair, or four %XX.
_WIDEST = len("\\ud83d\\ude00")
#: A secret's form shorter than this would blank out unrelated text.
_SHORTEST_SECRET = 8


# Cached: a long token's pattern takes some 20 ms to compile, and a burst of 429s
# builds an error for every answer.
@functools.lru_cache(maxsize=8)
def _redaction(secrets: tuple[str, ...]) -> tuple[re.Pattern[str] | None, int]:
    """One pattern for every form of *secrets*, and the most characters a match can take."""
    forms = set()
    for secret in filter(None, secrets):
        forms.add(secret)
        forms.update(_base64_forms(secret.encode()))
    if not forms:
        return None, 0
    ordered = sorted(forms, key=len, reverse=True)  # a longer form before its prefixes
    pattern = re.compile("|".join("".join(map(_written, form)) for form in ordered))
    longest = max(sum(1 if c in _PLAIN else _WIDEST for c in form) for form in forms)
    return pattern, longest


def _written(char: str) -> str:
    """A pattern for *char* as itself, JSON-escaped or percent-encoded.

    Letters, digits and ``-._~`` are left as they are: no standard encoder escapes them.
    The escapes are tried first: a literal backslash would match half of ``\\\\``.
    """
    if char in _PLAIN:
        return char
    units = char.encode("utf-16-be")
    code_units = "".join(f"\\\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
    ways = [f"(?i:{code_units})", "(?i:" + "".join(f"%{byte:02x}" for byte in char.encode()) + ")"]
    if char in _JSON_ESCAPES:
        ways.append(re.escape(_JSON_ESCAPES[char]))
    if char == " ":
        ways.append("\\+")
    ways.append(re.escape(char))
    return f"(?:{'|'.join(ways)})"


def _base64_forms(data: bytes) -> set[str]:
    """*data* in base64 (standard and URL-safe), alone or at any offset in longer data.

    Inside longer data the characters that mix its bits with its neighbours' vary: only
    those that encode *data* alone are matched.
    """
    whole = base64.b64encode(data).decode().rstrip("=")
    forms = {whole}
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + data).decode()
        forms.add(encoded[-(-8 * shift // 6) : 8 * (shift + len(data)) // 6])
    forms |= {form.translate(_URL_SAFE) for form in forms}
    return {form for form in forms if len(form) >= _SHORTEST_SECRET}


_URL_SAFE = str.maketrans("+/", "-_")

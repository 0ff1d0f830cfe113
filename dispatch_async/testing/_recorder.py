"""What the simulator received, request by request, for tests to assert on the wire.

Credentials are never kept: the ``Authorization`` value is cut to its scheme and a token
request's ``client_secret`` is removed from its body before anything is stored. The
record is bounded in count and in body size, so a soak run or a benchmark against a
long-running simulator does not grow without limit.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

import attrs
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "DEFAULT_RECORDED_BODY_BYTES",
    "DEFAULT_RECORDED_REQUESTS",
    "RecordedRequest",
    "Recorder",
]

#: How many of the latest requests `FakeDispatchServer.requests` keeps by default.
DEFAULT_RECORDED_REQUESTS: Final = 1000
#: Bodies larger than this many bytes are recorded by their size only, by default.
DEFAULT_RECORDED_BODY_BYTES: Final = 64 * 1024

_TOKEN_PATH: Final = "/oauth/token"  # noqa: S105 - a path
_API_PREFIX: Final = "/api/v3/"
_SECRET_FIELD: Final = "client_secret"  # noqa: S105 - a field's name
_CREDENTIAL_HEADERS: Final = ("Authorization", "Proxy-Authorization")
_FORM: Final = "application/x-www-form-urlencoded"
_JSON: Final = "application/json"


@attrs.frozen
class RecordedRequest:
    """One request as the simulator received it, credentials removed.

    ``headers`` are case-insensitive; ``Authorization`` keeps only its scheme
    (``"Bearer <redacted>"``). ``body`` is the body as received, except that a token
    request's ``client_secret`` is removed; it is None when there was none or when it
    was larger than the server's ``recorded_body_bytes`` (``size`` still tells its size).
    """

    method: str
    """The HTTP method (``"POST"``, ``"GET"``)."""
    path: str
    """The path, without the query (``"/api/v3/basic"``)."""
    headers: CIMultiDictProxy[str] = attrs.field(repr=False)
    """The request's headers, case-insensitive, credentials cut to their scheme."""
    size: int
    """The body's length in bytes, as received (0 without a body)."""
    body: bytes | None = attrs.field(repr=False)
    """The body, credentials removed; None when there was none or it was too large."""

    @property
    def endpoint(self) -> str | None:
        """``"basic"``, ``"single"``, ``"template"``, ``"webhook"``, ``"templates"`` (the
        listing) or ``"token"``; None for any other path."""
        if self.path == _TOKEN_PATH:
            return "token"
        if self.path.startswith(_API_PREFIX):
            return self.path.removeprefix(_API_PREFIX).strip("/") or None
        return None

    @property
    def json(self) -> Any:
        """The body parsed as JSON; None when there is no body kept or it is not JSON."""
        if not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    @property
    def form(self) -> dict[str, str] | None:
        """The fields of a form body (a token request's); None for any other body."""
        if self.body is None or _content_type(self.headers) != _FORM:
            return None
        return dict(parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True))

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, as ``GET /_requests`` answers it: the body parsed, not as bytes."""
        form = self.form
        return {
            "method": self.method,
            "path": self.path,
            "endpoint": self.endpoint,
            "headers": {str(name): value for name, value in self.headers.items()},
            "size": self.size,
            "json": None if form is not None else self.json,
            "form": form,
        }


class Recorder:
    """The latest requests, at most *max_requests*, bodies kept up to *max_body_bytes*."""

    def __init__(self, max_requests: int, max_body_bytes: int) -> None:
        if max_requests < 0 or max_body_bytes < 0:
            raise ValueError("the recorded request count and body size must be >= 0")
        self._kept: collections.deque[RecordedRequest] = collections.deque(maxlen=max_requests)
        self._max_body_bytes = max_body_bytes

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self._kept)

    def clear(self) -> None:
        self._kept.clear()

    def record(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None
    ) -> None:
        if self._kept.maxlen == 0:
            return
        size = len(body) if body else 0
        kept = body if body and size <= self._max_body_bytes else None
        if kept is not None and path == _TOKEN_PATH:
            kept = _without_secret(kept, _content_type(headers))
        self._kept.append(RecordedRequest(method, path, _redacted(headers), size, kept))


def _content_type(headers: Mapping[str, str]) -> str:
    return headers.get("Content-Type", "").partition(";")[0].strip().lower()


def _redacted(headers: Mapping[str, str]) -> CIMultiDictProxy[str]:
    copy = CIMultiDict(headers)
    for name in _CREDENTIAL_HEADERS:
        if name in copy:
            scheme, _, credential = copy[name].strip().partition(" ")
            copy[name] = f"{scheme} <redacted>" if credential.strip() else "<redacted>"
    return CIMultiDictProxy(copy)


def _without_secret(body: bytes, content_type: str) -> bytes | None:
    """A token request's body without its client_secret; None if it cannot be read."""
    if content_type == _JSON:
        try:
            fields = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(fields, dict):
            return None
        return orjson.dumps({k: v for k, v in fields.items() if k != _SECRET_FIELD})
    if content_type != _FORM:  # nothing says where a secret would be in it: keep none
        return None
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        return None
    return urlencode([(k, v) for k, v in pairs if k != _SECRET_FIELD]).encode()

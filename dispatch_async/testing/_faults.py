"""Faults the simulator can inject, and the queues that decide which request gets one.

A `Fault` is a value: it says what goes wrong and whether the service had already acted
on the recipients (recorded them as received) when it went wrong. `FaultSchedule` hands
faults to requests: scripted ones in order, then random status faults for soak runs.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any, Final

import attrs
import orjson

__all__ = ["Fault", "FaultKind", "FaultSchedule"]

# 500/502/504 say "something broke while handling it": the work may well have happened.
# 429, 503 and the 4xx family say "not handled", which is what clients rely on to resend.
_ACTED_STATUSES: Final = frozenset({500, 502, 504})

_JSON: Final = "application/json"


class FaultKind(enum.Enum):
    """What goes wrong; see the `Fault` constructors for each one's behaviour."""

    STATUS = "status"
    DELAY = "delay"
    HANG = "hang"
    DROP = "drop"
    DROP_BEFORE = "drop_before"
    OMIT = "omit"
    NOT_JSON = "not_json"
    WRONG_SHAPE = "wrong_shape"
    DIGITS_ONLY = "digits_only"
    REVOKE_TOKEN = "revoke_token"  # noqa: S105 - a fault's name, not a credential


@attrs.frozen
class Fault:
    """One injected failure. Build it with a constructor (`Fault.status(503)`, ...).

    ``acted`` tells whether the service records the request's recipients as received
    before failing: a client that resends after an acted fault sends twice.
    """

    kind: FaultKind
    """What goes wrong."""
    acted: bool
    """Whether the service records the recipients as received before failing."""
    status_code: int = 200
    """The status answered (``status`` faults; 200 for the others that answer)."""
    retry_after: str | None = None
    """The Retry-After header sent, verbatim; None for none."""
    body: bytes | None = None
    """The body answered instead of the normal one; None for the normal one."""
    content_type: str = _JSON
    """The answer's Content-Type."""
    seconds: float = 0.0
    """How long a ``delay`` fault waits before answering."""
    count: int = 0
    """How many recipients an ``omit`` fault leaves out of the answer."""

    @classmethod
    def status(
        cls,
        code: int,
        *,
        retry_after: str | None = None,
        body: bytes | str | Mapping[str, Any] | list[Any] | None = None,
        content_type: str | None = None,
        acted: bool | None = None,
    ) -> Fault:
        """Answer with status ``code`` instead of the normal response.

        Args:
            code: an error status, 400 to 599.
            retry_after: sent verbatim as ``Retry-After`` (any string, valid or not).
            body: JSON-able mapping or list (sent as JSON), or str/bytes sent as is.
                Defaults to ``{"error": "<reason phrase>"}``.
            content_type: overrides the body's content type.
            acted: overrides the default, which is True only for 500, 502 and 504.
        """
        if not 400 <= code <= 599:
            raise ValueError(f"a status fault needs an error status (400-599), got {code}")
        if body is None:
            body = {"error": _phrase(code)}
        raw, default_type = _encode_body(body)
        return cls(
            kind=FaultKind.STATUS,
            acted=code in _ACTED_STATUSES if acted is None else acted,
            status_code=code,
            retry_after=retry_after,
            body=raw,
            content_type=content_type or default_type,
        )

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Act, then answer normally ``seconds`` later (a slow but successful call)."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, got {seconds}")
        return cls(kind=FaultKind.DELAY, acted=True, seconds=seconds)

    @classmethod
    def hang(cls) -> Fault:
        """Act, then never answer: the client must time out (or the server close)."""
        return cls(kind=FaultKind.HANG, acted=True)

    @classmethod
    def drop(cls) -> Fault:
        """Act, then close the connection without a response: sent, fate unknown."""
        return cls(kind=FaultKind.DROP, acted=True)

    @classmethod
    def drop_before(cls) -> Fault:
        """Close the connection without acting, as if it died on the way in."""
        return cls(kind=FaultKind.DROP_BEFORE, acted=False)

    @classmethod
    def omit(cls, n: int) -> Fault:
        """Act on every recipient but leave the last ``n`` out of both response lists."""
        if n < 1:
            raise ValueError(f"omit needs n >= 1, got {n}")
        return cls(kind=FaultKind.OMIT, acted=True, count=n)

    @classmethod
    def not_json(
        cls,
        *,
        body: bytes = b"<html><body><h1>502 Bad Gateway</h1></body></html>",
        content_type: str = "text/html",
    ) -> Fault:
        """Act, then answer 200 with a body that is not JSON (a proxy's error page)."""
        return cls(kind=FaultKind.NOT_JSON, acted=True, body=body, content_type=content_type)

    @classmethod
    def wrong_shape(cls, *, body: Mapping[str, Any] | list[Any] | None = None) -> Fault:
        """Act, then answer 200 with JSON that breaks the documented shape.

        The default drops ``id`` from every ``validMessages`` item (and, on the token
        endpoint, ``access_token``); ``body`` replaces the whole answer instead.
        """
        raw = None if body is None else _encode_body(body)[0]
        return cls(kind=FaultKind.WRONG_SHAPE, acted=True, body=raw)

    @classmethod
    def digits_only(cls) -> Fault:
        """Act, then answer 200 with every returned number stripped to its digits."""
        return cls(kind=FaultKind.DIGITS_ONLY, acted=True)

    @classmethod
    def revoke_token(cls) -> Fault:
        """Revoke the presented token and answer 401 without acting."""
        return cls(kind=FaultKind.REVOKE_TOKEN, acted=False)


# What the token endpoint can meaningfully suffer: it has no recipients to omit or
# reformat and no token of its own to revoke.
_TOKEN_KINDS: Final = frozenset(
    {
        FaultKind.STATUS,
        FaultKind.DELAY,
        FaultKind.HANG,
        FaultKind.DROP,
        FaultKind.DROP_BEFORE,
        FaultKind.NOT_JSON,
        FaultKind.WRONG_SHAPE,
    }
)


class FaultSchedule:
    """Decides which fault, if any, the next request gets.

    Scripted faults are consumed one per request, most specific queue first: by number
    (the first number of the request, in message order, that has a queue), then by
    path, then the queue for any dispatch path. Only when none applies is a random
    status fault drawn from ``rates``.
    """

    def __init__(
        self,
        rates: Mapping[int, float] | None = None,
        *,
        seed: int | None = None,
        retry_after: str = "0",
    ) -> None:
        self._any: deque[Fault] = deque()
        self._by_path: dict[str, deque[Fault]] = {}
        self._by_number: dict[str, deque[Fault]] = {}
        self._token: deque[Fault] = deque()
        self._rates = _check_rates(rates or {})
        # A seeded PRNG makes soak runs reproducible; nothing here is security related.
        self._random = random.Random(seed)  # noqa: S311
        self._retry_after = retry_after

    @property
    def pending(self) -> int:
        """How many scripted faults are still waiting for a request."""
        return (
            len(self._any)
            + len(self._token)
            + sum(map(len, self._by_path.values()))
            + sum(map(len, self._by_number.values()))
        )

    def add(self, faults: Iterable[Fault], *, path: str | None = None) -> None:
        """Queue faults for the next dispatch requests (on ``path`` when given)."""
        if path is None:
            self._any.extend(faults)
        else:
            self._by_path.setdefault(path, deque()).extend(faults)

    def add_for_number(self, number: str, faults: Iterable[Fault]) -> None:
        """Queue faults for the next requests whose messages include ``number``."""
        self._by_number.setdefault(number, deque()).extend(faults)

    def add_for_token(self, faults: Iterable[Fault]) -> None:
        """Queue faults for the next token requests."""
        faults = list(faults)
        for fault in faults:
            if fault.kind not in _TOKEN_KINDS:
                raise ValueError(f"{fault.kind.value} faults do not apply to the token endpoint")
        self._token.extend(faults)

    def clear(self) -> None:
        """Forget every scripted fault (random rates stay)."""
        self._any.clear()
        self._by_path.clear()
        self._by_number.clear()
        self._token.clear()

    def for_dispatch(self, path: str, numbers: list[str]) -> Fault | None:
        """The fault for a dispatch request on ``path`` carrying ``numbers``, if any."""
        if self._by_number:
            by_number = self._by_number
            # Only pays a dict probe per recipient while a test has number scripts.
            for number in numbers:
                queue = by_number.get(number)
                if queue:
                    fault = queue.popleft()
                    if not queue:
                        del by_number[number]
                    return fault
        queue = self._by_path.get(path)
        if queue:
            return queue.popleft()
        if self._any:
            return self._any.popleft()
        return self._draw()

    def for_token(self) -> Fault | None:
        """The fault for the next token request, if any."""
        return self._token.popleft() if self._token else None

    def _draw(self) -> Fault | None:
        if not self._rates:
            return None
        roll = self._random.random()
        for code, rate in self._rates.items():
            if roll < rate:
                retry_after = self._retry_after if code == 429 else None
                return Fault.status(code, retry_after=retry_after, acted=False)
            roll -= rate
        return None


def _check_rates(rates: Mapping[int, float]) -> dict[int, float]:
    for code, rate in rates.items():
        if not 400 <= code <= 599:
            raise ValueError(f"fault rate for {code}: not an error status (400-599)")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate for {code}: {rate} is not within [0, 1]")
    if sum(rates.values()) > 1.0:
        raise ValueError("fault rates add up to more than 1")
    # Sorted so that a given seed draws the same faults whatever the mapping's order.
    return {code: rates[code] for code in sorted(rates) if rates[code] > 0}


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "Error"


def _encode_body(body: bytes | str | Mapping[str, Any] | list[Any]) -> tuple[bytes, str]:
    if isinstance(body, bytes):
        return body, "application/octet-stream"
    if isinstance(body, str):
        return body.encode(), "text/plain"
    # orjson only takes real dicts, not any Mapping.
    return orjson.dumps(dict(body) if isinstance(body, Mapping) else body), _JSON

"""Idle connections: retired before the server closes them, never written to once it has.

A request written on a pooled connection that the server is closing fails after it was
written: the SDK must then report it ``maybe_sent``, though the service never saw it.
Two defences, both here:

- an idle connection is reused only while younger than `IDLE_LIFE`, or than the
  server's ``Keep-Alive: timeout=N`` less a margin for latency, whichever is shorter
  (`IdleLife`, for the SDK's own connector; a caller's ``http_session`` is theirs);
- before the first byte of a request is written, a connection the server has already
  closed (its FIN or RST waiting in the socket, not yet seen by the event loop) is not
  written to (`server_has_closed`): nothing was sent, so the failure is ``not_sent``.
"""

from __future__ import annotations

import re
import select
from collections.abc import Mapping
from typing import Final

import aiohttp

__all__ = ["IDLE_LIFE", "IdleLife", "advertised_life", "idle_connector", "server_has_closed"]

#: Seconds an idle connection is reused when the server does not say how long it keeps
#: one (Node's own client, undici, uses 4 s; Node, Apache and uvicorn close at 5 s).
IDLE_LIFE: Final = 4.0
#: Taken off the server's advertised timeout: the server's idle clock starts a one-way
#: trip before ours, and our request needs another to arrive.
_MARGIN: Final = 1.0
_TIMEOUT: Final = re.compile(r"(?:^|[\s,;])timeout\s*=\s*\"?([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)
# The peer's FIN (POLLRDHUP, Linux), or a reset or hang-up (reported whether asked or not).
_CLOSED: Final = getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0)


def advertised_life(keep_alive: str) -> float | None:
    """How long an idle connection may be reused by a ``Keep-Alive`` header; None: not said.

    The advertised timeout less a margin: 1 s, or half of a timeout under 2 s.
    """
    match = _TIMEOUT.search(keep_alive)
    if match is None:
        return None
    timeout = float(match.group(1))
    return max(timeout - min(_MARGIN, timeout / 2), 0.0)


class IdleLife:
    """The idle life of the SDK's own connector: `IDLE_LIFE`, shortened by the server's word.

    Only ever shortened: a longer promise may not hold for a proxy or load balancer
    between us and the server. The connector is aiohttp's; its idle limit
    (``keepalive_timeout``) has no public setter, so `_set` is the one place that writes
    aiohttp's private attribute (tests/network/test_keepalive.py fails if it goes).
    """

    __slots__ = ("_connector", "_heard", "seconds")

    def __init__(self, connector: aiohttp.TCPConnector) -> None:
        self._connector = connector
        self._heard: str | None = None
        self.seconds = IDLE_LIFE

    def heed(self, headers: Mapping[str, str]) -> None:
        """Shorten the idle life to what the answer's ``Keep-Alive`` header allows."""
        keep_alive = headers.get("Keep-Alive")
        if keep_alive is None or keep_alive == self._heard:
            return
        self._heard = keep_alive
        life = advertised_life(keep_alive)
        if life is not None and life < self.seconds:
            self.seconds = life
            _set(self._connector, life)


def idle_connector(limit: int) -> aiohttp.TCPConnector:
    """A connector of at most *limit* connections, each reused while idle `IDLE_LIFE` s."""
    return aiohttp.TCPConnector(limit=limit, keepalive_timeout=IDLE_LIFE)


def _set(connector: aiohttp.TCPConnector, seconds: float) -> None:
    # Should aiohttp rename it, IDLE_LIFE still holds: a request is never broken for it.
    if isinstance(getattr(connector, "_keepalive_timeout", None), float):
        connector._keepalive_timeout = seconds


def server_has_closed(writer: object) -> bool:
    """Whether the server has closed the connection *writer* writes to, unseen as yet.

    The event loop learns of a FIN only when it next reads; a pooled connection can look
    alive for that moment. Asks the kernel instead (``poll``, no wait). False where that
    cannot be asked (no ``POLLRDHUP``: not Linux; no socket).
    """
    transport = getattr(writer, "transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or not _CLOSED & getattr(select, "POLLRDHUP", 0):
        return False
    poller = select.poll()
    poller.register(sock.fileno(), _CLOSED)
    return bool(poller.poll(0))

"""The fleet's learned rate: one Redis key, read by every process, changed by compare-and-set.

Each process keeps a copy, read again when it is a moment old, so a 429 seen by one
lowers the rate of all within that moment, and a process that starts later adopts the
rate the fleet has learned. A change is decided here, by the same `Aimd` transitions as
for a single process, and written only if the key still holds the state it was decided
from (a Lua compare-and-set: EVAL, GET and SET, within the documented ACL). So when N
processes find the rate due an increase at once, one of them raises it and the others
find it already changed: one step per interval for the fleet, not N.

A process uses the fleet's rate within its own bounds (`Aimd.within`): a rate another
process learned, or a stranger wrote, never makes it send faster than its
``max_requests_per_second`` nor slower than the floor. The times in the state are the
fleet's (Redis's clock, see `Schedule.now`); a 429 is matched to the rate it was sent
under by version, not by time. A key of another type or that holds no state is
replaced by a fresh start, and said so once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._adaptive import Aimd, RateState
from .._throttle import Pace, Slot
from .connection import redis_errors
from .schedule import Schedule, Turn

__all__ = ["SharedRate"]

#: Seconds a process trusts its copy of the fleet's rate before reading it again.
REFRESH = 0.25
#: Seconds the learned rate outlives the fleet's last change to it.
KEEP = 24 * 3600
#: Tries at a compare-and-set before giving the decision up (others are deciding).
TRIES = 3

#: A key of another type counts as empty: it is replaced, never a reason to stop.
_SWAP = """
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then current = false end
if (current or '') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return ARGV[2]
end
return current
"""


class SharedRate:
    """The learned rate a fleet shares in Redis under the key *key* makes of *name*.

    *fresh* is called first in every entry point: after a fork it gives the child its own
    connections and this object its own turn (`start_afresh`).
    """

    shared = True

    def __init__(
        self,
        client: Callable[[], Awaitable[Any]],
        key: Callable[[str], str],
        name: str,
        aimd: Aimd,
        window: Callable[[float], Awaitable[bool]],
        on_error: Callable[[BaseException], None],
        fresh: Callable[[], None],
    ) -> None:
        self._client = client
        self._fresh = fresh
        self._key = key
        self._name = name
        self._aimd = aimd
        self._window = window
        self._on_error = on_error
        self._errors = redis_errors()
        self._script: tuple[Any, Any] | None = None
        self._schedule = Schedule(client, key, f"{name}:next", (name, aimd))
        self._turn: asyncio.Lock | None = None
        #: The fleet's rate in this process's bounds, and the value in Redis it was read
        #: from (what a compare-and-set expects to find).
        self.state: RateState | None = None
        self._text = ""
        self._sent_under = aimd.start(0.0)
        self._read_at = -math.inf
        self.pace = Pace(lambda: self.current_rate)

    @property
    def current_rate(self) -> float:
        return self.state.rate if self.state is not None else self._aimd.initial

    async def take(self) -> Slot:
        """Return when the fleet's rate lets one more request go from this process."""
        # One reservation at a time per process: else each of its waiting requests would
        # book a slot ahead, at a rate that may have changed by the time the last comes.
        self._fresh()
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            # Reserved at a rate, the request belongs to it, whatever is learned meanwhile.
            self._sent_under = await self.refresh()
            held = await self._window(self._sent_under.rate)
            return Slot(self._sent_under.version, held)

    async def reserve(self, rate: float) -> Turn:
        """Reserve the fleet's next free send time at the learned rate (*rate* if Redis has
        none). Keeps the rate it was reserved at."""
        turn = await self._schedule.reserve(1 / rate)
        if turn.learned is not None:
            state = self._keep(turn.learned.decode("utf-8", "replace"))
            if state is not None and turn.reserved:
                self._sent_under = state
        return turn

    async def hold(self, seconds: float) -> None:
        """Hold the fleet's schedule for *seconds* from now (a 429's Retry-After)."""
        self._fresh()
        try:
            await self._schedule.hold(seconds)
        except self._errors as exc:
            self._on_error(exc)

    async def refresh(self) -> RateState:
        """The fleet's rate, read again if this process's copy is a moment old."""
        if self.state is not None and time.monotonic() - self._read_at < REFRESH:
            return self.state
        try:
            text, state = await self._read()
            if state is None:  # the first process, or a stranger's value: start afresh
                if text:
                    self._schedule.repaired(self._key(self._name), "held no learned rate")
                fresh = self._aimd.start(self._schedule.now())
                state = self._keep(await self._swap(text, fresh))
                if state is None:  # gone again meanwhile: this process starts afresh
                    state = self._keep(fresh.encode())
                    assert state is not None
        except self._errors as exc:
            self._on_error(exc)
            if self.state is None:
                self.state = self._aimd.start(self._schedule.now())
            return self.state
        return state

    async def _read(self) -> tuple[str, RateState | None]:
        """The key's value (a key of another type: a value no state matches), and the
        state it holds, adopted."""
        import redis.exceptions

        client = await self._client()
        try:
            raw = await client.get(self._key(self._name))
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            self._schedule.repaired(self._key(self._name), "was of another type")
            return "", None
        text = "" if raw is None else raw.decode("utf-8", "replace")
        return text, self._keep(text) if text else None

    async def answered(self, slot: Slot, status: int) -> None:
        """Decide from a 429 or a success, for the whole fleet."""
        self._fresh()
        aimd = self._aimd
        if status == 429:

            def change(state: RateState) -> RateState:
                return aimd.limited(state, slot.version, self._schedule.now())

        elif status == 200:

            def change(state: RateState) -> RateState:
                return aimd.succeeded(state, slot.version, self._schedule.now(), slot.held)

        else:
            return
        state, text = self.state, self._text
        # Most answers change nothing even by this process's copy: no need to ask Redis.
        if state is None or change(state) is state:
            return
        try:
            for _ in range(TRIES):
                new = change(state)
                if new is state:
                    return
                text = await self._swap(text, new)
                won = self._keep(text)
                if won is None or text == new.encode():
                    return  # written; or a stranger's value, replaced at the next refresh
                state = won
        except self._errors as exc:
            self._on_error(exc)

    async def _swap(self, expected: str, new: RateState) -> str:
        """Write *new* if the key still holds *expected*: what the key holds then."""
        client = await self._client()
        if self._script is None or self._script[0] is not client:
            self._script = (client, client.register_script(_SWAP))
        raw = await self._script[1](
            keys=[self._key(self._name)], args=[expected, new.encode(), KEEP]
        )
        return "" if raw is None else raw.decode("utf-8", "replace")

    def start_afresh(self) -> None:
        """In a forked child: the parent's task holding the turn did not come along."""
        self._turn = None

    def _keep(self, text: str) -> RateState | None:
        """The state *text* holds, in this process's bounds (None if it holds none); kept
        as the fleet's rate unless it is older than the one kept."""
        state = RateState.decode(text)
        if state is None:
            return None
        state = self._aimd.within(state)
        held = self.state
        # An answer that left Redis before a newer one this process already has: stale.
        # (A fresh start after the key expired has a lower version but a later time.)
        if held is None or state.version >= held.version or state.changed_at > held.changed_at:
            self.state, self._text = state, text
            self._read_at = time.monotonic()
        return state

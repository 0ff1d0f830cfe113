"""The fleet's learned rate: one Redis key, read by every process, changed by compare-and-set.

Each process keeps a copy, read again when it is a moment old, so a 429 seen by one
lowers the rate of all within that moment, and a process that starts later adopts the
rate the fleet has learned. A change is decided here, by the same `Aimd` transitions as
for a single process, and written only if the key still holds the state it was decided
from (a Lua compare-and-set: EVAL, GET and SET, within the documented ACL). So when N
processes find the rate due an increase at once, one of them raises it and the others
find it already changed: one step per interval for the fleet, not N.

The times in the state are wall-clock (``time.time()``): the fleet's hosts are assumed
to keep their clocks in sync (NTP); a 429 is matched to the rate it was sent under by
version, not by time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._adaptive import Aimd, RateState
from ._redis import redis_errors
from ._redis_schedule import Schedule
from ._throttle import Pace, Slot

__all__ = ["SharedRate"]

#: Seconds a process trusts its copy of the fleet's rate before reading it again.
REFRESH = 0.25
#: Seconds the learned rate outlives the fleet's last change to it.
KEEP = 24 * 3600
#: Tries at a compare-and-set before giving the decision up (others are deciding).
TRIES = 3

_SWAP = """
local current = redis.call('GET', KEYS[1])
if (current or '') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return ARGV[2]
end
return current
"""


class SharedRate:
    """The learned rate a fleet shares in Redis under *key*.

    *fresh* is called first in every entry point: after a fork it gives the child its own
    connections and this object its own turn (`start_afresh`).
    """

    shared = True

    def __init__(
        self,
        client: Callable[[], Any],
        key: str,
        aimd: Aimd,
        window: Callable[[float], Awaitable[bool]],
        on_error: Callable[[BaseException], None],
        fresh: Callable[[], None],
    ) -> None:
        self._client = client
        self._fresh = fresh
        self._key = key
        self._aimd = aimd
        self._window = window
        self._on_error = on_error
        self._errors = redis_errors()
        self._script: Any = None
        self._schedule = Schedule(client, f"{key}:next", key)
        self._turn: asyncio.Lock | None = None
        self.state: RateState | None = None
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

    async def reserve(self, rate: float) -> float:
        """Reserve the fleet's next free send time at the learned rate (*rate* if Redis has
        none): seconds until it comes."""
        return await self._reserve(time.time(), 1 / rate, learned=True)

    async def hold(self, seconds: float) -> None:
        """Hold the fleet's schedule for *seconds* from now (a 429's Retry-After)."""
        self._fresh()
        try:
            await self._reserve(time.time() + seconds, 0.0, learned=False)
        except self._errors as exc:
            self._on_error(exc)

    async def _reserve(self, earliest: float, gap: float, learned: bool) -> float:
        """Take the schedule's next free time, not before *earliest*, and move it on:
        seconds from *earliest* until the time taken. Keeps the state it was taken at."""
        wait, raw = await self._schedule.reserve(earliest, gap, learned)
        state = None if raw is None else RateState.decode(raw.decode("utf-8", "replace"))
        if state is not None:
            self._keep(state)
            if learned:
                self._sent_under = state
        return float(wait)

    async def refresh(self) -> RateState:
        """The fleet's rate, read again if this process's copy is a moment old."""
        if self.state is not None and time.monotonic() - self._read_at < REFRESH:
            return self.state
        try:
            raw = await self._client().get(self._key)
            text = "" if raw is None else raw.decode("utf-8", "replace")
            state = RateState.decode(text) if text else None
            if state is None:  # the first process, or a stranger's value: start afresh
                state = await self._swap(text, self._aimd.start(time.time()))
        except self._errors as exc:
            self._on_error(exc)
            if self.state is None:
                self.state = self._aimd.start(time.time())
            return self.state
        self._keep(state)
        return state

    async def answered(self, slot: Slot, status: int) -> None:
        """Decide from a 429 or a success, for the whole fleet."""
        self._fresh()
        aimd = self._aimd
        if status == 429:

            def change(state: RateState) -> RateState:
                return aimd.limited(state, slot.version, time.time())

        elif status == 200:

            def change(state: RateState) -> RateState:
                return aimd.succeeded(state, slot.version, time.time(), slot.held)

        else:
            return
        state = self.state
        # Most answers change nothing even by this process's copy: no need to ask Redis.
        if state is None or change(state) is state:
            return
        try:
            for _ in range(TRIES):
                new = change(state)
                if new is state:
                    return
                won = await self._swap(state.encode(), new)
                self._keep(won)
                if won.version == new.version and won.changed_at == new.changed_at:
                    return
                state = won
        except self._errors as exc:
            self._on_error(exc)

    async def _swap(self, expected: str, new: RateState) -> RateState:
        """*new* if the key still holds *expected*; else what it holds (which won)."""
        if self._script is None:
            self._script = self._client().register_script(_SWAP)
        raw = await self._script(keys=[self._key], args=[expected, new.encode(), KEEP])
        held = None if raw is None else RateState.decode(raw.decode("utf-8", "replace"))
        return held if held is not None else new

    def forget_client(self) -> None:
        """The client was closed: register the script on the next one."""
        self._script = None
        self._schedule.forget_client()

    def start_afresh(self) -> None:
        """In a forked child: the parent's task holding the turn did not come along."""
        self._turn = None

    def _keep(self, state: RateState) -> None:
        held = self.state
        # An answer that left Redis before a newer one this process already has: stale.
        # (A fresh start after the key expired has a lower version but a later time.)
        if (
            held is not None
            and state.version < held.version
            and state.changed_at <= held.changed_at
        ):
            return
        self.state = state
        self._read_at = time.monotonic()

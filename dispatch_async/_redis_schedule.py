"""The fleet's send schedule in Redis: each request reserves the next free send time.

First come, first served: a request waits until the time it reserved, and the next one,
from whichever process, gets the time one gap later. (A moving window that every process
races for, each also pacing itself to the fleet's rate, let the first process to catch a
free slot keep every later one: the others sent nothing for seconds.) The times are
wall-clock (``time.time()``): the fleet's hosts are assumed to keep their clocks in sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Schedule"]

#: The next free send time in KEYS[1], not before ARGV[1], moved on by the gap ARGV[2];
#: with ARGV[3] = "1", by 1/rate at the learned rate in KEYS[2] (its first field), so that
#: no process sends at a rate the fleet has just cut. Returns the wait and KEYS[2]'s value.
#: ('%.17g' keeps the time exact: tostring's 14 digits would round each step by up to
#: 50 us, a few percent too fast at a thousand requests a second.)
_RESERVE = """
local now = tonumber(ARGV[1])
local gap = tonumber(ARGV[2])
local state = false
if KEYS[2] then state = redis.call('GET', KEYS[2]) end
if ARGV[3] == '1' and state then
  local rate = tonumber(string.match(state, '^%S+'))
  if rate and rate > 0 then gap = 1 / rate end
end
local at = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0') or now)
local after = at + gap
local keep = math.ceil((after - now) * 1000) + 1000
redis.call('SET', KEYS[1], string.format('%.17g', after), 'PX', keep)
return {tostring(at - now), state}
"""


class Schedule:
    """The fleet's next free send time, under *key*; *rate_key* holds a learned rate."""

    def __init__(self, client: Callable[[], Any], key: str, rate_key: str | None = None) -> None:
        self._client = client
        self._keys = [key] if rate_key is None else [key, rate_key]
        self._script: Any = None

    async def reserve(
        self, earliest: float, gap: float, learned: bool = False
    ) -> tuple[float, bytes | None]:
        """Take the next free time, not before *earliest*, and move it on by *gap* (or by
        the learned rate's): seconds from *earliest* until the time taken, and the
        learned rate's raw value (None without one)."""
        if self._script is None:
            self._script = self._client().register_script(_RESERVE)
        wait, raw = await self._script(
            keys=self._keys, args=[earliest, gap, "1" if learned else "0"]
        )
        return float(wait), raw

    def forget_client(self) -> None:
        """The client was closed: register the script on the next one."""
        self._script = None

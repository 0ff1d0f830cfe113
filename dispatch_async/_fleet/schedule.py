"""The fleet's send schedule in Redis: each request reserves the next free send time.

First come, first served: a request waits until the time it reserved, and the next one,
from whichever process, gets the time one gap later. (A moving window that every process
races for, each also pacing itself to the fleet's rate, let the first process to catch a
free slot keep every later one: the others sent nothing for seconds.)

No process can hold the others back for longer than the rate justifies:

- The times are Redis's (``TIME``, inside the script), so a host whose clock is off moves
  nothing. (A Redis user that may not run ``TIME`` falls back to each process's own
  clock, and says so once.)
- The schedule runs at most `AHEAD_TURNS` gaps (or `AHEAD_SECONDS`) ahead of now: a
  request finding it full reserves nothing and asks again when a turn frees. So a time
  further ahead than twice that was written by no member of the fleet (a clock that was
  off, a hand-set value): it is reset, as is a key of another type or that holds no time.
- A shared Retry-After (the learned rate's ``hold``) lasts `HOLD_SECONDS` at most.

With a learned rate, each reservation is spaced at the rate Redis holds at that moment,
within the reserving process's bounds, so no process sends at a rate the fleet has just
cut nor outside the bounds it was given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from .._adaptive import Aimd
from .._retry import RetryPolicy

__all__ = ["AHEAD_SECONDS", "AHEAD_TURNS", "HOLD_SECONDS", "Schedule", "Turn"]

log = logging.getLogger("dispatch_async")

#: Turns the schedule may hold ahead of now: a fleet of up to this many processes waiting
#: at once is served first come, first served; more take turns asking again.
AHEAD_TURNS = 8
#: ...or this many seconds' worth, at a high rate (else processes would ask every few ms).
AHEAD_SECONDS = 1.0
#: The longest Retry-After the whole fleet is held for: a longer one holds only the
#: process that was told (the longest a session honours by default).
HOLD_SECONDS = float(attrs.fields(RetryPolicy).max_retry_after.default or 0)

#: The clock (Redis's; the caller's, ARGV[1], if the ACL refuses TIME) and a reader of
#: times that says what is wrong with a stored one. A number is sent and stored as
#: '%.17g': tostring's 14 digits would round each step by up to 50 us, a few percent too
#: fast at a thousand requests a second.
_COMMON = """
local now, clock = tonumber(ARGV[1]), 'own'
local t = redis.pcall('TIME')
if not t.err then now, clock = tonumber(t[1]) + tonumber(t[2]) / 1000000, 'redis' end
local function stored(key, most)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then return nil, 'was of another type' end
  if not value then return nil end
  local at = tonumber(value)
  if not at or at ~= at or at == math.huge or at == -math.huge then
    return nil, 'held no time'
  end
  if at > now + most then return nil, 'was ' .. math.floor(at - now) .. ' s ahead' end
  return at
end
local function keep(key, at)
  redis.call('SET', key, string.format('%.17g', at), 'PX', math.ceil((at - now) * 1000) + 1000)
end
"""

#: KEYS: the next free time; with a learned rate, the rate (KEYS[2]) and the fleet's hold
#: (KEYS[3]). ARGV: the caller's clock, the gap (used without a learned rate), the rate's
#: bounds (the most: 0 for none), AHEAD_TURNS, AHEAD_SECONDS, HOLD_SECONDS. Returns
#: whether a time was reserved, the seconds to wait (until it; else until asking
#: again), the learned rate's value, the clock and its time, what was reset.
_RESERVE = (
    _COMMON
    + """
local gap = tonumber(ARGV[2])
local state = false
if KEYS[2] then
  state = redis.pcall('GET', KEYS[2])
  if type(state) ~= 'string' then state = false end
  local rate = state and tonumber(string.match(state, '^%S+'))
  if rate and rate > 0 and rate < math.huge then
    rate = math.max(rate, tonumber(ARGV[3]))
    if tonumber(ARGV[4]) > 0 then rate = math.min(rate, tonumber(ARGV[4])) end
    gap = 1 / rate
  end
end
local ahead = math.max(tonumber(ARGV[5]) * gap, tonumber(ARGV[6]))
local reset = false
local base, at, why = now, nil, nil
if KEYS[3] then
  local hold
  hold, why = stored(KEYS[3], tonumber(ARGV[7]))
  if why then redis.call('DEL', KEYS[3]); reset = {KEYS[3], why} end
  if hold and hold > base then base = hold end
end
-- Twice the turns it may hold: after the rate doubled, the turns taken before are legal.
at, why = stored(KEYS[1], base - now + 2 * ahead)
if why then reset = {KEYS[1], why} end
if not at or at < base then at = base end
local fmt = '%.17g'
if at - base > ahead - gap / 2 then
  local again = string.format(fmt, at - now - ahead + gap)
  return {0, again, state, clock, string.format(fmt, now), reset}
end
keep(KEYS[1], at + gap)
return {1, string.format(fmt, at - now), state, clock, string.format(fmt, now), reset}
"""
)

#: KEYS: the fleet's hold. ARGV: the caller's clock, seconds, HOLD_SECONDS. Holds the
#: fleet until that many seconds (HOLD_SECONDS at most) from now, unless held longer.
_HOLD = (
    _COMMON
    + """
local most = tonumber(ARGV[3])
local hold, why = stored(KEYS[1], most)
local till = now + math.min(tonumber(ARGV[2]), most)
if why then redis.call('DEL', KEYS[1]) end
if not hold or till > hold then keep(KEYS[1], till) end
return {clock, string.format('%.17g', now), why and {KEYS[1], why} or false}
"""
)


@attrs.frozen
class Turn:
    """What a reservation got: *wait* seconds until the time *reserved* (else until
    asking again), and the learned rate's raw value (None without one)."""

    reserved: bool
    wait: float
    learned: bytes | None


class Schedule:
    """The fleet's next free send time, under the key *key* makes of *name*; with
    *learned* (the name of a learned rate, and its bounds), spaced at that rate and held
    by a Retry-After. *client* gives the connected client.

    It keeps the fleet's clock: Redis's time, as of its last answer.
    """

    def __init__(
        self,
        client: Callable[[], Awaitable[Any]],
        key: Callable[[str], str],
        name: str,
        learned: tuple[str, Aimd] | None = None,
    ) -> None:
        self._client = client
        self._key = key
        self._names = [name]
        self._bounds = ["0", "0"]  # (read only with a learned rate)
        if learned is not None:
            rate_name, aimd = learned
            self._names += [rate_name, f"{rate_name}:hold"]
            self._bounds = [repr(aimd.minimum), repr(aimd.max_requests_per_second or 0)]
        self._scripts: tuple[Any, Any, Any, list[str]] | None = None
        self._offset = 0.0
        self._told: set[str] = set()

    def now(self) -> float:
        """The fleet's time: Redis's, by this host's clock and the difference last seen."""
        return time.time() + self._offset

    async def reserve(self, gap: float) -> Turn:
        """Take the next free time, and move it on by *gap* (or by the learned rate's)."""
        reserve, _, keys = await self._registered()
        mine = time.time()
        reply = await reserve(
            keys=keys,
            args=[repr(mine), repr(gap), *self._bounds, AHEAD_TURNS, AHEAD_SECONDS, HOLD_SECONDS],
        )
        taken, wait, learned, clock, now, reset = reply
        self._clocked(clock, float(now), mine, reset)
        return Turn(bool(taken), float(wait), learned or None)

    async def hold(self, seconds: float) -> None:
        """Hold the fleet's next send for *seconds* (`HOLD_SECONDS` at most) from now."""
        _, hold, keys = await self._registered()
        mine = time.time()
        clock, now, reset = await hold(
            keys=keys[2:], args=[repr(mine), repr(seconds), HOLD_SECONDS]
        )
        self._clocked(clock, float(now), mine, reset)

    def repaired(self, key: str, what: str) -> None:
        """Say once per process that *key* was reset because it *what*."""
        if key not in self._told:
            self._told.add(key)
            log.warning("the fleet's rate limit in Redis: %s %s; it was reset", key, what)

    async def _registered(self) -> tuple[Any, Any, list[str]]:
        """The scripts, registered on the current client (a new one after a fork or a
        close), and the keys they use (braced on a Cluster: known once connected)."""
        client = await self._client()
        if self._scripts is None or self._scripts[0] is not client:
            keys = [self._key(name) for name in self._names]
            reserve, hold = client.register_script(_RESERVE), client.register_script(_HOLD)
            self._scripts = (client, reserve, hold, keys)
        return self._scripts[1:]

    def _clocked(self, clock: bytes, now: float, mine: float, reset: Any) -> None:
        if clock == b"redis":
            self._offset = now - mine
        elif "TIME" not in self._told:
            self._told.add("TIME")
            log.warning(
                "the Redis user may not run TIME: the fleet's rate limit keeps time by "
                "each host's clock (allow +time, see the fleet guide's ACL)"
            )
        if reset:
            key, what = (part.decode("utf-8", "replace") for part in reset)
            self.repaired(key, what)

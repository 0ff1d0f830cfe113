"""Learning the request rate the service accepts, from its answers: AIMD.

While requests go through and the rate holds them back, the rate rises by one step per
interval; a 429 cuts it by a factor. Until the first 429 the rate doubles per interval
(a slow start: the limit may be 10 or 10,000 requests/s), and the step is then a
fraction of the rate that drew the 429, so the climb back takes the same few seconds
at any scale.

Pure: each transition takes a state and returns the next (the same object when nothing
changes), so one implementation decides for a single process (`_throttle`) and for a
fleet, where the state lives in Redis and a compare-and-set applies each decision once
(`_fleet/learned_rate.py`). A state has a version: a 429 to a request sent under an older
version says the old rate was too high, which the newer state already acted on.
"""

from __future__ import annotations

from typing import Literal

import attrs

from ._exceptions import ConfigurationError

__all__ = ["Aimd", "RateState"]

Reason = Literal["start", "increase", "decrease"]


@attrs.frozen
class RateState:
    """The learned rate in requests per second, and what made it so."""

    rate: float
    version: int
    changed_at: float
    step: float | None = None  # None while probing (before the first 429)
    reason: Reason = "start"

    def encode(self) -> str:
        """A string for Redis: the same state always encodes the same way."""
        step = "-" if self.step is None else repr(self.step)
        return f"{self.rate!r} {self.version} {self.changed_at!r} {step} {self.reason}"

    @classmethod
    def decode(cls, text: str) -> RateState | None:
        """The state *text* holds, or None if it is not one (a stranger wrote the key)."""
        try:
            rate, version, changed_at, step, reason = text.split(" ")
            state = cls(
                float(rate),
                int(version),
                float(changed_at),
                None if step == "-" else float(step),
                reason,  # type: ignore[arg-type]
            )
        except ValueError:
            return None
        if not rate_ok(state.rate) or state.reason not in ("start", "increase", "decrease"):
            return None
        return state


def rate_ok(rate: float) -> bool:
    return rate > 0 and rate != float("inf")


def _positive(_: object, attribute: attrs.Attribute[float], value: float | None) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not rate_ok(value)
    ):
        raise ConfigurationError(f"{attribute.name} must be a positive number")


@attrs.frozen
class Aimd:
    """How the rate is learned; ``max_requests_per_second`` bounds it (None: only the service)."""

    max_requests_per_second: float | None = attrs.field(default=None, validator=_positive)
    initial: float = attrs.field(default=10.0, validator=_positive)
    minimum: float = attrs.field(default=0.1, validator=_positive)
    #: Each 429 multiplies the rate by this.
    factor: float = 0.8
    #: Each step, once probing is over, is this share of the rate that drew the last 429.
    step_share: float = 0.04
    #: Seconds between two increases.
    interval: float = 1.0

    def start(self, now: float) -> RateState:
        """The state before anything is known."""
        return RateState(self.bounded(self.initial), 1, now)

    def succeeded(self, state: RateState, version: int, now: float, held: bool) -> RateState:
        """A request sent under *version* went through; *held*: the rate had made it wait.

        A rate that holds nothing back is not being tested, so it does not rise. A change
        dated more than an interval ahead was timed by a clock that is off: were it
        trusted, nothing would rise until that clock's time came.
        """
        if not held or version != state.version:
            return state
        if -self.interval < now - state.changed_at < self.interval:
            return state
        grown = state.rate * 2 if state.step is None else state.rate + state.step
        rate = self.bounded(grown)
        if rate == state.rate:
            return state
        return RateState(rate, state.version + 1, now, state.step, "increase")

    def limited(self, state: RateState, version: int, now: float) -> RateState:
        """The service answered 429 to a request sent under *version*."""
        if version != state.version:
            return state
        step = max(state.rate * self.step_share, self.minimum)
        rate = self.bounded(state.rate * self.factor)
        return RateState(rate, state.version + 1, now, step, "decrease")

    def within(self, state: RateState) -> RateState:
        """*state* with its rate in these bounds (a fleet's rate read from Redis may not be)."""
        rate = self.bounded(state.rate)
        return state if rate == state.rate else attrs.evolve(state, rate=rate)

    def bounded(self, rate: float) -> float:
        """*rate*, at least ``minimum`` and at most ``max_requests_per_second``."""
        rate = max(rate, self.minimum)
        return (
            rate
            if self.max_requests_per_second is None
            else min(rate, self.max_requests_per_second)
        )

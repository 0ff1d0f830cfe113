"""Hooks that see every call, chunk attempt, retry, pause, learned rate and token of a session.

A hook is any callable taking one event. Pass ``hooks=[...]`` to a `DispatchSession`,
or `set_hooks` for every session. Built in: `LoggingHook` (the default),
`OpenTelemetryHook` (extra ``otel``) and `PrometheusHook` (extra ``prometheus``).
"""

from ._events import (
    CallFinished,
    CallStarted,
    ChunkAnswered,
    ChunkSent,
    ChunkSplit,
    Event,
    Hook,
    Paused,
    RateChanged,
    RetryScheduled,
    TokenObtained,
)
from ._hooks import get_hooks, set_hooks
from ._logging import LoggingHook
from ._otel import OpenTelemetryHook
from ._prometheus import PrometheusHook

__all__ = [
    "CallFinished",
    "CallStarted",
    "ChunkAnswered",
    "ChunkSent",
    "ChunkSplit",
    "Event",
    "Hook",
    "LoggingHook",
    "OpenTelemetryHook",
    "Paused",
    "PrometheusHook",
    "RateChanged",
    "RetryScheduled",
    "TokenObtained",
    "get_hooks",
    "set_hooks",
]

"""The default hook: events as log records with structured ``extra=`` fields.

The library logger has a NullHandler, so nothing prints unless the application
configures logging; ``DISPATCH_LOG=info|debug`` adds a readable stderr handler
without code (like the openai SDK's OPENAI_LOG).
"""

from __future__ import annotations

import logging
import os
import sys

import attrs

from ._events import (
    CallFinished,
    ChunkAnswered,
    ChunkSplit,
    Event,
    Paused,
    RetryScheduled,
)

__all__ = ["LoggingHook", "configure_library_logger"]

_LOGGER = "dispatch_async"


class LoggingHook:
    """Log each event on ``dispatch_async.events``, at a level for what it says.

    What every call does (started, each chunk sent and answered, finished, tokens, the
    learned rate) is DEBUG: a worker sending one call per task must not log a line per
    task. Retries and pauses are INFO, and so is an attempt that failed without the
    service acting; an attempt the service may have acted on, a request refused as too
    large (`ChunkSplit`), and a call that ended with failed recipients or an error, are
    WARNING.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(f"{_LOGGER}.events")

    def __repr__(self) -> str:
        return f"LoggingHook({self._log.name!r})"

    def __call__(self, event: Event) -> None:
        level = _level(event)
        if not self._log.isEnabledFor(level):
            return
        fields = attrs.asdict(event, filter=lambda a, _: a.name != "headers")
        extra = {f"dispatch_{name}": value for name, value in fields.items()}
        extra["dispatch_event"] = type(event).__name__
        text = " ".join(f"{name}={value}" for name, value in fields.items())
        self._log.log(level, "%s %s", type(event).__name__, text, extra=extra)


def _level(event: Event) -> int:
    if isinstance(event, ChunkAnswered) and event.error is not None:
        return logging.WARNING if event.maybe_sent else logging.INFO
    if isinstance(event, CallFinished):
        failed = event.outcomes.get("maybe_sent", 0) + event.outcomes.get("not_sent", 0)
        return logging.WARNING if failed or event.error is not None else logging.DEBUG
    if isinstance(event, Paused | RetryScheduled):
        return logging.INFO
    if isinstance(event, ChunkSplit):
        return logging.WARNING  # the job goes on, but its chunk_size is too large
    return logging.DEBUG


def configure_library_logger(environ: dict[str, str] | None = None) -> None:
    """A NullHandler on the library logger, and a stderr handler if DISPATCH_LOG asks."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    wanted = (environ if environ is not None else os.environ).get("DISPATCH_LOG", "").lower()
    level = {"info": logging.INFO, "debug": logging.DEBUG}.get(wanted)
    if level is None or any(getattr(h, "_dispatch_log", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s"))
    handler._dispatch_log = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)


configure_library_logger()

"""Which hooks run: set per session (``hooks=``) or for the process (`set_hooks`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ._events import Event, Hook

__all__ = ["emit", "get_hooks", "set_hooks"]

log = logging.getLogger("dispatch_async")

_global: tuple[Hook, ...] | None = None
_complained: set[int] = set()


def set_hooks(hooks: Iterable[Hook] | None) -> None:
    """Set the hooks of every session created without ``hooks=``.

    None restores the default (logging); an empty iterable turns instrumentation off.
    """
    global _global
    _global = None if hooks is None else tuple(hooks)


def get_hooks() -> tuple[Hook, ...]:
    """The hooks a session without ``hooks=`` reports to."""
    if _global is None:
        from ._logging import LoggingHook

        return (_DEFAULT.setdefault("logging", LoggingHook()),)
    return _global


_DEFAULT: dict[str, Hook] = {}


def emit(hooks: tuple[Hook, ...], event: Event) -> None:
    """Give *event* to each hook; a hook that raises is logged once and then ignored."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:
            if id(hook) not in _complained:
                _complained.add(id(hook))
                log.exception("the instrumentation hook %r failed; its errors are ignored", hook)

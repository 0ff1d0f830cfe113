"""Ctrl-C and SIGTERM heard on the running loop for a while, then left as they were.

asyncio's ``remove_signal_handler`` sets Python's default SIGINT handler whatever was
there before: in a process started in the background, which ignores SIGINT, a job run and
stopped in it would leave Ctrl-C turned on. The handlers found are put back instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["on_stop_signals"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[int], object]) -> Iterator[None]:
    """Call *callback* (with the signal's number) on the running loop for each SIGINT or
    SIGTERM while inside, e.g. to stop a bulk job cleanly; then put back the handlers found.

    Where the loop cannot handle signals (off the main thread, on Windows), nothing is
    changed and the signals do what they did.
    """
    loop = asyncio.get_running_loop()
    found = {}
    for signum in _STOP_SIGNALS:
        previous = signal.getsignal(signum)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, callback, signum)
            found[signum] = previous
    try:
        yield
    finally:
        for signum, previous in found.items():
            loop.remove_signal_handler(signum)
            if previous is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, previous)

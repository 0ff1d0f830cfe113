"""What a forked child inherits from its parent's event loop: kept, never used, never closed.

After ``fork()`` the child holds copies of the parent's loop, connections and tasks. Using
them would talk on the parent's sockets; even closing them is unsafe (an epoll set and a
TLS session are shared with the parent: a close can unregister the parent's sockets or
end its connections), and letting them be collected would run exactly that cleanup, with
"unclosed" warnings. So the child keeps them, untouched, for its whole life.
"""

from __future__ import annotations

import ctypes

__all__ = ["left_by_parent"]

_INHERITED: list[object] = []
# One reference that is never given back: interpreter shutdown, which clears module
# globals and collects what they held, then leaves this list (and what it holds) alone.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_INHERITED))


def left_by_parent(*objects: object) -> None:
    """Keep *objects* (the parent's, in a forked child) alive and untouched until exit."""
    _INHERITED.extend(objects)

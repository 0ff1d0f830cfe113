"""``python -m dispatch_async._cli``: the ``dispatch-async`` command."""

from __future__ import annotations

from . import main

if __name__ == "__main__":  # pragma: no branch - this module is only ever run
    main()

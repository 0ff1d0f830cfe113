"""``python -m dispatch_async.testing``: run the simulator standalone (see ``--help``)."""

from __future__ import annotations

import sys

from ._standalone import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

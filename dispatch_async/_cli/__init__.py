"""The ``dispatch-async`` command: bulk sends, a queue of workers, the demo, the simulator.

A layer above the SDK: it uses only the public names of ``dispatch_async`` (and of
``dispatch_async.testing``), and nothing in the SDK imports it. Click is the ``[cli]``
extra: without it, ``main`` says what to install instead of failing with a traceback.

The commands are at this package's top; below them four wings, imported one way (down):
``queued`` -> ``job`` -> ``reading``, and ``screen`` by all (docs/guides/contributing.md).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

INSTALL_HINT = 'the command line needs the cli extra: pip install "dispatch-async[cli]"'


def main(argv: Sequence[str] | None = None) -> None:
    """The ``dispatch-async`` script."""
    try:
        from .commands import cli
    except ImportError as exc:
        if exc.name not in ("click", "tqdm", "phonenumbers", "aiolimiter"):
            raise  # pragma: no cover - a broken installation, not a missing extra
        sys.stderr.write(f"dispatch-async: {INSTALL_HINT} ({exc.name} is missing)\n")
        raise SystemExit(2) from None
    cli.main(args=list(argv) if argv is not None else None, prog_name="dispatch-async")

"""The one error a person sees (a Problem: one line on stderr, no traceback) and the exit codes."""

from __future__ import annotations

import errno

__all__ = ["DISK_ERRORS", "FAILED", "OK", "USAGE", "Problem"]

#: Exit codes: every line sent or validly rejected; some lines failed (or the job stopped
#: early); a usage or configuration error.
OK, FAILED, USAGE = 0, 1, 2
#: Errors of the disk rather than of the file named: the run failed (exit 1), the usage
#: is fine.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG})


class Problem(Exception):
    """A reason to stop with one clear line on stderr and no traceback."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

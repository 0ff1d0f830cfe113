"""A real server binary (nginx, tinyproxy) run by a test on 127.0.0.1, and stopped after.

The launcher is tools/daemon.py's (the benchmarks use it too); here a missing binary is a
skip (a failure in CI) and a server that does not start fails the test.
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest

from tools.daemon import START_TIMEOUT, free_port
from tools.daemon import running as _running

__all__ = ["START_TIMEOUT", "binary", "free_port", "running"]


def binary(path: str, package: str) -> str:
    """The server at *path*; a skip with the reason when it is missing, a failure in CI."""
    found = shutil.which(path)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {path} (.ci/run installs the {package} package)")
        pytest.skip(f"{path} is missing (apt-get install -y {package})")
    return found


#: *command* running until the block ends, once it listens on *port*; a failed start fails
#: the test.
running = functools.partial(_running, fail=pytest.fail)

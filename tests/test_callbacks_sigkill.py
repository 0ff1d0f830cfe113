"""No acknowledged callback is lost when the receiver is killed under load.

``benchmarks/callbacks.py --kill`` (the one implementation of this check) starts
``dispatch-async callbacks serve`` on a SQLite file, posts vendor-shaped events over
real HTTP from 64 connections, SIGKILLs the receiver, restarts it on the same file, and
looks every event it had answered 200 up in the store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "callbacks.py"


def test_every_acknowledged_event_survives_a_sigkill(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [
            sys.executable,
            str(SCRIPT),
            "--kill",
            "--seconds",
            "4",
            "--messages",
            "100000",
            "--connections",
            "64",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        timeout=300,
        env={**os.environ},
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    result = orjson.loads(done.stdout)
    assert result["acknowledged"] > 100  # it was under load when killed
    assert result["lost"] == 0
    assert result["acknowledged_and_stored"] == result["acknowledged"]
    assert result["posted"] >= result["acknowledged"]

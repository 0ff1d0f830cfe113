"""The processes a benchmark runs: the simulator in its own process, each measurement in
a fresh interpreter (benchmarks/workloads.py), and what they cost in CPU.

Used by run.py's phases and by the benchmarks that run on their own (ab, cli, fleet, chaos).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOADS = HERE / "workloads.py"
STATS_SERVER = HERE / "stats_server.py"
CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]

    def cpu_seconds(self) -> float:
        """The server process's user+sys CPU so far (Linux /proc; 0.0 elsewhere)."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


@contextlib.contextmanager
def server(command: list[str], stats: dict[str, Any] | None = None) -> Iterator[Server]:
    """Start a simulator process, yield it once it printed its URL, SIGTERM it at the end.

    With *stats*, the JSON line the process prints on exit is stored into it.
    """
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and scripts
        command, stdout=subprocess.PIPE, text=True, cwd=HERE.parent
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http"):
            raise SystemExit(f"the simulator did not start: {command}")
        yield Server(url, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        if stats is not None and out.strip():
            stats.update(json.loads(out.strip().splitlines()[-1]))


def simulator(*extra: str) -> list[str]:
    return [sys.executable, "-m", "dispatch_async.testing", "--port", "0", "--fast-ids", *extra]


def child(spec: dict[str, Any], srv: Server | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; adds the server's CPU for it."""
    before = srv.cpu_seconds() if srv else 0.0
    done = subprocess.run(  # noqa: S603 - our own interpreter and scripts
        [sys.executable, str(WORKLOADS), json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=600,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"measurement {spec} failed:\n{done.stderr}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if srv is not None:
        out["server_cpu"] = srv.cpu_seconds() - before
    return out


def compile_installed() -> None:
    """Compile the package and its dependencies to bytecode, as ``pip install`` does.

    Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), every process a
    benchmark starts would compile each module it imports again, about 0.7 s of CPU per
    start that an installed copy never pays; the more a command imports, the more so.
    """
    import sysconfig

    import dispatch_async

    paths = [str(Path(dispatch_async.__file__).parent), sysconfig.get_paths()["purelib"]]
    subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *paths],
        capture_output=True,
        check=False,  # a read-only site-packages: measured as it is
    )


def import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return float(done.stdout)

"""What the blocking client costs per call: ``DispatchClient`` against ``DispatchSession``.

The same small call (``send_template`` of one recipient) is made ``calls`` times in a
row through a `DispatchClient` (each call handed from the caller's thread to the
client's loop thread and back) and through a `DispatchSession` awaited on the caller's
own loop, against the same simulator process. Each side runs in a fresh interpreter,
opened and warmed by a first call before the clock starts; the sides alternate
(session, client, session, client, ...) for ``reps`` pairs. The overhead per call is
the client's median wall time per call minus the session's (the service's own time is
in both and cancels out); the per-pair differences give its range. Target:
<= 0.3 ms per small call. ``run.py --only blocking`` includes it, or on its own:

    python benchmarks/blocking.py URL [--calls 2000] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

SECRET = "test-secret"
TARGET_MS = 0.3
KINDS = ("session", "client")


def _number(i: int) -> str:
    return f"+55119{i:08d}"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _one(kind: str, url: str, calls: int) -> dict[str, float]:
    """One side's run, in this interpreter: seconds of wall and CPU per call."""
    import dispatch_async as da

    options: dict[str, Any] = {"client_secret": SECRET, "account": "acme"}
    if kind == "client":
        with da.DispatchClient(url, **options) as client:
            client.send_template([_number(0)], template_id="pix_reminder")
            cpu0, wall0 = _cpu(), time.perf_counter()
            for i in range(calls):
                client.send_template([_number(i)], template_id="pix_reminder")
            cpu1, wall1 = _cpu(), time.perf_counter()
    else:

        async def run() -> tuple[float, float, float, float]:
            async with da.DispatchSession(url, **options) as session:
                await session.send_template([_number(0)], template_id="pix_reminder")
                cpu0, wall0 = _cpu(), time.perf_counter()
                for i in range(calls):
                    await session.send_template([_number(i)], template_id="pix_reminder")
                return cpu0, wall0, _cpu(), time.perf_counter()

        cpu0, wall0, cpu1, wall1 = asyncio.run(run())
    return {"wall": (wall1 - wall0) / calls, "cpu": (cpu1 - cpu0) / calls}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(url: str, calls: int, reps: int) -> dict[str, Any]:
    """Alternate the two sides *reps* times; per-call figures in milliseconds."""
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for _ in range(reps):
        for kind in KINDS:
            done = subprocess.run(  # noqa: S603 - our interpreter, this file
                [sys.executable, __file__, "--one", kind, url, "--calls", str(calls)],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            runs[kind].append(json.loads(done.stdout))
    ms = {kind: [r["wall"] * 1000 for r in items] for kind, items in runs.items()}
    cpu_ms = {kind: [r["cpu"] * 1000 for r in items] for kind, items in runs.items()}
    return {
        "calls": calls,
        "reps": reps,
        "wall_ms": {kind: _spread(values) for kind, values in ms.items()},
        "cpu_ms": {kind: _spread(values) for kind, values in cpu_ms.items()},
        "overhead_ms": statistics.median(ms["client"]) - statistics.median(ms["session"]),
        "overhead_pairs_ms": _spread(
            [c - s for c, s in zip(ms["client"], ms["session"], strict=True)]
        ),
        "cpu_overhead_ms": statistics.median(cpu_ms["client"])
        - statistics.median(cpu_ms["session"]),
        "raw": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--one", choices=KINDS, help="run one side here and print its JSON")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.url, args.calls)))
        return
    out = measure(args.url, args.calls, args.reps)
    out.pop("raw")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""What the blocking client costs per call: ``DispatchClient`` against ``DispatchSession``.

The same small call (``send_template`` of one recipient) is made through a
`DispatchSession`, awaited on the caller's loop, and through a `DispatchClient` (handed
from the caller's thread to the client's loop thread and back), alternately, call by
call, in one process against the same simulator process; which side goes first
alternates too. Both are opened and warmed by a first call before the clock starts.
Machine load hits both sides of a pair alike, so the overhead per call is the median of
the per-pair differences (client minus session; the service's own time cancels out);
the CPU figures are the process's user+sys time summed over each side's calls. The run
is repeated in ``reps`` fresh interpreters. Target: <= 0.3 ms per small call.
``run.py --only blocking`` includes it, or on its own:

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


def _one(url: str, calls: int) -> dict[str, float]:
    """One process's pairs: the medians, in seconds per call, and CPU per call."""
    import dispatch_async as da

    options: dict[str, Any] = {"client_secret": SECRET, "account": "acme"}
    wall: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu = dict.fromkeys(KINDS, 0.0)

    async def run() -> None:
        async with da.DispatchSession(url, **options) as session:
            with da.DispatchClient(url, **options) as client:
                sides = {
                    "session": lambda i: session.send_template(
                        [_number(i)], template_id="pix_reminder"
                    ),
                    "client": lambda i: client.send_template(
                        [_number(i)], template_id="pix_reminder"
                    ),
                }
                await sides["session"](0)
                sides["client"](0)
                for i in range(calls):
                    for kind in KINDS if i % 2 else reversed(KINDS):
                        cpu0, wall0 = _cpu(), time.perf_counter()
                        done = sides[kind](i)
                        if kind == "session":
                            await done
                        wall[kind].append(time.perf_counter() - wall0)
                        cpu[kind] += _cpu() - cpu0

    asyncio.run(run())
    return {
        "session": statistics.median(wall["session"]),
        "client": statistics.median(wall["client"]),
        "difference": statistics.median(
            c - s for c, s in zip(wall["client"], wall["session"], strict=True)
        ),
        "session_cpu": cpu["session"] / calls,
        "client_cpu": cpu["client"] / calls,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(url: str, calls: int, reps: int) -> dict[str, Any]:
    """*reps* fresh processes of *calls* pairs each; figures in milliseconds."""
    runs = []
    for _ in range(reps):
        done = subprocess.run(  # noqa: S603 - our interpreter, this file
            [sys.executable, __file__, url, "--one", "--calls", str(calls)],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        runs.append({k: v * 1000 for k, v in json.loads(done.stdout).items()})
    return {
        "calls": calls,
        "reps": reps,
        "wall_ms": {kind: _spread([r[kind] for r in runs]) for kind in KINDS},
        "cpu_ms": {kind: _spread([r[f"{kind}_cpu"] for r in runs]) for kind in KINDS},
        "overhead_ms": _spread([r["difference"] for r in runs]),
        "raw": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--one", action="store_true", help="one process's pairs, as JSON")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.url, args.calls)))
        return
    out = measure(args.url, args.calls, args.reps)
    out.pop("raw")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""The benchmark harness: SDK against a hand-written aiohttp client, side by side.

``python benchmarks/run.py`` (or ``nox -s bench``) starts the simulator in its own
process, runs every measurement in a fresh interpreter (benchmarks/workloads.py),
interleaving SDK and baseline repetitions, then prints one table and writes it as JSON
to benchmarks/results/. ``--quick`` is a smoke run with small inputs (seconds, not
minutes) whose figures are not comparable to the targets.

The processes are in processes.py, the measurements in phases.py, the table in table.py.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from phases import (
    Plan,
    phase_adaptive,
    phase_answers,
    phase_blocking,
    phase_cli,
    phase_e164,
    phase_grid,
    phase_https,
    phase_memory,
    phase_overhead,
    phase_server,
    phase_startup,
    phase_tokens,
)
from processes import HERE, server, simulator
from table import render, render_grid, table

RESULTS = HERE / "results"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


PHASES = (
    "overhead",
    "https",
    "answers",
    "server",
    "grid",
    "memory",
    "cli",
    "blocking",
    "tokens",
    "e164",
    "startup",
    "adaptive",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (seconds)")
    parser.add_argument(
        "--only", action="append", choices=PHASES, help="run only these phases (repeatable)"
    )
    parser.add_argument("--soak-seconds", type=float, help="length of the token-lifetime run")
    parser.add_argument("--output", type=Path, help="JSON path (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.soak_seconds is not None:
        plan.soak_seconds = args.soak_seconds
    phases = args.only or list(PHASES)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "versions": {
            name: _version(name) for name in ("dispatch-async", "aiohttp", "orjson", "phonenumbers")
        },
        "quick": args.quick,
        "settings": {"chunk_size": 1000, "concurrency": 8, "endpoint": "/api/v3/template"},
    }
    with server(simulator()) as srv:
        results["server_url"] = srv.url
        if "overhead" in phases:
            results["overhead"] = phase_overhead(plan, srv)
        if "https" in phases:
            results["https"] = phase_https(plan, srv)
        if "answers" in phases:
            results["answers"] = phase_answers(plan, srv)
        if "server" in phases:
            results["server"] = phase_server(plan, srv)
        if "grid" in phases:
            results["grid"] = phase_grid(plan, srv)
        if "memory" in phases:
            results["memory"] = phase_memory(plan, srv)
        if "cli" in phases:
            results["cli"] = phase_cli(plan, srv)
        if "blocking" in phases:
            results["blocking"] = phase_blocking(plan, srv)
    if "tokens" in phases:
        results["tokens"] = phase_tokens(plan)
    if "e164" in phases:
        results["e164"] = phase_e164(plan)
    if "startup" in phases:
        results["startup"] = phase_startup(plan)
    if "adaptive" in phases:
        results["adaptive"] = phase_adaptive(plan)
    results.setdefault("overhead", {})
    results["elapsed_seconds"] = time.monotonic() - started
    rows = table(results)
    results["table"] = rows
    print(render(rows))
    if "grid" in results:
        print()
        print(render_grid(results["grid"]))
    if "adaptive" in results:
        import adaptive

        print()
        print(adaptive.render(results["adaptive"]))
    print(
        f"\n{results['elapsed_seconds']:.0f}s in all"
        + (" (--quick: not comparable)" if args.quick else "")
    )
    text = json.dumps(results, indent=2)
    output = args.output
    if output is None:
        RESULTS.mkdir(exist_ok=True)
        output = RESULTS / time.strftime("bench-%Y%m%d-%H%M%S.json")
        (RESULTS / "latest.json").write_text(text)
    output.write_text(text)
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

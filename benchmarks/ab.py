"""Two or more copies of the SDK against the baseline, interleaved: is a change worth keeping?

``python benchmarks/ab.py --n 1000000 --reps 7 before=/tmp/old after=.`` runs, in each
round, the baseline and every named copy of the package (a directory holding
``dispatch_async/``, put first on ``PYTHONPATH``) in a fresh interpreter through
``workloads.py``, rotating their order from round to round so that drift on a shared
machine hits every side alike. It prints, per variant, the median client CPU (user+sys)
and throughput with min-max, and the ratio to the baseline of the same round (median and
min-max of the per-round ratios), and the CPU with the result then dropped (a result
of objects is freed outside the send's clock; a packed one frees its decoded entries
inside it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from processes import WORKLOADS, server, simulator

HERE = Path(__file__).resolve().parent


def measure(url: str, n: int, client: str, path: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = str(Path(path).resolve())
    spec = {"kind": "send", "url": url, "n": n, "client": client}
    done = subprocess.run(  # noqa: S603 - our own interpreter and scripts
        [sys.executable, str(WORKLOADS), json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        env=env,
        timeout=600,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{client} at {path} failed:\n{done.stderr}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def spread(values: list[float], fmt: str) -> str:
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("variants", nargs="+", help="name=path of a copy of the package")
    args = parser.parse_args()
    # A SIGTERM unwinds through server()'s cleanup, so the simulator stops with us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    variants: list[tuple[str, str | None]] = [("baseline", None)]
    variants += [tuple(v.split("=", 1)) for v in args.variants]  # type: ignore[misc]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    with server(simulator()) as srv:
        for rep in range(args.reps):
            shift = rep % len(variants)
            for name, path in variants[shift:] + variants[:shift]:
                client = "baseline" if path is None else "sdk"
                runs[name].append(measure(srv.url, args.n, client, path))
            print(f"round {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    base = runs["baseline"]
    print(f"{args.n:,} recipients, {args.reps} rounds (client CPU s, throughput /s, ratios)")
    for name, _ in variants:
        items = runs[name]
        cpu = [r["cpu"] for r in items]
        tput = [args.n / r["wall"] for r in items]
        cpu_pairs = [r["cpu"] / b["cpu"] for r, b in zip(items, base, strict=True)]
        tput_pairs = [b["wall"] / r["wall"] for r, b in zip(items, base, strict=True)]
        ratio = statistics.median(cpu) / statistics.median([b["cpu"] for b in base])
        whole = [r["cpu"] + r["drop_cpu"] for r in items]
        whole_pairs = [
            (r["cpu"] + r["drop_cpu"]) / (b["cpu"] + b["drop_cpu"])
            for r, b in zip(items, base, strict=True)
        ]
        print(
            f"{name:>10}: CPU {spread(cpu, '{:.3f}')}; x{ratio:.2f}, pairs "
            f"{spread(cpu_pairs, '{:.2f}')}; throughput {spread(tput, '{:,.0f}')}, pairs "
            f"{spread(tput_pairs, '{:.2f}')}\n{'':>12}and dropping the result: CPU "
            f"{spread(whole, '{:.3f}')}, pairs {spread(whole_pairs, '{:.2f}')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

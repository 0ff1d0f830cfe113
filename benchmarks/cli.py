"""``dispatch-async send`` against the script a user could write instead (script.py).

Both read the same CSV and send it to the same simulator process, alternating
(script, CLI, script, CLI, ...); each run's CPU is its own process's user+sys time
(``os.wait4``), its wall time from spawn to exit. Prints medians, the ratio of the
medians and the range of the per-pair ratios; ``run.py --only cli`` includes it.

    python benchmarks/cli.py [--rows 300000] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SECRET = "test-secret"


def make_csv(path: Path, rows: int, seed: int = 7) -> None:
    """Rows of number,name,pix: 1% of the numbers invalid, as in the SDK benchmarks."""
    rnd = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write("number,name,pix\n")
        for i in range(rows):
            number = f"+55119{i:08d}" if rnd.random() >= 0.01 else f"bad-{i}"
            out.write(f"{number},Cliente {i},PIX{i:010d}\n")


def timed(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run *command*; its own CPU seconds (user+sys) and wall seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and scripts
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode not in (0, 1):
        raise SystemExit(f"{command[:4]} failed ({process.returncode}):\n{stderr}")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(url: str, rows: int, reps: int) -> dict[str, Any]:
    """The interleaved comparison; *url* is a running simulator."""
    env = dict(os.environ)
    env.update(DISPATCH_BASE_URL=url, DISPATCH_CLIENT_SECRET=SECRET, DISPATCH_ACCOUNT="bench")
    runs: dict[str, list[dict[str, float]]] = {"script": [], "cli": []}
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-") as tmp:
        source = Path(tmp) / "contacts.csv"
        make_csv(source, rows)
        for rep in range(reps):
            for kind in ("script", "cli"):
                output = Path(tmp) / f"{kind}-{rep}.jsonl"
                if kind == "script":
                    command = [sys.executable, str(HERE / "script.py"), str(source), str(output)]
                else:
                    command = [
                        sys.executable,
                        "-m",
                        "dispatch_async._cli",
                        "send",
                        "template",
                        "--template-id",
                        "bench",
                        "-i",
                        str(source),
                        "-o",
                        str(output),
                        "-q",
                    ]
                runs[kind].append(timed(command, env))
                output.unlink()
                Path(f"{output}.pending").unlink(missing_ok=True)
    pairs = list(zip(runs["cli"], runs["script"], strict=True))
    return {
        "rows": rows,
        "reps": reps,
        **{
            kind: {k: spread([r[k] for r in items]) for k in ("cpu", "wall")} | {"raw": items}
            for kind, items in runs.items()
        },
        "cpu_ratio": statistics.median(r["cpu"] for r in runs["cli"])
        / statistics.median(r["cpu"] for r in runs["script"]),
        "wall_ratio": statistics.median(r["wall"] for r in runs["cli"])
        / statistics.median(r["wall"] for r in runs["script"]),
        "cpu_ratio_pairs": spread([c["cpu"] / s["cpu"] for c, s in pairs]),
        "wall_ratio_pairs": spread([c["wall"] / s["wall"] for c, s in pairs]),
    }


def render(result: dict[str, Any]) -> str:
    def cell(side: str, key: str) -> str:
        s = result[side][key]
        return f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})"

    lines = [f"CLI vs script, {result['rows']:,} CSV rows, {result['reps']} interleaved pairs"]
    for key in ("cpu", "wall"):
        pairs = result[f"{key}_ratio_pairs"]
        lines.append(
            f"  {key:<4} script {cell('script', key)}  cli {cell('cli', key)}  "
            f"ratio {result[f'{key}_ratio']:.2f}x; pairs {pairs['median']:.2f} "
            f"({pairs['min']:.2f}-{pairs['max']:.2f})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from processes import server, simulator

    with server(simulator()) as srv:
        result = measure(srv.url, args.rows, args.reps)
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

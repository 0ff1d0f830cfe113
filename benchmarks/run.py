"""The benchmark harness: SDK against a hand-written aiohttp client, side by side.

``python benchmarks/run.py`` (or ``nox -s bench``) starts the simulator in its own
process, runs every measurement in a fresh interpreter (benchmarks/workloads.py),
interleaving SDK and baseline repetitions, then prints one table and writes it as JSON
to benchmarks/results/. ``--quick`` is a smoke run with small inputs (seconds, not
minutes) whose figures are not comparable to the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads.py"
STATS_SERVER = HERE / "stats_server.py"
RESULTS = HERE / "results"
MB = 1024 * 1024
CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Plan:
    """How much to measure; the defaults fit the whole run in about seven minutes."""

    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    reps: dict[int, int] = field(default_factory=lambda: {10_000: 9, 100_000: 9, 1_000_000: 7})
    grid_n: int = 100_000
    grid_reps: int = 3
    cli_rows: int = 300_000
    cli_reps: int = 5
    chunk_sizes: tuple[int, ...] = (100, 500, 1000, 5000)
    concurrencies: tuple[int, ...] = (1, 4, 8, 32)
    stream_n: int = 1_000_000
    stream_reps: int = 3
    retained_n: int = 1_000_000
    server_n: int = 1_000_000
    burst_sends: int = 1000
    soak_seconds: float = 60.0
    soak_lifetime: float = 5.0
    import_reps: int = 9
    blocking_calls: int = 2000
    blocking_reps: int = 5
    adaptive_seconds: float = 20.0
    e164_numbers: int = 20_000
    e164_reps: int = 5

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            sizes=(2_000, 10_000, 50_000),
            reps={2_000: 3, 10_000: 3, 50_000: 3},
            grid_n=20_000,
            grid_reps=1,
            stream_n=50_000,
            stream_reps=1,
            retained_n=50_000,
            server_n=50_000,
            burst_sends=200,
            soak_seconds=8.0,
            soak_lifetime=2.0,
            import_reps=3,
            cli_rows=30_000,
            cli_reps=2,
            blocking_calls=300,
            blocking_reps=2,
            adaptive_seconds=12.0,
            e164_numbers=3000,
            e164_reps=2,
        )


# -- processes -----------------------------------------------------------------------


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


# -- statistics ----------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def interleaved(
    reps: int, measure: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """A B A B ...: drift on a shared machine hits both sides alike."""
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "sdk": []}
    for _ in range(reps):
        for client in ("baseline", "sdk"):
            runs[client].append(measure(client))
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "reps": len(runs["sdk"])}
    for client, items in runs.items():
        out[client] = {
            "cpu_per_100k": spread([r["cpu"] / n * 100_000 for r in items]),
            "throughput": spread([n / r["wall"] for r in items]),
            "server_busy": spread([r["server_cpu"] / r["wall"] for r in items]),
            "server_cpu_per_100k": spread([r["server_cpu"] / n * 100_000 for r in items]),
            "first_call_cpu": spread([r["first_call_cpu"] for r in items]),
            "raw": items,
        }
    pairs = list(zip(runs["sdk"], runs["baseline"], strict=True))
    out["cpu_ratio"] = statistics.median(r["cpu"] for r in runs["sdk"]) / statistics.median(
        r["cpu"] for r in runs["baseline"]
    )
    out["cpu_ratio_pairs"] = spread([s["cpu"] / b["cpu"] for s, b in pairs])
    out["throughput_ratio"] = statistics.median(r["wall"] for r in runs["baseline"]) / (
        statistics.median(r["wall"] for r in runs["sdk"])
    )
    out["throughput_ratio_pairs"] = spread([b["wall"] / s["wall"] for s, b in pairs])
    return out


# -- the phases ----------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def phase_overhead(plan: Plan, srv: Server) -> dict[str, Any]:
    out = {}
    for n in plan.sizes:
        log(f"client overhead and scaling: {n:,} recipients x {plan.reps[n]} interleaved pairs")
        runs = interleaved(
            plan.reps[n],
            lambda client, n=n: child(
                {"kind": "send", "url": srv.url, "n": n, "client": client}, srv
            ),
        )
        out[str(n)] = summarise(runs, n)
    return out


def phase_answers(plan: Plan, srv: Server) -> dict[str, Any]:
    """The SDK's client CPU on answers with ``session_id`` (the real service's shape, the
    default simulator's) against the spec's bare answers, from a second simulator."""
    n = plan.sizes[-2]
    log(f"answer shapes: {n:,} recipients x {plan.reps[n]} interleaved pairs, SDK only")
    with server(simulator("--no-session-ids")) as bare:
        urls = {"bare": bare, "session_id": srv}
        runs: dict[str, list[dict[str, Any]]] = {"bare": [], "session_id": []}
        for _ in range(plan.reps[n]):
            for shape, target in urls.items():
                spec = {"kind": "send", "url": target.url, "n": n, "client": "sdk"}
                runs[shape].append(child(spec, target))
    pairs = zip(runs["session_id"], runs["bare"], strict=True)
    return {
        "n": n,
        "reps": plan.reps[n],
        "cpu_per_100k": {
            shape: spread([r["cpu"] / n * 100_000 for r in items]) for shape, items in runs.items()
        },
        "cpu_ratio": statistics.median(r["cpu"] for r in runs["session_id"])
        / statistics.median(r["cpu"] for r in runs["bare"]),
        "cpu_ratio_pairs": spread([s["cpu"] / b["cpu"] for s, b in pairs]),
        "raw": runs,
    }


def phase_server(plan: Plan, srv: Server) -> dict[str, Any]:
    log(f"server on its own: baseline client, concurrency 32, {plan.server_n:,} recipients")
    n = plan.server_n
    runs = [
        child(
            {"kind": "send", "url": srv.url, "n": n, "client": "baseline", "concurrency": 32},
            srv,
        )
        for _ in range(2)
    ]
    return {
        "n": n,
        "throughput": spread([n / r["wall"] for r in runs]),
        "server_cpu_per_100k": spread([r["server_cpu"] / n * 100_000 for r in runs]),
        "capacity": spread([n / r["server_cpu"] for r in runs if r["server_cpu"] > 0] or [0.0]),
        "server_busy": spread([r["server_cpu"] / r["wall"] for r in runs]),
    }


def phase_grid(plan: Plan, srv: Server) -> dict[str, Any]:
    n = plan.grid_n
    cells = len(plan.chunk_sizes) * len(plan.concurrencies)
    log(f"chunk size x concurrency: {cells} cells x {plan.grid_reps} reps, {n:,} recipients")
    cells_out = []
    for rep in range(plan.grid_reps):
        # Alternate the order so that drift does not favour one corner of the grid.
        order = [(c, k) for c in plan.chunk_sizes for k in plan.concurrencies]
        for chunk_size, concurrency in order if rep % 2 == 0 else reversed(order):
            r = child(
                {
                    "kind": "send",
                    "url": srv.url,
                    "n": n,
                    "client": "sdk",
                    "chunk_size": chunk_size,
                    "concurrency": concurrency,
                },
                srv,
            )
            cells_out.append({"chunk_size": chunk_size, "concurrency": concurrency, **r})
    grid = {}
    for chunk_size in plan.chunk_sizes:
        for concurrency in plan.concurrencies:
            runs = [
                c
                for c in cells_out
                if c["chunk_size"] == chunk_size and c["concurrency"] == concurrency
            ]
            grid[f"{chunk_size}x{concurrency}"] = {
                "chunk_size": chunk_size,
                "concurrency": concurrency,
                "throughput": spread([n / r["wall"] for r in runs]),
                "cpu_per_100k": spread([r["cpu"] / n * 100_000 for r in runs]),
            }
    return {"n": n, "reps": plan.grid_reps, "cells": grid}


def phase_memory(plan: Plan, srv: Server) -> dict[str, Any]:
    log(f"memory: streaming {plan.stream_n:,} x {plan.stream_reps}, retained {plan.retained_n:,}")
    streams = [
        child({"kind": "stream_rss", "url": srv.url, "n": plan.stream_n}, srv)
        for _ in range(plan.stream_reps)
    ]
    kept = {
        client: child(
            {"kind": "retained", "url": srv.url, "n": plan.retained_n, "client": client}, srv
        )
        for client in ("sdk", "baseline")
    }
    return {
        "stream_n": plan.stream_n,
        "stream_rise_mb": spread([(r["rss_peak"] - r["rss_before"]) / MB for r in streams]),
        "stream_before_mb": spread([r["rss_before"] / MB for r in streams]),
        "stream_peak_mb": spread([r["rss_peak"] / MB for r in streams]),
        "stream_throughput": spread([plan.stream_n / r["wall"] for r in streams]),
        "retained_n": plan.retained_n,
        "retained_per_recipient": {c: r["per_recipient"] for c, r in kept.items()},
    }


def phase_tokens(plan: Plan) -> dict[str, Any]:
    log(f"tokens: {plan.burst_sends} concurrent sends on a fresh session")
    burst_server: dict[str, Any] = {}
    with server([sys.executable, str(STATS_SERVER)], burst_server) as srv:
        burst = child({"kind": "token_burst", "url": srv.url, "sends": plan.burst_sends})
    log(
        f"tokens: sending for {plan.soak_seconds:.0f}s with a {plan.soak_lifetime:g}s "
        "token lifetime"
    )
    soak_server: dict[str, Any] = {}
    lifetime = ["--token-lifetime", str(plan.soak_lifetime)]
    with server([sys.executable, str(STATS_SERVER), *lifetime], soak_server) as srv:
        soak = child({"kind": "token_soak", "url": srv.url, "seconds": plan.soak_seconds})
    return {
        "burst": {"sends": plan.burst_sends, "client": burst, "server": burst_server},
        "soak": {
            "seconds": plan.soak_seconds,
            "lifetime": plan.soak_lifetime,
            # Refreshed at 75-80% of the lifetime, plus the first fetch.
            "expected_calls": 1 + int(plan.soak_seconds / (plan.soak_lifetime * 0.75)),
            "client": soak,
            "server": soak_server,
        },
    }


def phase_cli(plan: Plan, srv: Server) -> dict[str, Any]:
    log(f"CLI vs script: {plan.cli_rows:,} CSV rows x {plan.cli_reps} interleaved pairs")
    import cli

    return cli.measure(srv.url, plan.cli_rows, plan.cli_reps)


def phase_blocking(plan: Plan, srv: Server) -> dict[str, Any]:
    log(
        f"blocking client vs session: {plan.blocking_calls:,} small calls x "
        f"{plan.blocking_reps} interleaved pairs"
    )
    import blocking

    return blocking.measure(srv.url, plan.blocking_calls, plan.blocking_reps)


def phase_adaptive(plan: Plan) -> dict[str, Any]:
    log(
        f"adaptive: learning a 50/s limit that drops to 20, 1 and 3 workers, "
        f"{plan.adaptive_seconds:g}s per run x 6 runs"
    )
    import adaptive

    return adaptive.measure(plan.adaptive_seconds, plan.adaptive_seconds / 2)


def phase_e164(plan: Plan) -> dict[str, Any]:
    log(
        f"to_e164 vs phonenumbers: {plan.e164_numbers:,} numbers x 3 corpora x "
        f"{plan.e164_reps} interleaved pairs of processes"
    )
    import e164

    return e164.measure(plan.e164_numbers, plan.e164_reps)


def phase_startup(plan: Plan) -> dict[str, Any]:
    log(f"start-up: import times x {plan.import_reps} interleaved")
    times: dict[str, list[float]] = {"aiohttp": [], "dispatch_async": []}
    for _ in range(plan.import_reps):
        for module in times:
            times[module].append(import_seconds(module))
    return {module: spread(values) for module, values in times.items()} | {
        "ratio": statistics.median(times["dispatch_async"]) / statistics.median(times["aiohttp"])
    }


# -- the table -----------------------------------------------------------------------

Row = list[str]


def rng(s: dict[str, float], fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """``median (min-max)``."""
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    return f"{fmt.format(m)} ({fmt.format(lo)}-{fmt.format(hi)})"


def row(figure: str, value: str, target: str = "", ok: bool | None = None) -> Row:
    return [figure, value, target, "" if ok is None else ("pass" if ok else "MISS")]


def size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def overhead_rows(overhead: dict[str, Any]) -> list[Row]:
    rows = []
    # The targets name 100k and 1M: the two largest sizes of the plan.
    for key in sorted(overhead, key=int)[-2:]:
        o, label = overhead[key], size_label(int(key))
        sdk, base = o["sdk"], o["baseline"]
        rows += [
            row(f"{label}: client CPU s/100k, SDK", rng(sdk["cpu_per_100k"])),
            row(f"{label}: client CPU s/100k, baseline", rng(base["cpu_per_100k"])),
            row(
                f"{label}: CPU ratio SDK/baseline",
                f"{o['cpu_ratio']:.2f}x; pairs {rng(o['cpu_ratio_pairs'], '{:.2f}')}",
                "<= 1.10x",
                o["cpu_ratio"] <= 1.10,
            ),
            row(f"{label}: throughput/s, SDK", rng(sdk["throughput"], "{:,.0f}")),
            row(f"{label}: throughput/s, baseline", rng(base["throughput"], "{:,.0f}")),
            row(
                f"{label}: throughput ratio SDK/baseline",
                f"{o['throughput_ratio']:.2f}x; pairs {rng(o['throughput_ratio_pairs'], '{:.2f}')}",
                ">= 0.97x",
                o["throughput_ratio"] >= 0.97,
            ),
            row(
                f"{label}: server CPU busy, SDK / baseline runs",
                f"{sdk['server_busy']['median']:.0%} / {base['server_busy']['median']:.0%}",
                "info",
            ),
        ]
    return rows


def scaling_rows(overhead: dict[str, Any]) -> list[Row]:
    def per(client: str) -> dict[int, float]:
        return {
            int(n): o[client]["cpu_per_100k"]["median"] / 100_000 * 1e6 for n, o in overhead.items()
        }

    sdk, base = per("sdk"), per("baseline")
    if not sdk:
        return []
    spread_ = max(sdk.values()) / min(sdk.values()) - 1
    smallest = overhead[min(overhead, key=int)]
    first = smallest["sdk"]["raw"][0]["warm_n"]
    return [
        row(
            f"first call ({first:,} recipients, token, connections), CPU ms SDK / baseline",
            f"{smallest['sdk']['first_call_cpu']['median'] * 1000:.0f} / "
            f"{smallest['baseline']['first_call_cpu']['median'] * 1000:.0f}",
            "info",
        ),
        row(
            "SDK CPU us/recipient by size",
            ", ".join(f"{size_label(n)} {v:.2f}" for n, v in sorted(sdk.items())),
        ),
        row(
            "baseline CPU us/recipient by size",
            ", ".join(f"{size_label(n)} {v:.2f}" for n, v in sorted(base.items())),
            "info",
        ),
        row("SDK CPU/recipient: max/min - 1", f"{spread_:.0%}", "<= 15%", spread_ <= 0.15),
    ]


def answer_rows(a: dict[str, Any]) -> list[Row]:
    label = size_label(a["n"])
    cpu = a["cpu_per_100k"]
    return [
        row(f"{label}: SDK client CPU s/100k, bare answers", rng(cpu["bare"])),
        row(f"{label}: SDK client CPU s/100k, answers with session_id", rng(cpu["session_id"])),
        row(
            f"{label}: CPU ratio session_id/bare",
            f"{a['cpu_ratio']:.2f}x; pairs {rng(a['cpu_ratio_pairs'], '{:.2f}')}",
            "<= 1.05x",
            a["cpu_ratio"] <= 1.05,
        ),
    ]


def server_rows(s: dict[str, Any]) -> list[Row]:
    return [
        row(
            "server alone: CPU s/100k (capacity, one core)",
            f"{s['server_cpu_per_100k']['median']:.3f} ({s['capacity']['median']:,.0f}/s)",
            "info",
        ),
        row(
            f"server alone: baseline at concurrency 32, {size_label(s['n'])}/s",
            rng(s["throughput"], "{:,.0f}"),
            "info",
        ),
    ]


def grid_rows(g: dict[str, Any]) -> list[Row]:
    cells = g["cells"]
    best = max(cells.values(), key=lambda c: c["throughput"]["median"])
    rows = [
        row(
            "grid: fastest chunk_size x concurrency",
            f"{best['chunk_size']}x{best['concurrency']}: {best['throughput']['median']:,.0f}/s",
            "info",
        )
    ]
    default = cells.get("1000x8")
    if default:
        share = default["throughput"]["median"] / best["throughput"]["median"]
        rows.append(
            row(
                "grid: default 1000x8",
                f"{default['throughput']['median']:,.0f}/s ({share:.0%} of fastest)",
                "info",
            )
        )
    return rows


def memory_rows(m: dict[str, Any]) -> list[Row]:
    kept = m["retained_per_recipient"]
    return [
        row(
            f"stream {size_label(m['stream_n'])}: peak RSS rise, MB",
            rng(m["stream_rise_mb"], "{:.1f}"),
            "<= 64 MB",
            m["stream_rise_mb"]["max"] <= 64,
        ),
        row(
            f"aggregated {size_label(m['retained_n'])}: retained B/recipient, SDK",
            f"{kept['sdk']:.0f}",
            "<= 300",
            kept["sdk"] <= 300,
        ),
        row("  same, baseline (its two lists of answer dicts)", f"{kept['baseline']:.0f}", "info"),
    ]


def token_rows(t: dict[str, Any]) -> list[Row]:
    burst, soak = t["burst"], t["soak"]
    calls = burst["server"].get("token_calls", -1)
    seen = soak["server"]
    expired = seen.get("expired_token_uses", -1)
    refused = seen.get("unauthorized", -1)
    failed = soak["client"]["failed"]
    return [
        row(
            f"token calls, {burst['sends']:,} concurrent sends (server/client)",
            f"{calls} / {burst['client']['token_calls']}",
            "== 1",
            calls == 1 and burst["client"]["token_calls"] == 1,
        ),
        row(
            f"token calls, {soak['seconds']:.0f}s run at {soak['lifetime']:g}s lifetime",
            f"{seen.get('token_calls', -1)} (~{soak['expected_calls']} expected; "
            f"{soak['client']['recipients']:,} recipients sent)",
            "info",
        ),
        row(
            "  expired tokens used / 401s / failed",
            f"{expired} / {refused} / {failed}",
            "0 / 0 / 0",
            expired == 0 and refused == 0 and failed == 0,
        ),
    ]


def startup_rows(st: dict[str, Any]) -> list[Row]:
    return [
        row("import dispatch_async, ms", rng(st["dispatch_async"], "{:.0f}", 1000)),
        row("import aiohttp, ms", rng(st["aiohttp"], "{:.0f}", 1000)),
        row("import ratio", f"{st['ratio']:.2f}x", "<= 1.5x", st["ratio"] <= 1.5),
    ]


def cli_rows(c: dict[str, Any]) -> list[Row]:
    label = f"CLI send vs script, {size_label(c['rows'])} rows"
    return [
        row(
            f"{label}: CPU s, CLI / script",
            f"{rng(c['cli']['cpu'], '{:.2f}')} / {rng(c['script']['cpu'], '{:.2f}')}",
        ),
        row(
            f"{label}: CPU ratio",
            f"{c['cpu_ratio']:.2f}x; pairs {rng(c['cpu_ratio_pairs'], '{:.2f}')}",
            "<= 1.25x",
            c["cpu_ratio"] <= 1.25,
        ),
        row(
            f"{label}: wall ratio",
            f"{c['wall_ratio']:.2f}x; pairs {rng(c['wall_ratio_pairs'], '{:.2f}')}",
            "<= 1.2x",
            c["wall_ratio"] <= 1.2,
        ),
    ]


def blocking_rows(b: dict[str, Any]) -> list[Row]:
    wall, cpu, overhead = b["wall_ms"], b["cpu_ms"], b["overhead_ms"]
    return [
        row(
            "blocking client: ms per small call, client / session",
            f"{rng(wall['client'])} / {rng(wall['session'])}",
            "info",
        ),
        row(
            "blocking client: overhead per call, ms",
            rng(overhead),
            "<= 0.3 ms",
            overhead["median"] <= 0.3,
        ),
        row(
            "blocking client: CPU ms per call, client / session",
            f"{rng(cpu['client'])} / {rng(cpu['session'])}",
            "info",
        ),
    ]


def e164_rows(e: dict[str, Any]) -> list[Row]:
    import e164

    return [row(figure, value, target, met) for figure, value, target, met in e164.verdicts(e)]


def adaptive_rows(a: dict[str, Any]) -> list[Row]:
    import adaptive

    return [row(figure, value, target, met) for figure, value, target, met in adaptive.verdicts(a)]


def table(results: dict[str, Any]) -> list[Row]:
    """[figure, value, target, pass/MISS] rows for whatever phases ran."""
    rows: list[Row] = []
    if results.get("overhead"):
        rows += overhead_rows(results["overhead"])
    if results.get("server"):
        rows += server_rows(results["server"])
    if results.get("answers"):
        rows += answer_rows(results["answers"])
    if results.get("overhead"):
        rows += scaling_rows(results["overhead"])
    if results.get("grid"):
        rows += grid_rows(results["grid"])
    if results.get("memory"):
        rows += memory_rows(results["memory"])
    if results.get("tokens"):
        rows += token_rows(results["tokens"])
    if results.get("cli"):
        rows += cli_rows(results["cli"])
    if results.get("blocking"):
        rows += blocking_rows(results["blocking"])
    if results.get("e164"):
        rows += e164_rows(results["e164"])
    if results.get("startup"):
        rows += startup_rows(results["startup"])
    if results.get("adaptive"):
        rows += adaptive_rows(results["adaptive"])
    return rows


def render(rows: list[Row]) -> str:
    header = ["figure", "value: median (min-max)", "target", "result"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def render_grid(grid: dict[str, Any]) -> str:
    cells = grid["cells"]
    chunks = sorted({c["chunk_size"] for c in cells.values()})
    conc = sorted({c["concurrency"] for c in cells.values()})
    lines = [
        f"SDK throughput in recipients/s, and client CPU s/100k in brackets "
        f"({grid['n']:,} recipients, median of {grid['reps']}):",
        "chunk_size \\ concurrency" + "".join(f"{k:>20}" for k in conc),
    ]
    for c in chunks:
        cells_text = (
            f"{cells[f'{c}x{k}']['throughput']['median']:>12,.0f} "
            f"({cells[f'{c}x{k}']['cpu_per_100k']['median']:.2f})"
            for k in conc
        )
        lines.append(f"{c:<24}" + "".join(f"{t:>20}" for t in cells_text))
    return "\n".join(lines)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- main ----------------------------------------------------------------------------

PHASES = (
    "overhead",
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

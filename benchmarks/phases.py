"""What run.py measures, phase by phase, and how much of it (`Plan`).

Each phase returns plain data for the JSON file; table.py turns it into rows.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processes import ROOT, STATS_SERVER, Server, child, import_seconds, server, simulator

MB = 1024 * 1024


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
    https_reps: int = 5

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
            https_reps=2,
        )


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


def phase_https(plan: Plan, srv: Server) -> dict[str, Any]:
    """The overhead phase's two largest sizes over HTTPS: nginx on 127.0.0.1 terminates TLS
    (a certificate from a CA made here with trustme) and passes the requests to *srv*."""
    import trustme

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tools.nginx import nginx_tls

    out: dict[str, Any] = {}
    ca = trustme.CA()
    with tempfile.TemporaryDirectory(prefix="bench-https-") as directory:
        ca_file = Path(directory) / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        with nginx_tls(Path(directory) / "nginx", ca, srv.url) as nginx:
            for n in plan.sizes[-2:]:
                log(f"HTTPS through nginx: {n:,} recipients x {plan.https_reps} interleaved pairs")
                spec = {"kind": "send", "url": nginx.base_url, "ca_file": str(ca_file), "n": n}
                runs = interleaved(
                    plan.https_reps, lambda client, spec=spec: child(spec | {"client": client}, srv)
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

"""Fleet throughput, two tables from one throwaway ``redis-server`` on 127.0.0.1.

``sessions``: 1, 2 and 4 processes, each with its own ``DispatchSession`` and a
``RedisTokenStore`` on the same prefix, splitting N recipients between them: recipients
per second and the simulator's token-call count per run.

``queue``: the command line's queued job against a direct send with the same number of
requests in flight. For each fleet size W, W ``dispatch-async worker --max-jobs M``
processes run; then, interleaved, ``send basic --concurrency W*M -o`` (direct) and
``send basic --queue --job J -o`` (queued: the producer enqueues, waits for the workers
and writes the report) send the same CSV, each timed from spawn to exit.

    python benchmarks/fleet.py [--only sessions|queue] [--latency S]
        [--recipients N] [--token-lifetime S]                       # sessions
        [--rows 60000] [--chunk-size 500] [--workers 1,3] [--max-jobs 4] [--reps 3]

The simulator runs in its own process, with ``--latency`` seconds before every answer
(a real service takes about 0.2 s). Needs redis-server on PATH and the ``queue`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dispatch_async as da

HERE = Path(__file__).resolve().parent
CLI = (sys.executable, "-m", "dispatch_async._cli")
SECRET = "test-secret"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    """A throwaway redis-server (no persistence); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
    port = _free_port()
    process = subprocess.Popen(  # noqa: S603 - our own programs
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(250):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait()


# -- sessions sharing a token ----------------------------------------------------------


async def _worker(
    url: str, redis_url: str, prefix: str, start_at: float, first: int, n: int
) -> None:
    store = da.RedisTokenStore(redis_url, key_prefix=prefix)
    async with da.DispatchSession(
        url, client_secret=SECRET, account="bench", token_store=store
    ) as session:
        numbers = (f"+55119{i:08d}" for i in range(first, first + n))
        await asyncio.sleep(max(start_at - time.time(), 0))
        started = time.time()
        result = await session.send_basic(numbers, text="hi", chunk_size=1000, max_concurrency=8)
        ended = time.time()
    print(json.dumps({"start": started, "end": ended, "valid": len(result.valid),
                      "failed": len(result.failed)}))  # fmt: skip


def _run(
    size: int, recipients: int, lifetime: float, latency: float, redis_url: str
) -> dict[str, float]:
    server = subprocess.Popen(  # noqa: S603 - our own programs
        [
            *(sys.executable, str(HERE / "stats_server.py")),
            *("--token-lifetime", str(lifetime), "--latency", str(latency)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    prefix = f"bench-{size}-{time.time_ns()}:"
    start_at = time.time() + 2.0  # every worker has imported and opened its session
    share = recipients // size
    workers = [
        subprocess.Popen(  # noqa: S603 - our own programs
            [
                *(sys.executable, __file__, "worker", url, redis_url, prefix),
                *(str(start_at), str(i * share), str(share)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(size)
    ]
    reports = [json.loads(w.communicate(timeout=300)[0].strip().splitlines()[-1]) for w in workers]
    server.terminate()
    stats = json.loads(server.communicate(timeout=30)[0].strip().splitlines()[-1])
    seconds = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    valid = sum(r["valid"] for r in reports)
    return {
        "workers": size,
        "recipients": valid,
        "failed": sum(r["failed"] for r in reports),
        "seconds": seconds,
        "per_second": valid / seconds,
        "token_calls": stats["token_calls"],
        "received": stats["recipients_received"],
    }


def sessions(args: argparse.Namespace, redis_url: str) -> None:
    print(f"sessions: {args.recipients:,} recipients, token lifetime {args.token_lifetime:g}s, "
          f"latency {args.latency:g}s, chunk 1000, 8 in flight per process")  # fmt: skip
    print(f"{'workers':>7} {'seconds':>8} {'recipients/s':>13} {'token calls':>12} "
          f"{'lifetimes':>10} {'failed':>7}")  # fmt: skip
    for size in (1, 2, 4):
        r = _run(size, args.recipients, args.token_lifetime, args.latency, redis_url)
        assert r["received"] == r["recipients"], r
        print(f"{r['workers']:>7} {r['seconds']:>8.2f} {r['per_second']:>13,.0f} "
              f"{r['token_calls']:>12} {r['seconds'] / args.token_lifetime:>10.1f} "
              f"{r['failed']:>7}")  # fmt: skip


# -- a queued job against a direct send --------------------------------------------------


def _cpu(pid: int) -> float:
    """User+sys CPU seconds of process *pid* so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(
    command: list[str], env: dict[str, str], output: Path, rows: int, workers: list[int]
) -> tuple[float, float]:
    """Wall seconds from spawn to exit of *command* (which must write *rows* records), and
    the CPU seconds it and the *workers* used meanwhile."""
    before = sum(_cpu(pid) for pid in workers)
    started = time.perf_counter()
    process = subprocess.Popen(  # noqa: S603 - our own programs
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    cpu = usage.ru_utime + usage.ru_stime + sum(_cpu(pid) for pid in workers) - before
    if os.waitstatus_to_exitcode(status) != 0:
        stderr = process.stderr.read().decode() if process.stderr else ""
        sys.exit(f"{' '.join(command[3:6])} failed:\n{stderr[-3000:]}")
    records = output.read_bytes().count(b"\n")
    assert records == rows, (command, records, rows)
    output.unlink()
    return seconds, cpu


def _token_calls(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_stats", timeout=10) as answer:  # noqa: S310 - ours
        return int(json.load(answer)["token_calls"])


@contextlib.contextmanager
def _workers(
    count: int, max_jobs: int, queue_args: list[str], env: dict[str, str], logs: Path
) -> Iterator[list[int]]:
    """*count* worker processes, running (their session open) before this yields."""
    processes = []
    for i in range(count):
        log = logs / f"worker-{count}-{i}.log"
        with open(log, "wb") as sink:
            processes.append(
                subprocess.Popen(  # noqa: S603 - our own programs
                    [*CLI, "worker", *queue_args, "--max-jobs", str(max_jobs), "-v"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=sink,
                )
            )
    try:
        deadline = time.monotonic() + 60
        logs_of = [logs / f"worker-{count}-{i}.log" for i in range(count)]
        while not all(b" started: " in path.read_bytes() for path in logs_of):
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                sys.exit(f"the workers did not start: see {logs}")
            time.sleep(0.05)
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)
        for process in processes:
            process.wait(timeout=30)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def queue(args: argparse.Namespace, redis_url: str) -> None:
    sys.path.insert(0, str(HERE))
    from cli import make_csv
    from processes import compile_installed, server, simulator

    compile_installed()

    sizes = [int(n) for n in args.workers.split(",")]
    requests = -(-args.rows // args.chunk_size)
    print(f"queue: {args.rows:,} CSV rows (1% invalid numbers) in chunks of {args.chunk_size}, "
          f"latency {args.latency:g}s, {args.reps} interleaved pairs per row, median (min-max);"
          f" ideal = {requests} requests / in flight x latency")  # fmt: skip
    print(f"{'workers x jobs':>14} {'in flight':>9} {'ideal s':>8} {'direct s':>20} "
          f"{'queued s':>20} {'queued/direct':>22} {'CPU s direct':>12} {'queued':>7} "
          f"{'token calls':>11}")  # fmt: skip
    with (
        server(simulator("--latency", str(args.latency))) as srv,
        tempfile.TemporaryDirectory(prefix="dispatch-fleet-") as tmp,
    ):
        source = Path(tmp) / "in.csv"
        make_csv(source, args.rows)
        output = Path(tmp) / "out.jsonl"
        prefix = f"bench-{time.time_ns()}:"
        env = {
            **os.environ,
            "DISPATCH_BASE_URL": srv.url,
            "DISPATCH_CLIENT_SECRET": SECRET,
            "DISPATCH_ACCOUNT": "bench",
        }
        queue_args = ["--queue", redis_url, "--key-prefix", prefix]
        send = [*CLI, "send", "basic", "--text", "hi", "-i", str(source), "-o", str(output)]
        send += ["--chunk-size", str(args.chunk_size), "-q"]
        for size in sizes:
            in_flight = size * args.max_jobs
            direct: list[float] = []
            queued: list[float] = []
            cpu: dict[str, list[float]] = {"direct": [], "queued": []}
            tokens_before = _token_calls(srv.url)
            with _workers(size, args.max_jobs, queue_args, env, Path(tmp)) as pids:
                for rep in range(args.reps):
                    concurrency = ["--concurrency", str(in_flight)]
                    wall, used = _timed([*send, *concurrency], env, output, args.rows, [])
                    direct.append(wall)
                    cpu["direct"].append(used)
                    job = [*queue_args, "--job", f"w{size}-{rep}"]
                    wall, used = _timed([*send, *job], env, output, args.rows, pids)
                    queued.append(wall)
                    cpu["queued"].append(used)
            # The direct sends fetch a token each; the fleet shares one.
            tokens = _token_calls(srv.url) - tokens_before - args.reps
            ratios = [q / d for q, d in zip(queued, direct, strict=True)]
            ratio = statistics.median(queued) / statistics.median(direct)
            pairs = f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            print(f"{f'{size} x {args.max_jobs}':>14} {in_flight:>9} "
                  f"{requests / in_flight * args.latency:>8.2f} {_spread(direct):>20} "
                  f"{_spread(queued):>20} {pairs:>22} {statistics.median(cpu['direct']):>12.2f} "
                  f"{statistics.median(cpu['queued']):>7.2f} {tokens:>11}")  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        url, redis_url, prefix, start_at, first, n = sys.argv[2:8]
        asyncio.run(_worker(url, redis_url, prefix, float(start_at), int(first), int(n)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=["sessions", "queue"])
    parser.add_argument("--latency", type=float, default=None, help="0 (sessions), 0.2 (queue)")
    parser.add_argument("--recipients", type=int, default=400_000)
    parser.add_argument("--token-lifetime", type=float, default=4.0)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--chunk-size", type=int, default=500)
    parser.add_argument("--workers", default="1,3", help="fleet sizes, comma separated")
    parser.add_argument("--max-jobs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    only = args.only or ["sessions", "queue"]
    latency = args.latency
    with _redis() as redis_url:
        if "sessions" in only:
            args.latency = 0.0 if latency is None else latency
            sessions(args, redis_url)
        if "queue" in only:
            args.latency = 0.2 if latency is None else latency
            queue(args, redis_url)


if __name__ == "__main__":
    main()

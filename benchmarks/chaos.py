"""A queued job through a fleet that keeps losing workers, and a Redis restarted mid-job.

    python benchmarks/chaos.py [--workers 20] [--rows 200000] [--chunk-size 100]
        [--rate 200] [--latency 0.1] [--max-jobs 2] [--kill-every 1.5]
        [--takeover-after 5] [--token-lifetime 10] [--no-restart]
        [--restart-at SECONDS] [--down-for SECONDS] [--cluster]

It starts a throwaway ``redis-server`` (127.0.0.1, append-only file on), the simulator in
a process of its own (``--latency`` before every answer; it notes when each request and
token call arrived), ``--workers`` worker processes sharing ``--rate`` requests per
second, then the producer (``send --queue --job chaos``). Every ``--kill-every``
seconds a random worker is SIGKILLed and a new one started; once a third of the chunks
are done (and the producer has exited), or at ``--restart-at`` seconds, Redis is
stopped, left down ``--down-for`` seconds, and started again with its data (down over a
refresh point, e.g. ``--restart-at 7 --down-for 2`` with 10 s tokens, it shows what the
fleet does with its token meanwhile). With ``--cluster`` the Redis is a 3-primary,
3-replica Redis Cluster (tools/redis_topologies.py), the fleet is given one node's URL,
and the restart is a failover instead, while the producer may still be storing chunks:
``CLUSTER FAILOVER`` on the replica of the primary that serves the job's keys (the key
prefix is chosen so that it serves the token's, the limit's and the chunk stream's too).
At the end, ``report -o`` writes the results, and it prints:

- every input line recorded exactly once, and no number received twice (the simulator's
  count), with the outcomes;
- the gaps between token calls (one call per token lifetime for the whole fleet: the
  token is refreshed ahead, at 75-80% of its lifetime, by one worker);
- the rate: requests per second from the first to the last request and between the
  10th and 90th percentile of arrivals (without start-up and tail), and the busiest
  second (a sliding 1-second window of arrivals) against ``--rate``;
- for each killed worker's chunk that was in flight: how long after the kill it was
  recorded (taken over and recorded ``maybe_sent``);
- the workers' CPU seconds per chunk, and the load average.

With ``--kill-every 0 --no-restart`` it is the fleet's throughput at scale, undisturbed.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chaos_redis import ClusterRedis, Redis, Watcher

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLI = (sys.executable, "-m", "dispatch_async._cli")
SECRET = "chaos-secret"


# -- the simulator, in its own process -----------------------------------------------------


def serve(latency: float, lifetime: float, out: Path) -> None:
    """The simulator, noting arrivals; on SIGTERM it writes what it saw to *out*."""
    from aiohttp import web

    from dispatch_async.testing import FakeDispatchServer, serve_forever

    class TimedServer(FakeDispatchServer):
        token_times: list[float] = []  # noqa: RUF012 - one server per process
        dispatch_times: list[float] = []  # noqa: RUF012

        async def _token(self, request: web.Request) -> web.StreamResponse:
            self.token_times.append(time.time())
            return await super()._token(request)

        async def _dispatch(self, request: web.Request) -> web.StreamResponse:
            self.dispatch_times.append(time.time())
            return await super()._dispatch(request)

    server = TimedServer(
        client_secret=SECRET, latency=latency, token_lifetime=lifetime, fast_ids=True
    )
    asyncio.run(serve_forever(server))
    stats = server.stats
    seen = {
        "token_times": server.token_times,
        "dispatch_times": server.dispatch_times,
        "received": sorted(stats.received),
        "duplicates": dict(stats.duplicates),
        "recipients_received": stats.recipients_received,
        "unauthorized": stats.unauthorized,
        "expired_token_uses": stats.expired_token_uses,
    }
    out.write_text(json.dumps(seen))


# -- the run ---------------------------------------------------------------------------------


def _cpu(pid: int) -> float:
    """User+sys CPU seconds of process *pid* so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fleet:
    """The worker processes, each reaped with its CPU time when it ends."""

    def __init__(self, command: list[str], env: dict[str, str], logs: Path) -> None:
        self.command = command
        self.env = env
        self.logs = logs
        self.running: dict[int, subprocess.Popen[bytes]] = {}
        self.cpu = 0.0
        self.started = 0
        self.pids: dict[int, None] = {}  # every worker started, in order
        self.ended_by_themselves: dict[int, tuple[int, str]] = {}  # exit code, log's end

    def start(self) -> int:
        self.started += 1
        with open(self.logs / f"worker-{self.started}.log", "wb") as sink:
            process = subprocess.Popen(  # noqa: S603 - our own programs
                self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=sink
            )
        self.running[process.pid] = process
        self.pids[process.pid] = None
        return process.pid

    def wait_started(self) -> None:
        """Until every worker running has logged that it started (its session open)."""
        deadline = time.monotonic() + 120
        logs = [self.logs / f"worker-{i}.log" for i in range(1, self.started + 1)]
        while not all(b" started: " in log.read_bytes() for log in logs):
            if time.monotonic() > deadline:
                sys.exit(f"the workers did not start: see {self.logs}")
            time.sleep(0.1)

    def kill(self, pid: int, signum: int = signal.SIGKILL) -> None:
        """Send *signum* to worker *pid* and reap it, unless it ended on its own before."""
        process = self.running.pop(pid)
        ended, status, usage = os.wait4(pid, os.WNOHANG)
        if ended:  # a worker that stopped by itself: the run reports it and its log's end
            self.ended_by_themselves[pid] = (os.waitstatus_to_exitcode(status), self._log(pid))
        else:
            os.kill(pid, signum)
            _, status, usage = os.wait4(pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        self.cpu += usage.ru_utime + usage.ru_stime

    def _log(self, pid: int) -> str:
        number = list(self.pids).index(pid) + 1
        return (self.logs / f"worker-{number}.log").read_text(errors="replace")[-1500:]

    def stop_all(self) -> None:
        for pid in list(self.running):
            self.kill(pid, signal.SIGTERM)


def chaos(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from cli import make_csv
    from processes import compile_installed

    compile_installed()
    source = tmp / "in.csv"
    make_csv(source, args.rows)
    chunks = -(-args.rows // args.chunk_size)
    data = tmp / "redis"
    data.mkdir()
    store = ClusterRedis(data) if args.cluster else Redis(data)
    seen_file = tmp / "seen.json"
    simulator = subprocess.Popen(  # noqa: S603 - our own programs
        [
            *(sys.executable, __file__, "serve", str(args.latency), str(args.token_lifetime)),
            str(seen_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert simulator.stdout is not None
    base_url = simulator.stdout.readline().strip()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DISPATCH_BASE_URL": base_url,
        "DISPATCH_CLIENT_SECRET": SECRET,
        "DISPATCH_ACCOUNT": "chaos",
    }
    queue = ["--queue", store.url, "--key-prefix", store.prefix]
    fleet = Fleet(
        [
            *(*CLI, "worker", *queue, "--max-jobs", str(args.max_jobs)),
            *("--rate", str(args.rate), "--takeover-after", str(args.takeover_after), "-v"),
        ],
        env,
        tmp,
    )
    for _ in range(args.workers):
        fleet.start()
    fleet.wait_started()
    # From here on, the workers' CPU is the job's (and the replacements' start-ups).
    fleet.cpu = -sum(_cpu(pid) for pid in fleet.running)
    keys = store.tag(f"{store.prefix}job:chaos")
    state_key, owner_key, out_key = f"{keys}:state", f"{keys}:owner", f"{keys}:out"
    producer = subprocess.Popen(  # noqa: S603 - our own programs
        [*CLI, "send", "basic", "--text", "hi", "-i", str(source), "--chunk-size",
         str(args.chunk_size), *queue, "--job", "chaos"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    started = time.time()
    rnd = random.Random(27)
    next_kill = started + args.kill_every if args.kill_every else float("inf")
    restarted: float | None = None if args.restart else 0.0
    waits: list[float] = []
    watched: dict[bytes, float] = {}  # chunk in flight at a kill -> the kill's time
    kills = 0

    poll = Watcher(store.url, store.cluster)
    while True:
        done = poll(lambda r: r.hlen(out_key))
        now = time.time()
        if watched:
            chunks_watched = list(watched)
            states = poll(lambda r, c=chunks_watched: r.hmget(state_key, c))
            for chunk, state in zip(chunks_watched, states, strict=True):
                if state == b"done":
                    waits.append(now - watched.pop(chunk))
        if done >= chunks:
            break
        if producer.poll() is not None and producer.returncode != 0:
            sys.exit(f"the producer failed: {producer.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        if now >= next_kill and fleet.running:
            victim = rnd.choice(list(fleet.running))
            fleet.kill(victim)
            kills += 1
            owners = poll(lambda r: r.hgetall(owner_key))
            states = poll(lambda r: r.hgetall(state_key))
            for chunk, owner in owners.items():
                if owner.endswith(f":{victim}".encode()) and states.get(chunk) == b"in_flight":
                    watched[chunk] = now
            fleet.start()
            next_kill = now + args.kill_every
        due = done >= chunks / 3 if args.restart_at is None else now - started >= args.restart_at
        producer_done = not store.waits_for_producer or producer.poll() == 0
        if restarted is None and producer_done and due:
            store.disrupt(state_key, args.down_for)
            restarted = time.time() - started
        time.sleep(0.1)
    ended = time.time()
    poll.close()
    producer.wait()
    others = {
        "simulator": _cpu(simulator.pid),
        "redis": sum(map(_cpu, store.pids())),
        "this_script": _cpu(os.getpid()),
    }
    fleet.stop_all()
    output = tmp / "results.jsonl"
    reported = subprocess.run(  # noqa: S603 - our own programs
        [*CLI, "report", *queue, "--job", "chaos", "-o", str(output)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    simulator.send_signal(signal.SIGTERM)
    simulator.wait(timeout=60)
    store.stop()
    seen = json.loads(seen_file.read_text())
    records = [json.loads(line) for line in output.read_bytes().splitlines()]
    summary = _summary(args, records, seen, reported, fleet, chunks, started, ended, kills,
                       waits, watched)  # fmt: skip
    summary.update(store.report(None if restarted is None else round(restarted, 1)))
    span = ended - started
    summary["cpu_share_of_a_core"] = {
        "workers": round(fleet.cpu / span, 2),
        **{name: round(cpu / span, 2) for name, cpu in others.items()},
    }
    return summary


def _summary(
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    seen: dict[str, Any],
    reported: subprocess.CompletedProcess[str],
    fleet: Fleet,
    chunks: int,
    started: float,
    ended: float,
    kills: int,
    waits: list[float],
    watched: dict[bytes, float],
) -> dict[str, Any]:
    lines = Counter(r["line"] for r in records)
    outcomes = Counter(r["outcome"] for r in records)
    sent = {r["number"] for r in records if r["outcome"] == "sent"}
    maybe = {r["number"] for r in records if r["outcome"] == "maybe_sent"}
    invalid = {r["number"] for r in records if r["outcome"] == "invalid"}
    received = set(seen["received"])
    times = sorted(seen["dispatch_times"])
    busiest = max(bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times))
    tokens = seen["token_times"]
    span = times[-1] - times[0]
    p10, p90 = times[len(times) // 10], times[len(times) * 9 // 10]
    each = Counter(int(t - times[0]) for t in times)
    return {
        "workers": args.workers,
        "rows": args.rows,
        "chunks": chunks,
        "seconds": round(ended - started, 1),
        "report_exit": reported.returncode,
        "every_line_once": sorted(lines) == list(range(2, args.rows + 2))
        and set(lines.values()) == {1},
        "outcomes": dict(outcomes),
        "numbers_received_twice": len(seen["duplicates"]),
        "sent_all_received": sent <= received,
        "received_all_accounted": received <= sent | maybe | invalid,
        "unauthorized": seen["unauthorized"] + seen["expired_token_uses"],
        "token_calls": len(tokens),
        # Refresh-ahead replaces the token at 75-80% of its lifetime, by one process.
        "gaps_between_token_calls_s": [round(b - a, 1) for a, b in itertools.pairwise(tokens)],
        "requests": len(times),
        "requests_per_second": round((len(times) - 1) / span, 1),
        # Between the 10th and the 90th percentile of arrivals: without start-up and tail.
        "requests_per_second_mid_run": round(0.8 * len(times) / (p90 - p10), 1),
        "busiest_second": busiest,
        # Arrivals in each whole second from the first request: where the rate dipped.
        "requests_each_second": [each.get(i, 0) for i in range(int(span) + 1)],
        "busiest_vs_limit": round(busiest / args.rate, 3),
        "kills": kills,
        "takeover_waits_s": sorted(round(w, 1) for w in waits),
        "chunks_in_flight_at_a_kill_never_recorded": len(watched),
        "worker_cpu_ms_per_chunk": round(fleet.cpu / chunks * 1000, 1),
        "worker_processes": fleet.started,
        "workers_that_stopped_by_themselves": {
            str(pid): {"exit_code": code, "log_end": log}
            for pid, (code, log) in fleet.ended_by_themselves.items()
        },
        "load_average": os.getloadavg(),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(float(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--max-jobs", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=1.5, help="0: no kills")
    parser.add_argument("--takeover-after", type=float, default=5.0)
    parser.add_argument("--token-lifetime", type=float, default=10.0)
    parser.add_argument("--no-restart", dest="restart", action="store_false")
    parser.add_argument("--restart-at", type=float, help="seconds (default: a third done)")
    parser.add_argument("--down-for", type=float, default=0.0, help="seconds Redis is down")
    parser.add_argument(
        "--cluster", action="store_true", help="a Redis Cluster; a failover, not a restart"
    )
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dispatch-chaos-") as tmp:
        summary = chaos(args, Path(tmp))
    print(json.dumps(summary, indent=1))
    ok = (
        summary["every_line_once"]
        and summary["numbers_received_twice"] == 0
        and summary["sent_all_received"]
        and summary["received_all_accounted"]
        and not summary["chunks_in_flight_at_a_kill_never_recorded"]
        and not summary["workers_that_stopped_by_themselves"]
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

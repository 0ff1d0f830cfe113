"""Delivery callbacks into `dispatch-async callbacks serve` (SQLite): throughput, memory, SIGKILL.

The receiver runs in its own process (the CLI, as a user runs it). The load generator is
wrk (C, ``apt-get install wrk``) running ``callbacks.lua`` when it is installed, else a
small raw-socket client in this process (about 100 µs of CPU per event, taken from the
same two cores); either posts vendor-shaped events over HTTP/1.1 keep-alive connections:
for each message its outbound echo, then ``DELIVERED``, then ``READ``, each ``--window``
messages later (a message's events spread out in time, as the service sends them), each
with its own reference and event id.

    python benchmarks/callbacks.py --messages 1000000            # the full run
    python benchmarks/callbacks.py --messages 20000 --quick      # a smoke run
    python benchmarks/callbacks.py --kill --seconds 10           # the SIGKILL check
    python benchmarks/callbacks.py --direct --messages 100000    # no HTTP: parse + store
    python benchmarks/callbacks.py --floor --messages 100000     # aiohttp doing nothing

Connections: 256 by default. The receiver answers once the event is durable, so each
connection has one event in a commit at a time: events/s <= connections / commit time
(a commit here is an fsync of 5-10 ms plus the writes), and 64 connections cap it
near 4,000/s whatever the CPU.

Throughput: events acknowledged (200) per second, overall and per 10 s interval;
memory: the receiver's RSS (``/proc/<pid>/status``) sampled every second. Kill: the
receiver is SIGKILLed under load, restarted on the same file, and every event it had
acknowledged is looked up in the store (public API): ``lost`` must be 0. One JSON object
goes to stdout (the figures); a summary to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from dispatch_async.callbacks import CallbackReceiver, DeliveryTracker

TOKEN = "benchmark-token-0123456789abcdef"
_LISTENING = re.compile(rb"listening on http://([\d.]+):(\d+)(\S*)/<token>")
_TYPES = (("outbound", "basic"), ("inbound", "DELIVERED"), ("inbound", "READ"))


def events(messages: int, window: int, start: int = 0) -> Iterator[tuple[str, str, bytes]]:
    """(reference, type, body) of every event, message i's steps *window* messages apart."""
    base = 1_719_835_200.0  # 2024-07-01T12:00:00Z
    for slot in range(start, start + messages + 2 * window):
        for step, (direction, type_) in enumerate(_TYPES):
            index = slot - step * window
            if not start <= index < start + messages:
                continue
            reference = f"00000000-0000-4000-8000-{index:012d}"
            moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + index / 1000 + step))
            body = orjson.dumps(
                {
                    "reference": reference,
                    "campaign_name": "bench",
                    "event_id": f"{reference}:0",
                    "direction": direction,
                    "session_id": None,
                    "user_id": f"55119{index % 100_000_000:08d}",
                    "timestamp": f"{moment}.000Z",
                    "channel": "RCS",
                    "type": type_,
                }
            )
            yield reference, type_, body


class Load:
    """Posts events on *connections* keep-alive connections until they run out or fail."""

    def __init__(self, host: str, port: int, path: str, source: Iterator[Any]) -> None:
        self.host, self.port = host, port
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self.source = source
        self.acknowledged: list[tuple[str, str]] = []
        self.posted = 0
        self.refused = 0
        self.latencies: list[float] = []

    async def run(self, connections: int) -> None:
        await asyncio.gather(*(self._connection() for _ in range(connections)))

    async def _connection(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            return
        try:
            for reference, type_, body in self.source:
                started = time.perf_counter()
                writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
                self.posted += 1
                status = await _answer(reader)
                if status == 200:
                    self.acknowledged.append((reference, type_))
                    self.latencies.append(time.perf_counter() - started)
                else:
                    self.refused += 1
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return  # the receiver went away (the kill test)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _answer(reader: asyncio.StreamReader) -> int:
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("the receiver closed the connection")
    status = int(line.split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


#: ``--floor``: aiohttp reading each body and answering 200, nothing else (the HTTP cost).
_FLOOR = """
import asyncio
from aiohttp import web
async def handle(request):
    await request.read()
    return web.Response(body=b'{"status":"stored"}', content_type="application/json")
async def main():
    app = web.Application()
    app.router.add_post("/callbacks/{token}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{port}/callbacks/<token>", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def start_receiver(
    store: Path, *, floor: bool = False
) -> tuple[asyncio.subprocess.Process, str, int, str]:
    command = ("-c", _FLOOR) if floor else ("-m", "dispatch_async._cli", "callbacks", "serve")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *command,
        *(() if floor else ("--store", str(store), "--port", "0")),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "DISPATCH_CALLBACK_TOKEN": TOKEN},
    )
    assert process.stdout is not None
    line = await process.stdout.readline()
    found = _LISTENING.search(line)
    if found is None:
        raise SystemExit(f"the receiver did not start: {line!r}")
    return process, found[1].decode(), int(found[2]), f"{found[3].decode()}/{TOKEN}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Wrk:
    """wrk (C, with ``callbacks.lua``) posting the same events: a generator that leaves
    the receiver the CPU the Python one took (about 100 µs per event)."""

    def __init__(self, host: str, port: int, path: str, args: argparse.Namespace) -> None:
        self.url = f"http://{host}:{port}{path}"
        self.args = args
        self.answered = 0
        self.result: dict[str, Any] = {}
        self.cpu = 0.0  # wrk's CPU seconds

    async def run(self, connections: int) -> None:
        threads = self.args.wrk_threads
        process = await asyncio.create_subprocess_exec(
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            "-d3600s",
            "--timeout",
            "60s",
            "-s",
            str(Path(__file__).with_name("callbacks.lua")),
            self.url,
            stdout=asyncio.subprocess.PIPE,
            env={
                **os.environ,
                "CB_MESSAGES": str(self.args.messages),
                "CB_WINDOW": str(self.args.window),
                "CB_THREADS": str(threads),
            },
        )
        assert process.stdout is not None
        done = 0
        while done < threads and (line := await process.stdout.readline()):
            if line.startswith(b"answered "):
                self.answered += int(line.split()[1])
            elif line == b"done\n":
                done += 1
        self.cpu = cpu_seconds(process.pid)
        process.send_signal(signal.SIGINT)  # wrk writes its summary and exits
        for line in (await process.communicate())[0].splitlines():
            if line.startswith(b"{"):
                self.result = orjson.loads(line)
        self.answered = int(self.result.get("acknowledged", 0))


async def throughput(args: argparse.Namespace, store: Path) -> dict[str, Any]:
    process, host, port, path = await start_receiver(store, floor=args.floor)
    use_wrk = args.generator == "wrk"
    load: Load | Wrk = (
        Wrk(host, port, path, args)
        if use_wrk
        else Load(host, port, path, events(args.messages, args.window))
    )

    def progress() -> int:
        return load.answered if isinstance(load, Wrk) else len(load.acknowledged)

    samples: list[tuple[float, int, float]] = []  # (seconds, acknowledged, RSS MiB)
    started = time.perf_counter()

    async def sample() -> None:
        while True:
            samples.append((time.perf_counter() - started, progress(), rss_mib(process.pid)))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    cpu_before, own_before = cpu_seconds(process.pid), time.process_time()
    await load.run(args.connections)
    elapsed = time.perf_counter() - started
    receiver_cpu = cpu_seconds(process.pid) - cpu_before
    generator_cpu = time.process_time() - own_before  # the Python generator's
    sampler.cancel()
    samples.append((elapsed, progress(), rss_mib(process.pid)))
    process.send_signal(signal.SIGTERM)
    await process.wait()
    rates = [
        (b[1] - a[1]) / (b[0] - a[0])
        for a, b in zip(samples[::10], samples[10::10], strict=False)
        if b[0] > a[0]
    ]
    counts: dict[str, int] = {}
    if not args.floor:
        async with DeliveryTracker(store) as tracker:
            counts = {str(k): v for k, v in (await tracker.counts("bench")).items()}
    if isinstance(load, Wrk):
        acknowledged, refused = load.answered, int(load.result.get("refused", -1))
        p50, p99 = load.result.get("p50_ms"), load.result.get("p99_ms")
    else:
        acknowledged, refused = len(load.acknowledged), load.refused
        latencies = sorted(load.latencies)
        p50 = round(latencies[len(latencies) // 2] * 1000, 1)
        p99 = round(latencies[int(len(latencies) * 0.99)] * 1000, 1)
    rss = [s[2] for s in samples]
    tenth = max(1, len(rss) // 10)
    return {
        "generator": args.generator,
        "messages": args.messages,
        "events": acknowledged,
        "refused": refused,
        "connections": args.connections,
        "seconds": round(elapsed, 1),
        "events_per_second": round(acknowledged / elapsed),
        "slowest_10s_interval_per_second": round(min(rates)) if rates else None,
        "fastest_10s_interval_per_second": round(max(rates)) if rates else None,
        "receiver_cpu_us_per_event": round(receiver_cpu / acknowledged * 1e6),
        "receiver_events_per_cpu_second": round(acknowledged / receiver_cpu),
        "generator_cpu_us_per_event": round(
            (load.cpu if isinstance(load, Wrk) else generator_cpu) / acknowledged * 1e6
        ),
        "load_average_1m": os.getloadavg()[0],
        "latency_ms_p50": p50,
        "latency_ms_p99": p99,
        "rss_mib_first_tenth_max": round(max(rss[:tenth]), 1),
        "rss_mib_last_tenth_max": round(max(rss[-tenth:]), 1),
        "rss_mib_max": round(max(rss), 1),
        "store_mib": round(sum(f.stat().st_size for f in store.parent.iterdir()) / 2**20),
        "counts_by_status": counts,
    }


async def direct(args: argparse.Namespace, store: Path) -> dict[str, Any]:
    """The receiver's core without HTTP: bodies through `CallbackReceiver.accept`."""
    async with DeliveryTracker(store) as tracker:
        receiver = CallbackReceiver(tracker, token=TOKEN)
        source = events(args.messages, args.window)
        acknowledged = 0

        async def connection() -> None:
            nonlocal acknowledged
            for _, _, body in source:
                if (await receiver.accept(body)).status == 200:
                    acknowledged += 1

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(connection() for _ in range(args.connections)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "messages": args.messages,
        "events": acknowledged,
        "seconds": round(elapsed, 1),
        "events_per_second": round(acknowledged / elapsed),
        "cpu_us_per_event": round(cpu / acknowledged * 1e6),
        "load_average_1m": os.getloadavg()[0],
    }


async def kill(args: argparse.Namespace, store: Path) -> dict[str, Any]:
    process, host, port, path = await start_receiver(store)
    load = Load(host, port, path, events(args.messages, args.window))
    running = asyncio.create_task(load.run(args.connections))
    await asyncio.sleep(args.seconds)
    process.send_signal(signal.SIGKILL)
    await process.wait()
    await running
    posted_at_kill = len(load.acknowledged)
    restarted, *_ = await start_receiver(store)  # recovers the WAL, then serves
    restarted.send_signal(signal.SIGTERM)
    await restarted.wait()
    lost = 0
    by_reference: dict[str, list[str]] = {}
    for reference, type_ in load.acknowledged:
        by_reference.setdefault(reference, []).append(type_)
    stored = 0
    async with DeliveryTracker(store) as tracker:
        for reference, types in by_reference.items():
            kept = {event.type for event in await tracker.events(reference)}
            stored += len(kept)
            lost += sum(1 for type_ in types if type_ not in kept)
        total = sum((await tracker.counts("bench")).values())
    return {
        "seconds_under_load": args.seconds,
        "posted": load.posted,
        "acknowledged": posted_at_kill,
        "acknowledged_and_stored": posted_at_kill - lost,
        "lost": lost,
        "stored_events_of_acknowledged_messages": stored,
        "messages_in_store": total,
        "killed_with": "SIGKILL",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=1000, help="messages between steps")
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--kill", action="store_true", help="the SIGKILL check instead")
    parser.add_argument(
        "--direct", action="store_true", help="the receiver's core in this process, no HTTP"
    )
    parser.add_argument(
        "--floor", action="store_true", help="an aiohttp server that stores nothing instead"
    )
    parser.add_argument(
        "--generator",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="the load generator of the throughput run (default: wrk when installed)",
    )
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads")
    parser.add_argument("--seconds", type=float, default=10.0, help="load before the kill")
    parser.add_argument("--quick", action="store_true", help="smoke run; figures mean little")
    parser.add_argument("--dir", type=Path, help="where the store goes (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        store = Path(directory) / "deliveries.sqlite3"
        phase = "kill" if args.kill else "direct" if args.direct else "throughput"
        if args.floor and phase != "throughput":
            raise SystemExit("--floor is a throughput run")
        run = {"kill": kill, "direct": direct, "throughput": throughput}[phase]
        result = asyncio.run(run(args, store))
    result["phase"] = "floor" if args.floor else phase
    print(orjson.dumps(result).decode())
    for key, value in result.items():
        print(f"{key:>40}: {value}", file=sys.stderr)


if __name__ == "__main__":
    main()

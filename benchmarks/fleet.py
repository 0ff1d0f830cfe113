"""Fleet throughput: 1, 2 and 4 worker processes sharing one token (and Redis) at once.

``python benchmarks/fleet.py [--recipients N] [--token-lifetime S]`` starts a throwaway
``redis-server`` on 127.0.0.1 and the simulator in its own process, then for each fleet
size runs that many worker processes, each with its own ``DispatchSession`` and a
``RedisTokenStore`` on the same prefix, splitting N recipients between them. It prints
recipients per second and the simulator's token-call count per run. Needs redis-server
on PATH and the ``redis`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import dispatch_async as da

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _worker(
    url: str, redis_url: str, prefix: str, start_at: float, first: int, n: int
) -> None:
    store = da.RedisTokenStore(redis_url, key_prefix=prefix)
    async with da.DispatchSession(
        url, client_secret="test-secret", account="bench", token_store=store
    ) as session:
        numbers = (f"+55119{i:08d}" for i in range(first, first + n))
        await asyncio.sleep(max(start_at - time.time(), 0))
        started = time.time()
        result = await session.send_basic(numbers, text="hi", chunk_size=1000, max_concurrency=8)
        ended = time.time()
    print(json.dumps({"start": started, "end": ended, "valid": len(result.valid),
                      "failed": len(result.failed)}))  # fmt: skip


def _run(size: int, recipients: int, lifetime: float, redis_url: str) -> dict[str, float]:
    server = subprocess.Popen(  # noqa: S603 - our own programs
        [sys.executable, str(HERE / "stats_server.py"), "--token-lifetime", str(lifetime)],
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


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        url, redis_url, prefix, start_at, first, n = sys.argv[2:8]
        asyncio.run(_worker(url, redis_url, prefix, float(start_at), int(first), int(n)))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipients", type=int, default=400_000)
    parser.add_argument("--token-lifetime", type=float, default=4.0)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
    port = _free_port()
    redis = subprocess.Popen(  # noqa: S603 - our own programs
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        print(f"{args.recipients:,} recipients, token lifetime {args.token_lifetime:g}s, "
              f"chunk 1000, 8 in flight per worker")  # fmt: skip
        print(f"{'workers':>7} {'seconds':>8} {'recipients/s':>13} {'token calls':>12} "
              f"{'lifetimes':>10} {'failed':>7}")  # fmt: skip
        for size in (1, 2, 4):
            r = _run(size, args.recipients, args.token_lifetime, f"redis://127.0.0.1:{port}/0")
            assert r["received"] == r["recipients"], r
            print(f"{r['workers']:>7} {r['seconds']:>8.2f} {r['per_second']:>13,.0f} "
                  f"{r['token_calls']:>12} {r['seconds'] / args.token_lifetime:>10.1f} "
                  f"{r['failed']:>7}")  # fmt: skip
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()

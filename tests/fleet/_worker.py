"""One worker process of a test fleet: sends chunks until a wall-clock time, then reports.

``python -m tests.fleet._worker URL REDIS_URL PREFIX RPS INDEX`` prints ``ready`` once its session
is open, then reads the wall-clock time to stop at from its standard input (so
that a slow start on a loaded machine does not shorten the run), and prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import dispatch_async as da


async def work(url: str, redis_url: str, prefix: str, rps: float, index: int) -> None:
    store = da.RedisTokenStore(redis_url, key_prefix=prefix)
    limiter = da.RedisRateLimiter(redis_url, requests_per_second=rps, key_prefix=prefix)
    sent = requests = failed = 0
    async with da.DispatchSession(
        url,
        client_secret="test-secret",
        account="acme",
        token_store=store,
        rate_limiter=limiter,
        chunk_size=5,
        max_concurrency=4,
    ) as session:
        print("ready", flush=True)  # noqa: T201
        until = float(await asyncio.to_thread(sys.stdin.readline))
        batch = 0
        while time.time() < until:
            start = (index * 1_000_000) + batch * 20
            numbers = [f"+55119{n:08d}" for n in range(start, start + 20)]
            result = await session.send_basic(numbers, text="hi")
            sent += len(result.valid)
            failed += len(result.failed)
            requests += result.requests
            batch += 1
    print(json.dumps({"sent": sent, "failed": failed, "requests": requests}))  # noqa: T201


if __name__ == "__main__":
    url, redis_url, prefix, rps, index = sys.argv[1:6]
    asyncio.run(work(url, redis_url, prefix, float(rps), int(index)))

"""One worker of a fleet learning its rate in Redis: sends, then reports.

``python -m tests.fleet._adaptive_worker URL REDIS_URL PREFIX INDEX UNTIL`` prints one JSON
line: what it sent, and every learned rate it saw (``RateChanged`` events). UNTIL is
``decrease`` (send until the shared rate has been cut, by anyone; 30 s at most) or
``once`` (one batch).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import attrs

import dispatch_async as da
from dispatch_async.instrumentation import Event, RateChanged


async def work(url: str, redis_url: str, prefix: str, index: int, until: str) -> None:
    limiter = da.RedisRateLimiter(redis_url, requests_per_second="auto", key_prefix=prefix)
    seen: list[dict[str, object]] = []

    def hook(event: Event) -> None:
        if isinstance(event, RateChanged):
            seen.append(attrs.asdict(event))

    sent = failed = 0
    async with da.DispatchSession(
        url,
        client_secret="test-secret",
        account="acme",
        rate_limiter=limiter,
        retry=da.RetryPolicy(attempts=100, max_time=60),
        chunk_size=1,
        max_concurrency=4,
        hooks=[hook],
    ) as session:
        batch = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (until == "once" and batch):
            if until == "decrease" and any(seen["reason"] == "decrease" for seen in seen):
                break
            start = index * 1_000_000 + batch * 10
            numbers = [f"+55119{n:08d}" for n in range(start, start + 10)]
            result = await session.send_basic(numbers, text="hi")
            sent += len(result.valid)
            failed += len(result.failed)
            batch += 1
        rate = session.requests_per_second
    print(json.dumps({"sent": sent, "failed": failed, "seen": seen, "rate": rate}))  # noqa: T201


if __name__ == "__main__":
    url, redis_url, prefix, index, until = sys.argv[1:6]
    asyncio.run(work(url, redis_url, prefix, int(index), until))

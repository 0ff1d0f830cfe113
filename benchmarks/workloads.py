"""One measurement in a fresh interpreter: ``python benchmarks/workloads.py '<json spec>'``.

The harness (run.py) starts this once per measurement and reads the one JSON line it
prints. Recipients are made before the clock starts; CPU is this process's user+sys
time (``getrusage``) and wall time around the send call only, on a client already
opened and warmed by a first call (token fetched, connections open), for the SDK and
the baseline alike. The first call is timed apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import ssl
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import baseline

import dispatch_async as da
from dispatch_async import instrumentation

# DISPATCH_BENCH_HOOKS=off|empty measures what the instrumentation costs (default: the default).
_HOOKS = {"off": [], "empty": [lambda event: None]}.get(os.environ.get("DISPATCH_BENCH_HOOKS", ""))
if _HOOKS is not None:
    instrumentation.set_hooks(_HOOKS)

SECRET = "test-secret"
ACCOUNT = "acme"
TEMPLATE = "pix_reminder"
#: Every hundredth number is one the service rejects, so both answer lists are used.
INVALID_EVERY = 100


def recipient(i: int) -> dict[str, Any]:
    """The i-th benchmark recipient: a wire-shaped dict with one template variable."""
    number = f"+0{i:012d}" if i % INVALID_EVERY == INVALID_EVERY - 1 else f"+55119{i:08d}"
    return {"number": number, "vars": {"pixCode": f"00020126580014br.gov.bcb.pix{i:010d}"}}


def recipients(n: int) -> list[dict[str, Any]]:
    return [recipient(i) for i in range(n)]


def stream(n: int) -> Iterator[dict[str, Any]]:
    return (recipient(i) for i in range(n))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def session(url: str, spec: dict[str, Any], **kwargs: Any) -> da.DispatchSession:
    return da.DispatchSession(
        url,
        client_secret=SECRET,
        account=ACCOUNT,
        chunk_size=spec.get("chunk_size", 1000),
        max_concurrency=spec.get("concurrency", 8),
        **kwargs,
    )


@contextlib.asynccontextmanager
async def opened(spec: dict[str, Any]) -> AsyncIterator[Callable[[list[Any]], Awaitable[Any]]]:
    """An open client of either kind, as one ``send(recipients)`` coroutine function.

    With ``ca_file`` in *spec* (an https URL), each trusts that CA: the SDK through
    `da.ssl_context`, the baseline through an ``ssl.SSLContext`` of its own.
    """
    ca_file = spec.get("ca_file")
    if spec["client"] == "baseline":
        async with baseline.BaselineClient(
            spec["url"],
            client_secret=SECRET,
            account=ACCOUNT,
            template_id=TEMPLATE,
            chunk_size=spec.get("chunk_size", 1000),
            concurrency=spec.get("concurrency", 8),
            ssl_context=ssl.create_default_context(cafile=ca_file) if ca_file else None,
        ) as raw:
            yield raw.send
    else:
        tls = {"ssl": da.ssl_context(ca_file)} if ca_file else {}
        async with session(spec["url"], spec, **tls) as client:

            async def send(items: list[Any]) -> da.DispatchResult:
                return await client.send_template(items, template_id=TEMPLATE)

            yield send


def counts(kept: Any) -> tuple[int, int, int]:
    """(valid, invalid, failed) of what either client returned."""
    if isinstance(kept, tuple):
        return len(kept[0]), len(kept[1]), 0
    return len(kept.valid), len(kept.invalid), len(kept.failed)


def check_counts(kept: Any, n: int) -> None:
    expected_invalid = n // INVALID_EVERY
    got = counts(kept)
    if got != (n - expected_invalid, expected_invalid, 0):
        raise SystemExit(f"wrong outcome counts {got} for {n} recipients")


async def send(spec: dict[str, Any]) -> dict[str, Any]:
    """Client overhead: one aggregated send of n recipients by the SDK or the baseline.

    The clock runs around the send call only. Before it, the client is opened and
    warmed by a first call (chunk_size x concurrency recipients, at most 16,000) that
    fetches the token and opens the connections; that call is timed apart.
    """
    n = spec["n"]
    warm = recipients(min(spec.get("chunk_size", 1000) * spec.get("concurrency", 8), 16_000))
    items = recipients(n)
    async with opened(spec) as send_:
        gc.collect()
        cpu0 = cpu_seconds()
        check_counts(await send_(warm), len(warm))
        first = cpu_seconds() - cpu0
        gc.collect()
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        kept = await send_(items)
        cpu1, wall1 = cpu_seconds(), time.perf_counter()
    check_counts(kept, n)
    # What the result costs to let go of: a result of objects is freed here, out of the
    # send's clock, where a packed one freed its decoded entries inside it.
    cpu2 = cpu_seconds()
    del kept
    gc.collect()
    dropped = cpu_seconds() - cpu2
    return {
        "cpu": cpu1 - cpu0,
        "wall": wall1 - wall0,
        "drop_cpu": dropped,
        "first_call_cpu": first,
        "warm_n": len(warm),
    }


async def stream_rss(spec: dict[str, Any]) -> dict[str, Any]:
    """Memory: stream n recipients from a generator through stream_template, drop each part."""
    url, n = spec["url"], spec["n"]
    gc.collect()
    before = peak_rss_bytes()
    seen = 0
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    async with session(url, spec) as client:
        async for part in client.stream_template(stream(n), template_id=TEMPLATE):
            seen += len(part.positions)
    cpu1, wall1 = cpu_seconds(), time.perf_counter()
    if seen != n:
        raise SystemExit(f"streamed {seen} of {n} recipients")
    return {
        "rss_before": before,
        "rss_peak": peak_rss_bytes(),
        "cpu": cpu1 - cpu0,
        "wall": wall1 - wall0,
    }


async def retained(spec: dict[str, Any]) -> dict[str, Any]:
    """Memory: bytes an aggregated result keeps per recipient (tracemalloc, input deleted)."""
    n = spec["n"]
    gc.collect()
    tracemalloc.start()
    floor = tracemalloc.get_traced_memory()[0]
    items = recipients(n)
    async with opened(spec) as send_:
        kept = await send_(items)
    del items
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    check_counts(kept, n)  # and keeps the result alive up to here
    return {"bytes": held - floor, "per_recipient": (held - floor) / n}


async def call_rss(spec: dict[str, Any]) -> dict[str, Any]:
    """Memory: peak RSS of one ``send_basic`` (result held) or ``stream_basic`` (each part
    dropped) of n numbers read from a generator, against the peak before the call."""
    url, n = spec["url"], spec["n"]
    numbers = (recipient(i)["number"] for i in range(n))
    async with session(url, spec) as client:
        await client.send_basic(["+5511900000000"], text="warm")  # token, connection
        gc.collect()
        before = peak_rss_bytes()
        cpu0 = cpu_seconds()
        if spec["call"] == "send":
            kept = await client.send_basic(numbers, text="Olá")
            seen = len(kept.positions)
            check_counts(kept, n)
        else:
            seen = 0
            async for part in client.stream_basic(numbers, text="Olá"):
                seen += len(part.positions)
        cpu = cpu_seconds() - cpu0
        peak = peak_rss_bytes()
    if seen != n:
        raise SystemExit(f"{spec['call']} accounted for {seen} of {n} recipients")
    return {"rss_before": before, "rss_peak": peak, "cpu": cpu}


class _TokenCounter:
    """Counts, from the client's side, token requests and 401 answers (aiohttp tracing)."""

    def __init__(self) -> None:
        self.token_calls = 0
        self.unauthorized = 0
        self.requests = 0
        self.config = aiohttp.TraceConfig()
        self.config.on_request_end.append(self._ended)

    async def _ended(self, _: object, __: object, params: aiohttp.TraceRequestEndParams) -> None:
        self.requests += 1
        if params.url.path == "/oauth/token":
            self.token_calls += 1
        if params.response.status == 401:
            self.unauthorized += 1


async def token_burst(spec: dict[str, Any]) -> dict[str, Any]:
    """Token: k concurrent send_template calls on a fresh session; how many token requests."""
    url, k = spec["url"], spec["sends"]
    counter = _TokenCounter()
    async with (
        aiohttp.ClientSession(trace_configs=[counter.config]) as http,
        session(url, spec, http_session=http) as client,
    ):
        results = await asyncio.gather(
            *(
                client.send_template(
                    [recipient(i * 10 + j) for j in range(10)], template_id=TEMPLATE
                )
                for i in range(k)
            )
        )
    failed = sum(len(r.failed) for r in results)
    return {
        "token_calls": counter.token_calls,
        "unauthorized": counter.unauthorized,
        "requests": counter.requests,
        "failed": failed,
    }


async def token_soak(spec: dict[str, Any]) -> dict[str, Any]:
    """Token: send without pause for a while on one session; count token requests and 401s."""
    url, seconds = spec["url"], spec["seconds"]
    items = recipients(spec.get("batch", 20_000))
    counter = _TokenCounter()
    sent = failed = 0
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(trace_configs=[counter.config]) as http,
        session(url, spec, http_session=http) as client,
    ):
        while time.monotonic() - started < seconds:
            result = await client.send_template(items, template_id=TEMPLATE)
            sent += len(items)
            failed += len(result.failed)
    return {
        "seconds": time.monotonic() - started,
        "recipients": sent,
        "failed": failed,
        "token_calls": counter.token_calls,
        "unauthorized": counter.unauthorized,
        "requests": counter.requests,
    }


WORKLOADS = {
    "send": send,
    "stream_rss": stream_rss,
    "retained": retained,
    "call_rss": call_rss,
    "token_burst": token_burst,
    "token_soak": token_soak,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = asyncio.run(WORKLOADS[spec["kind"]](spec))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

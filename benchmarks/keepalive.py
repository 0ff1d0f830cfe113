"""What retiring idle connections costs: reconnects, and the CPU of a TLS handshake.

``python benchmarks/keepalive.py`` (node on PATH; about 40 s) against Node's own ``http``
server with its defaults (tests/network/node_service.js: it closes an idle connection
6 s after its last answer and advertises ``Keep-Alive: timeout=5``), on 127.0.0.1:

1. **Reconnects per 1,000 calls** at idle gaps of 0 to 5.5 s between the calls of a
   session: the SDK's own connector (reused while idle < 4 s, or the server's timeout less
   1 s) against aiohttp's default connector (15 s), given as ``http_session``. Each gap
   runs 20 sessions of 1 + 5 calls at once, on a server of its own that counts the
   connections it accepted.
2. **Client CPU of a TLS handshake**: calls of one recipient over HTTPS (a CA made by
   trustme, ECDSA P-256, TLS 1.3, no session resumption), each on a new connection
   against all on one kept-alive connection; the difference per call is the handshake's.

Prints the figures and their ratios; no verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dispatch_async as da  # noqa: E402
from tests.network.conftest import NodeService, node_service  # noqa: E402

GAPS = (0.0, 1.0, 3.0, 4.5, 5.5)
SESSIONS = 20
CALLS = 5
SECRET = "bench-secret"


def session(url: str, http: aiohttp.ClientSession | None = None) -> da.DispatchSession:
    return da.DispatchSession(
        url,
        client_secret=SECRET,
        account="acme",
        retry=da.RetryPolicy(wait=False),
        http_session=http,
    )


async def calls_with_gaps(url: str, gap: float, index: int, *, sdk_pool: bool) -> None:
    """One warm-up call, then CALLS calls each after *gap* s of idleness."""
    http = None if sdk_pool else aiohttp.ClientSession()
    try:
        async with session(url, http) as client:
            for call in range(CALLS + 1):
                if call:
                    await asyncio.sleep(gap)
                await client.send_basic([f"+55119{index:04d}{call:04d}"], text="gap")
    finally:
        if http is not None:
            await http.close()


async def reconnects(gap: float, *, sdk_pool: bool) -> float:
    """Reconnects per 1,000 calls at *gap*: connections past each session's first."""
    with node_service() as service:
        await asyncio.gather(
            *(calls_with_gaps(service.url, gap, i, sdk_pool=sdk_pool) for i in range(SESSIONS))
        )
        seen = await service.seen()
    connections: int = seen["connections"]
    return 1000 * (connections - SESSIONS) / (SESSIONS * CALLS)


async def reconnect_table() -> None:
    runs = [reconnects(gap, sdk_pool=sdk) for sdk in (True, False) for gap in GAPS]
    figures = await asyncio.gather(*runs)
    sdk, default = figures[: len(GAPS)], figures[len(GAPS) :]
    print(f"Reconnects per 1,000 calls ({SESSIONS} sessions x {CALLS} calls per gap)")
    print(f"{'idle gap':>10} {'SDK (4 s)':>10} {'aiohttp (15 s)':>15}")
    for gap, ours, theirs in zip(GAPS, sdk, default, strict=True):
        print(f"{gap:>9.1f}s {ours:>10.0f} {theirs:>15.0f}")


@contextlib.contextmanager
def tls_service() -> Iterator[tuple[NodeService, ssl.SSLContext]]:
    """node_service.js over HTTPS with a certificate for 127.0.0.1 from a fresh CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    with tempfile.TemporaryDirectory() as folder:
        chain, key = Path(folder, "chain.pem"), Path(folder, "key.pem")
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        key.write_bytes(cert.private_key_pem.bytes())
        context = ssl.create_default_context()
        ca.configure_trust(context)
        with node_service("--tls", str(chain), str(key)) as service:
            yield NodeService(service.url.replace("http:", "https:"), service.process), context


async def cpu_per_call(url: str, context: ssl.SSLContext, calls: int, *, fresh: bool) -> float:
    """Client CPU seconds per call, each on a new connection (*fresh*) or all on one."""
    connector = aiohttp.TCPConnector(ssl=context, force_close=fresh)
    async with aiohttp.ClientSession(connector=connector) as http, session(url, http) as client:
        await client.send_basic(["+5511900000000"], text="warm")  # the token
        start = time.process_time()
        for call in range(calls):
            await client.send_basic([f"+551190000{call:04d}"], text="tls")
        return (time.process_time() - start) / calls


async def handshake_cpu(calls: int) -> None:
    with tls_service() as (service, context):
        pairs = [
            (
                await cpu_per_call(service.url, context, calls, fresh=True),
                await cpu_per_call(service.url, context, calls, fresh=False),
            )
            for _ in range(3)
        ]
        seen = await service.seen(context)
    fresh = sorted(p[0] for p in pairs)[1]
    kept = sorted(p[1] for p in pairs)[1]
    print(f"\nClient CPU per call over HTTPS ({calls} calls, median of 3 runs)")
    print(f"  new connection each call: {fresh * 1e6:8.0f} us")
    print(f"  one kept-alive connection: {kept * 1e6:7.0f} us")
    handshake = fresh - kept
    print(f"  a new connection:         {handshake * 1e6:8.0f} us ({fresh / kept:.2f}x a call)")
    print(f"  (server: {seen['connections']} connections, {seen['dispatch']} dispatches)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300, help="HTTPS calls per run")
    args = parser.parse_args()
    await reconnect_table()
    await handshake_cpu(args.calls)


if __name__ == "__main__":
    asyncio.run(main())

"""The simulator in its own process, printing what it saw when stopped.

``python benchmarks/stats_server.py [--token-lifetime S] [--latency S]`` prints its URL on one line,
serves until SIGTERM, then prints its ``ServerStats`` counters as one JSON line. The
harness uses it where the server's own count is the evidence (token requests, expired
tokens used); elsewhere it runs ``python -m dispatch_async.testing`` itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dispatch_async.testing import FakeDispatchServer, serve_forever


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-lifetime", type=float, default=3600.0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    server = FakeDispatchServer(
        token_lifetime=args.token_lifetime, latency=args.latency, fast_ids=True
    )
    asyncio.run(serve_forever(server))
    stats = server.stats
    counters = {
        "token_calls": stats.token_calls,
        "tokens_issued": stats.tokens_issued,
        "requests": stats.requests,
        "dispatch_calls": stats.dispatch_calls,
        "recipients_received": stats.recipients_received,
        "max_concurrent": stats.max_concurrent,
        "unauthorized": stats.unauthorized,
        "expired_token_uses": stats.expired_token_uses,
        "unknown_token_uses": stats.unknown_token_uses,
    }
    sys.stdout.write(json.dumps(counters) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

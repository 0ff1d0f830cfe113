"""A fake dispatch service for tests, benchmarks and demos.

`FakeDispatchServer` is a real HTTP server on 127.0.0.1 that follows the dispatch API
as documented (token issuance, the four dispatch endpoints, the templates listing), counts
what it saw in `ServerStats`, keeps the latest requests as `RecordedRequest` values
(credentials removed) and can be scripted with `Fault` values:

    from dispatch_async.testing import FakeDispatchServer, Fault

    async with FakeDispatchServer() as server:
        server.script(Fault.status(503, retry_after="0"), Fault.drop())
        ...  # point the client at server.url
        assert not server.stats.duplicates
        assert server.requests[-1].json["account"] == "acme"

It is an independent model of the service and shares no code with the client.

``FakeDispatchServer(callbacks=CallbackPlan(...))`` also posts delivery callbacks (see
`CallbackPlan`) to each request's callback URL.

With pytest-asyncio installed, the ``dispatch_server`` fixture gives a started server,
and ``callback_server`` a started ``dispatch_async.callbacks.CallbackServer``.
`FakeClock` is a clock on which retries wait no time, for ``RetryPolicy(clock=...)``.
``python -m dispatch_async.testing --port 8000`` runs one standalone (see ``--help``);
`main` is that command line (its options: `argument_parser`), and `serve_forever` does
the same from code.
"""

from ._callbacks import CallbackPlan, CallbackSender, CallbackStats
from ._clock import FakeClock
from ._faults import Fault, FaultKind
from ._recorder import DEFAULT_RECORDED_BODY_BYTES, DEFAULT_RECORDED_REQUESTS, RecordedRequest
from ._server import DEFAULT_TEMPLATES, FakeDispatchServer
from ._standalone import argument_parser, main, serve_forever
from ._stats import ServerStats

__all__ = [
    "DEFAULT_RECORDED_BODY_BYTES",
    "DEFAULT_RECORDED_REQUESTS",
    "DEFAULT_TEMPLATES",
    "CallbackPlan",
    "CallbackSender",
    "CallbackStats",
    "FakeClock",
    "FakeDispatchServer",
    "Fault",
    "FaultKind",
    "RecordedRequest",
    "ServerStats",
    "argument_parser",
    "main",
    "serve_forever",
]

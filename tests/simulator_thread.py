"""The simulator on its own event loop in a thread, for tests whose own thread blocks.

A synchronous test calling the blocking client cannot share its thread's loop with the
simulator: the simulator would never get to answer. Faults are scripted through the
portal, on the simulator's loop; its counters are plain integers, read from anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal

from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET


@attrs.frozen
class ThreadedSimulator:
    server: FakeDispatchServer
    portal: BlockingPortal

    @property
    def url(self) -> str:
        return self.server.url

    def script(self, *faults: Fault) -> None:
        self.portal.call(lambda: self.server.script(*faults))


@contextlib.contextmanager
def simulator_in_thread(**options: object) -> Iterator[ThreadedSimulator]:
    with start_blocking_portal(name="simulator") as portal:
        server = FakeDispatchServer(client_secret=SECRET, **options)  # type: ignore[arg-type]
        portal.call(server.start)
        try:
            yield ThreadedSimulator(server, portal)
        finally:
            portal.call(server.close)

"""pytest plugin (entry point ``dispatch_async``): ``dispatch_server``, ``callback_server``.

The fixtures need pytest-asyncio; without it the plugin loads and offers nothing, so
installing this package never breaks someone else's test run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..callbacks import CallbackServer
    from ._server import FakeDispatchServer

__all__: list[str] = []

try:
    import pytest_asyncio
except ImportError:
    pass
else:

    @pytest_asyncio.fixture
    async def dispatch_server() -> AsyncIterator[FakeDispatchServer]:
        """A started `FakeDispatchServer` with default settings, closed afterwards."""
        # Imported here so that loading the plugin costs nothing until it is used.
        from ._server import FakeDispatchServer

        async with FakeDispatchServer() as server:
            yield server

    @pytest_asyncio.fixture
    async def callback_server() -> AsyncIterator[CallbackServer]:
        """A started ``CallbackServer`` on 127.0.0.1 with its own tracker, closed after.

        Give ``callback_server.url`` as a send's ``callback``, then ask
        ``callback_server.tracker``. Unlike the simulator, it is the SDK's own receiver.
        """
        from ..callbacks import CallbackServer

        async with CallbackServer() as server:
            yield server

    __all__ += ["callback_server", "dispatch_server"]

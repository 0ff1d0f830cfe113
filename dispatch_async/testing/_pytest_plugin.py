"""pytest plugin (entry point ``dispatch_async``): the ``dispatch_server`` fixture.

The fixture needs pytest-asyncio; without it the plugin loads and offers nothing, so
installing this package never breaks someone else's test run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

    __all__ += ["dispatch_server"]

"""``CallbackServer``: the receiver on its own HTTP server (``_http``), with the tracker it owns.

What ``dispatch-async callbacks serve`` runs, and what a test or a demo needs in one
line: a started receiver on 127.0.0.1 whose ``url`` a send's ``callback`` can take.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Self

from ._http import Site
from ._receiver import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, CallbackReceiver
from ._tracker import DeliveryTracker

__all__ = ["CallbackServer"]


class CallbackServer:
    """An HTTP server for the service's callbacks, storing into a tracker it owns.

    ```python
    async with CallbackServer(DeliveryTracker("deliveries.sqlite3")) as server:
        print(server.url)            # give it as a send's callback
        state = await server.tracker.message(message_id)
    ```

    Args:
        tracker: an unopened tracker: the server opens it on entry and closes it on
            exit, after the last answer. None: a SQLite file in the temporary
            directory, removed on exit (for tests and demos).
        token: the URL's secret token; None makes one.
        previous_tokens: as for `CallbackReceiver` (accepted while a URL is rotated).
        host: the address to listen on.
        port: 0 picks a free port (``port`` says which once started).
        path: where the URL starts; the token follows it.
        allowed_ips: as for `CallbackReceiver`.
        max_body_bytes: as for `CallbackReceiver`.
        body_timeout: as for `CallbackReceiver`.
    """

    def __init__(
        self,
        tracker: DeliveryTracker | None = None,
        *,
        token: str | None = None,
        previous_tokens: Collection[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = "/callbacks",
        allowed_ips: Collection[str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
    ) -> None:
        self._temporary: Path | None = None
        if tracker is None:
            name = f"dispatch-async-callbacks-{secrets.token_hex(8)}.sqlite3"
            self._temporary = Path(tempfile.gettempdir()) / name
            tracker = DeliveryTracker(self._temporary, poll_interval=0.05)
        self.tracker = tracker
        self.receiver = CallbackReceiver(
            tracker,
            token=CallbackReceiver.new_token() if token is None else token,
            previous_tokens=previous_tokens,
            allowed_ips=allowed_ips,
            max_body_bytes=max_body_bytes,
            body_timeout=body_timeout,
        )
        self.host = host
        self.port = port
        self.path = "/" + path.strip("/")
        self._site: Site | None = None

    def __repr__(self) -> str:
        return f"<CallbackServer {self.host}:{self.port}{self.path} {self.tracker!r}>"

    @property
    def base(self) -> str:
        """``http://host:port/path``: the URL without its token."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path.rstrip('/')}"

    @property
    def url(self) -> str:
        """The callback URL, token included: a secret."""
        return self.receiver.url(self.base)

    async def start(self) -> None:
        """Open the tracker, then listen."""
        await self.tracker.open()
        self._site = Site(self.receiver, self.path)
        try:
            self.port = await self._site.start(self.host, self.port)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop answering, then commit what was acknowledged and close the tracker."""
        site, self._site = self._site, None
        if site is not None:
            await site.aclose()
        await self.tracker.aclose()
        if self._temporary is not None:
            _remove_database(self._temporary)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)

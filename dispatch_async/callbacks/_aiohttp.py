"""The receiver as an aiohttp.web handler: add it to your app's router."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from ._receiver import Answer, CallbackReceiver

__all__ = ["aiohttp_handler"]


def aiohttp_handler(
    receiver: CallbackReceiver,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler for callbacks; route it to a path ending with ``{token}``.

    ```python
    app.router.add_post("/callbacks/{token}", aiohttp_handler(receiver))
    ```

    The body is read up to the receiver's limit, whatever the app's ``client_max_size``.
    """

    async def handle(request: web.Request) -> web.Response:
        remote = request.remote
        refused = receiver.refuse(request.method, request.path, remote, request.content_length)
        if refused is not None:
            return _response(refused)
        length = request.content_length
        if length is not None:  # checked against the limit by refuse()
            try:
                body = await request.content.readexactly(length) if length else b""
            except asyncio.IncompleteReadError:
                return _response(_INCOMPLETE)
            return _response(await receiver.accept(body, remote))
        limit = receiver.max_body_bytes
        chunks = bytearray()
        while chunk := await request.content.read(limit + 1 - len(chunks)):
            chunks += chunk
            if len(chunks) > limit:
                return _response(receiver.too_large(remote))
        return _response(await receiver.accept(bytes(chunks), remote))

    return handle


_INCOMPLETE = Answer(400, b'{"error":"the body ended before its Content-Length"}')
_HEADERS = {"Content-Type": "application/json"}


def _response(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, body=answer.body, headers=_HEADERS)

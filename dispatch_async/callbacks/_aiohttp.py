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
        try:
            async with asyncio.timeout(receiver.body_timeout):
                body = await _read(request, receiver)
        except TimeoutError:
            return _response(receiver.too_slow(remote))
        except ConnectionResetError:  # the caller hung up mid-body: nobody to answer
            return _response(_INCOMPLETE)
        if isinstance(body, Answer):
            return _response(body)
        return _response(await receiver.accept(body, remote))

    return handle


async def _read(request: web.Request, receiver: CallbackReceiver) -> bytes | Answer:
    """The body, or the answer refusing it."""
    length = request.content_length
    if length is not None:  # checked against the limit by refuse()
        try:
            return await request.content.readexactly(length) if length else b""
        except asyncio.IncompleteReadError:
            return _INCOMPLETE
    limit = receiver.max_body_bytes
    chunks = bytearray()
    while chunk := await request.content.read(limit + 1 - len(chunks)):
        chunks += chunk
        if len(chunks) > limit:
            return receiver.too_large(request.remote)
    return bytes(chunks)


_INCOMPLETE = Answer(400, b'{"error":"the body ended before its Content-Length"}')
_HEADERS = {"Content-Type": "application/json"}


def _response(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, body=answer.body, headers=_HEADERS)

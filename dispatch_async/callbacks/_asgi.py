"""The receiver as a plain ASGI application: mount it in FastAPI or Starlette, or serve it.

No framework is imported: the app speaks ASGI 3 itself (HTTP, and lifespan so that a
server running it alone starts and stops cleanly; the tracker stays yours to open).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ._receiver import Answer, CallbackReceiver

__all__ = ["ASGIApp", "asgi_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def asgi_app(receiver: CallbackReceiver) -> ASGIApp:
    """An ASGI app that answers callbacks at any path ending with the receiver's token.

    ```python
    app = FastAPI(lifespan=...)            # open and close the tracker there
    app.mount("/callbacks", asgi_app(receiver))
    # the service posts to receiver.url("https://your.host/callbacks")
    ```
    """

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        client = scope.get("client")
        remote = client[0] if client else None
        refused = receiver.refuse(
            scope["method"], scope["path"], remote, _content_length(scope["headers"])
        )
        if refused is not None:
            await _answer(send, refused)
            return
        try:
            async with asyncio.timeout(receiver.body_timeout):
                body = await _read(receive, receiver, remote)
        except TimeoutError:
            body = receiver.too_slow(remote)
        if body is None:  # the caller hung up
            return
        if isinstance(body, Answer):
            await _answer(send, body)
            return
        await _answer(send, await receiver.accept(body, remote))

    return app


async def _read(
    receive: Receive, receiver: CallbackReceiver, remote: str | None
) -> bytes | Answer | None:
    """The body, the answer refusing it, or None when the caller hung up."""
    body = bytearray()
    limit = receiver.max_body_bytes
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return receiver.too_large(remote)
        if not message.get("more_body", False):
            return bytes(body)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _answer(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(answer.body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer.body})

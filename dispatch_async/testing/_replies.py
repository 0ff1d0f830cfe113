"""How the simulator answers over HTTP: JSON and raw bodies, refusals, dropped connections."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

import orjson
from aiohttp import web

from ._faults import Fault

__all__ = [
    "JSON_CONTENT_TYPE",
    "Dropped",
    "accepts_json",
    "bearer_token",
    "drop",
    "invalid_token",
    "json_answer",
    "pause",
    "raw_answer",
    "seconds_text",
    "status_answer",
]

JSON_CONTENT_TYPE: Final = "application/json"


class Dropped(Exception):
    """A handler closed its connection on purpose: there is no answer to send."""


async def pause(closing: asyncio.Event, request: web.Request, seconds: float | None) -> None:
    """Wait ``seconds`` (None: forever), dropping the connection if *closing* is set."""
    if seconds is None:
        await closing.wait()
    else:
        try:
            async with asyncio.timeout(seconds):
                await closing.wait()
        except TimeoutError:
            return
    raise drop(request)


def drop(request: web.Request) -> Dropped:
    """Close the connection without an answer; the caller raises what this returns."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return Dropped()


def bearer_token(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    # RFC 6750: the scheme is case-insensitive.
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def accepts_json(accept: str) -> bool:
    accept = accept.lower()
    return any(t in accept for t in (JSON_CONTENT_TYPE, "application/*", "*/*"))


def seconds_text(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def json_answer(
    status: int, body: object, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), headers=headers, content_type=JSON_CONTENT_TYPE
    )


def raw_answer(status: int, body: bytes, content_type: str) -> web.Response:
    # Through headers: aiohttp's content_type= refuses parameters such as charset.
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


def status_answer(fault: Fault) -> web.Response:
    response = raw_answer(fault.status_code, fault.body or b"", fault.content_type)
    if fault.retry_after is not None:
        response.headers["Retry-After"] = fault.retry_after
    return response


def invalid_token() -> web.Response:
    return json_answer(
        401,
        {"error": "invalid_token"},
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )

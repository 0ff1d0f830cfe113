"""The yardstick: the client a careful user would write by hand with aiohttp and orjson.

Get a token, post the chunks under a semaphore, parse each answer, extend two lists.
No retries, no per-recipient checks, no result objects: whatever the SDK costs on top
of this is its overhead.
"""

from __future__ import annotations

import asyncio
import ssl
from types import TracebackType
from typing import Any

import aiohttp
import orjson


class BaselineClient:
    """``async with BaselineClient(url, ...) as client: valid, invalid = await client.send(r)``."""

    def __init__(
        self,
        base_url: str,
        *,
        client_secret: str,
        account: str,
        template_id: str,
        chunk_size: int = 1000,
        concurrency: int = 8,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url
        self.client_secret = client_secret
        self.account = account
        self.template_id = template_id
        self.chunk_size = chunk_size
        self.concurrency = concurrency
        self.ssl_context = ssl_context
        self.token: str | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BaselineClient:
        connector = aiohttp.TCPConnector(ssl=self.ssl_context or True)
        self._http = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.close()

    async def send(
        self, recipients: list[dict[str, Any]]
    ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """Send to ``/api/v3/template``; return (validMessages, invalidMessages)."""
        http = self._http
        assert http is not None, "use async with"
        if self.token is None:
            async with http.post(
                f"{self.base_url}/oauth/token",
                data={"grant_type": "client_credentials", "client_secret": self.client_secret},
            ) as response:
                response.raise_for_status()
                self.token = orjson.loads(await response.read())["access_token"]
        url = f"{self.base_url}/api/v3/template"
        headers = {
            "Authorization": f"Bearer {self.token}",
            "X-Auth-Type": "JWT",
            "Content-Type": "application/json",
        }
        valid: list[dict[str, str]] = []
        invalid: list[dict[str, str]] = []
        gate = asyncio.Semaphore(self.concurrency)

        async def post(chunk: list[dict[str, Any]]) -> None:
            body = orjson.dumps(
                {"account": self.account, "template_id": self.template_id, "messages": chunk}
            )
            async with gate, http.post(url, data=body, headers=headers) as response:
                response.raise_for_status()
                data = orjson.loads(await response.read())
            valid.extend(data["validMessages"])
            invalid.extend(data["invalidMessages"])

        size = self.chunk_size
        await asyncio.gather(
            *(post(recipients[start : start + size]) for start in range(0, len(recipients), size))
        )
        return valid, invalid

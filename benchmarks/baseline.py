"""The yardstick: the client a careful user would write by hand with aiohttp and orjson.

Get a token, post the chunks under a semaphore, parse each answer, extend two lists.
No retries, no per-recipient checks, no result objects: whatever the SDK costs on top
of this is its overhead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson


async def send_all(
    base_url: str,
    recipients: list[dict[str, Any]],
    *,
    client_secret: str,
    account: str,
    template_id: str,
    chunk_size: int = 1000,
    concurrency: int = 8,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Send *recipients* to ``/api/v3/template``; return (validMessages, invalidMessages)."""
    valid: list[dict[str, str]] = []
    invalid: list[dict[str, str]] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{base_url}/oauth/token",
            data={"grant_type": "client_credentials", "client_secret": client_secret},
        ) as response:
            response.raise_for_status()
            token = orjson.loads(await response.read())["access_token"]
        url = f"{base_url}/api/v3/template"
        headers = {
            "Authorization": f"Bearer {token}",
            "X-Auth-Type": "JWT",
            "Content-Type": "application/json",
        }
        gate = asyncio.Semaphore(concurrency)

        async def post(chunk: list[dict[str, Any]]) -> None:
            body = orjson.dumps({"account": account, "template_id": template_id, "messages": chunk})
            async with gate, http.post(url, data=body, headers=headers) as response:
                response.raise_for_status()
                data = orjson.loads(await response.read())
            valid.extend(data["validMessages"])
            invalid.extend(data["invalidMessages"])

        await asyncio.gather(
            *(
                post(recipients[start : start + chunk_size])
                for start in range(0, len(recipients), chunk_size)
            )
        )
    return valid, invalid

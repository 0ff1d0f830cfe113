"""``dispatch-async callbacks serve`` as a real process, for the tests that need one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

COMMAND = (sys.executable, "-m", "dispatch_async._cli", "callbacks", "serve")
_LISTENING = re.compile(r"listening on (http://\S+?)/<token>")


@attrs.frozen
class Receiver:
    process: asyncio.subprocess.Process
    base: str  # http://127.0.0.1:PORT/callbacks
    token: str

    @property
    def url(self) -> str:
        return f"{self.base}/{self.token}"


@contextlib.asynccontextmanager
async def receiver_process(
    store: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Receiver]:
    """Start the receiver on a free port; stopped (SIGTERM, else killed) on exit."""
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        "--store",
        str(store),
        "--port",
        "0",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode()
        found = _LISTENING.search(line)
        if found is None:
            assert process.stderr is not None
            problem = (await process.stderr.read()).decode()
            raise AssertionError(f"the receiver did not start: {line!r} {problem}")
        given = (env or {}).get("DISPATCH_CALLBACK_TOKEN")
        token = given or store.with_name(store.name + ".token").read_text().strip()
        yield Receiver(process, found[1], token)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        await process.communicate()

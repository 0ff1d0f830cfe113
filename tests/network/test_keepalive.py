"""A server's idle timeout never turns into a false ``maybe_sent``.

Against Node's own ``http`` server (node_service.js, which counts what it received):
calls whose idle gaps step across the moment the server closes an idle connection,
through a relay adding 100 ms each way so the close and the request cross on the wire. Every
recipient must be sent, once; none may end ``maybe_sent`` while the service never saw it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

import dispatch_async as da
from dispatch_async._keepalive import (
    IDLE_LIFE,
    IdleLife,
    advertised_life,
    idle_connector,
    server_has_closed,
)

from .conftest import LatencyRelay, NodeService, node_service

SECRET = "node-secret"
#: One-way delay the relay adds: a request written up to 2 x DELAY before the client
#: sees the server's close crosses it on the wire (wide enough for a loaded machine).
DELAY = 0.1


def session(url: str, **settings: Any) -> da.DispatchSession:
    return da.DispatchSession(
        url, client_secret=SECRET, account="acme", retry=da.RetryPolicy(wait=False), **settings
    )


def warm_number(number: str) -> str:
    return "+551191" + number.removeprefix("+551190")


async def probe(url: str, number: str, gap: float) -> da.DispatchResult:
    """One call, *gap* s of idleness, then a call to *number* on the same session."""
    async with session(url) as client:
        await client.send_basic([warm_number(number)], text="warm")
        await asyncio.sleep(gap)  # the idle gap under test, not a synchronisation
        return await client.send_basic([number], text="probe")


async def scan(service: NodeService, url: str, gaps: list[float]) -> list[str]:
    """Probe every gap at once (one session each); the numbers falsely ``maybe_sent``.

    Also checks that no number reached the service twice.
    """
    numbers = [f"+551190{i:07d}" for i in range(1, len(gaps) + 1)]
    results = await asyncio.gather(*(probe(url, n, g) for n, g in zip(numbers, gaps, strict=True)))
    seen = (await service.seen())["numbers"]
    assert all(count == 1 for count in seen.values()), seen
    maybe = [f.recipient.number for r in results for f in r.failed if f.maybe_sent]
    return [number for number in maybe if number not in seen]


def across(close: float, count: int = 40) -> list[float]:
    """*count* idle gaps stepping across the window in which a request and the server's
    close cross (from 2 x DELAY before *close* to *close*), a little wider each side."""
    start, end = close - 2 * DELAY - 0.05, close + 0.02
    return [start + (end - start) * i / (count - 1) for i in range(count)]


class TestIdleCloseRace:
    async def test_node_defaults_close_no_request_falsely_maybe_sent(self) -> None:
        # Node 20 closes an idle connection 6 s after its last answer (keepAliveTimeout
        # 5 s, plus 1 s it adds) and advertises timeout=5.
        with node_service() as service:
            async with LatencyRelay(service.port, DELAY) as relay:
                assert await scan(service, relay.url, across(6.0)) == []
            assert (await service.seen())["dispatch"] == 80

    async def test_node_keep_alive_1000_closes_no_request_falsely_maybe_sent(self) -> None:
        # keepAliveTimeout=1000: closed 2 s after the last answer, timeout=1 advertised.
        with node_service("--keep-alive-ms", "1000") as service:
            async with LatencyRelay(service.port, DELAY) as relay:
                assert await scan(service, relay.url, across(2.0)) == []

    async def test_server_closing_unannounced_at_5_s_closes_no_request_falsely_maybe_sent(
        self,
    ) -> None:
        # No Keep-Alive header, closed 5 s after the last answer (uvicorn's default; nginx
        # with keepalive_timeout 5s): the SDK's own limit, 4 s, retires it first.
        with node_service("--idle-close-ms", "5000") as service:
            async with LatencyRelay(service.port, DELAY) as relay:
                assert await scan(service, relay.url, across(5.0)) == []


class TestClosedBeforeWritten:
    async def test_request_on_a_connection_the_server_closed_is_not_written(self) -> None:
        # The server closes the idle connection (no Keep-Alive header, after 300 ms)
        # while the event loop is held between taking the pooled connection and writing
        # the request on it: the loop has not seen the FIN, the connection looks alive.
        # Nothing may be written on it: the request goes on a new connection, once.
        with node_service("--idle-close-ms", "300") as service:
            held: list[bool] = []

            async def hold_until_closed(*_: object) -> None:
                if held:
                    service.wait_for_line(b"closed")

            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(hold_until_closed)
            async with (
                aiohttp.ClientSession(trace_configs=[trace]) as http,
                session(service.url, http_session=http) as client,
            ):
                await client.send_basic(["+5511900000000"], text="warm")
                held.append(True)
                result = await client.send_basic(["+5511900000001"], text="probe")
            seen = await service.seen()
        assert [f.error for f in result.failed] == []
        assert [m.number for m in result.valid] == ["+5511900000001"]
        assert seen["numbers"] == {"+5511900000000": 1, "+5511900000001": 1}
        assert seen["connections"] == 2


class TestIdleLife:
    async def test_a_connection_idle_less_than_its_life_is_reused(self) -> None:
        with node_service() as service:
            async with session(service.url) as client:
                for _ in range(3):
                    await client.send_basic(["+5511900000000"], text="again")
                    await asyncio.sleep(0.2)
            assert (await service.seen())["connections"] == 1

    def test_default_life_is_under_the_common_five_seconds(self) -> None:
        assert IDLE_LIFE == 4.0

    @pytest.mark.parametrize(
        ("header", "life"),
        [
            ("timeout=5", 4.0),
            ("timeout=5, max=1000", 4.0),
            ("max=100, timeout=75", 74.0),
            ('timeout="2"', 1.0),
            ("timeout=1", 0.5),
            ("Timeout=0", 0.0),
            ("max=100", None),
            ("timeout=soon", None),
        ],
    )
    def test_advertised_timeout_less_a_margin(self, header: str, life: float | None) -> None:
        assert advertised_life(header) == life

    def test_a_connector_without_the_attribute_is_left_alone(self) -> None:
        # Were aiohttp to rename it, a request must not break: IDLE_LIFE still holds.
        life = IdleLife(object())  # type: ignore[arg-type]
        life.heed({"Keep-Alive": "timeout=1"})
        assert life.seconds == 0.5

    def test_a_connection_the_kernel_cannot_be_asked_about_is_taken_as_open(self) -> None:
        assert server_has_closed(object()) is False

    async def test_aiohttp_still_keeps_the_idle_limit_where_it_is_shortened(self) -> None:
        # IdleLife writes TCPConnector._keepalive_timeout (no public setter): if aiohttp
        # renames it, this fails, and the Keep-Alive header is no longer heeded.
        connector = idle_connector(10)
        try:
            assert connector._keepalive_timeout == IDLE_LIFE
        finally:
            await connector.close()
        assert "_keepalive_timeout" in aiohttp.BaseConnector._get.__code__.co_names

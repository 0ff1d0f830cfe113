"""Properties of the batcher over random inputs and random fault schedules per chunk.

Whatever the input (valid, invalid, repeated numbers, in any form and shape) and
whatever goes wrong with each chunk, every recipient ends in exactly one bucket, and the
simulator never receives a number more often than the input holds it: nothing the
service may have acted on is sent again.

Each example gets its own simulator and session on the test's event loop, and checks
that closing them leaves no task behind, so nothing leaks from one example to the next.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async.testing import FakeDispatchServer, Fault

#: Valid numbers, one in digits only (the service accepts it too), and invalid ones.
POOL = [
    "+5511900000001",
    "+5511900000002",
    "+5511900000003",
    "+5521987654321",
    "5511900000004",
    "+14155550100",
    "+12025550143",
    "123",
    "abc",
    "+0123456789",
    "+55 11 90000-0005",
]

FAULTS = {
    "400": lambda: Fault.status(400),
    "401": lambda: Fault.status(401),
    "404": lambda: Fault.status(404),
    "429": lambda: Fault.status(429, retry_after="0"),
    "500": lambda: Fault.status(500),
    "502": lambda: Fault.status(502),
    "503": lambda: Fault.status(503),
    "504": lambda: Fault.status(504),
    "drop": Fault.drop,
    "drop_before": Fault.drop_before,
    "not_json": Fault.not_json,
    "wrong_shape": Fault.wrong_shape,
    "digits_only": Fault.digits_only,
    "revoke_token": Fault.revoke_token,
    "omit 1": lambda: Fault.omit(1),
    "omit 3": lambda: Fault.omit(3),
}

recipient = st.tuples(st.sampled_from(POOL), st.sampled_from(["str", "Recipient", "dict"]))
#: Faults met by a chunk's successive attempts (a retried chunk meets the next one).
schedule = st.lists(st.lists(st.sampled_from(sorted(FAULTS)), max_size=3), max_size=8)


def as_given(number: str, form: str) -> Any:
    if form == "Recipient":
        return da.Recipient(number)
    if form == "dict":
        return {"number": number}
    return number


def shaped(items: list[Any], shape: str) -> Any:
    if shape == "generator":
        return (item for item in items)
    if shape == "async generator":

        async def rows() -> AsyncIterator[Any]:
            for item in items:
                yield item

        return rows()
    return items


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    rest: Iterator[str] = iter(whole)
    return all(item in rest for item in part)


@settings(max_examples=40, deadline=None)
@given(
    recipients=st.lists(recipient, max_size=40),
    faults=schedule,
    chunk_size=st.integers(1, 6),
    max_concurrency=st.integers(1, 4),
    dedupe=st.booleans(),
    shape=st.sampled_from(["list", "generator", "async generator"]),
    streamed=st.booleans(),
)
async def test_every_recipient_ends_in_one_bucket_and_nothing_is_sent_twice(
    recipients: list[tuple[str, str]],
    faults: list[list[str]],
    chunk_size: int,
    max_concurrency: int,
    dedupe: bool,
    shape: str,
    streamed: bool,
) -> None:
    numbers = [number for number, _ in recipients]
    items = [as_given(number, form) for number, form in recipients]
    async with FakeDispatchServer() as server:
        for index, names in enumerate(faults):
            chunk = numbers[index * chunk_size : (index + 1) * chunk_size]
            if chunk and names:
                server.script_for(chunk[0], *(FAULTS[name]() for name in names))
        async with da.DispatchSession(
            server.url,
            client_secret=server.client_secret,
            account="acme",
            retry=da.RetryPolicy(wait=False, attempts=3),
            chunk_size=chunk_size,
            max_concurrency=max_concurrency,
            dedupe=dedupe,
        ) as session:
            # A 401 to a fresh token stops the job: what was read is still accounted for.
            stopped = False
            if streamed:
                parts: list[da.DispatchResult] = []
                try:
                    await _collect(
                        session.stream_template(shaped(items, shape), template_id="t"), parts
                    )
                except da.AuthenticationError:
                    stopped = True
                for part in parts:  # each part accounts for exactly its own positions
                    assert Counter(_accounted(part)) == Counter(
                        numbers[part.positions.start : part.positions.stop]
                    )
                result = _merge(parts)
            else:
                try:
                    result = await session.send_template(shaped(items, shape), template_id="t")
                except da.AuthenticationError as stop:
                    result, stopped = stop.result or da.DispatchResult(range(-1)), True
        received = server.stats.received
        client_requests = server.stats.requests
    assert asyncio.all_tasks() == {asyncio.current_task()}, "a task outlived its example"

    if stopped:
        # A 401, and a 401 again to the fresh token: at least two were scripted.
        refusals = {"401", "revoke_token"}
        assert sum(name in refusals for names in faults for name in names) >= 2
    if not stopped or (shape == "list" and not streamed):
        assert len(result.valid) + len(result.invalid) + len(result.failed) == len(numbers)
        assert Counter(_accounted(result)) == Counter(numbers)
    else:  # a stream stopped part way: what it read, each once
        assert Counter(_accounted(result)) == Counter(numbers[: len(result.positions)])
    assert is_subsequence([v.number for v in result.valid], numbers)
    assert is_subsequence([f.recipient.number for f in result.failed], numbers)
    assert not result.unexpected
    assert result.requests == client_requests

    wanted = Counter(numbers)
    for number, times in received.items():
        assert times <= (1 if dedupe else wanted[number]), number
    for item in result.valid:
        assert received[item.number] >= 1
    if dedupe and not stopped:  # every occurrence after the first, and nothing else
        duplicates = Counter(i.number for i in result.invalid if i.reason == "duplicate")
        assert duplicates == Counter({n: c - 1 for n, c in wanted.items() if c > 1})
    for failure in result.failed:
        number = failure.recipient.number
        if wanted[number] == 1 and not failure.maybe_sent:
            assert received[number] == 0, number


async def _collect(stream: AsyncIterator[da.DispatchResult], into: list[da.DispatchResult]) -> None:
    async for part in stream:
        into.append(part)


def _accounted(result: da.DispatchResult) -> list[str]:
    return (
        [v.number for v in result.valid]
        + [i.number for i in result.invalid]
        + [f.recipient.number for f in result.failed]
    )


def _merge(parts: list[da.DispatchResult]) -> da.DispatchResult:
    parts = sorted(parts, key=lambda p: p.positions.start)
    return da.DispatchResult(
        range(parts[-1].positions.stop if parts else 0),
        [v for p in parts for v in p.valid],
        [i for p in parts for i in p.invalid],
        [f for p in parts for f in p.failed],
        [u for p in parts for u in p.unexpected],
        sum(p.requests for p in parts),
        sum(p.retries for p in parts),
    )

"""The simulator's delivery callbacks: vendor-shaped events POSTed to the request's URL.

For every message the service acted on, the events the real service sends (the fields
of its callbacks page; the ``type`` values integrations of it report): the outbound echo,
then ``DELIVERED`` (by SMS for a share of phones without RCS, when the request has an SMS
fallback), ``READ``, ``EXCEPTION``/``ERROR``, an inbound reply, and ``bloqueado por
duplicidade`` for identical content to the same number within an hour. And what a real
network does to them: duplicates, reordering, delays, drops, and re-delivery after an
answer that is not 2xx (bounded).

The simulator only ever posts to loopback addresses (127.0.0.1, ::1, localhost): a
callback URL elsewhere is counted in ``refused_urls`` and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Final

import aiohttp
import attrs
import orjson

__all__ = ["CallbackPlan", "CallbackSender", "CallbackStats"]

log = logging.getLogger("dispatch_async.testing")

_LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})
#: What the outbound echo's ``type`` names per endpoint (its RCS category).
_RCS_TYPE: Final = {
    "basic": "basic",
    "single": "single",
    "template": "conversacional",
    "webhook": "conversacional",
}
_DUPLICATE_WINDOW: Final = 3600.0
_BLOCKED: Final = "bloqueado por duplicidade"


@attrs.frozen
class CallbackPlan:
    """What the simulator's callbacks say, and what the network does to them.

    Shares are probabilities, drawn per message (outcomes) or per event (faults).
    """

    delivered: float = 1.0
    """Share of messages delivered (the others get ``EXCEPTION`` or ``ERROR``)."""
    sms_fallback: float = 0.0
    """Share of delivered messages whose phone has no RCS: delivered on channel ``SMS``
    when the request has an SMS fallback, else ``EXCEPTION``."""
    read: float = 0.5
    """Share of messages delivered by RCS that are then read."""
    replied: float = 0.0
    """Share of read messages that get an inbound ``text`` reply."""
    block_duplicates: bool = True
    """Identical content (the text, or the template) to the same number within an hour
    gets ``bloqueado por duplicidade`` instead of being sent."""
    duplicates: float = 0.0
    """Share of events posted twice."""
    reorder: float = 0.0
    """Share of messages whose events are posted in a shuffled order."""
    delay: float = 0.0
    """Each event waits a random 0 to this many seconds before it is posted."""
    drop: float = 0.0
    """Share of events never posted."""
    max_attempts: int = 3
    """Posts of one event at most, while the receiver answers other than 2xx (or cannot
    be reached)."""
    retry_wait: float = 0.05
    """Seconds between those posts."""
    concurrency: int = 8
    """Events being posted at once."""
    messages: int | None = None
    """Messages that get callbacks at most, the first ones acted on (None: every one):
    a large job's delivery tracking shown on a sample, as ``dispatch-async demo`` does."""
    seed: int | None = None
    """Seeds every draw (None: a fresh seed)."""


@attrs.define
class CallbackStats:
    """What the simulator's callbacks did; plain counters."""

    events: int = 0
    """Events made (one per step of a message; before drops and duplicates)."""
    acknowledged: int = 0
    """POSTs that got a 2xx."""
    failed_attempts: int = 0
    """POSTs answered otherwise, or that could not be made (each is retried, bounded)."""
    given_up: int = 0
    """Events given up after ``max_attempts`` posts."""
    dropped: int = 0
    """Events dropped on purpose (``drop``)."""
    duplicated: int = 0
    """Extra posts of an event (``duplicates``)."""
    blocked: int = 0
    """Messages answered ``bloqueado por duplicidade``."""
    refused_urls: int = 0
    """Requests whose callback URL is not on a loopback address: nothing posted."""
    by_type: dict[str, int] = attrs.field(factory=dict)
    """Events of each ``type`` made, e.g. ``{"DELIVERED": 10, "READ": 5}``."""


class CallbackSender:
    """Posts a server's callbacks in the background; ``FakeDispatchServer.callbacks``.

    ``await server.callbacks.settled()`` waits until every event made so far has been
    posted (or dropped, or given up): a test's synchronisation point.
    """

    def __init__(self, plan: CallbackPlan) -> None:
        self.plan = plan
        self.stats = CallbackStats()
        self._random = random.Random(plan.seed)  # noqa: S311 - a simulation, not a secret
        self._jobs: deque[tuple[str, Mapping[str, Any], Iterator[dict[str, Any]]]] = deque()
        self._recent: dict[tuple[str, str], float] = {}
        self._tracked = 0  # messages given callbacks so far
        self._busy = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._client: aiohttp.ClientSession | None = None
        self._workers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start posting (FakeDispatchServer does it)."""
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._workers = [
            asyncio.create_task(self._work(), name="simulator-callbacks")
            for _ in range(self.plan.concurrency)
        ]

    async def close(self) -> None:
        """Stop posting; events not yet posted are dropped."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if self._client is not None:
            await self._client.close()
            self._client = None
        self._idle.set()

    async def settled(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until every event made so far is posted, dropped or given up."""
        async with asyncio.timeout(timeout):
            await self._idle.wait()

    def acted(self, endpoint: str, body: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
        """The service acted on a dispatch request: queue its messages' callbacks."""
        url = body.get("callback") or body.get("webhook")
        if not isinstance(url, str):
            return
        if urllib.parse.urlsplit(url).hostname not in _LOOPBACK:
            self.stats.refused_urls += 1
            return
        valid = [m for m in answer.get("validMessages") or () if "id" in m]
        if self.plan.messages is not None:
            valid = valid[: max(self.plan.messages - self._tracked, 0)]
        if not valid:
            return
        self._tracked += len(valid)
        self._jobs.append((url, body, self._messages(endpoint, body, valid)))
        self._idle.clear()
        self._wake.set()

    # Making events

    def _messages(
        self, endpoint: str, body: Mapping[str, Any], valid: list[dict[str, Any]]
    ) -> Iterator[dict[str, Any]]:
        """Each message's events as one job item: ``{"events": [...]}``, made lazily."""
        content = _content(body)
        has_sms = any(
            isinstance(f, dict) and f.get("channel") == "sms" for f in body.get("fallback") or ()
        )
        for message in valid:
            yield {"events": self._events(endpoint, body, message, content, has_sms)}

    def _events(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        message: Mapping[str, Any],
        content: str,
        has_sms: bool,
    ) -> list[dict[str, Any]]:
        plan, draw = self.plan, self._random.random
        number = "".join(c for c in str(message.get("number", "")) if c.isdigit())
        now = time.time()
        shared = {
            "reference": message["id"],
            "campaign_name": body.get("campaign_name"),
            "event_id": f"{message['id']}:0",
            "session_id": message.get("session_id"),
            "user_id": number,
        }
        steps: list[tuple[str, str, str]] = []  # (direction, channel, type)
        if plan.block_duplicates and self._seen_recently(number, content, now):
            self.stats.blocked += 1
            steps.append(("outbound", "SMS", _BLOCKED))
        else:
            steps.append(("outbound", "RCS", _RCS_TYPE[endpoint]))
            if draw() >= plan.delivered:
                steps.append(("inbound", "RCS", "EXCEPTION" if draw() < 0.5 else "ERROR"))
            elif draw() < plan.sms_fallback:
                steps.append(("inbound", "SMS", "DELIVERED" if has_sms else "EXCEPTION"))
            else:
                steps.append(("inbound", "RCS", "DELIVERED"))
                if draw() < plan.read:
                    steps.append(("inbound", "RCS", "READ"))
                    if draw() < plan.replied:
                        steps.append(("inbound", "RCS", "text"))
        events = []
        for step, (direction, channel, type_) in enumerate(steps):
            event = {
                **shared,
                "direction": direction,
                "timestamp": _iso(now + step * 0.001),
                "channel": channel,
                "type": type_,
            }
            if type_ == "text":  # an external event: a new event_id, and what was said
                event["event_id"] = f"{message['id']}:1"
                event["message"] = {"text": "ok"}
            self.stats.by_type[type_] = self.stats.by_type.get(type_, 0) + 1
            events.append(event)
        self.stats.events += len(events)
        if len(events) > 1 and draw() < plan.reorder:
            self._random.shuffle(events)
        return events

    def _seen_recently(self, number: str, content: str, now: float) -> bool:
        key = (number, content)
        last = self._recent.get(key)
        self._recent[key] = now if last is None or now - last >= _DUPLICATE_WINDOW else last
        return last is not None and now - last < _DUPLICATE_WINDOW

    # Posting

    async def _work(self) -> None:
        while True:
            item = self._next()
            if item is None:
                if self._busy == 0 and not self._jobs:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            url, events = item
            self._busy += 1
            try:
                for event in events:
                    await self._deliver(url, event)
            finally:
                self._busy -= 1
            if self._busy == 0 and not self._jobs:
                self._idle.set()
                self._wake.set()  # let idle workers re-check

    def _next(self) -> tuple[str, list[dict[str, Any]]] | None:
        while self._jobs:
            url, _, messages = self._jobs[0]
            item = next(messages, None)
            if item is not None:
                return url, item["events"]
            self._jobs.popleft()
        return None

    async def _deliver(self, url: str, event: dict[str, Any]) -> None:
        plan, draw = self.plan, self._random.random
        if plan.drop and draw() < plan.drop:
            self.stats.dropped += 1
            return
        copies = 1
        if plan.duplicates and draw() < plan.duplicates:
            copies = 2
            self.stats.duplicated += 1
        raw = orjson.dumps(event)
        for _ in range(copies):
            if plan.delay:
                await asyncio.sleep(draw() * plan.delay)
            await self._post(url, raw)

    async def _post(self, url: str, raw: bytes) -> None:
        assert self._client is not None
        for attempt in range(1, self.plan.max_attempts + 1):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                headers = {"Content-Type": "application/json"}
                async with self._client.post(url, data=raw, headers=headers) as response:
                    await response.read()
                    if 200 <= response.status < 300:
                        self.stats.acknowledged += 1
                        return
            self.stats.failed_attempts += 1
            if attempt < self.plan.max_attempts:
                await asyncio.sleep(self.plan.retry_wait)
        self.stats.given_up += 1
        log.debug("gave up a callback after %d attempts", self.plan.max_attempts)


def _content(body: Mapping[str, Any]) -> str:
    """What "identical content" compares: the text, or the template and its variables."""
    content = body.get("content")
    if isinstance(content, dict):
        text = content.get("text")
        if isinstance(text, dict):
            return f"text:{text.get('message')}"
    return f"template:{body.get('template_id')}"


def _iso(epoch: float) -> str:
    moment = dt.datetime.fromtimestamp(epoch, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

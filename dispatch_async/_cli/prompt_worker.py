"""arq's worker, woken when there is work instead of every ``poll_delay``.

arq fetches jobs from its queue once per ``poll_delay`` (0.5 s): a slot freed by a
chunk that took 0.2 s stays idle until the next fetch, which made a queued job about
twice as slow as a direct send with as many requests in flight. This worker fetches
again as soon as one of its chunks ends (a slot is free) or a producer announces a
chunk on the queue's wake channel (``wake``). ``poll_delay`` stays as the longest it
waits without either, for what nobody announces: a dead worker's chunk handed over
when its in-progress key expires, a lost announcement.

It overrides two methods arq does not document (``_poll_iteration``, ``start_jobs``): an
arq without them is refused at start, since this worker would otherwise fetch in a loop
with no pause at all (hence also the upper bound on arq).
"""

from __future__ import annotations

import asyncio
from typing import Any

import arq
from arq.constants import in_progress_key_prefix
from arq.worker import Worker

from .spec import Problem
from .wake import Wakeups

__all__ = ["PromptWorker"]


class PromptWorker(Worker):
    """An ``arq.worker.Worker`` that also takes *wake_channel*: announcements of new jobs."""

    def __init__(self, *, wake_channel: str, poll_delay: float = 0.5, **settings: Any) -> None:
        # Checked before arq's __init__, which installs signal handlers on an event loop.
        missing = [name for name in ("_poll_iteration", "start_jobs") if not hasattr(Worker, name)]
        if missing:
            raise Problem(
                f"arq {arq.VERSION} has no Worker.{', Worker.'.join(missing)}, which the queue "
                "worker builds on: install the arq this package names (pip install "
                "'dispatch-async[queue]')"
            )
        # arq's own loop must not sleep between fetches: this one waits in _poll_iteration.
        super().__init__(poll_delay=0, **settings)
        self.idle_poll = poll_delay
        self.wake_channel = wake_channel
        self.wake = asyncio.Event()
        self._wakeups: Wakeups | None = None

    async def _poll_iteration(self) -> None:
        if self._wakeups is None:
            self._wakeups = Wakeups(self.pool, self.wake_channel, self.wake)
        # Subscribed before fetching, so that nothing announced after the fetch is missed.
        await self._wakeups.resubscribe()
        await super()._poll_iteration()
        await self._wakeups.wait(self.idle_poll)

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        if job_ids:
            # The chunks other workers are sending stay at the head of the queue until
            # they end, and arq checks each with three round trips: skip them with one.
            async with self.pool.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.exists(in_progress_key_prefix + job_id.decode())
                running = await pipe.execute()
            job_ids = [job_id for job_id, busy in zip(job_ids, running, strict=True) if not busy]
        started = set(self.tasks.values())
        # arq still claims each of the others atomically (WATCH/MULTI): one of them may
        # have been taken since.
        await super().start_jobs(job_ids)
        for task in self.tasks.values():
            if task not in started:
                # Set after arq's own callback has released the slot.
                task.add_done_callback(lambda _: self.wake.set())

    async def close(self) -> None:
        if self._wakeups is not None:
            await self._wakeups.aclose()
        await super().close()

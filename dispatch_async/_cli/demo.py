"""``dispatch-async demo``: a whole bulk send against the simulator, with no credentials.

It writes a synthetic contacts CSV (a few percent invalid numbers), starts the
simulator in this process with random 429s and a few scripted 503s and 429s, and runs
the very same ``send template`` job on it: same reader, journal, progress and summary.
The simulator posts delivery callbacks for the first messages to a `CallbackServer`
the demo runs, and the demo tells what they said.
"""

from __future__ import annotations

import csv
import random
import secrets
import tempfile
from pathlib import Path

from dispatch_async.callbacks import CallbackServer, DeliveryStatus
from dispatch_async.testing import CallbackPlan, FakeDispatchServer, Fault

from .job.send import run_send
from .job.spec import DEFAULTS, Connection, Display, InputSpec, JobSpec, Target
from .screen.words import counted

__all__ = ["run_demo"]

_NAMES = ("Ana", "Bruno", "Carla", "Diego", "Elisa", "Fábio", "Gabi", "Hugo", "Iara", "João")
#: The share of synthetic numbers the simulator rejects as not a phone number.
_INVALID_SHARE = 0.03
#: Random faults on every dispatch request, each retried after Retry-After: 0.
_FAULT_RATES = {429: 0.02}
#: Messages whose delivery the demo tracks: the first ones sent. Every callback is a
#: POST from the simulator's client, much dearer than a recipient in a bulk request, so
#: tracking all 100,000 would take minutes.
_TRACKED = 2000


def write_contacts(path: Path, count: int, seed: int) -> int:
    """Write *count* synthetic recipients as CSV; returns how many numbers are invalid."""
    rng = random.Random(seed)  # noqa: S311 - sample data, not security
    invalid = 0
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["number", "name", "pixCode"])
        for index in range(count):
            if rng.random() < _INVALID_SHARE:
                number = f"0{index:07d}"  # a leading 0 is never a valid phone number
                invalid += 1
            else:
                number = f"+55119{index:08d}"
            writer.writerow([number, rng.choice(_NAMES), f"PIX{rng.getrandbits(40):010X}"])
    return invalid


async def run_demo(
    *,
    recipients: int,
    output: Path | None,
    seed: int,
    display: Display,
) -> int:
    """Run the demo; the exit code of the send, as for ``send``."""
    workdir = Path(tempfile.mkdtemp(prefix="dispatch-async-demo-"))
    contacts = workdir / "contacts.csv"
    invalid = write_contacts(contacts, recipients, seed)
    secret = secrets.token_urlsafe(24)
    # Most delivered, some by the SMS fallback (phones without RCS), half the others read.
    plan = CallbackPlan(
        delivered=0.97, sms_fallback=0.15, read=0.5, concurrency=32, messages=_TRACKED, seed=seed
    )
    async with (
        CallbackServer() as receiver,
        FakeDispatchServer(
            client_secret=secret,
            fault_rates=_FAULT_RATES,
            seed=seed,
            random_retry_after="0",
            callbacks=plan,
        ) as server,
    ):
        # A 503 and a 429 in a few chunks spread through the job, so retries show; never
        # two numbers of one chunk, or its faults would add up past the retry attempts.
        spacing = max(recipients // 5, DEFAULTS.chunk_size)
        for index in range(recipients // 10, recipients, spacing):
            number = f"+55119{index:08d}"
            server.script_for(number, Fault.status(503, retry_after="0"))
            server.script_for(number, Fault.status(429, retry_after="0"))
        if not display.quiet:
            print(
                f"demo: the simulator listens on {server.url} (random 429s, scripted 503s); "
                f"{counted(recipients, 'synthetic recipient')} "
                f"({counted(invalid, 'invalid number')}) "
                f"in {contacts}",
                file=display.err,
            )
        spec = JobSpec(
            target=Target(
                "template",
                template_id="pix_reminder",
                campaign_name="demo",
                fallback_sms="Seu Pix vence hoje",
                callback=receiver.url,
            ),
            # The simulator is in this process: a proxy of the environment cannot reach it.
            connection=Connection(server.url, secret, "demo", trust_env=False),
            input=InputSpec(str(contacts), "csv"),
            output=output if output is not None else workdir / "results.jsonl",
            display=display,
        )
        code = await run_send(spec)
        assert server.callbacks is not None
        await server.callbacks.settled(timeout=120)
        counts = await receiver.tracker.counts("demo")
        posted = server.callbacks.stats.acknowledged
    if not display.quiet:
        print(_delivery_line(counts, posted), file=display.err)
    if not display.quiet:
        print(
            "next: set DISPATCH_BASE_URL, DISPATCH_CLIENT_SECRET and DISPATCH_ACCOUNT, then "
            "dispatch-async send template --template-id ID --input FILE --output results.jsonl",
            file=display.err,
        )
    return code


def _delivery_line(counts: dict[DeliveryStatus, int], posted: int) -> str:
    """What the callbacks said, as counts of messages."""
    status = DeliveryStatus
    sms = counts.get(status.DELIVERED_SMS, 0)
    read = counts.get(status.READ, 0) + counts.get(status.INTERACTION, 0)
    delivered = counts.get(status.DELIVERED, 0) + sms + read
    tracked = sum(counts.values())
    return (
        f"delivery callbacks ({counted(tracked, 'message')}, the first sent): "
        f"{delivered:,} delivered ({sms:,} by SMS fallback), "
        f"{read:,} read, {tracked - delivered:,} not delivered; "
        f"{counted(posted, 'event')} posted by the simulator, each stored before its 200"
    )

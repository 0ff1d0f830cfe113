"""What the end of a send tells a person to do next, beyond the counts.

Numbers written as at home (``(11) 98765-4321``) are rejected by the service unless
``--prevalidate`` puts them in E.164 with the region's code; when most rejections look
like that, the summary says so and names the flags. ``--max-invalid`` makes too many
rejections a failure. Rows that may have been sent are to be checked, and the export
command that writes them out is named. Every command printed here works as printed on
the finished job's results file alone (its options are kept beside it: ``job.jobfile``);
``tests/cli/test_advice.py`` runs each one.
"""

from __future__ import annotations

import itertools
import shlex
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import dispatch_async as da

__all__ = [
    "HOME_REGION",
    "LocalNumbers",
    "Screening",
    "export_command",
    "resume_command",
    "too_many_invalid",
]

#: The region tried for rejected numbers when neither --region nor DISPATCH_REGION gives
#: one: the service is Brazilian, and so are most of the lists sent through it.
HOME_REGION = "BR"
#: How many rejected numbers are looked at (phonenumbers costs tens of microseconds each).
_SAMPLE = 1000


class Screening(Protocol):
    """What advice reads of a job's settings (``job.spec.SendSettings`` has both).

    A protocol, not the class: the screen wing imports no other wing.
    """

    @property
    def prevalidate(self) -> bool: ...

    @property
    def region(self) -> str | None: ...


class LocalNumbers:
    """The first rejected numbers of a run, to tell whether they are local numbers."""

    def __init__(self, settings: Screening) -> None:
        self._settings = settings
        self._region = settings.region or HOME_REGION
        # With both, a local number of the region was sent in E.164: a rejection is not one.
        self._active = not (settings.prevalidate and settings.region)
        self._sample: list[str] = []

    def add(self, invalid: Iterable[da.InvalidMessage]) -> None:
        """Keep rejected numbers (not duplicates) until the sample is full."""
        room = _SAMPLE - len(self._sample)
        if room > 0 and self._active:
            self._sample += (
                item.number
                for item in itertools.islice(invalid, room)
                if item.reason != da.DUPLICATE_REASON
            )

    def advice(self) -> str | None:
        """The summary's line when at least half the numbers looked at are local ones."""
        sample = self._sample
        region = self._region
        local = sum(1 for n in sample if n[:1] != "+" and da.to_e164(n, region) is not None)
        if not local or 2 * local < len(sample):
            return None
        settings = self._settings
        flags = [] if settings.prevalidate else ["--prevalidate"]
        if not settings.region:
            flags.append(f"--region {region}")
        first = "first " if len(sample) == _SAMPLE else ""
        return (
            f"  {local:,} of the {first}{len(sample):,} numbers rejected look like local "
            f"numbers of {region}, written without the country code: {' '.join(flags)} "
            f"sends them in E.164 (DISPATCH_REGION sets the region for every job)"
        )


def too_many_invalid(totals: Counter[str], most: float | None) -> str | None:
    """Why the job fails ``--max-invalid`` (percent of its recorded lines), or None."""
    lines = totals.total()
    if most is None or not lines or 100 * totals["invalid"] <= most * lines:
        return None
    return (
        f"too many rejected: {totals['invalid']:,} of the job's {lines:,} lines are invalid "
        f"({100 * totals['invalid'] / lines:.1f}%, over --max-invalid {most:g}%)"
    )


def export_command(output: Path, outcome: str, input_path: str) -> str:
    """The command that writes the input rows of *outcome* to a file of their own."""
    suffix = Path(input_path).suffix if input_path != "-" else ""
    to = Path(output).with_name(f"{outcome}{suffix or '.csv'}")
    return (
        f"dispatch-async export {shlex.quote(str(output))} --outcome {outcome} "
        f"-o {shlex.quote(str(to))}"
    )


def resume_command(output: Path, *, resend_maybe_sent: bool = False) -> str:
    """The command that continues the job writing *output* with the options it kept.

    It sends the ``not_sent`` rows again, and the ``maybe_sent`` ones only with
    *resend_maybe_sent*; a ``sent`` row never.
    """
    again = " --resend-maybe-sent" if resend_maybe_sent else ""
    return f"dispatch-async send --resume{again} -o {shlex.quote(str(output))}"

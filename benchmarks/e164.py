"""What ``--prevalidate`` costs a number: ``da.to_e164`` against phonenumbers on the same corpus.

Each repetition runs each side in a fresh interpreter of its own (phonenumbers' patterns
for many regions push one another out of the re module's cache: the other side's calls
to phonenumbers would pay for it), which side goes first alternating. A side makes the
corpora from a fixed seed (tests/phone_corpus.py, the corpus the differential test
uses) and converts each twice: the first pass cold (patterns compiled as each region and
length is met, by phonenumbers and by the SDK alike), the second the steady state the
rest of a long job sees. phonenumbers is its parse + is_valid_number +
format_number(E164) with its default settings, which is what ``to_e164`` was.
Throughput is numbers per CPU second of the process (user+sys), so other jobs on a
shared machine slow both sides alike; the ratio is the SDK's over phonenumbers', from
the medians and per repetition. The corpora, all read with region
"BR":

* ``spreadsheet``: a Brazilian company's phone column; 90% Brazilian numbers in the
  formats people type (local mobile and landline, with or without +55 / 55, trunk 0,
  carrier codes, any separators, 10% typos), 5% foreign numbers (from twenty countries
  Brazilians deal with most), 5% junk;
* ``foreign``: only foreign numbers, "+" and country code, from every region;
* ``invalid``: only what is not a number (empty cells, text, wrong lengths, Excel's
  scientific notation).

Then each side converts one number of each common form 5,000 times: what a form costs.

Target (issue 25): at least 10x phonenumbers on ``spreadsheet``. ``run.py --only e164``
includes it, or on its own:

    python benchmarks/e164.py [--numbers 20000] [--reps 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 10.0
CORPORA = ("spreadsheet", "foreign", "invalid")
SIDES = ("phonenumbers", "sdk")
#: One number of each form, converted again and again: what each form costs.
FORMS = {
    "(11) 98765-4321": "local mobile",
    "11 3456-7890": "local landline",
    "+55 11 98765-4321": "+55",
    "55 11 98765 4321": "55",
    "0 11 98765-4321": "trunk 0",
    "0 15 11 98765-4321": "carrier code",
    "0XX11 98765-4321": "0XX",
    "+1 212 555 0123": "foreign (US)",
    "+351 912 345 678": "foreign (PT)",
}
FORM_CALLS = 5000


def _one(numbers: int, side: str) -> dict[str, Any]:
    """One process, one side: each corpus timed twice, the first pass cold."""
    sys.path.insert(0, str(ROOT))
    import dispatch_async as da
    from dispatch_async import _e164
    from tests import phone_corpus

    convert = da.to_e164 if side == "sdk" else phone_corpus.by_phonenumbers
    started = time.perf_counter()
    convert("(11) 98765-4321", "BR")
    out: dict[str, Any] = {"first_call": time.perf_counter() - started}
    makers = {
        "spreadsheet": phone_corpus.spreadsheet_mix,
        "foreign": phone_corpus.foreign,
        "invalid": phone_corpus.invalid,
    }
    for name, make in makers.items():
        corpus = phone_corpus.corpus(numbers, 25, make)
        for first in (True, False):
            cpu = time.process_time()
            answers = [convert(number, "BR") for number in corpus]
            out[f"{name}_cold" if first else name] = numbers / (time.process_time() - cpu)
        out[f"{name}_answers"] = hashlib.sha256(json.dumps(answers).encode()).hexdigest()
        if side == "sdk":
            tables = _e164._load()
            unsure = sum(_e164._decide(tables, n, "BR") is _e164._UNSURE for n in corpus)
            out[f"{name}_fallback"] = unsure / numbers
    for number in FORMS:
        convert(number, "BR")
        cpu = time.process_time()
        for _ in range(FORM_CALLS):
            convert(number, "BR")
        out[number] = (time.process_time() - cpu) / FORM_CALLS * 1e6
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(numbers: int, reps: int) -> dict[str, Any]:
    """*reps* rounds of a fresh process per side, which side goes first alternating.

    A process per side: phonenumbers' patterns for many regions push one another out
    of the re module's cache, which would slow the other side's calls to phonenumbers.
    """
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for rep in range(reps):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            done = subprocess.run(  # noqa: S603 - our interpreter, this file
                [sys.executable, __file__, "--one", side, "--numbers", str(numbers)],
                capture_output=True,
                text=True,
                check=True,
                timeout=1800,
                cwd=ROOT,
            )
            runs[side].append(json.loads(done.stdout))
    sdk_runs, their_runs = runs["sdk"], runs["phonenumbers"]
    out: dict[str, Any] = {
        "numbers": numbers,
        "reps": reps,
        "first_call_ms": {
            side: _spread([r["first_call"] * 1000 for r in runs[side]]) for side in SIDES
        },
    }
    for name in CORPORA:
        if any(
            s[f"{name}_answers"] != p[f"{name}_answers"]
            for s, p in zip(sdk_runs, their_runs, strict=True)
        ):
            raise SystemExit(f"{name}: the SDK and phonenumbers answered differently")
        sdk = [r[name] for r in sdk_runs]
        theirs = [r[name] for r in their_runs]
        cold = [r[f"{name}_cold"] for r in sdk_runs]
        their_cold = [r[f"{name}_cold"] for r in their_runs]
        out[name] = {
            "sdk": _spread(sdk),
            "phonenumbers": _spread(theirs),
            "ratio": statistics.median(sdk) / statistics.median(theirs),
            "ratio_pairs": _spread([s / p for s, p in zip(sdk, theirs, strict=True)]),
            "cold_ratio": statistics.median(cold) / statistics.median(their_cold),
            "fallback": sdk_runs[0][f"{name}_fallback"],
        }
    out["forms_us"] = {
        number: {side: statistics.median(r[number] for r in runs[side]) for side in SIDES}
        for number in FORMS
    }
    out["raw"] = runs
    return out


def verdicts(result: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """[figure, value, target, met] rows for run.py's table."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for name in CORPORA:
        r = result[name]
        sdk, theirs = r["sdk"], r["phonenumbers"]
        pairs = r["ratio_pairs"]
        rows.append(
            (
                f"to_e164 {name}: numbers/CPU s, SDK / phonenumbers",
                f"{sdk['median']:,.0f} ({sdk['min']:,.0f}-{sdk['max']:,.0f}) / "
                f"{theirs['median']:,.0f} ({theirs['min']:,.0f}-{theirs['max']:,.0f})",
                "",
                None,
            )
        )
        target = name == "spreadsheet"
        rows.append(
            (
                f"to_e164 {name}: ratio SDK/phonenumbers ({r['fallback']:.1%} to phonenumbers)",
                f"{r['ratio']:.1f}x; pairs {pairs['median']:.1f} "
                f"({pairs['min']:.1f}-{pairs['max']:.1f}); first pass {r['cold_ratio']:.1f}x",
                f">= {TARGET:g}x" if target else "info",
                r["ratio"] >= TARGET if target else None,
            )
        )
    for number, t in result["forms_us"].items():
        rows.append(
            (
                f"to_e164 {number!r} ({FORMS[number]}): us, SDK / phonenumbers",
                f"{t['sdk']:.1f} / {t['phonenumbers']:.0f} ({t['phonenumbers'] / t['sdk']:.0f}x)",
                "info",
                None,
            )
        )
    per_1000 = {side: 1_000_000 / result["spreadsheet"][side]["median"] for side in SIDES}
    first = result["first_call_ms"]
    rows.append(
        (
            "to_e164: CPU ms per 1,000 spreadsheet numbers, SDK / phonenumbers",
            f"{per_1000['sdk']:.1f} / {per_1000['phonenumbers']:.1f}",
            "info",
            None,
        )
    )
    rows.append(
        (
            "to_e164: first call (phonenumbers import, tables), ms, SDK / phonenumbers",
            f"{first['sdk']['median']:.0f} / {first['phonenumbers']['median']:.0f}",
            "info",
            None,
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", choices=SIDES, help="one process's figures, as JSON")
    parser.add_argument("--numbers", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.numbers, args.one)))
        return
    result = measure(args.numbers, args.reps)
    for figure, value, target, met in verdicts(result):
        verdict = "" if met is None else ("pass" if met else "MISS")
        print(f"{figure:<70} {value:<40} {target:<8} {verdict}".rstrip())


if __name__ == "__main__":
    main()

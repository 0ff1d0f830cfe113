"""Print the mutation score of the last `mutmut run`, per module and in all (nox -s mutation).

Reads mutmut's records (mutants/**/*.py.meta). Killed: a test failed or timed out; a
mutant mutmut did not run (not selected, or no test reached it) is counted apart.
Exits 1 when the score is under the target, so that a drop is noticed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET = 90.0
KILLED = {1, 3, 24, -24, 36, 37, 152, 255}  # failed, pytest error, timeout, type check
SURVIVED = {0, 5, 33}  # passed, or no test reached it: nothing noticed the change


def main() -> int:
    metas = sorted(Path("mutants").glob("**/*.py.meta"))
    total_killed = total_run = 0
    for meta in metas:
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        ran = [code for code in codes.values() if code is not None]
        if not ran:
            continue
        killed = sum(code in KILLED for code in ran)
        survivors = sorted(k for k, code in codes.items() if code in SURVIVED)
        total_killed += killed
        total_run += len(ran)
        module = meta.name.removesuffix(".py.meta")
        print(
            f"{module:14} {killed:5}/{len(ran):<5} killed {100 * killed / len(ran):5.1f}%"
            f"  (not run: {len(codes) - len(ran)})"
        )
        for name in survivors:
            print(f"    survived: {name}")
    if not total_run:
        print("no mutant ran: run `mutmut run` first")
        return 1
    score = 100 * total_killed / total_run
    print(f"{'all':14} {total_killed:5}/{total_run:<5} killed {score:5.1f}% (target {TARGET:.0f}%)")
    return 0 if score >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

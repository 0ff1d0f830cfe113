"""What a collected result costs in memory: ``send_basic`` against ``stream_basic``.

``python benchmarks/memory.py [--n 1000000 --n 2000000] [--reps 1]`` runs each call over
n numbers read from a generator, each in a fresh interpreter (workloads.py ``call_rss``)
against the simulator in its own process (its memory does not count), and prints the
rise of the client's peak RSS (``ru_maxrss``) over the peak before the call, per
recipient, with the target for ``send_*`` and a verdict.
"""

from __future__ import annotations

import argparse
import statistics

from processes import child, compile_installed, server, simulator

MIB = 1024 * 1024
#: What a ``send_*`` call may keep per recipient at 1M, RSS rise (issue 39).
TARGET_BYTES_PER_RECIPIENT = 64
TARGET_N = 1_000_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, action="append", help="recipients (repeatable)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each measurement")
    args = parser.parse_args(argv)
    sizes = args.n or [1_000_000, 2_000_000]
    compile_installed()
    rises: dict[tuple[str, int], float] = {}
    print(
        f"{'call':<14}{'n':>11}{'before MiB':>12}{'peak MiB':>10}{'rise MiB':>10}"
        f"{'B/recipient':>13}{'CPU s':>8}"
    )
    with server(simulator()) as srv:
        for n in sizes:
            for call in ("send", "stream"):
                runs = [
                    child({"kind": "call_rss", "url": srv.url, "n": n, "call": call}, srv)
                    for _ in range(args.reps)
                ]
                before = statistics.median(r["rss_before"] for r in runs)
                peak = statistics.median(r["rss_peak"] for r in runs)
                rise = statistics.median(r["rss_peak"] - r["rss_before"] for r in runs)
                cpu = statistics.median(r["cpu"] for r in runs)
                rises[call, n] = rise / n
                print(
                    f"{call + '_basic':<14}{n:>11,}{before / MIB:>12.1f}{peak / MIB:>10.1f}"
                    f"{rise / MIB:>10.1f}{rise / n:>13.1f}{cpu:>8.2f}",
                    flush=True,
                )
    held = rises.get(("send", TARGET_N))
    if held is not None:
        verdict = "met" if held <= TARGET_BYTES_PER_RECIPIENT else "MISSED"
        print(
            f"target: send_* keeps at most {TARGET_BYTES_PER_RECIPIENT} B per recipient at "
            f"{TARGET_N:,} (RSS rise): {held:.1f} B, {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

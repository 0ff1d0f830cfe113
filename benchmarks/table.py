"""run.py's table: a [figure, value, target, pass/MISS] row per figure the phases measured."""

from __future__ import annotations

from typing import Any

Row = list[str]


def rng(s: dict[str, float], fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """``median (min-max)``."""
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    return f"{fmt.format(m)} ({fmt.format(lo)}-{fmt.format(hi)})"


def row(figure: str, value: str, target: str = "", ok: bool | None = None) -> Row:
    return [figure, value, target, "" if ok is None else ("pass" if ok else "MISS")]


def ratio_row(figure: str, figures: dict[str, Any], key: str, target: str | None) -> Row:
    """A ratio of medians, with the range of the per-pair ratios (``<key>_pairs``),
    against a *target* such as ``"<= 1.10x"`` or ``">= 0.97x"`` (None: for information)."""
    ratio = figures[key]
    value = f"{ratio:.2f}x; pairs {rng(figures[f'{key}_pairs'], '{:.2f}')}"
    if target is None:
        return row(figure, value, "info")
    bound, limit = target.split()
    limit_value = float(limit.removesuffix("x"))
    return row(
        figure, value, target, ratio <= limit_value if bound == "<=" else ratio >= limit_value
    )


def size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def overhead_rows(
    overhead: dict[str, Any], over: str = "", throughput_target: str | None = ">= 0.97x"
) -> list[Row]:
    """The overhead phase's rows, or the HTTPS phase's (*over* "HTTPS via nginx", no
    throughput target: issue 35 sets one for CPU only)."""
    rows = []
    # The targets name 100k and 1M: the two largest sizes of the plan.
    for key in sorted(overhead, key=int)[-2:]:
        o, label = overhead[key], f"{over} {size_label(int(key))}".lstrip()
        sdk, base = o["sdk"], o["baseline"]
        rows += [
            row(f"{label}: client CPU s/100k, SDK", rng(sdk["cpu_per_100k"])),
            row(f"{label}: client CPU s/100k, baseline", rng(base["cpu_per_100k"])),
            ratio_row(f"{label}: CPU ratio SDK/baseline", o, "cpu_ratio", "<= 1.10x"),
            row(f"{label}: throughput/s, SDK", rng(sdk["throughput"], "{:,.0f}")),
            row(f"{label}: throughput/s, baseline", rng(base["throughput"], "{:,.0f}")),
            ratio_row(
                f"{label}: throughput ratio SDK/baseline", o, "throughput_ratio", throughput_target
            ),
            row(
                f"{label}: server CPU busy, SDK / baseline runs",
                f"{sdk['server_busy']['median']:.0%} / {base['server_busy']['median']:.0%}",
                "info",
            ),
        ]
    return rows


def scaling_rows(overhead: dict[str, Any]) -> list[Row]:
    def per(client: str) -> dict[int, float]:
        return {
            int(n): o[client]["cpu_per_100k"]["median"] / 100_000 * 1e6 for n, o in overhead.items()
        }

    sdk, base = per("sdk"), per("baseline")
    if not sdk:
        return []
    spread_ = max(sdk.values()) / min(sdk.values()) - 1
    smallest = overhead[min(overhead, key=int)]
    first = smallest["sdk"]["raw"][0]["warm_n"]
    return [
        row(
            f"first call ({first:,} recipients, token, connections), CPU ms SDK / baseline",
            f"{smallest['sdk']['first_call_cpu']['median'] * 1000:.0f} / "
            f"{smallest['baseline']['first_call_cpu']['median'] * 1000:.0f}",
            "info",
        ),
        row(
            "SDK CPU us/recipient by size",
            ", ".join(f"{size_label(n)} {v:.2f}" for n, v in sorted(sdk.items())),
        ),
        row(
            "baseline CPU us/recipient by size",
            ", ".join(f"{size_label(n)} {v:.2f}" for n, v in sorted(base.items())),
            "info",
        ),
        row("SDK CPU/recipient: max/min - 1", f"{spread_:.0%}", "<= 15%", spread_ <= 0.15),
    ]


def answer_rows(a: dict[str, Any]) -> list[Row]:
    label = size_label(a["n"])
    cpu = a["cpu_per_100k"]
    return [
        row(f"{label}: SDK client CPU s/100k, bare answers", rng(cpu["bare"])),
        row(f"{label}: SDK client CPU s/100k, answers with session_id", rng(cpu["session_id"])),
        ratio_row(f"{label}: CPU ratio session_id/bare", a, "cpu_ratio", "<= 1.05x"),
    ]


def server_rows(s: dict[str, Any]) -> list[Row]:
    return [
        row(
            "server alone: CPU s/100k (capacity, one core)",
            f"{s['server_cpu_per_100k']['median']:.3f} ({s['capacity']['median']:,.0f}/s)",
            "info",
        ),
        row(
            f"server alone: baseline at concurrency 32, {size_label(s['n'])}/s",
            rng(s["throughput"], "{:,.0f}"),
            "info",
        ),
    ]


def grid_rows(g: dict[str, Any]) -> list[Row]:
    cells = g["cells"]
    best = max(cells.values(), key=lambda c: c["throughput"]["median"])
    rows = [
        row(
            "grid: fastest chunk_size x concurrency",
            f"{best['chunk_size']}x{best['concurrency']}: {best['throughput']['median']:,.0f}/s",
            "info",
        )
    ]
    default = cells.get("1000x8")
    if default:
        share = default["throughput"]["median"] / best["throughput"]["median"]
        rows.append(
            row(
                "grid: default 1000x8",
                f"{default['throughput']['median']:,.0f}/s ({share:.0%} of fastest)",
                "info",
            )
        )
    return rows


def memory_rows(m: dict[str, Any]) -> list[Row]:
    kept = m["retained_per_recipient"]
    return [
        row(
            f"stream {size_label(m['stream_n'])}: peak RSS rise, MB",
            rng(m["stream_rise_mb"], "{:.1f}"),
            "<= 64 MB",
            m["stream_rise_mb"]["max"] <= 64,
        ),
        row(
            f"aggregated {size_label(m['retained_n'])}: retained B/recipient, SDK",
            f"{kept['sdk']:.0f}",
            "<= 300",
            kept["sdk"] <= 300,
        ),
        row("  same, baseline (its two lists of answer dicts)", f"{kept['baseline']:.0f}", "info"),
    ]


def token_rows(t: dict[str, Any]) -> list[Row]:
    burst, soak = t["burst"], t["soak"]
    calls = burst["server"].get("token_calls", -1)
    seen = soak["server"]
    expired = seen.get("expired_token_uses", -1)
    refused = seen.get("unauthorized", -1)
    failed = soak["client"]["failed"]
    return [
        row(
            f"token calls, {burst['sends']:,} concurrent sends (server/client)",
            f"{calls} / {burst['client']['token_calls']}",
            "== 1",
            calls == 1 and burst["client"]["token_calls"] == 1,
        ),
        row(
            f"token calls, {soak['seconds']:.0f}s run at {soak['lifetime']:g}s lifetime",
            f"{seen.get('token_calls', -1)} (~{soak['expected_calls']} expected; "
            f"{soak['client']['recipients']:,} recipients sent)",
            "info",
        ),
        row(
            "  expired tokens used / 401s / failed",
            f"{expired} / {refused} / {failed}",
            "0 / 0 / 0",
            expired == 0 and refused == 0 and failed == 0,
        ),
    ]


def startup_rows(st: dict[str, Any]) -> list[Row]:
    return [
        row("import dispatch_async, ms", rng(st["dispatch_async"], "{:.0f}", 1000)),
        row("import aiohttp, ms", rng(st["aiohttp"], "{:.0f}", 1000)),
        row("import ratio", f"{st['ratio']:.2f}x", "<= 1.5x", st["ratio"] <= 1.5),
    ]


def cli_rows(c: dict[str, Any]) -> list[Row]:
    label = f"CLI send vs script, {size_label(c['rows'])} rows"
    return [
        row(
            f"{label}: CPU s, CLI / script",
            f"{rng(c['cli']['cpu'], '{:.2f}')} / {rng(c['script']['cpu'], '{:.2f}')}",
        ),
        ratio_row(f"{label}: CPU ratio", c, "cpu_ratio", "<= 1.25x"),
        ratio_row(f"{label}: wall ratio", c, "wall_ratio", "<= 1.2x"),
    ]


def blocking_rows(b: dict[str, Any]) -> list[Row]:
    wall, cpu, overhead = b["wall_ms"], b["cpu_ms"], b["overhead_ms"]
    return [
        row(
            "blocking client: ms per small call, client / session",
            f"{rng(wall['client'])} / {rng(wall['session'])}",
            "info",
        ),
        row(
            "blocking client: overhead per call, ms",
            rng(overhead),
            "<= 0.3 ms",
            overhead["median"] <= 0.3,
        ),
        row(
            "blocking client: CPU ms per call, client / session",
            f"{rng(cpu['client'])} / {rng(cpu['session'])}",
            "info",
        ),
    ]


def e164_rows(e: dict[str, Any]) -> list[Row]:
    import e164

    return [row(figure, value, target, met) for figure, value, target, met in e164.verdicts(e)]


def adaptive_rows(a: dict[str, Any]) -> list[Row]:
    import adaptive

    return [row(figure, value, target, met) for figure, value, target, met in adaptive.verdicts(a)]


def table(results: dict[str, Any]) -> list[Row]:
    """[figure, value, target, pass/MISS] rows for whatever phases ran."""
    rows: list[Row] = []
    if results.get("overhead"):
        rows += overhead_rows(results["overhead"])
    if results.get("https"):
        rows += overhead_rows(results["https"], "HTTPS via nginx", None)
    if results.get("server"):
        rows += server_rows(results["server"])
    if results.get("answers"):
        rows += answer_rows(results["answers"])
    if results.get("overhead"):
        rows += scaling_rows(results["overhead"])
    if results.get("grid"):
        rows += grid_rows(results["grid"])
    if results.get("memory"):
        rows += memory_rows(results["memory"])
    if results.get("tokens"):
        rows += token_rows(results["tokens"])
    if results.get("cli"):
        rows += cli_rows(results["cli"])
    if results.get("blocking"):
        rows += blocking_rows(results["blocking"])
    if results.get("e164"):
        rows += e164_rows(results["e164"])
    if results.get("startup"):
        rows += startup_rows(results["startup"])
    if results.get("adaptive"):
        rows += adaptive_rows(results["adaptive"])
    return rows


def render(rows: list[Row]) -> str:
    header = ["figure", "value: median (min-max)", "target", "result"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def render_grid(grid: dict[str, Any]) -> str:
    cells = grid["cells"]
    chunks = sorted({c["chunk_size"] for c in cells.values()})
    conc = sorted({c["concurrency"] for c in cells.values()})
    lines = [
        f"SDK throughput in recipients/s, and client CPU s/100k in brackets "
        f"({grid['n']:,} recipients, median of {grid['reps']}):",
        "chunk_size \\ concurrency" + "".join(f"{k:>20}" for k in conc),
    ]
    for c in chunks:
        cells_text = (
            f"{cells[f'{c}x{k}']['throughput']['median']:>12,.0f} "
            f"({cells[f'{c}x{k}']['cpu_per_100k']['median']:.2f})"
            for k in conc
        )
        lines.append(f"{c:<24}" + "".join(f"{t:>20}" for t in cells_text))
    return "\n".join(lines)

"""The script a user could write instead of ``dispatch-async send``: the CLI's yardstick.

CSV reader -> ``stream_template`` -> one orjson line per recipient, using only the
public SDK. No journal, no resume, no progress: what the CLI adds must be paid for
within the ratios in benchmarks/README.md.

    python benchmarks/script.py INPUT.csv OUTPUT.jsonl   (DISPATCH_* from the environment)
"""

from __future__ import annotations

import asyncio
import csv
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

import dispatch_async as da


def recipients(path: str) -> Iterator[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as stream:
        for row in csv.DictReader(stream):
            number = row.pop("number")
            yield {"number": number, "vars": row}


async def send(source: str, out: BinaryIO) -> None:
    async with da.DispatchSession.from_env() as session:
        async for part in session.stream_template(recipients(source), template_id="bench"):
            lines = [orjson.dumps({"number": v.number, "id": v.id}) for v in part.valid]
            lines += [orjson.dumps({"number": i.number, "reason": i.reason}) for i in part.invalid]
            lines += [
                orjson.dumps({"number": f.recipient.number, "error": str(f.error)})
                for f in part.failed
            ]
            out.write(b"\n".join(lines) + b"\n")


if __name__ == "__main__":
    with open(sys.argv[2], "wb") as output:
        asyncio.run(send(sys.argv[1], output))

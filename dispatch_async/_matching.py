"""Deciding what happened to each recipient of a chunk, from the answer or the error.

An answer is matched back to what was sent by number. A well-behaved service echoes
every number once, and that case is checked in bulk (list searches and comparisons
in C). Anything else goes through the careful path: numbers in another
format (digits only), duplicates, entries missing an id, recipients the answer
forgot (failed, maybe sent) and entries that match nothing we sent (``unexpected``).
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from ._exceptions import DispatchError, MalformedResponseError, MissingFromResponseError
from ._models import (
    DispatchResult,
    FailedRecipient,
    invalid_messages,
    valid_messages,
)
from ._recipients import Chunk, recipient_of
from ._wire import AnswerColumns, decode_json

__all__ = ["result_from_answer", "result_from_error"]

log = logging.getLogger("dispatch_async")

_NOT_DIGITS = re.compile(r"\D")
_NO_REASON = "the service gave no reason"
_ID = itemgetter("id")
_NUMBER = itemgetter("number")
_REASON = itemgetter("reason")


def result_from_error(
    chunk: Chunk, error: DispatchError, *, requests: int = 0, retries: int = 0
) -> DispatchResult:
    """Every sendable recipient of *chunk* failed with *error*."""
    given = chunk.given_numbers()
    maybe_sent = error.maybe_sent
    failures = [
        FailedRecipient(recipient_of(m, g), error, maybe_sent)
        for m, g in zip(chunk.messages, given, strict=True)
    ]
    numbers, reasons = _rejected(chunk)
    return DispatchResult(
        chunk.positions,
        valid_messages([], []),
        invalid_messages(numbers, reasons),
        failures,
        requests=requests,
        retries=retries,
    )


def result_from_answer(
    chunk: Chunk, data: Any, *, requests: int = 1, retries: int = 0
) -> DispatchResult:
    """The outcome of every recipient of *chunk*, from the service's 200 answer *data*.

    *data* is the parsed JSON, or ``AnswerColumns`` when it was decoded with its shape
    checked (``decode_answer``); both go through the same match.
    """
    if isinstance(data, AnswerColumns):
        if _matches(chunk, data.valid_numbers, data.invalid_numbers):
            return _quick_result(
                chunk,
                data.ids,
                data.valid_numbers,
                data.invalid_numbers,
                data.reasons,
                requests=requests,
                retries=retries,
            )
        try:
            data = decode_json(data.body)
        except MalformedResponseError as unreadable:
            return result_from_error(chunk, unreadable, requests=requests, retries=retries)
    if not isinstance(data, dict):
        error = MalformedResponseError(f"the answer is a JSON {type(data).__name__}, not an object")
        return result_from_error(chunk, error, requests=requests, retries=retries)
    valid = data.get("validMessages", [])
    invalid = data.get("invalidMessages", [])
    if not isinstance(valid, list) or not isinstance(invalid, list):
        error = MalformedResponseError("validMessages and invalidMessages must be arrays")
        return result_from_error(chunk, error, requests=requests, retries=retries)
    columns = _columns(valid, invalid)
    if columns is not None and _matches(chunk, columns[1], columns[2]):
        return _quick_result(chunk, *columns, requests=requests, retries=retries)
    return _careful_match(chunk, valid, invalid, requests=requests, retries=retries)


_Columns = tuple[Sequence[str], Sequence[str], list[str], list[str]]


def _quick_result(
    chunk: Chunk,
    ids: Sequence[str],
    valid_numbers: Sequence[str],
    invalid_numbers: list[str],
    reasons: list[str],
    *,
    requests: int,
    retries: int,
) -> DispatchResult:
    numbers, local_reasons = _rejected(chunk)
    return DispatchResult(
        chunk.positions,
        valid_messages(ids, valid_numbers),
        invalid_messages(invalid_numbers + numbers, reasons + local_reasons),
        requests=requests,
        retries=retries,
    )


def _columns(valid: list[Any], invalid: list[Any]) -> _Columns | None:
    """(ids, valid numbers, invalid numbers, reasons) if every entry has them as strings.

    The ids and numbers are tuples: the part keeps them until the job's end, and the
    garbage collector stops tracking a tuple of strings (see ``_Pairs``).
    """
    try:
        # map + itemgetter raise exactly what m["id"] would (KeyError, TypeError).
        ids = tuple(map(_ID, valid))
        valid_numbers = tuple(map(_NUMBER, valid))
        invalid_numbers = list(map(_NUMBER, invalid))
        reasons = list(map(_REASON, invalid))
        # str.join type-checks a whole list in C: it raises unless every item is a str.
        "".join(ids)
        "".join(valid_numbers)
        "".join(invalid_numbers)
        "".join(reasons)
    except (KeyError, TypeError):
        return None
    if "" in ids:
        return None
    return ids, valid_numbers, invalid_numbers, reasons


def _matches(chunk: Chunk, valid_numbers: Sequence[str], invalid_numbers: list[str]) -> bool:
    """Whether the answer names exactly the numbers sent, as sent, each once."""
    if chunk.given is not None:
        return False
    sent = list(map(_NUMBER, chunk.messages))
    if len(valid_numbers) + len(invalid_numbers) != len(sent):
        return False
    return _interleaved(sent, valid_numbers, invalid_numbers) or (
        # Another order: compare as multisets. dict.__eq__ compares the counts in C,
        # where Counter.__eq__ is a Python loop dearer than all the rest of the match.
        dict.__eq__(Counter([*valid_numbers, *invalid_numbers]), Counter(sent))
    )


def _interleaved(sent: list[str], valid: Sequence[str], invalid: Sequence[str]) -> bool:
    """Whether *sent* splits into *valid* and *invalid*, each in the order sent.

    That is how a service answers when it keeps the order: checked in C by locating the
    shorter list's numbers in *sent* (``list.index`` from the last hit on) and comparing
    what is left with the other list. Any other answer gets False, never a wrong True.
    """
    few, many = (invalid, valid) if len(invalid) <= len(valid) else (valid, invalid)
    if not few:
        return list(many) == sent
    rest: list[str] = []
    at = 0
    try:
        for number in few:
            found = sent.index(number, at)
            rest += sent[at:found]
            at = found + 1
    except ValueError:
        return False
    rest += sent[at:]
    return rest == list(many)


def _careful_match(
    chunk: Chunk, valid: list[Any], invalid: list[Any], *, requests: int, retries: int
) -> DispatchResult:
    given = chunk.given_numbers()
    exact: defaultdict[str, deque[int]] = defaultdict(deque)
    digits: defaultdict[str, deque[int]] = defaultdict(deque)
    for position, message in enumerate(chunk.messages):
        exact[message["number"]].append(position)
        digits[_NOT_DIGITS.sub("", message["number"])].append(position)
    claimed: set[int] = set()

    def claim(number: object) -> int | None:
        if type(number) is not str:
            return None
        for table, key in ((exact, number), (digits, _NOT_DIGITS.sub("", number))):
            queue = table.get(key)
            while queue:
                candidate = queue.popleft()
                if candidate not in claimed:
                    claimed.add(candidate)
                    return candidate
        return None

    outcomes: dict[int, tuple[str, str]] = {}
    broken: dict[int, DispatchError] = {}
    unexpected: list[Mapping[str, Any]] = []
    for entry, kind in [(e, "valid") for e in valid] + [(e, "invalid") for e in invalid]:
        index = claim(entry.get("number")) if isinstance(entry, dict) else None
        if index is None:
            unexpected.append(entry if isinstance(entry, dict) else {"entry": entry})
            continue
        if kind == "valid":
            message_id = entry.get("id")
            if type(message_id) is str and message_id:
                outcomes[index] = ("valid", message_id)
            else:
                broken[index] = MalformedResponseError(
                    "the service listed this recipient as valid without a usable id"
                )
        else:
            reason = entry.get("reason")
            outcomes[index] = ("invalid", reason if type(reason) is str else _NO_REASON)

    ids: list[str] = []
    valid_numbers: list[str] = []
    invalid_numbers: list[str] = []
    reasons: list[str] = []
    failures: list[FailedRecipient] = []
    missing = MissingFromResponseError("the answer did not mention this recipient")
    for position, message in enumerate(chunk.messages):
        outcome = outcomes.get(position)
        if outcome is None:
            error = broken.get(position, missing)
            failures.append(FailedRecipient(recipient_of(message, given[position]), error, True))
        elif outcome[0] == "valid":
            ids.append(outcome[1])
            valid_numbers.append(given[position])
        else:
            invalid_numbers.append(given[position])
            reasons.append(outcome[1])
    numbers, local_reasons = _rejected(chunk)
    if unexpected or failures:
        log.warning(
            "chunk at %d: the answer left %d recipient(s) unaccounted for and named %d "
            "number(s) that were not sent",
            chunk.start,
            len(failures),
            len(unexpected),
        )
    return DispatchResult(
        chunk.positions,
        valid_messages(ids, valid_numbers),
        invalid_messages(invalid_numbers + numbers, reasons + local_reasons),
        failures,
        unexpected,
        requests=requests,
        retries=retries,
    )


def _rejected(chunk: Chunk) -> tuple[list[str], list[str]]:
    if not chunk.rejected:
        return [], []
    numbers, reasons = zip(*chunk.rejected, strict=True)
    return list(numbers), list(reasons)

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
from operator import itemgetter, methodcaller
from typing import Any

from ._columns import Complement
from ._exceptions import DispatchError, MalformedResponseError, MissingFromResponseError
from ._models import InvalidMessages, invalid_messages, valid_messages
from ._outcome import DispatchResult, FailedRecipient
from ._recipients import Chunk, recipient_of
from ._wire import AnswerColumns, decode_json

__all__ = ["result_from_answer", "result_from_error"]

log = logging.getLogger("dispatch_async")

_NOT_DIGITS = re.compile(r"\D")
_NO_REASON = "the service gave no reason"
_ID = itemgetter("id")
_NUMBER = itemgetter("number")
_REASON = itemgetter("reason")
_SESSION = methodcaller("get", "session_id")
_SESSION_TYPES = frozenset({str, type(None)})


def result_from_error(
    chunk: Chunk, error: DispatchError, *, requests: int = 0, retries: int = 0
) -> DispatchResult:
    """Every sendable recipient of *chunk* failed with *error*."""
    given = chunk.given_numbers()
    maybe_sent = error.maybe_sent
    refs = chunk.refs
    failures = [
        FailedRecipient(recipient_of(m, g, refs.get(p)), error, maybe_sent, p)
        for m, g, p in zip(chunk.messages, given, chunk.message_positions(), strict=True)
    ]
    return DispatchResult(
        chunk.positions,
        valid_messages((), (), (), refs),
        _invalid(chunk, (), (), ()),
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
        where = _match(chunk, data.valid_numbers, data.invalid_numbers)
        if where is not None:
            return _quick_result(
                chunk,
                (
                    data.ids,
                    data.valid_numbers,
                    data.invalid_numbers,
                    data.reasons,
                    data.session_ids,
                ),
                where,
                requests=requests,
                retries=retries,
            )
        try:
            data = decode_json(data.body)
        # Defensive: msgspec has decoded this body as JSON; orjson refuses none it accepts.
        except MalformedResponseError as unreadable:  # pragma: no cover
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
    if columns is not None:
        where = _match(chunk, columns[1], columns[2])
        if where is not None:
            return _quick_result(chunk, columns, where, requests=requests, retries=retries)
    return _careful_match(chunk, valid, invalid, requests=requests, retries=retries)


_Columns = tuple[Sequence[str], Sequence[str], list[str], list[str], Sequence[str | None] | None]
#: The input positions of an answer's valid and invalid entries, in their order.
_Where = tuple[Sequence[int], Sequence[int]]


def _quick_result(
    chunk: Chunk, columns: _Columns, where: _Where, *, requests: int, retries: int
) -> DispatchResult:
    ids, valid_numbers, invalid_numbers, reasons, session_ids = columns
    return DispatchResult(
        chunk.positions,
        valid_messages(ids, valid_numbers, where[0], chunk.refs, session_ids),
        _invalid(chunk, invalid_numbers, reasons, where[1]),
        requests=requests,
        retries=retries,
    )


def _invalid(
    chunk: Chunk, numbers: Sequence[str], reasons: Sequence[str], positions: Sequence[int]
) -> InvalidMessages:
    """The service's rejections, then the chunk's local ones."""
    if chunk.rejected:
        local_numbers, local_reasons, local_positions = zip(*chunk.rejected, strict=True)
        numbers = [*numbers, *local_numbers]
        reasons = [*reasons, *local_reasons]
        positions = [*positions, *local_positions]
    return invalid_messages(numbers, reasons, positions, chunk.refs)


def _columns(valid: list[Any], invalid: list[Any]) -> _Columns | None:
    """(ids, valid numbers, invalid numbers, reasons, session ids) if every entry has the
    first four as strings; session ids are kept where they are strings, else None.

    The chunk's result packs them (``_packed``): the part keeps them until the job's end.
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
    return ids, valid_numbers, invalid_numbers, reasons, _session_ids(valid)


def _session_ids(valid: list[dict[str, Any]]) -> Sequence[str | None] | None:
    """Each entry's ``session_id`` if a string, else None; None if no entry has one."""
    sessions = tuple(map(_SESSION, valid))
    kinds = set(map(type, sessions))
    if str not in kinds:
        return None
    if kinds <= _SESSION_TYPES:
        return sessions
    return tuple(s if type(s) is str else None for s in sessions)


def _match(
    chunk: Chunk, valid_numbers: Sequence[str], invalid_numbers: Sequence[str]
) -> _Where | None:
    """Where each answer entry was in the input, if the answer names exactly the numbers
    sent, as sent, each once; else None.

    A number sent twice is matched in input order: its first answer entry is its first
    position in the chunk.
    """
    if chunk.given is not None:
        return None
    sent = list(map(_NUMBER, chunk.messages))
    if len(valid_numbers) + len(invalid_numbers) != len(sent):
        return None
    where = chunk.message_positions()
    split = _split(sent, valid_numbers, invalid_numbers)
    if split is not None:
        holes, few_are_invalid = split
        few = list(map(where.__getitem__, holes))
        many = Complement(where, holes) if holes else where
        return (many, few) if few_are_invalid else (few, many)
    # Another order: compare as multisets. dict.__eq__ compares the counts in C,
    # where Counter.__eq__ is a Python loop dearer than all the rest of the match.
    if not dict.__eq__(Counter([*valid_numbers, *invalid_numbers]), Counter(sent)):
        return None
    queues: defaultdict[str, deque[int]] = defaultdict(deque)
    for number, position in zip(sent, where, strict=True):
        queues[number].append(position)
    return (
        [queues[number].popleft() for number in valid_numbers],
        [queues[number].popleft() for number in invalid_numbers],
    )


def _interleaved(sent: list[str], valid: Sequence[str], invalid: Sequence[str]) -> bool:
    """Whether *sent* splits into *valid* and *invalid*, each in the order sent."""
    return _split(sent, valid, invalid) is not None


def _split(
    sent: list[str], valid: Sequence[str], invalid: Sequence[str]
) -> tuple[list[int], bool] | None:
    """If *sent* splits into *valid* and *invalid*, each in the order sent: the indices in
    *sent* of the shorter list's numbers, and whether that list is *invalid*.

    That is how a service answers when it keeps the order: checked in C by locating the
    shorter list's numbers in *sent* (``list.index`` from the last hit on) and comparing
    what is left with the other list. Any other answer gets None, never a wrong split.
    """
    few_are_invalid = len(invalid) <= len(valid)
    few, many = (invalid, valid) if few_are_invalid else (valid, invalid)
    if not few:
        return ([], few_are_invalid) if list(many) == sent else None
    holes: list[int] = []
    rest: list[str] = []
    at = 0
    try:
        for number in few:
            found = sent.index(number, at)
            holes.append(found)
            rest += sent[at:found]
            at = found + 1
    except ValueError:
        return None
    rest += sent[at:]
    return (holes, few_are_invalid) if rest == list(many) else None


def _careful_match(
    chunk: Chunk, valid: list[Any], invalid: list[Any], *, requests: int, retries: int
) -> DispatchResult:
    given = chunk.given_numbers()
    where = chunk.message_positions()
    refs = chunk.refs
    exact: defaultdict[str, deque[int]] = defaultdict(deque)
    digits: defaultdict[str, deque[int]] = defaultdict(deque)
    for index, message in enumerate(chunk.messages):
        exact[message["number"]].append(index)
        digits[_NOT_DIGITS.sub("", message["number"])].append(index)
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

    outcomes: dict[int, tuple[str, str, str | None]] = {}
    broken: dict[int, DispatchError] = {}
    unexpected: list[Mapping[str, Any]] = []
    for entry, kind in [(e, "valid") for e in valid] + [(e, "invalid") for e in invalid]:
        claimed_at = claim(entry.get("number")) if isinstance(entry, dict) else None
        if claimed_at is None:
            unexpected.append(entry if isinstance(entry, dict) else {"entry": entry})
            continue
        if kind == "valid":
            message_id = entry.get("id")
            if type(message_id) is str and message_id:
                session = entry.get("session_id")
                outcomes[claimed_at] = (
                    "valid",
                    message_id,
                    session if type(session) is str else None,
                )
            else:
                broken[claimed_at] = MalformedResponseError(
                    "the service listed this recipient as valid without a usable id"
                )
        else:
            reason = entry.get("reason")
            outcomes[claimed_at] = (
                "invalid",
                reason if type(reason) is str else _NO_REASON,
                None,
            )

    ids: list[str] = []
    session_ids: list[str | None] = []
    valid_numbers: list[str] = []
    valid_positions: list[int] = []
    invalid_numbers: list[str] = []
    reasons: list[str] = []
    invalid_positions: list[int] = []
    failures: list[FailedRecipient] = []
    missing = MissingFromResponseError("the answer did not mention this recipient")
    for index, message in enumerate(chunk.messages):
        outcome = outcomes.get(index)
        position = where[index]
        if outcome is None:
            error = broken.get(index, missing)
            recipient = recipient_of(message, given[index], refs.get(position))
            failures.append(FailedRecipient(recipient, error, True, position))
        elif outcome[0] == "valid":
            ids.append(outcome[1])
            session_ids.append(outcome[2])
            valid_numbers.append(given[index])
            valid_positions.append(position)
        else:
            invalid_numbers.append(given[index])
            reasons.append(outcome[1])
            invalid_positions.append(position)
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
        valid_messages(
            ids,
            valid_numbers,
            valid_positions,
            refs,
            session_ids if any(s is not None for s in session_ids) else None,
        ),
        _invalid(chunk, invalid_numbers, reasons, invalid_positions),
        failures,
        unexpected,
        requests=requests,
        retries=retries,
    )

"""Turning what callers pass as recipients into wire messages, and chunks of them.

This is the hottest code in the SDK: it runs once per recipient of a bulk job. It
checks only what the service cannot be trusted to reject cleanly (types and shape)
and reuses the caller's objects where it safely can.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping, Sequence
from itertools import islice
from typing import Any, TypeAlias

import attrs

from ._exceptions import InputError, InvalidRecipientError
from ._models import Recipient

__all__ = [
    "BadChunkError",
    "Chunk",
    "RecipientLike",
    "Recipients",
    "Unfinished",
    "WireMessage",
    "check_shape",
    "chunked",
    "recipient_of",
    "to_wire",
]

RecipientLike: TypeAlias = "str | Recipient | Mapping[str, Any]"
Recipients: TypeAlias = "Iterable[RecipientLike] | AsyncIterable[RecipientLike]"
WireMessage: TypeAlias = dict[str, Any]

_FIELDS = frozenset({"number", "vars"})


@attrs.define(slots=True)
class Chunk:
    """A run of consecutive input positions, ready to be sent as one request.

    ``given`` holds the caller's numbers when they differ from the wire ones (E.164
    normalisation); ``rejected`` holds (number, reason, position) refused locally, and
    then ``where`` the input position of each message. ``refs`` maps input positions to
    the callers' ``Recipient.ref`` (only those given; it may hold other chunks' too).
    """

    start: int
    size: int
    messages: list[WireMessage]
    given: list[str] | None = None
    rejected: list[tuple[str, str, int]] = attrs.field(factory=list)
    where: Sequence[int] | None = None
    refs: Mapping[int, Any] = attrs.field(factory=dict)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.size)

    def message_positions(self) -> Sequence[int]:
        """The input position of each message, in the order of ``messages``."""
        if self.where is not None:
            return self.where
        return range(self.start, self.start + len(self.messages))

    def given_numbers(self) -> list[str]:
        """The caller's numbers, in the order of ``messages``."""
        if self.given is not None:
            return self.given
        return [m["number"] for m in self.messages]

    def part(self, begin: int, end: int) -> Chunk:
        """``messages[begin:end]`` as a chunk of its own (the local rejects go with the
        first part), for a request the server refused as too large.

        The parts of a chunk split at increasing bounds cover its positions exactly.
        """
        where = self.message_positions()
        first = self.start if begin == 0 else where[begin]
        last = self.start + self.size if end == len(self.messages) else where[end]
        return Chunk(
            first,
            last - first,
            self.messages[begin:end],
            None if self.given is None else self.given[begin:end],
            self.rejected if begin == 0 else [],
            where[begin:end],
            self.refs,
        )


def to_wire(
    items: Sequence[Any], start: int, refs: dict[int, Any] | None = None
) -> list[WireMessage]:
    """Check recipients and give their wire form, or raise naming the first bad position.

    The ``ref`` of each Recipient that has one goes into *refs*, by input position.
    """
    return _to_wire(items, start, _wire_prefix(items), refs)


def _wire_prefix(items: Sequence[Any]) -> int:
    """How many leading items are already wire messages (a dict of a non-empty number
    string and a vars dict of strings), to be sent as they are.

    This loop is paid once per recipient of a bulk job, so it only reads: no helper
    calls and no list to build (a million-entry copy is work for the garbage collector
    too). Every check is an exact type check, as anything else needs a copy.
    """
    done = 0
    for item in items:
        if type(item) is not dict or len(item) != 2:
            return done
        try:
            number = item["number"]
            values = item["vars"]
        except KeyError:
            return done
        if type(number) is not str or not number or type(values) is not dict:
            return done
        for key, value in values.items():
            if type(value) is not str or type(key) is not str:
                return done
        done += 1
    return done


def _to_wire(
    items: Sequence[Any], start: int, done: int, refs: dict[int, Any] | None = None
) -> list[WireMessage]:
    """``to_wire`` when the first *done* items are known to be wire messages already."""
    # islice, not items[:done]: a Sequence need not take slices (a deque does not).
    out: list[WireMessage] = list(islice(items, done))
    if done == len(items):
        return out
    append = out.append
    # ``len(out)`` is the offset: every item that gets this far appends one message.
    for item in islice(items, done, None):
        cls = type(item)
        if cls is dict:
            number = item.get("number")
            values = item.get("vars")
            if type(number) is str and number:
                if type(values) is dict and len(item) == 2 and _wire_prefix((item,)):
                    append(item)
                    continue
                if values is None and len(item) == 1:
                    append({"number": number, "vars": {}})
                    continue
        elif cls is str:
            if item:
                append({"number": item, "vars": {}})
                continue
        elif cls is Recipient:
            values = item.vars
            if item.ref is not None and refs is not None:
                refs[start + len(out)] = item.ref
            append(
                {"number": item.number, "vars": values if type(values) is dict else dict(values)}
            )
            continue
        if isinstance(item, Recipient) and item.ref is not None and refs is not None:
            refs[start + len(out)] = item.ref
        append(_slow_to_wire(item, start + len(out)))
    return out


def _slow_to_wire(item: object, position: int) -> WireMessage:
    """The careful path: other types, subclasses, and the exact complaint on error."""
    if isinstance(item, Recipient):
        return {"number": item.number, "vars": dict(item.vars)}
    if isinstance(item, str):
        if not item:
            raise InvalidRecipientError(position, "the number is an empty string")
        return {"number": str(item), "vars": {}}
    if not isinstance(item, Mapping):
        raise InvalidRecipientError(
            position,
            f"expected a number string, a Recipient or a mapping, not {type(item).__name__}",
        )
    unknown = set(item) - _FIELDS
    if unknown:
        raise InvalidRecipientError(
            position,
            f"unknown field(s) {sorted(map(str, unknown))}; a recipient has 'number' and 'vars'",
        )
    number = item.get("number")
    if not isinstance(number, str) or not number:
        raise InvalidRecipientError(
            position, f"'number' must be a non-empty string, not {number!r}"
        )
    values = item.get("vars")
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise InvalidRecipientError(
            position, f"'vars' must be a mapping, not {type(values).__name__}"
        )
    for key, value in values.items():
        if not isinstance(key, str):
            raise InvalidRecipientError(position, f"vars key {key!r} is not a string")
        if not isinstance(value, str):
            raise InvalidRecipientError(
                position, f"vars[{key!r}] must be a string, not {type(value).__name__}"
            )
    return {"number": str(number), "vars": {str(k): str(v) for k, v in values.items()}}


def recipient_of(message: WireMessage, given: str | None = None, ref: Any = None) -> Recipient:
    """The caller-facing Recipient for a wire message (used for failures only)."""
    number = given if given is not None else message["number"]
    return Recipient(number, vars=dict(message["vars"]), ref=ref)


def check_shape(recipients: object) -> None:
    """Refuse the classic mistakes of passing one recipient where a collection belongs."""
    if isinstance(recipients, str | bytes | Mapping | Recipient):
        kind = type(recipients).__name__
        raise InputError(f"recipients must be a collection of recipients, not a single {kind}")
    if not isinstance(recipients, Iterable | AsyncIterable):
        raise InputError(f"recipients must be iterable, not {type(recipients).__name__}")


class Unfinished:
    """The recipients of a streamed chunk read before its read was cut short.

    A read cancelled by a deadline or a close has taken them from the caller's iterator:
    the result must account for them (not sent) like for any chunk never sent.
    """

    __slots__ = ("items", "start")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.start = 0

    def take(self) -> Chunk | None:
        """Those recipients as a chunk (BadChunkError as for any chunk), and forget them."""
        items, self.items = self.items, []
        return _chunk_or_raise(items, self.start) if items else None


async def chunked(
    recipients: Recipients, size: int, unfinished: Unfinished | None = None
) -> AsyncGenerator[Chunk, None]:
    """Yield chunks of at most *size* recipients, reading the input lazily.

    A sequence is checked whole before the first chunk is yielded, so a bad recipient
    anywhere in a list stops the call before anything is sent. A streamed chunk's
    recipients are in *unfinished* while it is being read.
    """
    unfinished = unfinished or Unfinished()
    if isinstance(recipients, Sequence):
        done = _wire_prefix(recipients)
        refs: dict[int, Any] = {}
        if done == len(recipients) and type(recipients) is list:
            # Already the wire form: each chunk is a slice of the caller's list.
            messages: list[WireMessage] = recipients
        else:
            messages = _to_wire(recipients, 0, done, refs)
        for start in range(0, len(messages), size):
            part = messages[start : start + size]
            # One refs mapping for the whole list: outcomes look refs up by position.
            yield Chunk(start, len(part), part, refs=refs)
        return
    start = 0
    if isinstance(recipients, AsyncIterable):
        iterator = aiter(recipients)
        while True:
            items = unfinished.items = []
            unfinished.start = start
            async for item in iterator:
                items.append(item)
                if len(items) == size:
                    break
            unfinished.items = []
            if not items:
                return
            yield _chunk_or_raise(items, start)
            start += len(items)
            if len(items) < size:
                return
    else:
        sync_iterator = iter(recipients)
        while items := list(islice(sync_iterator, size)):
            yield _chunk_or_raise(items, start)
            start += len(items)


class BadChunkError(InvalidRecipientError):
    """A bad recipient in a streamed input, with the good ones read before it."""

    def __init__(self, error: InvalidRecipientError, before: Chunk) -> None:
        super().__init__(error.position, error.problem)
        self.before = before


def _chunk_or_raise(items: list[Any], start: int) -> Chunk:
    refs: dict[int, Any] = {}
    try:
        return Chunk(start, len(items), to_wire(items, start, refs), refs=refs)
    except InvalidRecipientError as error:
        good = items[: error.position - start]
        before = Chunk(start, len(good), to_wire(good, start, refs), refs=refs)
        raise BadChunkError(error, before) from None

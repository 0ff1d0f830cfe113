"""A chunk the server refuses as too large (HTTP 413), sent again in smaller parts.

A 413 means the request was refused before anything was acted on (nginx's
``client_max_body_size`` is 1 MB by default; a thousand recipients with a few vars
exceed it). The chunk's recipients are sent again in halves, a refused half halved
again, down to one recipient per request; a recipient refused alone is not sent. The
call remembers the largest part that went through (`PartSize`), so its later chunks go
out in parts of that size at once: a 413 per chunk in flight until one chunk went
through in parts, not one per chunk of the call. The
parts of a chunk leave one after another, so a call never has more requests in flight
than ``max_concurrency``. A call without a 413 pays one comparison per chunk.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Awaitable, Callable

import attrs

from ._exceptions import DispatchError, RequestTooLargeError
from ._matching import result_from_error
from ._outcome import DispatchResult, merge_results
from ._recipients import Chunk

__all__ = ["Flight", "PartSize", "Progress", "ended", "in_parts"]

#: Told of each refusal that splits: (the refused part, its body's bytes, the new part size).
OnSplit = Callable[[Chunk, int | None, int], None]


@attrs.define
class PartSize:
    """The most recipients per request one call sends, once its server refused more.

    Learned from the parts that went through, not from the refusals, and only from a
    chunk that had a part refused with no recipient too large alone in it: a part is
    refused for holding too many recipients or one too large alone, and halving the
    call's size on every refusal would send the whole call one recipient per request
    for the sake of that one recipient.
    """

    most: int | None = None
    """None until a chunk was sent in parts; then the largest part of such a chunk that
    went through (the smallest of these over the call's chunks)."""

    def fits(self, count: int) -> bool:
        """Whether *count* recipients may go in one request."""
        return self.most is None or count <= self.most

    def learned(self, largest: int) -> None:
        """A chunk sent in parts got parts of *largest* recipients through."""
        if largest and (self.most is None or largest < self.most):
            self.most = largest


@attrs.define
class Progress:
    """How far a chunk sent in parts has got: what its result keeps if it ends early."""

    answered: list[DispatchResult] = attrs.Factory(list)
    """The results of the parts answered, in order."""
    upto: int = 0
    """``messages[:upto]`` are accounted for in ``answered``."""
    sending: int = 0
    """``messages[upto:sending]`` are the part in flight; the rest was never sent."""
    size: int = 0
    """The part size the chunk was sent in (`DispatchResult.split_to`)."""


@attrs.define
class Flight:
    """What the batcher must know of a chunk's requests if it has to cancel them.

    ``announce`` is awaited once, just before the first request leaves. ``progress``
    is set when the chunk is sent in parts (a 413).
    """

    announce: Callable[[], Awaitable[object]] | None = None
    in_request: bool = False
    requests: int = 0
    retries: int = 0
    progress: Progress | None = None


def spans(begin: int, end: int, size: int) -> list[tuple[int, int]]:
    """``range(begin, end)`` cut into the fewest runs of at most *size*, near-equal."""
    count = -(-(end - begin) // size)
    bounds = [begin + (end - begin) * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


async def in_parts(
    chunk: Chunk,
    flight: Flight,
    size: PartSize,
    send: Callable[[Chunk], Awaitable[DispatchResult]],
    *,
    refused: RequestTooLargeError | None = None,
    on_split: OnSplit | None = None,
) -> DispatchResult:
    """*chunk* sent in parts of at most ``size.most`` recipients, one after another.

    *refused* is the server's answer to the whole chunk, if it was sent whole. *send*
    sends one part and returns its result; it raises `RequestTooLargeError` when the
    part is refused as too large, which halves it.
    """
    progress = flight.progress = Progress()
    todo: deque[tuple[int, int, RequestTooLargeError | None]] = deque(
        [(0, len(chunk.messages), refused)]
    )
    largest = 0  # the most recipients of one part that went through
    refusals: list[tuple[int, int]] = []  # the parts of several recipients refused
    alone: list[int] = []  # the recipients refused alone
    while todo:
        begin, end, error = todo.popleft()
        part = chunk.part(begin, end)
        if error is None:
            if not size.fits(end - begin):
                assert size.most is not None
                todo.extendleft(reversed([(a, b, None) for a, b in spans(begin, end, size.most)]))
                continue
            progress.sending = end
            try:
                result = await send(part)
            except RequestTooLargeError as too_large:
                error = too_large
            else:
                largest = max(largest, end - begin)
        if error is not None:
            if end - begin > 1:
                refusals.append((begin, end))
                half = (end - begin + 1) // 2
                if on_split is not None:
                    on_split(part, error.request_bytes, half)
                todo.extendleft(reversed([(a, b, None) for a, b in spans(begin, end, half)]))
                continue
            alone.append(begin)
            result = result_from_error(part, RequestTooLargeError.for_one_recipient(error))
        progress.answered.append(result)
        progress.upto = progress.sending = end
        progress.size = largest
    if any(not any(b <= a < e for a in alone) for b, e in refusals):
        size.learned(largest)  # a part was refused for its size, not for one recipient
    elif refusals:
        progress.size = 0  # each refusal held a recipient too large alone: no news
    return _whole(chunk, flight, progress.answered)


def ended(chunk: Chunk, flight: Flight, error: DispatchError) -> DispatchResult:
    """*chunk*'s result when *error* ends its requests (a deadline, a refused secret).

    Sent whole: every recipient failed with *error*. Sent in parts: the parts answered
    keep their answers, the part in flight fails with *error*, and the parts never sent
    are not sent, whatever *error* says of the request in flight.
    """
    progress = flight.progress
    if progress is None:
        return result_from_error(chunk, error, requests=flight.requests, retries=flight.retries)
    count = len(chunk.messages)
    parts = list(progress.answered)
    if progress.upto < progress.sending:
        parts.append(result_from_error(chunk.part(progress.upto, progress.sending), error))
    if progress.sending < count:
        unsent = error
        if error.maybe_sent:
            unsent = copy.copy(error)
            unsent.maybe_sent = False
        parts.append(result_from_error(chunk.part(progress.sending, count), unsent))
    return _whole(chunk, flight, parts)


def _whole(chunk: Chunk, flight: Flight, parts: list[DispatchResult]) -> DispatchResult:
    """The parts' results as the chunk's one result."""
    progress = flight.progress
    return attrs.evolve(
        merge_results(parts),
        positions=chunk.positions,
        requests=flight.requests,
        retries=flight.retries,
        split_to=None if progress is None or not progress.size else progress.size,
    )

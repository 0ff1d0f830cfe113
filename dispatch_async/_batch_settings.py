"""How a call is split and sent: the session's settings and a call's overrides.

A floor below the batcher and the local checks (`_screen`), which both read them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Set
from typing import TypedDict

import attrs

from ._arguments import check_arguments, unknown_argument
from ._outcome import DispatchResult

__all__ = [
    "BatchOptions",
    "BatchSettings",
    "BeforeSend",
    "ChunkCallback",
    "ProgressCallback",
    "check_options",
]

ProgressCallback = Callable[[int, int | None], object]
#: Called with each chunk's result as it completes, before the call awaits again.
ChunkCallback = Callable[[DispatchResult], object]
#: Awaited with a chunk's input positions just before its request first leaves.
BeforeSend = Callable[[range], Awaitable[object]]


@attrs.frozen
class BatchSettings:
    """How a call is split and sent; every field can be overridden per call.

    ``chunk_size`` 1000 and ``max_concurrency`` 8 come from the benchmarks (guides/performance.md).
    ``before_send`` is awaited with a chunk's input positions once its request is about
    to leave (after the token and rate-limit waits): a write-ahead journal records there
    what may reach the service, so after a crash at most ``max_concurrency`` chunks are
    in doubt. If it raises, that chunk is not sent and the job stops with
    ``CallbackError``.
    """

    chunk_size: int = 1000
    """Recipients per request."""
    max_concurrency: int = 8
    """Requests in flight at once, per call."""
    dedupe: bool = False
    """Send each number once per call; repeats become `InvalidMessage` values with the
    reason `DUPLICATE_REASON`."""
    prevalidate: bool = False
    """Check numbers locally (extra ``phonenumbers``) and send them in E.164; numbers
    that are not phone numbers are refused before sending."""
    region: str | None = None
    """The country assumed for numbers written without ``+`` (``"BR"``), for
    ``prevalidate`` and ``dedupe``."""
    deadline: float | None = None
    """Seconds for the whole call. When they pass, the requests in flight are cancelled
    and the call returns: recipients not answered are failed (maybe sent if their
    request had left). None: no deadline."""
    exclude: Set[str] | Callable[[str], object] | None = attrs.field(default=None, hash=False)
    """Numbers never to send (an opt-out list): a set, or a callable that returns True for
    one. Compared with the number as it would be sent (E.164 with ``prevalidate``, else
    as given); excluded recipients are `InvalidMessage` values with the reason
    `EXCLUDED_REASON`. A callable that raises stops the job with `CallbackError`, as
    ``before_send`` does."""
    on_progress: ProgressCallback | None = None
    """Called with (recipients done, total or None) as each chunk completes."""
    on_chunk: ChunkCallback | None = None
    """Called with each chunk's `DispatchResult` as it completes, before the call awaits
    anything else: what went (ids included) is in the caller's hands before a cancel or
    a timeout around the call can strike. When the call is cancelled, the chunks it had
    in flight are passed too, failed (``maybe_sent``). An error it raises is logged and
    the call goes on."""
    before_send: BeforeSend | None = None
    """Awaited with a chunk's input positions just before its request first leaves."""

    def __attrs_post_init__(self) -> None:  # made, and made again by attrs.evolve
        check_arguments(attrs.asdict(self, recurse=False))


class BatchOptions(TypedDict, total=False):
    """Per-call overrides of the session's BatchSettings."""

    chunk_size: int
    max_concurrency: int
    dedupe: bool
    prevalidate: bool
    region: str | None
    deadline: float | None
    exclude: Set[str] | Callable[[str], object] | None
    on_progress: ProgressCallback | None
    on_chunk: ChunkCallback | None
    before_send: BeforeSend | None


_OPTION_NAMES = frozenset(attrs.fields_dict(BatchSettings))


def check_options(
    options: Mapping[str, object],
    function: Callable[..., object],
    siblings: Iterable[Callable[..., object]] = (),
) -> None:
    """Refuse a keyword in *options* that is no batch option: `UnknownArgumentError`
    naming *function* (the method called) and the name meant."""
    for name in options:
        if name not in _OPTION_NAMES:
            raise unknown_argument(function, name, sorted(_OPTION_NAMES), siblings)

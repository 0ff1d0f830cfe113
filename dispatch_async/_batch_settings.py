"""How a call is split and sent: the session's settings and a call's overrides.

A floor below the batcher and the local checks (`_screen`), which both read them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set
from typing import TypedDict

import attrs

from ._arguments import check_arguments

__all__ = ["BatchOptions", "BatchSettings", "BeforeSend", "ProgressCallback"]

ProgressCallback = Callable[[int, int | None], object]
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
    before_send: BeforeSend | None

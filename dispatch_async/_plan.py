"""A dry run: the chunks a send would make, checked and screened, with nothing sent.

It runs the batcher's own reading, checks and local screening (one implementation of
each), so what it reports is what a send with the same options would do.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import attrs

from ._batch_settings import BatchSettings, check_options
from ._endpoints import basic_text_warning
from ._models import InvalidMessage, invalid_messages
from ._recipients import BadChunkError, Chunk, Recipients, check_shape, chunked
from ._screen import Screen

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._batch_settings import BatchOptions

__all__ = ["PlannedChunk", "plan"]


@attrs.frozen
class PlannedChunk:
    """One request a send would make.

    ``positions`` are the chunk's input positions; ``numbers`` what would go on the wire
    (E.164 with ``prevalidate``); ``refused`` the recipients screened out locally.
    """

    positions: range
    """The chunk's input positions."""
    numbers: Sequence[str]
    """The numbers that would go on the wire (E.164 with ``prevalidate``)."""
    refused: Sequence[InvalidMessage]
    """The recipients screened out locally, as `InvalidMessage` values."""


async def plan(
    recipients: Recipients,
    *,
    basic_text: str | None = None,
    **options: Unpack[BatchOptions],
) -> AsyncGenerator[PlannedChunk, None]:
    """Check and screen *recipients* chunk by chunk as a send would; send nothing.

    Takes the batcher options of a send (``chunk_size``, ``dedupe``, ``prevalidate``,
    ``region``, ``exclude``; the others have nothing to do without sending). A bad recipient raises
    ``InvalidRecipientError`` as it would in a send: for a list before the first chunk,
    for a stream after the chunks read before it. With *basic_text*, the text of a
    ``send_basic``, a text too long for RCS basic gives a ``UserWarning``
    (`basic_text_warning`), not an error.
    """
    if basic_text is not None and (warning := basic_text_warning(basic_text)) is not None:
        warnings.warn(warning, UserWarning, stacklevel=2)
    check_options(options, plan)
    settings = BatchSettings(**options)
    check_shape(recipients)
    screen = Screen.of(settings)
    async with contextlib.aclosing(chunked(recipients, settings.chunk_size)) as chunks:
        try:
            async for chunk in chunks:
                yield _planned(await screen.apply(chunk))
        except BadChunkError as error:
            if error.before.size:
                yield _planned(await screen.apply(error.before))
            raise


def _planned(chunk: Chunk) -> PlannedChunk:
    refused = chunk.rejected
    return PlannedChunk(
        chunk.positions,
        tuple(message["number"] for message in chunk.messages),
        invalid_messages(
            tuple(number for number, _, _ in refused),
            tuple(reason for _, reason, _ in refused),
            tuple(position for _, _, position in refused),
            chunk.refs,
        ),
    )

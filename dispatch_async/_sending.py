"""The sending methods of `DispatchSession`, one pair per endpoint.

Each ``send_*`` takes exactly its ``stream_*``'s arguments (a test compares the
signatures) and awaits the same parts, merged by `collected`: the pairs differ only in
how the caller receives the results. Kept apart from ``_session`` so that the session's
module stays about its connection: token, pool, rate limit and requests.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterable
from typing import TYPE_CHECKING

from ._batch import collected
from ._batch_settings import check_options
from ._endpoints import BASIC, SINGLE, TEMPLATE, WEBHOOK, Endpoint, basic_text_warning, envelope
from ._models import Fallback
from ._outcome import DispatchResult
from ._recipients import Recipients
from ._wire import Envelope

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._batch_settings import BatchOptions

__all__ = ["Sending"]

log = logging.getLogger("dispatch_async")


class Sending:
    """`DispatchSession`'s ``send_*`` and ``stream_*`` methods (its only base class)."""

    __slots__ = ()

    account: str | None

    def _job(
        self,
        endpoint: Endpoint,
        fields: Envelope,
        recipients: Recipients,
        options: BatchOptions,
    ) -> AsyncGenerator[DispatchResult, None]:
        raise NotImplementedError  # the session's: it owns the batcher and the requests

    async def send_template(
        self,
        recipients: Recipients,
        *,
        template_id: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        webhook: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> DispatchResult:
        """Send template *template_id* (``POST /api/v3/template``) to every recipient.

        Returns one `DispatchResult` for all of them, in input order. *recipients* are
        phone numbers, `Recipient` values (a number with its template variables) or
        mappings with a ``number`` key, in any iterable or async iterable. The batch
        options (`BatchOptions`) override the session's for this call. An error that
        stops the job carries what was sent so far as ``error.result``.
        """
        check_options(options, Sending.send_template, _SENDS)
        return await collected(
            self.stream_template(
                recipients,
                template_id=template_id,
                campaign_name=campaign_name,
                fallback=fallback,
                callback=callback,
                webhook=webhook,
                account=account,
                **options,
            )
        )

    async def send_basic(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> DispatchResult:
        """Send *text* (``POST /api/v3/basic``, RCS basic: text only) to every recipient.

        Returns one `DispatchResult` for all of them, in input order; the arguments
        are as for `send_template`. A text over `BASIC_TEXT_MAX_BYTES` UTF-8 bytes is
        sent, with a warning logged (see `basic_text_warning`).
        """
        check_options(options, Sending.send_basic, _SENDS)
        return await collected(
            self.stream_basic(
                recipients,
                text=text,
                campaign_name=campaign_name,
                fallback=fallback,
                callback=callback,
                account=account,
                **options,
            )
        )

    async def send_single(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> DispatchResult:
        """Send *text* (``POST /api/v3/single``, longer text than basic) to every recipient.

        Returns one `DispatchResult` for all of them, in input order; the arguments
        are as for `send_template`.
        """
        check_options(options, Sending.send_single, _SENDS)
        return await collected(
            self.stream_single(
                recipients,
                text=text,
                campaign_name=campaign_name,
                fallback=fallback,
                callback=callback,
                account=account,
                **options,
            )
        )

    async def send_webhook(
        self,
        recipients: Recipients,
        *,
        webhook: str,
        text: str | None = None,
        template_id: str | None = None,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> DispatchResult:
        """Send with the service reporting to *webhook* (``POST /api/v3/webhook``).

        Returns one `DispatchResult` for every recipient, in input order; the arguments
        are as for `send_template`.
        """
        check_options(options, Sending.send_webhook, _SENDS)
        return await collected(
            self.stream_webhook(
                recipients,
                webhook=webhook,
                text=text,
                template_id=template_id,
                campaign_name=campaign_name,
                fallback=fallback,
                callback=callback,
                account=account,
                **options,
            )
        )

    def stream_template(
        self,
        recipients: Recipients,
        *,
        template_id: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        webhook: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """`send_template`, yielding a `DispatchResult` per chunk as each completes.

        For inputs too large to hold every outcome at once. Wrap a stream you may leave
        early in ``contextlib.aclosing`` (``contextlib.closing`` for a `DispatchClient`'s):
        it cancels the chunks in flight at once.
        """
        check_options(options, Sending.stream_template, _STREAMS)
        fields = envelope(
            TEMPLATE,
            account=account or self.account,
            template_id=template_id,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
            webhook=webhook,
        )
        return self._job(TEMPLATE, fields, recipients, options)

    def stream_basic(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """`send_basic`, yielding a `DispatchResult` per chunk as each completes."""
        check_options(options, Sending.stream_basic, _STREAMS)
        if isinstance(text, str) and (warning := basic_text_warning(text)) is not None:
            log.warning("%s", warning)
        fields = envelope(
            BASIC,
            account=account or self.account,
            text=text,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(BASIC, fields, recipients, options)

    def stream_single(
        self,
        recipients: Recipients,
        *,
        text: str,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """`send_single`, yielding a `DispatchResult` per chunk as each completes."""
        check_options(options, Sending.stream_single, _STREAMS)
        fields = envelope(
            SINGLE,
            account=account or self.account,
            text=text,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(SINGLE, fields, recipients, options)

    def stream_webhook(
        self,
        recipients: Recipients,
        *,
        webhook: str,
        text: str | None = None,
        template_id: str | None = None,
        campaign_name: str | None = None,
        fallback: Fallback | Iterable[Fallback] | None = None,
        callback: str | None = None,
        account: str | None = None,
        **options: Unpack[BatchOptions],
    ) -> AsyncGenerator[DispatchResult, None]:
        """`send_webhook`, yielding a `DispatchResult` per chunk as each completes."""
        check_options(options, Sending.stream_webhook, _STREAMS)
        fields = envelope(
            WEBHOOK,
            account=account or self.account,
            webhook=webhook,
            text=text,
            template_id=template_id,
            campaign_name=campaign_name,
            fallback=fallback,
            callback=callback,
        )
        return self._job(WEBHOOK, fields, recipients, options)


# For "send_basic and send_single take it" when a keyword belongs to another endpoint.
_SENDS = (Sending.send_template, Sending.send_basic, Sending.send_single, Sending.send_webhook)
_STREAMS = (
    Sending.stream_template,
    Sending.stream_basic,
    Sending.stream_single,
    Sending.stream_webhook,
)

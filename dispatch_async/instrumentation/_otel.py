"""OpenTelemetry: a span per call, a child span per chunk attempt, and the metrics.

Only ``opentelemetry-api`` is imported: the application picks the SDK and exporters.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ._events import (
    CallFinished,
    CallStarted,
    ChunkAnswered,
    ChunkSent,
    Event,
    Paused,
    RateChanged,
    RetryScheduled,
    TokenObtained,
)

try:
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - depends on the installed extras
    _INSTALLED = False
else:
    _INSTALLED = True

__all__ = ["OpenTelemetryHook"]

_SCOPE = "dispatch_async"
# The semantic conventions' advice for http.client.request.duration (seconds).
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)


class OpenTelemetryHook:
    """Report to the global (or given) tracer and meter providers.

    Follows OpenTelemetry's semantic conventions for HTTP clients: a ``CLIENT`` span per
    request (``POST``), under an ``INTERNAL`` span per call, and the
    ``http.client.request.duration`` histogram. The observability guide lists every
    span, metric and attribute.
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        if not _INSTALLED:
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                'OpenTelemetryHook needs opentelemetry-api: pip install "dispatch-async[otel]"'
            )
        from .._version import __version__

        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider=meter_provider)
        self._calls: dict[int, _Call] = {}
        self.recipients = meter.create_counter(
            "dispatch.recipients", unit="{recipient}", description="Recipients by outcome"
        )
        self.requests = meter.create_counter(
            "dispatch.requests", unit="{request}", description="HTTP requests by status"
        )
        self.retries = meter.create_counter(
            "dispatch.retries", unit="{retry}", description="Retries scheduled"
        )
        self.paused = meter.create_counter(
            "dispatch.paused", unit="s", description="Seconds paused at the service's request"
        )
        self.tokens = meter.create_counter(
            "dispatch.token.fetches", unit="{token}", description="Access tokens obtained"
        )
        self.rate = meter.create_gauge(
            "dispatch.request_rate",
            unit="{request}/s",
            description='The learned request rate (requests_per_second="auto")',
        )
        self.duration = meter.create_histogram(
            "http.client.request.duration",
            unit="s",
            description="Duration of HTTP client requests.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )

    def __call__(self, event: Event) -> None:
        if isinstance(event, ChunkSent):
            self._chunk_sent(event)
        elif isinstance(event, ChunkAnswered):
            self._chunk_answered(event)
        elif isinstance(event, CallStarted):
            self._call_started(event)
        elif isinstance(event, CallFinished):
            self._call_finished(event)
        elif isinstance(event, RetryScheduled):
            self.retries.add(1, {"dispatch.endpoint": event.endpoint})
        elif isinstance(event, Paused):
            self.paused.add(event.seconds, {"http.response.status_code": event.status})
        elif isinstance(event, TokenObtained):
            self.tokens.add(1, {"dispatch.token.source": event.source})
        elif isinstance(event, RateChanged):
            self.rate.set(event.requests_per_second, {"dispatch.rate.shared": event.shared})

    def _call_started(self, event: CallStarted) -> None:
        attributes: dict[str, Any] = {"dispatch.endpoint": event.endpoint}
        if event.recipients is not None:
            attributes["dispatch.recipients.count"] = event.recipients
        # The logical operation around the requests: INTERNAL, as the conventions want
        # no encompassing HTTP CLIENT span around per-request ones.
        span = self._tracer.start_span(
            f"dispatch {event.endpoint}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._calls[event.call_id] = _Call(span, event.url)

    def _chunk_sent(self, event: ChunkSent) -> None:
        call = self._calls.get(event.call_id)
        if call is None:  # pragma: no cover - a ChunkSent always follows its CallStarted
            return
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            **call.server,
            "url.full": call.url,
            "dispatch.chunk.start": event.start,
            "dispatch.chunk.size": event.size,
        }
        # Every request for a chunk after its first is a resend (retry or refused token).
        resends = call.sent.get(event.start, 0)
        call.sent[event.start] = resends + 1
        if resends:
            attributes["http.request.resend_count"] = resends
        span = self._tracer.start_span(
            "POST",
            context=trace.set_span_in_context(call.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        call.attempts[(event.start, event.attempt)] = span
        propagate.inject(event.headers, context=trace.set_span_in_context(span))

    def _chunk_answered(self, event: ChunkAnswered) -> None:
        call = self._calls.get(event.call_id)
        if call is None:  # pragma: no cover - a ChunkAnswered always follows its ChunkSent
            return
        span = call.attempts.pop((event.start, event.attempt), None)
        labels: dict[str, str | int] = {
            "dispatch.endpoint": event.endpoint,
            "http.request.method": "POST",
            **call.server,
        }
        if event.status is not None:
            labels["http.response.status_code"] = event.status
        if event.error is not None:
            # The status code when one came, else this hook's one identifier for "no answer".
            labels["error.type"] = "transport" if event.status is None else str(event.status)
        self.requests.add(1, labels)
        self.duration.record(event.duration, labels)
        if span is None:  # pragma: no cover - see _chunk_sent
            return
        for name in ("http.response.status_code", "error.type"):
            if name in labels:
                span.set_attribute(name, labels[name])
        if event.error is not None:
            span.set_attribute("dispatch.maybe_sent", event.maybe_sent)
            # The conventions: no description when the status code says it all.
            span.set_status(Status(StatusCode.ERROR, event.error if event.status is None else None))
        span.end()

    def _call_finished(self, event: CallFinished) -> None:
        for outcome, count in event.outcomes.items():
            if count:
                self.recipients.add(
                    count, {"dispatch.endpoint": event.endpoint, "dispatch.outcome": outcome}
                )
        call = self._calls.pop(event.call_id, None)
        if call is None:  # pragma: no cover - a CallFinished always follows its CallStarted
            return
        span = call.span
        span.set_attribute("dispatch.recipients.count", event.recipients)
        for outcome, count in event.outcomes.items():
            span.set_attribute(f"dispatch.recipients.{outcome}", count)
        failed = event.outcomes.get("maybe_sent", 0) + event.outcomes.get("not_sent", 0)
        if event.error is not None:
            span.set_attribute("error.type", event.error)
            span.set_status(Status(StatusCode.ERROR, event.error))
        elif failed:
            span.set_attribute("error.type", "recipients_failed")
            span.set_status(Status(StatusCode.ERROR, f"{failed} recipient(s) failed"))
        span.end()


class _Call:
    """A call's span, where its requests go, and its requests' spans."""

    __slots__ = ("attempts", "sent", "server", "span", "url")

    def __init__(self, span: Any, url: str) -> None:
        self.span = span
        self.url = url
        parsed = urlsplit(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.server: dict[str, str | int] = {
            "server.address": parsed.hostname or "",
            "server.port": port,
        }
        self.sent: dict[int, int] = {}  # requests sent so far, per chunk start
        self.attempts: dict[tuple[int, int], Any] = {}

"""OpenTelemetry: a span per call, a child span per chunk attempt, and the metrics.

Only ``opentelemetry-api`` is imported: the application picks the SDK and exporters.
"""

from __future__ import annotations

from typing import Any

from ._events import (
    CallFinished,
    CallStarted,
    ChunkAnswered,
    ChunkSent,
    Event,
    Paused,
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


class OpenTelemetryHook:
    """Report to the global (or given) tracer and meter providers."""

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        server_address: str | None = None,
    ) -> None:
        if not _INSTALLED:
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                'OpenTelemetryHook needs opentelemetry-api: pip install "dispatch-async[otel]"'
            )
        from .._version import __version__

        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider=meter_provider)
        self._server = server_address
        self._calls: dict[int, Any] = {}
        self._attempts: dict[tuple[int, int, int], Any] = {}
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
        self.duration = meter.create_histogram(
            "http.client.request.duration", unit="s", description="Dispatch request duration"
        )

    def __call__(self, event: Event) -> None:
        if isinstance(event, ChunkSent):
            self._chunk_sent(event)
        elif isinstance(event, ChunkAnswered):
            self._chunk_answered(event)
        elif isinstance(event, CallStarted):
            attributes = {"dispatch.endpoint": event.endpoint}
            if event.recipients is not None:
                attributes["dispatch.recipients"] = event.recipients  # type: ignore[assignment]
            self._calls[event.call_id] = self._tracer.start_span(
                f"dispatch {event.endpoint}", kind=SpanKind.CLIENT, attributes=attributes
            )
        elif isinstance(event, CallFinished):
            self._call_finished(event)
        elif isinstance(event, RetryScheduled):
            self.retries.add(1, {"dispatch.endpoint": event.endpoint})
        elif isinstance(event, Paused):
            self.paused.add(event.seconds, {"http.response.status_code": event.status})
        elif isinstance(event, TokenObtained):
            self.tokens.add(1, {"dispatch.token.source": event.source})

    def _chunk_sent(self, event: ChunkSent) -> None:
        parent = self._calls.get(event.call_id)
        context = trace.set_span_in_context(parent) if parent is not None else None
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.path": event.endpoint,
            "dispatch.chunk.start": event.start,
            "dispatch.chunk.size": event.size,
            "http.request.resend_count": event.attempt - 1,
        }
        if self._server:
            attributes["server.address"] = self._server
        span = self._tracer.start_span(
            "POST", context=context, kind=SpanKind.CLIENT, attributes=attributes
        )
        self._attempts[(event.call_id, event.start, event.attempt)] = span
        propagate.inject(event.headers, context=trace.set_span_in_context(span))

    def _chunk_answered(self, event: ChunkAnswered) -> None:
        span = self._attempts.pop((event.call_id, event.start, event.attempt), None)
        labels: dict[str, str | int] = {
            "dispatch.endpoint": event.endpoint,
            "http.request.method": "POST",
        }
        if event.status is None:
            labels["error.type"] = "transport"
        else:
            labels["http.response.status_code"] = event.status
        self.requests.add(1, labels)
        self.duration.record(event.duration, labels)
        if span is None:
            return
        span.set_attribute("dispatch.maybe_sent", event.maybe_sent)
        if event.status is not None:
            span.set_attribute("http.response.status_code", event.status)
        if event.error is not None:
            span.set_attribute("error.type", str(event.status or "transport"))
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end()

    def _call_finished(self, event: CallFinished) -> None:
        for outcome, count in event.outcomes.items():
            if count:
                self.recipients.add(
                    count, {"dispatch.endpoint": event.endpoint, "dispatch.outcome": outcome}
                )
        span = self._calls.pop(event.call_id, None)
        if span is None:
            return
        for outcome, count in event.outcomes.items():
            span.set_attribute(f"dispatch.recipients.{outcome}", count)
        if event.error is not None:
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end()

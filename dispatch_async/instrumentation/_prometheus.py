"""Prometheus: the OpenTelemetry hook's metrics, through prometheus-client."""

from __future__ import annotations

from typing import Any

from ._events import (
    CallFinished,
    ChunkAnswered,
    Event,
    Paused,
    RateChanged,
    RetryScheduled,
    TokenObtained,
)

__all__ = ["PrometheusHook"]


class PrometheusHook:
    """Count into *registry* (prometheus-client's default registry if None)."""

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:  # pragma: no cover - depends on the installed extras
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                'PrometheusHook needs prometheus-client: pip install "dispatch-async[prometheus]"'
            ) from None
        registry = registry if registry is not None else prom.REGISTRY
        self.recipients = prom.Counter(
            "dispatch_recipients",
            "Recipients by outcome",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.requests = prom.Counter(
            "dispatch_requests",
            "HTTP requests by status",
            ["endpoint", "status"],
            registry=registry,
        )
        self.retries = prom.Counter(
            "dispatch_retries", "Retries scheduled", ["endpoint"], registry=registry
        )
        self.paused = prom.Counter(
            "dispatch_paused_seconds",
            "Seconds paused at the service's request",
            ["status"],
            registry=registry,
        )
        self.tokens = prom.Counter(
            "dispatch_token_fetches", "Access tokens obtained", ["source"], registry=registry
        )
        self.rate = prom.Gauge(
            "dispatch_requests_per_second",
            'The learned request rate (requests_per_second="auto")',
            ["shared"],
            registry=registry,
        )
        self.duration = prom.Histogram(
            "dispatch_request_duration_seconds",
            "Dispatch request duration",
            ["endpoint"],
            registry=registry,
        )

    def __call__(self, event: Event) -> None:
        if isinstance(event, ChunkAnswered):
            status = "none" if event.status is None else str(event.status)
            self.requests.labels(event.endpoint, status).inc()
            self.duration.labels(event.endpoint).observe(event.duration)
        elif isinstance(event, CallFinished):
            for outcome, count in event.outcomes.items():
                if count:
                    self.recipients.labels(event.endpoint, outcome).inc(count)
        elif isinstance(event, RetryScheduled):
            self.retries.labels(event.endpoint).inc()
        elif isinstance(event, Paused):
            self.paused.labels(str(event.status)).inc(event.seconds)
        elif isinstance(event, TokenObtained):
            self.tokens.labels(event.source).inc()
        elif isinstance(event, RateChanged):
            self.rate.labels(str(event.shared).lower()).set(event.requests_per_second)

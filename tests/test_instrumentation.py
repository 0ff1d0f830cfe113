"""Instrumentation: hooks see every call, attempt, retry, pause and token; never break a send."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

import dispatch_async as da
from dispatch_async import instrumentation as ins
from dispatch_async.testing import FakeDispatchServer, Fault

from .conftest import SECRET, TEMPLATE, numbers

# No waits between retries, but a real (tiny) Retry-After pause.
POLICY = da.RetryPolicy(first_wait=0.0, max_wait=0.0)


class Recorder:
    def __init__(self) -> None:
        self.events: list[ins.Event] = []

    def __call__(self, event: ins.Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class HeaderSpy:
    """Every /api/v3 request's headers, as aiohttp really sent them."""

    def __init__(self) -> None:
        self.sent: list[CIMultiDict[str]] = []
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._started)

    async def _started(self, _: Any, __: Any, params: aiohttp.TraceRequestStartParams) -> None:
        if "/api/v3/" in params.url.path:
            self.sent.append(CIMultiDict(params.headers))


async def faulty_run(server: FakeDispatchServer, hooks: list[Any], spy: HeaderSpy) -> None:
    """429 (pause), 503 (retry), 500 (maybe sent), then a refused token, then a refresh."""
    recipients = numbers(30)
    server.script_for(recipients[0], Fault.status(429, retry_after="0.01"))
    server.script_for(recipients[10], Fault.status(503))
    server.script_for(recipients[20], Fault.status(500))
    async with (
        aiohttp.ClientSession(trace_configs=[spy.config]) as http,
        da.DispatchSession(
            server.url,
            client_secret=SECRET,
            account="acme",
            retry=POLICY,
            hooks=hooks,
            http_session=http,
            chunk_size=10,
            max_concurrency=1,
        ) as session,
    ):
        await session.send_template(recipients, **TEMPLATE)
        server.expire_tokens()
        await session.send_template(numbers(5, start=100), **TEMPLATE)
    assert server.pending_faults == 0


def api_statuses(server: FakeDispatchServer) -> Counter[str]:
    """What the simulator answered under /api/v3, by status (token answers taken out)."""
    counted = Counter({str(k): v for k, v in server.stats.status_counts.items()})
    counted["200"] -= server.stats.tokens_issued
    return +counted


# -- the hook protocol ------------------------------------------------------------


async def test_events_account_for_every_request_the_simulator_answered(
    server: FakeDispatchServer,
) -> None:
    recorder = Recorder()
    await faulty_run(server, [recorder], HeaderSpy())

    answered = recorder.of(ins.ChunkAnswered)
    assert len(recorder.of(ins.ChunkSent)) == len(answered) == server.stats.requests
    assert Counter(str(e.status) for e in answered) == api_statuses(server)
    assert [e.maybe_sent for e in answered if e.status == 500] == [True]
    assert all(not e.maybe_sent for e in answered if e.status in (401, 429, 503))
    assert [(e.start, e.attempt) for e in recorder.of(ins.RetryScheduled)] == [(0, 1), (10, 1)]
    assert recorder.of(ins.Paused) == [ins.Paused(429, 0.01)]
    tokens = recorder.of(ins.TokenObtained)
    assert len(tokens) == server.stats.tokens_issued == 2
    assert {t.source for t in tokens} == {"fetched"}
    assert all(t.lifetime > 0 and t.duration >= 0 for t in tokens)
    first, second = recorder.of(ins.CallFinished)
    assert first.outcomes == {"valid": 20, "invalid": 0, "maybe_sent": 10, "not_sent": 0}
    assert second.outcomes["valid"] == 5
    started = recorder.of(ins.CallStarted)
    assert [s.recipients for s in started] == [30, 5]
    assert [s.call_id for s in started] == [first.call_id, second.call_id]


async def test_a_request_that_got_no_answer_is_reported_without_a_status(
    server: FakeDispatchServer,
) -> None:
    recorder = Recorder()
    server.script(Fault.drop())
    async with da.DispatchSession(
        server.url, client_secret=SECRET, account="a", retry=POLICY, hooks=[recorder]
    ) as session:
        result = await session.send_template(numbers(3), **TEMPLATE)
    [answered] = recorder.of(ins.ChunkAnswered)
    assert answered.status is None
    assert answered.error is not None
    assert answered.maybe_sent == result.failed[0].maybe_sent
    [finished] = recorder.of(ins.CallFinished)
    assert finished.outcomes["maybe_sent"] + finished.outcomes["not_sent"] == 3


async def test_global_hooks_apply_to_sessions_without_their_own(
    server: FakeDispatchServer,
) -> None:
    recorder = Recorder()
    ins.set_hooks([recorder])
    try:
        assert ins.get_hooks() == (recorder,)
        async with da.DispatchSession(server.url, client_secret=SECRET, account="a") as s:
            await s.send_template(numbers(3), **TEMPLATE)
        async with da.DispatchSession(server.url, client_secret=SECRET, account="a", hooks=[]) as s:
            await s.send_template(numbers(3), **TEMPLATE)
    finally:
        ins.set_hooks(None)
    assert len(recorder.of(ins.CallFinished)) == 1
    assert isinstance(ins.get_hooks()[0], ins.LoggingHook)


async def test_a_failing_hook_is_logged_once_and_never_breaks_a_send(
    server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: ins.Event) -> None:
        raise RuntimeError("hook bug")

    async with da.DispatchSession(
        server.url, client_secret=SECRET, account="a", hooks=[broken], chunk_size=2
    ) as session:
        with caplog.at_level(logging.ERROR, logger="dispatch_async"):
            result = await session.send_template(numbers(6), **TEMPLATE)
    assert result.counts["valid"] == 6
    assert server.stats.recipients_received == 6
    failures = [r for r in caplog.records if "instrumentation hook" in r.getMessage()]
    assert len(failures) == 1


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class TestHeadersAddedByHooks:
    """``ChunkSent.headers`` carries trace context: a header that cannot go out is dropped.

    It is logged once per process: each case uses a header name of its own.
    """

    @pytest.mark.parametrize(
        "bad",
        [
            {"X-Trace-Int": 5},
            {"X-Trace-Split": "trace-value\r\nX-Evil: 1"},
            {"X-Trace-Bytes": b"trace-value"},
            {5: "trace-value"},
            {"X Trace": "trace-value"},
            {"X-Trace:Id": "trace-value"},
            {"authorization": "Bearer forged-by-a-hook"},
            {"CONTENT-LENGTH": "0"},
        ],
        ids=[
            "an int value",
            "a value with a line break",
            "a bytes value",
            "an int name",
            "a name with a space",
            "a name with a colon",
            "our Authorization, in lower case",
            "the framing",
        ],
    )
    async def test_a_bad_header_is_dropped_and_logged_once_and_every_recipient_is_sent(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture, bad: dict[Any, Any]
    ) -> None:
        def tracer(event: ins.Event) -> None:
            if isinstance(event, ins.ChunkSent):
                event.headers.update(bad)
                event.headers["traceparent"] = TRACEPARENT

        spy = HeaderSpy()
        async with (
            aiohttp.ClientSession(trace_configs=[spy.config]) as http,
            da.DispatchSession(
                server.url,
                client_secret=SECRET,
                account="a",
                hooks=[tracer],
                http_session=http,
                chunk_size=10,
            ) as session,
        ):
            with caplog.at_level(logging.WARNING, logger="dispatch_async"):
                result = await session.send_template(numbers(30), **TEMPLATE)
        assert result.counts["valid"] == 30
        assert server.stats.recipients_received == 30
        assert len(spy.sent) == 3
        for headers in spy.sent:
            assert headers["traceparent"] == TRACEPARENT  # the good header still goes out
            assert headers.getall("Authorization") != ["Bearer forged-by-a-hook"]
            assert len(headers.getall("Authorization")) == 1
            assert "X-Evil" not in headers
            assert "CONTENT-LENGTH" not in headers
            assert not any(name.startswith(("X-Trace", "X Trace")) for name in headers)
        dropped = [r for r in caplog.records if "header" in r.getMessage()]
        assert len(dropped) == 1
        assert "trace-value" not in caplog.text  # a header value may carry a secret
        assert "forged-by-a-hook" not in caplog.text


# -- OpenTelemetry -----------------------------------------------------------------


def otel() -> tuple[ins.OpenTelemetryHook, InMemorySpanExporter, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    hook = ins.OpenTelemetryHook(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    return hook, exporter, reader


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


async def test_opentelemetry_spans_nest_attempts_under_calls_and_propagate(
    server: FakeDispatchServer,
) -> None:
    hook, exporter, _ = otel()
    spy = HeaderSpy()
    await faulty_run(server, [hook], spy)

    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.parent is None]
    attempts = [s for s in spans if s.parent is not None]
    assert [s.name for s in calls] == ["dispatch /api/v3/template"] * 2
    assert len(attempts) == server.stats.requests == len(spy.sent)
    call_ids = {c.context.span_id for c in calls}
    assert all(a.parent is not None and a.parent.span_id in call_ids for a in attempts)
    statuses = Counter(str(a.attributes["http.response.status_code"]) for a in attempts)
    assert statuses == api_statuses(server)
    assert all(a.attributes["http.request.method"] == "POST" for a in attempts)
    # Each request carried its own attempt span's context.
    sent_parents = [h["traceparent"].split("-")[2] for h in spy.sent]
    assert sorted(sent_parents) == sorted(f"{a.context.span_id:016x}" for a in attempts)
    assert calls[0].attributes["dispatch.recipients.maybe_sent"] == 10


async def test_opentelemetry_metrics_equal_what_the_simulator_counted(
    server: FakeDispatchServer,
) -> None:
    hook, _, reader = otel()
    await faulty_run(server, [hook], HeaderSpy())

    points = metric_points(reader)
    by_status = {
        str(p.attributes["http.response.status_code"]): p.value for p in points["dispatch.requests"]
    }
    assert Counter(by_status) == api_statuses(server)
    by_outcome = {p.attributes["dispatch.outcome"]: p.value for p in points["dispatch.recipients"]}
    assert by_outcome == {"valid": 25, "maybe_sent": 10}
    assert by_outcome["valid"] + by_outcome["maybe_sent"] == server.stats.recipients_received
    assert sum(p.value for p in points["dispatch.retries"]) == 2
    assert [p.value for p in points["dispatch.paused"]] == [pytest.approx(0.01)]
    assert sum(p.value for p in points["dispatch.token.fetches"]) == server.stats.tokens_issued
    histogram = points["http.client.request.duration"]
    assert sum(p.count for p in histogram) == server.stats.requests


class TestOpenTelemetryFollowsTheHttpClientConventions:
    """Each attribute at the requirement level OpenTelemetry's semantic conventions give it.

    Request spans (HTTP client spans): ``http.request.method``, ``server.address``,
    ``server.port``, ``url.full`` Required; ``http.response.status_code`` if and only if
    an answer came; ``error.type`` if and only if the request failed;
    ``http.request.resend_count`` only on resends. ``http.client.request.duration``:
    the same, less ``url.full`` and ``http.request.resend_count``.
    """

    REQUIRED = ("http.request.method", "server.address", "server.port", "url.full")

    @pytest.fixture
    async def telemetry(self, server: FakeDispatchServer) -> tuple[list[Any], dict[str, list[Any]]]:
        hook, exporter, reader = otel()
        await faulty_run(server, [hook], HeaderSpy())
        server.script(Fault.drop_before())
        async with da.DispatchSession(
            server.url,
            client_secret=SECRET,
            account="a",
            retry=da.RetryPolicy(attempts=1),
            hooks=[hook],
        ) as session:
            await session.send_template(numbers(2, start=200), **TEMPLATE)
        return list(exporter.get_finished_spans()), metric_points(reader)

    @staticmethod
    def requests(spans: list[Any]) -> list[Any]:
        return [s for s in spans if s.parent is not None]

    async def test_request_spans_are_client_spans_with_the_required_attributes(
        self, server: FakeDispatchServer, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        spans, _ = telemetry
        requests = self.requests(spans)
        assert len(requests) == server.stats.requests
        for span in requests:
            assert span.kind is SpanKind.CLIENT
            assert span.name == "POST"  # {method}: no low-cardinality url.template
            attributes = dict(span.attributes or {})
            assert {name: attributes[name] for name in self.REQUIRED} == {
                "http.request.method": "POST",
                "server.address": "127.0.0.1",
                "server.port": server.port,
                "url.full": f"{server.url}/api/v3/template",
            }
            assert "url.path" not in attributes  # a server span's attribute

    async def test_a_status_code_only_when_an_answer_came_and_an_error_type_only_on_failure(
        self, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        spans, _ = telemetry
        by_outcome: dict[str, list[Any]] = {}
        for span in self.requests(spans):
            attributes = dict(span.attributes or {})
            status = attributes.get("http.response.status_code")
            by_outcome.setdefault(str(status), []).append(span)
            if status == 200:
                assert "error.type" not in attributes
                assert "dispatch.maybe_sent" not in attributes  # only failures carry it
                assert span.status.status_code is StatusCode.UNSET
            elif status is None:  # the connection dropped: no answer
                assert attributes["error.type"] == "transport"
                # Written whole before the connection died: the service may have acted.
                assert attributes["dispatch.maybe_sent"] is True
                assert span.status.status_code is StatusCode.ERROR
                assert span.status.description  # not inferable from a status code
            else:
                assert attributes["error.type"] == str(status)
                assert attributes["dispatch.maybe_sent"] is (status == 500)
                assert span.status.status_code is StatusCode.ERROR
                assert span.status.description is None  # the status code says it
        assert {"200", "401", "429", "500", "503", "None"} <= set(by_outcome)

    async def test_the_resend_count_is_only_on_resends(
        self, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        spans, _ = telemetry
        per_chunk: dict[tuple[int, int], list[Any]] = {}
        for span in sorted(self.requests(spans), key=lambda s: s.start_time):
            key = (span.parent.span_id, span.attributes["dispatch.chunk.start"])
            per_chunk.setdefault(key, []).append(span)
        resent = 0
        for chunk_spans in per_chunk.values():
            counts = [s.attributes.get("http.request.resend_count") for s in chunk_spans]
            assert counts == [None, *range(1, len(chunk_spans))]
            resent += len(chunk_spans) - 1
        # The 429 and the 503 were retried; the refused token's request was re-sent.
        assert resent == 3

    async def test_the_call_span_is_internal_and_errs_when_recipients_failed(
        self, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        spans, _ = telemetry
        calls = [s for s in spans if s.parent is None]
        assert [s.kind for s in calls] == [SpanKind.INTERNAL] * 3
        first, second, dropped = (dict(s.attributes or {}) for s in calls)
        assert first["dispatch.recipients.count"] == 30
        assert first["dispatch.recipients.maybe_sent"] == 10
        assert calls[0].status.status_code is StatusCode.ERROR
        assert first["error.type"] == "recipients_failed"
        assert second["dispatch.recipients.valid"] == 5
        assert calls[1].status.status_code is StatusCode.UNSET
        assert "error.type" not in second
        assert dropped["dispatch.recipients.maybe_sent"] == 2
        assert calls[2].status.status_code is StatusCode.ERROR

    async def test_no_attribute_name_is_also_a_namespace(
        self, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        spans, points = telemetry
        names = {name for span in spans for name in (span.attributes or {})}
        names |= {name for series in points.values() for p in series for name in p.attributes}
        assert len(names) > 10
        assert sorted(a for a in names for b in names if b.startswith(f"{a}.")) == []

    async def test_the_request_duration_carries_the_required_server_attributes(
        self, server: FakeDispatchServer, telemetry: tuple[list[Any], dict[str, list[Any]]]
    ) -> None:
        _, points = telemetry
        histogram = points["http.client.request.duration"]
        assert sum(p.count for p in histogram) == server.stats.requests
        for point in histogram:
            attributes = dict(point.attributes)
            assert attributes["http.request.method"] == "POST"
            assert attributes["server.address"] == "127.0.0.1"
            assert attributes["server.port"] == server.port
            status = attributes.get("http.response.status_code")
            assert ("error.type" in attributes) is (status != 200)
            assert "url.full" not in attributes  # high cardinality: spans only
            assert list(point.explicit_bounds) == [
                0.005,
                0.01,
                0.025,
                0.05,
                0.075,
                0.1,
                0.25,
                0.5,
                0.75,
                1,
                2.5,
                5,
                7.5,
                10,
            ]


class TestTheLearnedRateIsAGauge:
    async def test_opentelemetry_and_prometheus_show_the_rate_the_session_learned(
        self, server: FakeDispatchServer
    ) -> None:
        hook, _, reader = otel()
        registry = CollectorRegistry()
        recorder = Recorder()
        async with da.DispatchSession(
            server.url,
            client_secret=SECRET,
            account="a",
            requests_per_second="auto",
            hooks=[hook, ins.PrometheusHook(registry), recorder],
        ) as session:
            await session.send_template(numbers(4), **TEMPLATE, chunk_size=1)
            learned = session.requests_per_second
        changes = recorder.of(ins.RateChanged)
        assert changes, "the session reported no rate"
        assert learned == changes[-1].requests_per_second
        [point] = metric_points(reader)["dispatch.request_rate"]
        assert point.value == learned
        assert point.attributes == {"dispatch.rate.shared": False}
        shown = registry.get_sample_value("dispatch_requests_per_second", {"shared": "false"})
        assert shown == learned


# -- Prometheus --------------------------------------------------------------------


async def test_prometheus_metrics_equal_what_the_simulator_counted(
    server: FakeDispatchServer,
) -> None:
    registry = CollectorRegistry()
    await faulty_run(server, [ins.PrometheusHook(registry)], HeaderSpy())

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    endpoint = "/api/v3/template"
    for status, count in api_statuses(server).items():
        assert value("dispatch_requests_total", endpoint=endpoint, status=status) == count
    assert value("dispatch_recipients_total", endpoint=endpoint, outcome="valid") == 25
    assert value("dispatch_recipients_total", endpoint=endpoint, outcome="maybe_sent") == 10
    assert value("dispatch_retries_total", endpoint=endpoint) == 2
    assert value("dispatch_paused_seconds_total", status="429") == pytest.approx(0.01)
    assert value("dispatch_token_fetches_total", source="fetched") == server.stats.tokens_issued
    assert (
        value("dispatch_request_duration_seconds_count", endpoint=endpoint) == server.stats.requests
    )


# -- no secrets, nothing printed ---------------------------------------------------


async def test_no_secret_or_token_reaches_any_attribute_label_or_log_field(
    server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
) -> None:
    hook, exporter, reader = otel()
    registry = CollectorRegistry()
    spy = HeaderSpy()
    with caplog.at_level(logging.DEBUG, logger="dispatch_async"):
        await faulty_run(server, [hook, ins.PrometheusHook(registry), ins.LoggingHook()], spy)

    tokens = {h["Authorization"].removeprefix("Bearer ") for h in spy.sent}
    assert len(tokens) == 2  # the refresh really happened
    seen = [str(dict(s.attributes or {})) + s.name for s in exporter.get_finished_spans()]
    seen += [str(points) for points in metric_points(reader).values()]
    seen += [str(m.samples) for m in registry.collect()]
    seen += [str(vars(r)) + r.getMessage() for r in caplog.records]
    assert any("ChunkAnswered" in text for text in seen)  # the logs were captured
    for text in seen:
        for secret in (SECRET, *tokens):
            assert secret not in text


class TestTheLoggingHookLevels:
    """Per-call events at DEBUG; retries and pauses at INFO; failures at INFO or WARNING.

    A Celery worker sends one call per task: at INFO its log must not grow a line a task.
    """

    @staticmethod
    async def logged(
        server: FakeDispatchServer, caplog: pytest.LogCaptureFixture, recipients: list[str]
    ) -> dict[str, set[int]]:
        """The levels each event was logged at, by event name, for one call."""
        caplog.clear()
        async with da.DispatchSession(
            server.url,
            client_secret=SECRET,
            account="acme",
            retry=POLICY,
            hooks=[ins.LoggingHook()],
            chunk_size=10,
        ) as session:
            with caplog.at_level(logging.DEBUG, logger="dispatch_async.events"):
                await session.send_template(recipients, **TEMPLATE)
        levels: dict[str, set[int]] = {}
        for record in caplog.records:
            if record.name == "dispatch_async.events":
                levels.setdefault(record.dispatch_event, set()).add(record.levelno)  # type: ignore[attr-defined]
        return levels

    async def test_a_call_that_went_through_logs_nothing_above_debug(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        levels = await self.logged(server, caplog, numbers(20))
        assert {"CallStarted", "ChunkSent", "ChunkAnswered", "CallFinished"} <= set(levels)
        assert set().union(*levels.values()) == {logging.DEBUG}

    async def test_retries_and_pauses_are_info_and_failures_warning(
        self, server: FakeDispatchServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        recipients = numbers(30)
        server.script_for(recipients[0], Fault.status(429, retry_after="0.01"))
        server.script_for(recipients[10], Fault.status(503))
        server.script_for(recipients[20], Fault.status(500))
        levels = await self.logged(server, caplog, recipients)
        assert levels["Paused"] == {logging.INFO}
        assert levels["RetryScheduled"] == {logging.INFO}
        # 200s are DEBUG, the 503 (not acted on) INFO, the 500 (maybe acted on) WARNING.
        assert levels["ChunkAnswered"] == {logging.DEBUG, logging.INFO, logging.WARNING}
        assert levels["CallFinished"] == {logging.WARNING}, "the call has failed recipients"
        assert levels["CallStarted"] == {logging.DEBUG}


def test_the_library_prints_nothing_unless_asked() -> None:
    code = (
        "import logging, dispatch_async;"
        "logging.getLogger('dispatch_async').warning('something went wrong')"
    )
    env = {k: v for k, v in os.environ.items() if k != "DISPATCH_LOG"}
    # The child imports this copy of the package, not whatever the venv has installed.
    env["PYTHONPATH"] = str(Path(da.__file__).parent.parent)
    quiet = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert quiet.stderr == ""
    loud = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code],
        env={**env, "DISPATCH_LOG": "info"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "something went wrong" in loud.stderr


def test_a_missing_extra_is_a_configuration_error_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(da.ConfigurationError, match=r"dispatch-async\[prometheus\]"):
        ins.PrometheusHook(CollectorRegistry())
    monkeypatch.setattr("dispatch_async.instrumentation._otel._INSTALLED", False)
    with pytest.raises(da.ConfigurationError, match=r"dispatch-async\[otel\]"):
        ins.OpenTelemetryHook()

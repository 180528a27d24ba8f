"""bus/core/spans.py keeps one tracer per name of the installed provider (get_tracer builds a
new one per call: a third of a span's start, bench case 10), and starts spans on whichever
provider is installed now, never on one a cached tracer came from."""

from __future__ import annotations

import pytest
from opentelemetry import trace as otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bus.core import spans


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made, exporter


def names(exporter: InMemorySpanExporter) -> list[str]:
    return [s.name for s in exporter.get_finished_spans()]


def test_one_tracer_per_name_and_spans_on_the_provider_installed_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, first_spans = provider()
    monkeypatch.setattr(otel, "_TRACER_PROVIDER", first)
    spans.end(spans.start("hero.test", "one", "INTERNAL"))
    assert spans._tracer("hero.test") is spans._tracer("hero.test")
    second, second_spans = provider()
    monkeypatch.setattr(otel, "_TRACER_PROVIDER", second)
    spans.end(spans.start("hero.test", "two", "INTERNAL"))
    assert (names(first_spans), names(second_spans)) == (["one"], ["two"])

"""The one place the node sets up OpenTelemetry (the spans themselves: bus/core/spans.py).

Off by default (``[tracing]`` without an endpoint): no recorder is imported, no exporter thread
runs, and every span call of the bus (bus/core/spans.py) returns at once on the API's no-op
provider. On, :func:`tracing` installs the node's own tracer provider
(node/observe/recorder.py: a span costs a job a few µs, not the SDK's ~100 µs), whose spans
leave in batches over OTLP/HTTP from a thread of its own (node/observe/otlp.py: a plain
``threading.Thread``, no asyncio): the trio loop only appends finished spans to its queue, and
an export that stalls costs the node no task, only spans dropped once that queue is full.

Sampling is the node's decision, never the sender's: a message's traceparent is signed by its
actor, an untrusted party, so neither its sampled flag nor a trace id chosen to fall under a
ratio can make a node record (and export) what it would not. :class:`KeyedRatioSampler` draws
from a keyed hash of the trace id: nodes that share ``sampling_key`` record the same traces
whole; without one each node keeps its own random key, which at a ratio below 1 samples each
node's part of a trace independently.

The node's runner processes (node/worker/) export the spans of the attempts they run with a
provider of their own, set up from :func:`runner_settings` (the endpoint, the ratio and the
node's very sampling key, in the spec on their stdin: nothing in an environment), so that a
runner records exactly the traces its node records. Their span ids may be pinned
(bus/core/spans.py ``start(span_id=...)``): an attempt's id is derived from its job and number
(``attempt_span_id``), and a retry links to its first attempt by it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from node.config.tracing import TracingConfig

log = logging.getLogger(__name__)

SHUTDOWN_S = 5.0  # the most a stopping node waits for its last spans to leave


class KeyedRatioSampler:
    """Record a trace when a keyed hash of its trace id falls under ``ratio``; the parent's
    sampled flag and the trace id's own bits decide nothing (see the module docstring).
    :meth:`records` is what the node's provider asks; :meth:`should_sample` makes it an
    opentelemetry.sdk.trace.sampling.Sampler too (for an application's SDK provider)."""

    def __init__(self, ratio: float, key: bytes) -> None:
        self.ratio, self.key = ratio, key
        self.bound = round(ratio * 2**64)

    def records(self, trace_id: int) -> bool:
        if self.bound >= 2**64:  # 1.0: every trace, whatever the key
            return True
        digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), key=self.key, digest_size=8)
        return int.from_bytes(digest.digest(), "big") < self.bound

    def should_sample(
        self,
        parent_context: Any,  # noqa: ANN401 - the SDK's types, imported lazily
        trace_id: int,
        name: str,
        kind: Any = None,  # noqa: ANN401
        attributes: Any = None,  # noqa: ANN401
        links: Any = None,  # noqa: ANN401
        trace_state: Any = None,  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult
        from opentelemetry.trace import get_current_span

        parent = get_current_span(parent_context).get_span_context()
        decision = Decision.RECORD_AND_SAMPLE if self.records(trace_id) else Decision.DROP
        return SamplingResult(decision, attributes, parent.trace_state if parent else None)

    def get_description(self) -> str:
        return f"KeyedRatioSampler{{{self.ratio}}}"


def sampling_key(config: TracingConfig) -> bytes:
    """The sampler's key: from ``sampling_key`` (shared by the nodes of a grid), else random."""
    if config.sampling_key:
        return hashlib.blake2b(config.sampling_key.encode(), digest_size=32).digest()
    return secrets.token_bytes(32)


# what install() set up, for the spec of each runner process it starts ({}: tracing is off)
_RUNNER_SETTINGS: dict[str, Any] = {}


def runner_settings() -> dict[str, Any]:
    """What a runner process needs to export its spans as its node does ({}: tracing off):
    endpoint, ratio, the sampling key (hex), service name, node id and name."""
    return dict(_RUNNER_SETTINGS)


def _install(settings: dict[str, Any]) -> Any:  # noqa: ANN401
    from opentelemetry import trace

    from node.observe.otlp import Exporter
    from node.observe.recorder import TracerProvider

    resource = {
        "service.name": settings["service_name"],
        "service.instance.id": settings["node_id"],
        "hero.node.name": settings["node_name"],
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "hero-node",
    }
    sampler = KeyedRatioSampler(settings["sampling_ratio"], bytes.fromhex(settings["key"]))
    provider = TracerProvider(sampler, Exporter(settings["endpoint"], resource))
    trace.set_tracer_provider(provider)
    return provider


def install_runner(settings: dict[str, Any]) -> Any:  # noqa: ANN401
    """Install, in a runner process, the provider of :func:`runner_settings`; returns it."""
    return _install(settings)


def install(config: TracingConfig, node_id: str, node_name: str) -> Any:  # noqa: ANN401
    """Install the global tracer provider that exports this node's spans; returns it."""
    settings = {
        "endpoint": config.endpoint,
        "sampling_ratio": config.sampling_ratio,
        "key": sampling_key(config).hex(),
        "service_name": config.service_name,
        "node_id": node_id,
        "node_name": node_name,
    }
    provider = _install(settings)
    _RUNNER_SETTINGS.clear()
    _RUNNER_SETTINGS.update(settings)
    log.info(
        "tracing: spans to %s (sampling %g, service %s)",
        config.endpoint,
        config.sampling_ratio,
        config.service_name,
    )
    return provider


@asynccontextmanager
async def tracing(config: TracingConfig, node_id: str, node_name: str) -> AsyncIterator[None]:
    """Tracing for the node's lifetime: nothing at all when it is off; on, the provider is
    installed on entry and flushed and shut down on exit (in a thread: the shutdown blocks
    on the exporter's last send), within SHUTDOWN_S."""
    if not config.enabled:
        yield
        return
    provider = install(config, node_id, node_name)
    try:
        yield
    finally:
        _RUNNER_SETTINGS.clear()
        with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_S):
            await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)

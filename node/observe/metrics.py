"""Prometheus metrics of a running node: the text ``GET /metrics`` serves (node/web/).

Everything is read when scraped, into a registry made for that scrape (never
prometheus_client's global one: one process may run several nodes, and the tests do):

- jobs: the ``stats:jobs`` hash of each context, counted in Valkey by the scripts that start
  and end jobs (bus/store/atomic/lua/stats_jobs.lua), whichever process runs them, or summed by
  a runner process and applied by its ending scripts (bus/core/stats.py), so the counts
  hold across restarts of the node and include jobs run by runner processes;
- queue depths, outboxes and live runner slots: read from Valkey;
- links, frames, acks, refusals and signature verifications: the node's in-memory counters
  (``Counters.count``, published for ``hero-node status`` by node/observe/tallies.py) and its
  transport's; they start from zero when the node starts, as Prometheus expects of counters;
- Valkey's round-trip latency: one PING, timed.

docs/operate/metrics.md lists every family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from bus.core import keys
from bus.core.models import Peer
from bus.core.reasons import Reason
from bus.core.stats import STATS_BUCKETS_S
from bus.errors import StoreError
from bus.store import records
from bus.store.atomic import type_breakers
from bus.store.atomic.type_breakers import TypeBreaker
from bus.store.presence import LiveRunner, live_runners
from node.intake.admission import VERIFIED
from node.observe.quotas import pressure_families, quota_families
from node.state import NodeState

__all__ = ["exposition"]

# message refusals that are a signature's verdict (hero_signature_verifications_total)
SIGNATURE_REASONS = frozenset(
    {Reason.BAD_SIGNATURE, Reason.UNKNOWN_SIGNER, Reason.WRONG_SIGNER, Reason.FORGED_RESULT}
)
ACKS = {
    "acks_sent": ("sent", "ack"),
    "nacks_sent": ("sent", "nack"),
    "acks_received": ("received", "ack"),
    "nacks_received": ("received", "nack"),
}
REJECTED, REFUSED_DELIVERY = "rejected_", "refused_delivery_"
# the stage of a transport refusal (hero_link_refusals_total) when it is not "handshake"
STAGES = {
    "oversize_frame": "frame",
    Reason.LISTENER_FULL: "listener",
    Reason.ADDRESS_FULL: "listener",
    # a dialler that speaks cleartext to a TLS listener, or TLS to a cleartext one
    "plaintext_dialler": "listener",
    "tls_dialler": "listener",
}


@dataclass
class Scrape:
    """What one scrape read from Valkey (the node's memory is read as the families are built)."""

    ping_s: float
    stats: dict[int, dict[str, str]]  # by context: its stats:jobs hash
    depths: dict[int, dict[str, int]]  # by context: list name -> length
    runners: dict[int, list[LiveRunner]]
    outboxes: dict[str, tuple[int, int]]  # by peer id: (pending, in flight)
    # by context: each script type's circuit breaker (bus/store/atomic/type_breakers.py)
    breakers: dict[int, dict[str, TypeBreaker]]
    # by context: queued jobs per actor, and in all (bus.store.records.quota_depths)
    quotas: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    # a replicated store's promise as status shows it (bus/store/topology.py promise_facts)
    promise: dict[str, Any] | None = None


async def exposition(state: NodeState) -> tuple[bytes, str]:
    """The node's metrics in Prometheus' text format, and its content type. Raises
    StoreError if Valkey fails."""
    scrape = await read(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*job_families(scrape), *node_families(state, scrape)]))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Families:
    """A collector that yields families built already (the reads were async)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def read(state: NodeState) -> Scrape:
    """Read what the metrics need from Valkey: PING first, so its time is not a queue's."""
    store = state.store
    started = time.perf_counter()
    await store.ping()
    if state.job_stats.write is not None:  # what the node counted: in stats:jobs first
        await state.job_stats.write()
    scrape = Scrape(time.perf_counter() - started, {}, {}, {}, {}, {})
    for ctx in await store.context_ids():
        scrape.stats[ctx] = await records.job_stats(store, ctx)
        # each type's queue always (an empty list does not exist in Valkey), then the others
        names = [keys.MSG_OUT, keys.MSG_IN, keys.DLQ]
        names += [keys.queue(t) for t in sorted(state.config.runners)]
        names += sorted(set(await records.queue_names(store, ctx)) - set(names))
        scrape.depths[ctx] = dict(zip(names, await records.depths(store, ctx, names), strict=True))
        scrape.depths[ctx][keys.MSG_HELD] = await records.held_depth(store, ctx)
        scrape.runners[ctx] = await live_runners(store, ctx)
        scrape.breakers[ctx] = await type_breakers.read(store, ctx)
        scrape.quotas[ctx] = await records.quota_depths(store, ctx)
    for peer_id in state.peers.known:
        pending, inflight = await records.outbox_depths(store, peer_id)
        scrape.outboxes[peer_id] = (pending, inflight)
    if store.barrier is not None:  # replicated: what its promise does now, as status says
        with contextlib.suppress(StoreError):  # no Sentinel answers: the families say nothing
            scrape.promise = (await store.topology()).get("promise")
    return scrape


# -- jobs (stats:jobs) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobCounter:
    """A counter family read from stats:jobs fields ``<event>|<type>[|<status>|<reason>]``:
    those of ``event`` (and ``status``, if set), labelled ctx, type and the ``picked`` parts
    after the type (1: status, 2: reason)."""

    event: str
    status: str
    name: str
    doc: str
    picked: tuple[int, ...] = ()

    @property
    def labels(self) -> list[str]:
        return ["ctx", "type", *("status" if i == 1 else "reason" for i in self.picked)]

    def sample(self, ctx: int, field: str) -> list[str] | None:
        """The labels of the sample ``field`` counts in this family, or None."""
        event, *parts = field.split("|")
        if event != self.event or len(parts) != (3 if event in ("ended", "answered") else 1):
            return None
        if self.status and parts[1] != self.status:
            return None
        return [str(ctx), parts[0], *(parts[i] for i in self.picked)]


JOB_COUNTERS = (
    JobCounter("submitted", "", "hero_jobs_submitted", "Jobs submitted on this node."),
    JobCounter("received", "", "hero_jobs_received", "Jobs received from other nodes."),
    JobCounter("started", "", "hero_jobs_started", "Job attempts started on this node."),
    JobCounter("ended", "finished", "hero_jobs_finished", "Jobs that finished on this node."),
    JobCounter("ended", "error", "hero_jobs_failed", "Jobs that ended in error here.", (2,)),
    JobCounter("ended", "retry", "hero_jobs_retried", "Failed attempts retried later.", (2,)),
    JobCounter(
        "answered",
        "",
        "hero_jobs_answered",
        "Jobs submitted on this node whose final result reached it.",
        (1, 2),
    ),
)


def job_families(scrape: Scrape) -> list[Metric]:
    families = {c: CounterMetricFamily(c.name, c.doc, labels=c.labels) for c in JOB_COUNTERS}
    for ctx, stats in sorted(scrape.stats.items()):
        for field, value in sorted(stats.items()):
            for counter, family in families.items():
                labels = counter.sample(ctx, field)
                if labels is not None:
                    family.add_metric(labels, float(value))
    duration = histogram(
        "hero_job_duration_seconds",
        "Time from an attempt's start to its end, where the job ran.",
        "duration",
        scrape.stats,
    )
    round_trip = histogram(
        "hero_job_round_trip_seconds",
        "Time from a job's submission on this node to its result here.",
        "roundtrip",
        scrape.stats,
    )
    return [*families.values(), duration, round_trip]


def histogram(name: str, doc: str, field: str, stats: dict[int, dict[str, str]]) -> Metric:
    """A histogram family from the per-bucket counts stats_jobs.lua keeps (made cumulative
    here: the script adds one count per observation)."""
    family = HistogramMetricFamily(name, doc, labels=["ctx", "type"])
    for ctx, fields in sorted(stats.items()):
        for script_type, counts in sorted(bucket_counts(fields, field).items()):
            total, buckets = 0, []
            for bound in STATS_BUCKETS_S:
                total += counts.get(str(bound), 0)
                buckets.append((floatToGoString(bound), float(total)))
            buckets.append(("+Inf", float(total + counts.get("+Inf", 0))))
            sum_s = float(fields.get(f"{field}_sum|{script_type}", 0))
            family.add_metric([str(ctx), script_type], buckets, sum_s)
    return family


def bucket_counts(fields: Mapping[str, str], field: str) -> dict[str, dict[str, int]]:
    """The observations of histogram ``field`` in a ``stats:jobs`` hash, by script type and
    bucket bound (its label: "0.005" ... "+Inf"), as stats_jobs.lua counts them (not
    cumulative). The console's charts read them too (node/observe/sampler.py)."""
    by_type: dict[str, dict[str, int]] = {}
    for key, value in fields.items():
        kind, _, rest = key.partition("|")
        script_type, _, le = rest.partition("|")
        if kind == field and le:
            by_type.setdefault(script_type, {})[le] = int(value)
    return by_type


# -- the node: queues, runners, links, refusals --------------------------------------------------


def node_families(state: NodeState, scrape: Scrape) -> list[Metric]:
    return [
        *isolation_families(state),
        *disk_families(state, scrape),
        *promise_families(state, scrape),
        *valkey_families(scrape),
        *runner_families(scrape),
        *type_breaker_families(scrape),
        *link_families(state, scrape),
        *counter_families(state),
        *quota_families(state.config, scrape.quotas),
        *pressure_families(state.pressure.hold.held),
    ]


def isolation_families(state: NodeState) -> Iterable[Metric]:
    """1 for the node's isolation mode (docs/security/sandbox.md): an alert on
    ``hero_isolation_mode{mode="none"} == 1`` or ``{mode="refused"}`` catches a node whose jobs
    run unsandboxed, or do not run."""
    iso = state.runners.isolation
    gauge = GaugeMetricFamily(
        "hero_isolation_mode",
        "How this node isolates jobs: strict, namespaces, none (no sandbox) or refused.",
        labels=["mode", "limits", "cpu_time"],
    )
    if iso is not None:
        gauge.add_metric([iso.mode, iso.limits, iso.cpu_time], 1.0)
    return [gauge]


def disk_families(state: NodeState, scrape: Scrape) -> Iterable[Metric]:
    """Each context's disk use and quota (docs/security/bounds.md): used only where a quota is
    in force (its work dir a file system of its own); an alert on used / quota near 1 sees a
    context about to get ``disk_limit``."""
    from node.sandbox.disk import context_disks, work_root_of

    gauge = GaugeMetricFamily(
        "hero_context_disk_bytes",
        "A context's work dir: used bytes (where a quota is in force) and its quota.",
        labels=["ctx", "kind"],
    )
    root = work_root_of(state.config.home)
    disks = context_disks(root, sorted(scrape.depths), state.config.limits)
    for ctx, disk in disks.items():
        gauge.add_metric([ctx, "quota"], float(int(str(disk["quota_mb"])) * 2**20))
        if disk["enforced"]:
            gauge.add_metric([ctx, "used"], float(str(disk["used_bytes"])))
    return [gauge]


def promise_families(state: NodeState, scrape: Scrape) -> Iterable[Metric]:
    """A replicated store's promise (docs/operate/promise.md): how many replicas' fsyncs each
    waits for, whether it refuses them now (fewer replicas up), and how many of the node's own
    (link acks) were refused. An alert on ``hero_store_promise_refusing == 1`` catches a set
    that cannot confirm writes; ``{promise="one-replica"}`` names the weaker promise."""
    barrier = state.store.barrier
    if barrier is None:
        return []
    wanted = GaugeMetricFamily(
        "hero_store_promise_replicas_wanted",
        "Replica fsyncs (WAITAOF 1 N) each promise of the replicated store waits for.",
        labels=["promise"],
    )
    refusing = GaugeMetricFamily(
        "hero_store_promise_refusing",
        "1 while fewer replicas are up than the promise waits for: writes are not confirmed.",
        labels=["promise"],
    )
    refused = CounterMetricFamily(
        "hero_store_promises_refused",
        "Promises of this node (link acks) not given: WAITAOF did not confirm them.",
        labels=["promise"],
    )
    name = barrier.target.promise
    refused.add_metric([name], float(barrier.refused))
    if scrape.promise is not None:  # the set as the Sentinels see it now, as status says
        wanted.add_metric([name], float(scrape.promise["replicas_wanted"]))
        refusing.add_metric([name], float(scrape.promise["refusing"]))
    return [wanted, refusing, refused]


def valkey_families(scrape: Scrape) -> Iterable[Metric]:
    ping = GaugeMetricFamily(
        "hero_valkey_ping_seconds", "Round trip of a PING to the node's Valkey, at this scrape."
    )
    ping.add_metric([], scrape.ping_s)
    depth = GaugeMetricFamily(
        "hero_queue_depth",
        "Entries in a context's list: msg_out, msg_in, dlq and every queue:*; msg_held: "
        "job messages stored before a restart, held until acknowledged again.",
        labels=["ctx", "queue"],
    )
    for ctx, by_name in sorted(scrape.depths.items()):
        for name, length in by_name.items():
            depth.add_metric([str(ctx), name], float(length))
    return [ping, depth]


def runner_families(scrape: Scrape) -> Iterable[Metric]:
    slots = GaugeMetricFamily(
        "hero_runner_slots",
        "Live runners (local slots and external runners with a presence), busy or idle.",
        labels=["ctx", "type", "state"],
    )
    for ctx, runners in sorted(scrape.runners.items()):
        tally: dict[tuple[str, str], int] = {}
        for runner in runners:
            for state in ("busy", "idle"):
                tally.setdefault((runner.script_type, state), 0)
            kind = (runner.script_type, "busy" if runner.busy else "idle")
            tally[kind] += 1
        for (script_type, state), n in sorted(tally.items()):
            slots.add_metric([str(ctx), script_type, state], float(n))
    return [slots]


BREAKER_STATES = ("closed", "half_open", "open")


def type_breaker_families(scrape: Scrape) -> Iterable[Metric]:
    state = GaugeMetricFamily(
        "hero_type_breaker_state",
        "A script type's circuit breaker: 1 for its state (closed, half_open, open), 0 else.",
        labels=["ctx", "type", "state"],
    )
    failures = GaugeMetricFamily(
        "hero_type_breaker_failures",
        "Failed attempts in a row of a script type (its breaker opens at the threshold).",
        labels=["ctx", "type"],
    )
    for ctx, breakers in sorted(scrape.breakers.items()):
        for script_type, breaker in breakers.items():
            for name in BREAKER_STATES:
                value = 1.0 if breaker.state == name else 0.0
                state.add_metric([str(ctx), script_type, name], value)
            failures.add_metric([str(ctx), script_type], float(breaker.failures))
    return [state, failures]


def _peer_labels(peer: Peer) -> list[str]:
    return [peer.id, peer.name]


def link_families(state: NodeState, scrape: Scrape) -> Iterable[Metric]:
    peer_labels = ["peer", "name"]
    up = GaugeMetricFamily(
        "hero_link_up", "1 while an authenticated link to the peer is up.", labels=peer_labels
    )
    outbox = GaugeMetricFamily(
        "hero_outbox_depth",
        "Messages for the peer: waiting to be sent (pending) or sent, not acked (inflight).",
        labels=[*peer_labels, "state"],
    )
    frames = CounterMetricFamily(
        "hero_link_frames",
        "Frames on the links to the peer, after the handshake.",
        labels=[*peer_labels, "direction"],
    )
    sizes = CounterMetricFamily(
        "hero_link_bytes", "Bytes of those frames.", labels=[*peer_labels, "direction"]
    )
    sealed = GaugeMetricFamily(
        "hero_link_encrypted",
        "Per peer link up: 1 if encrypted (TLS 1.3), 0 if cleartext (why: link_encryption).",
        labels=[*peer_labels, "why"],
    )
    transport = state.peers.transport
    for peer_id, peer in sorted(state.peers.known.items()):
        labels = _peer_labels(peer)
        link = transport.link(peer_id) if transport is not None else None
        up.add_metric(labels, 1.0 if link is not None else 0.0)
        if link is not None and transport is not None:
            why = "" if link.encryption else transport.config.plaintext_why
            sealed.add_metric([*labels, why], 1.0 if link.encryption else 0.0)
        pending, inflight = scrape.outboxes.get(peer_id, (0, 0))
        outbox.add_metric([*labels, "pending"], float(pending))
        outbox.add_metric([*labels, "inflight"], float(inflight))
        traffic = transport.traffic.get(peer_id) if transport is not None else None
        if traffic is not None:
            frames.add_metric([*labels, "in"], float(traffic.frames_in))
            frames.add_metric([*labels, "out"], float(traffic.frames_out))
            sizes.add_metric([*labels, "in"], float(traffic.bytes_in))
            sizes.add_metric([*labels, "out"], float(traffic.bytes_out))
    unauthenticated = GaugeMetricFamily(
        "hero_link_pending_connections",
        "Inbound connections accepted and not yet authenticated (capped: max_pending_links).",
    )
    gate = transport.gate if transport is not None else None
    unauthenticated.add_metric([], float(gate.pending if gate is not None else 0))
    return [up, outbox, frames, sizes, sealed, unauthenticated]


def counter_families(state: NodeState) -> Iterable[Metric]:
    """The node's in-memory counters, each in its family; the rest as hero_node_events_total."""
    fams = {
        "acks": CounterMetricFamily(
            "hero_link_acks",
            "Messages acknowledged (ack) or refused (nack) on links.",
            labels=["direction", "kind"],
        ),
        "refused": CounterMetricFamily(
            "hero_messages_refused",
            "Messages refused (dead-lettered), by reason.",
            labels=["reason"],
        ),
        "links": CounterMetricFamily(
            "hero_link_refusals",
            "Refusals on links: handshakes, frames, and messages refused at delivery.",
            labels=["stage", "reason"],
        ),
        "verified": CounterMetricFamily(
            "hero_signature_verifications",
            "Message signatures checked: ok, or the reason of a refusal.",
            labels=["result"],
        ),
        "events": CounterMetricFamily(
            "hero_node_events", "Other events the node counts (hero-node status).", labels=["event"]
        ),
        "restarts": CounterMetricFamily(
            "hero_service_restarts", "Services restarted after a Redis outage.", labels=["service"]
        ),
    }
    fams["verified"].add_metric(["ok"], float(state.counters.metrics.get(VERIFIED, 0)))
    for name, n in sorted(state.counters.metrics.items()):
        _file(fams, name, float(n))
    if state.peers.transport is not None:
        for reason, n in sorted(state.peers.transport.refused.items()):
            stage = STAGES.get(reason, "handshake")
            fams["links"].add_metric([stage, reason], float(n))
    for service, n in sorted(state.counters.restarts.items()):
        fams["restarts"].add_metric([service], float(n))
    return fams.values()


def _file(fams: dict[str, CounterMetricFamily], name: str, n: float) -> None:
    """Add the node counter ``name`` to its family (see counter_families)."""
    if name in ACKS:
        fams["acks"].add_metric(list(ACKS[name]), n)
    elif name.startswith(REJECTED):
        reason = name.removeprefix(REJECTED)
        fams["refused"].add_metric([reason], n)
        if reason in SIGNATURE_REASONS:
            fams["verified"].add_metric([reason], n)
    elif name.startswith(REFUSED_DELIVERY):
        fams["links"].add_metric(["delivery", name.removeprefix(REFUSED_DELIVERY)], n)
    elif name == "bad_frames":
        fams["links"].add_metric(["frame", Reason.BAD_FRAME], n)
    elif name != VERIFIED:
        fams["events"].add_metric([name], n)

"""What the node says of its bounds (issue 46): each actor's queued jobs against its queue
bound, and whether the node holds new jobs back for want of room (node/intake/pressure.py).
Shared by ``/metrics`` (node/observe/metrics.py) and ``hero-node status`` (node/cli/status.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from bus.core import keys
from node.config import NodeConfig
from node.intake.admission import QueueBounds, queue_bounds


def quota_facts(bounds: QueueBounds, depths: Mapping[str, int]) -> dict[str, Any]:
    """A context's queued jobs against its ``bounds`` (0: none): ``{"actors": {id: {depth,
    bound}}, "context": {depth, bound}}``; ``depths`` as bus.store.records.quota_depths reads
    them."""
    actors = {
        actor: {"depth": n, "bound": bounds.actor}
        for actor, n in sorted(depths.items(), key=lambda kv: kv[0])
        if actor != keys.QUOTA_ALL
    }
    whole = {"depth": depths.get(keys.QUOTA_ALL, 0), "bound": bounds.context}
    return {"actors": actors, "context": whole}


def quota_text(facts: Mapping[str, Any]) -> str:
    """One status line: ``queued <actor>=<depth>/<bound> ...; context <depth>/<bound>``."""

    def of(entry: Mapping[str, int]) -> str:
        return f"{entry['depth']}/{entry['bound'] or 'unbounded'}"

    actors = " ".join(f"actor {a}={of(e)}" for a, e in facts["actors"].items())
    return f"queued {actors or '(none)'}; context {of(facts['context'])}"


def quota_families(config: NodeConfig, quotas: Mapping[int, Mapping[str, int]]) -> list[Metric]:
    """``hero_actor_queued_jobs`` and ``hero_queue_bound`` (an alert on their ratio sees an
    actor near its bound before it is refused)."""
    queued = GaugeMetricFamily(
        "hero_actor_queued_jobs",
        "Jobs of an actor queued and not started yet in a context (what its queue bound "
        'counts); actor="all": the whole context.',
        labels=["ctx", "actor"],
    )
    bound = GaugeMetricFamily(
        "hero_queue_bound",
        "The most jobs queued and not started yet per actor (scope=actor) or in all "
        "(scope=context) in a context; 0: no bound.",
        labels=["ctx", "scope"],
    )
    for ctx, depths in sorted(quotas.items()):
        bounds = queue_bounds(config, ctx)
        facts = quota_facts(bounds, depths)
        for actor, entry in facts["actors"].items():
            queued.add_metric([str(ctx), actor], float(entry["depth"]))
        queued.add_metric([str(ctx), keys.QUOTA_ALL], float(facts["context"]["depth"]))
        bound.add_metric([str(ctx), "actor"], float(bounds.actor))
        bound.add_metric([str(ctx), "context"], float(bounds.context))
    return [queued, bound]


def pressure_families(held: Mapping[str, str]) -> Iterable[Metric]:
    """``hero_intake_held{cause}``: 1 while the node takes no new jobs for want of ``cause``
    (disk, store_memory; node/intake/pressure.py)."""
    gauge = GaugeMetricFamily(
        "hero_intake_held",
        "1 while the node takes no new jobs for want of room: disk (free space under "
        "disk_headroom_mb) or store_memory (Valkey near its maxmemory).",
        labels=["cause"],
    )
    for cause in ("disk", "store_memory"):
        gauge.add_metric([cause], 1.0 if cause in held else 0.0)
    return [gauge]
